# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the files of one named engine and what they say.

Layout of ``<run_dir>/<name>/`` (:func:`paths`): ``supervisor.py``, ``spec.json`` (what was started: command,
chdir, the *names* of the environment variables, never their values), ``state.json`` (written by the supervisor
of ``_process``: running / exited with returncode or signal) and ``<name>.log`` (the process's stdout+stderr,
appended across restarts with a banner line) and ``lock`` (``_process.NameLock``'s file: empty, mode 0600).

* :func:`check_name` / :func:`check_run_dir` / :func:`check_layout` - the rules that make ``(run_dir, name)``
  spell one directory, refused with :class:`ProcessError` naming the option.
* :func:`read_state_doc` / :func:`read_state_file` - ``state.json`` through the shared reader, each field of the
  type the supervisor writes (:func:`clean_state`), never a traceback or a hang.
* :func:`describe_exit` - an exit status, a signal or a lost supervisor in words.
"""
from __future__ import annotations

import os
import re
import signal

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common._fsutil import read_part
from ansible_collections.llmops.serving.plugins.module_utils.common._process_run import live
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json


class ProcessError(Exception):
    """A failure with a message that names the cause; ``details`` goes into the module result."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


# --------------------------------------------------------------------------------------------- #
# Input rules: name, run_dir, environment
# --------------------------------------------------------------------------------------------- #

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def check_name(name):
    """``name`` is one plain path component: it names ``<run_dir>/<name>`` and nothing else."""
    if not isinstance(name, str) or not NAME_RE.match(name) or name in (".", ".."):
        shown = name if isinstance(name, str) and len(name) <= 200 else type(name).__name__
        raise ProcessError(
            "name: %r is not a plain process name; it becomes the directory <run_dir>/<name> that holds the "
            "engine's state and log, so it must be one path component of letters, digits, '_', '.' or '-' "
            "(not starting with '.' or '-', no '/', not empty, at most 128 characters); use for example "
            "name: vllm and set run_dir to the parent directory" % (shown,), reason="bad_name")


def check_run_dir(run_dir):
    if not isinstance(run_dir, str) or not os.path.isabs(run_dir):
        raise ProcessError(
            "run_dir: %r is not an absolute path; a relative run_dir depends on the working directory of each "
            "run, so two runs would not find the same engine; use an absolute path such as /var/tmp/llmops/run"
            % (run_dir,), reason="bad_run_dir")
    base = os.path.join(run_dir, "")
    if os.path.lexists(run_dir) and not os.path.isdir(base):
        raise ProcessError("run_dir: %s exists and is not a directory; point run_dir at a directory" % run_dir,
                           reason="bad_run_dir")


def check_layout(run_dir, name):
    """``<run_dir>/<name>`` is a real directory (or absent), never a symlink that leads elsewhere."""
    base = os.path.join(run_dir, name)
    if os.path.islink(base):
        raise ProcessError(
            "name: %s is a symlink; engine_process keeps the engine's state and log in a real directory there "
            "(a link could lead out of run_dir); remove the link or choose another name" % base, reason="bad_name")
    if os.path.lexists(base) and not os.path.isdir(base):
        raise ProcessError("name: %s exists and is not a directory; remove it or choose another name" % base,
                           reason="bad_name")


def paths(run_dir, name):
    base = os.path.join(run_dir, name)
    return {
        "dir": base,
        "supervisor": os.path.join(base, "supervisor.py"),
        "spec": os.path.join(base, "spec.json"),
        "state": os.path.join(base, "state.json"),
        "log": os.path.join(base, "%s.log" % name),
        "lock": os.path.join(base, "lock"),
    }


#: ``state.json`` is a few hundred bytes; anything larger is not the supervisor's.
STATE_MAX_BYTES = 64 * 1024
#: Fields of ``state.json`` and the types they must have (bool is never taken for an int); a field of another
#: type is dropped, so a malformed state file can hide facts but never point a signal at another process.
_STATE_FIELDS = {
    "state": str, "key": str, "name": str, "spec_hash": str,
    "supervisor_pid": int, "supervisor_start": int, "pid": int, "pid_start": int,
    "returncode": int, "signal": int, "stop_signal": int,
    "started_at": float, "ended_at": float, "stop_requested_at": float,
    "stop_requested": bool, "supervisor_lost": bool, "leader_exited": bool,
}
_STATES = ("running", "exited", "lost")


def _typed(value, kind):
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind is float:
        return float(value) if isinstance(value, (int, float)) else None
    if kind is int:
        return value if isinstance(value, int) else None
    return value if isinstance(value, str) and len(value) <= 256 else None


def clean_state(doc):
    """``(state, dropped)``: the fields of a state document that have the type the supervisor writes.

    A pid is a positive int, a start time a non-negative int, ``state`` one of running / exited / lost. Any
    other field, or a field of the wrong type, is left out and named in ``dropped`` (sorted)."""
    out, dropped = {}, []
    for k, v in doc.items():
        kind = _STATE_FIELDS.get(k)
        val = _typed(v, kind) if kind else None
        if val is not None and k in ("supervisor_pid", "pid") and val <= 0:
            val = None
        if val is not None and k in ("supervisor_start", "pid_start") and val < 0:
            val = None
        if val is not None and k == "state" and val not in _STATES:
            val = None
        if kind and v is None:
            out[k] = None  # the supervisor writes null for what it does not know (returncode while running)
        elif val is None:
            dropped.append(k if len(k) <= 64 else k[:64] + "...")
        else:
            out[k] = val
    return out, sorted(dropped)


def read_json_object(path, max_bytes=STATE_MAX_BYTES):
    """The JSON object in ``path``; None when it is absent, unreadable, not JSON or not an object.

    Read through the collection's reader for untrusted files: a FIFO, a device, a nesting bomb, an oversized or
    truncated file or a number like ``10**400`` is None, never a hang or a traceback."""
    try:
        st = load_json(path, "state file", max_bytes=max_bytes)
    except (OSError, UntrustedInput):
        return None
    return st if isinstance(st, dict) else None


def _state_problem(path, max_bytes=STATE_MAX_BYTES):
    """Why ``path`` cannot be taken as a state file (a short reason naming the file and the rule), or None
    when it is absent or a JSON object."""
    try:
        doc = load_json(path, "state file", max_bytes=max_bytes)
    except FileNotFoundError:
        return None
    except UntrustedInput as e:
        return "%s (%s limit)" % (e, e.limit)
    except OSError as e:
        return "state file: %s cannot be read (%s)" % (path, e.strerror or e.__class__.__name__)
    if not isinstance(doc, dict):
        return "state file: %s is not a JSON object" % path
    return None


def read_state_doc(path):
    """``(state fields, problem)``: :func:`clean_state` of ``path`` (``{}`` when it cannot be read), and a
    message naming the file and what was wrong with it (None when it was whole and well typed)."""
    problem = _state_problem(path)
    doc = read_json_object(path) if problem is None else None
    if doc is None:
        return {}, problem
    st, dropped = clean_state(doc)
    if dropped:
        problem = ("state file: %s has fields of the wrong type or unknown fields (%s); they were ignored"
                   % (path, ", ".join(dropped[:10])))
    return st, problem


def read_state_file(path):
    """State from the state file alone (no /proc scan): what :mod:`engine_probe` polls."""
    st = read_state_doc(path)[0]
    if not st.get("state"):
        return {"state": "absent"}
    if st.get("state") == "running":
        if live(st.get("pid"), st.get("pid_start")):
            return st
        if live(st.get("supervisor_pid"), st.get("supervisor_start")):
            return st  # child just exited; the supervisor is about to record it
        st = dict(st, state="lost", returncode=None)
    return st


def log_tail(path, lines=40):
    data = read_part(path, 64 * 1024, from_end=True)
    return [] if data is None else data.decode("utf-8", "replace").splitlines()[-lines:]


def write_private(path, data):
    _fsutil.atomic_write_json(path, data, mode=0o600, sort_keys=True)


def describe_exit(st):
    if st.get("signal"):
        try:
            return "signal %s (%s)" % (st["signal"], signal.Signals(st["signal"]).name)
        except ValueError:
            return "signal %s" % st["signal"]
    if st.get("state") == "lost":
        return "an unknown status (its supervisor was killed)"
    if st.get("returncode") is None and st.get("supervisor_lost"):
        return "an unknown status (its supervisor was killed; engine_process stopped it with %s)" % (
            "SIGKILL" if st.get("stop_signal") == signal.SIGKILL else "SIGTERM")
    return "exit status %s" % st.get("returncode")
