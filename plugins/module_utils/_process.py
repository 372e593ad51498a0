# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: one supervised engine per name, whose exit status is never masked.

Layout of ``<run_dir>/<name>/``: ``supervisor.py`` (written from SUPERVISOR_SOURCE), ``spec.json`` (what was
started: command, chdir, the *names* of the environment variables, never their values), ``state.json``
(written by the supervisor: running / exited with returncode or signal) and ``<name>.log`` (the process's
stdout+stderr, appended across restarts with a banner line).

The supervisor is a small Python parent that runs the command as a direct child in its own session (so the
engine's process group id is its pid), forwards SIGTERM/SIGINT to that process group, and records the child's
real exit status.

One engine per name. The rules that make ``(run_dir, name)`` name at most one engine:

* ``name`` is one plain path component (:func:`check_name`) and ``run_dir`` is absolute, so the pair always
  spells the same directory; the *identity key* is a hash of ``realpath(run_dir)`` and ``name``.
* Every run that may start or stop the engine holds a lock for that key across the whole check-and-spawn
  (:class:`NameLock`). The lock is an abstract Unix socket bound to the key: the kernel releases it when the
  holder dies, and no file can be unlinked or deleted with the run directory to break it.
* The engine's identity does not live only in the run directory. The supervisor passes
  ``LLMOPS_ENGINE_PROCESS=<key>`` and ``LLMOPS_ENGINE_SPEC=<spec hash>`` in the engine's environment (inherited
  by its workers) and carries ``--llmops-engine-process=<key>`` on its own command line; ``state.json`` records
  pid *and* start time (``/proc/<pid>/stat`` field 22) of both, so a reused pid is never taken for the engine.
  When ``state.json`` does not show a live engine (deleted run dir, killed supervisor), :func:`locate` scans
  ``/proc`` for the marker and still finds it, so a second ``started`` does not start a second engine and
  ``stopped`` can still stop it. A supervisor whose state file was deleted writes it again within a second.
* ``stopped`` signals the supervisor when it lives; when it was killed, the engine's process group gets SIGTERM
  directly, then SIGKILL after the grace period.

Secrets: ``env`` values reach the engine only through the supervisor's process environment; they are never
written to ``spec.json`` (names only), ``state.json`` or the log by this code. Credentials written in the command
(``--api-key X``) reach the supervisor on its stdin; ``spec.json`` and the log banner show them masked.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil, _secrets
from ansible_collections.llmops.serving.plugins.module_utils._untrusted import UntrustedInput, load_json, loads_json

MARKER_ENV = "LLMOPS_ENGINE_PROCESS"
SPEC_ENV = "LLMOPS_ENGINE_SPEC"
SUPERVISOR_FLAG = "--llmops-engine-process="

SUPERVISOR_SOURCE = r'''
import json, os, signal, subprocess, sys, time

def proc_start(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None

def write_state(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)  # the run dir may have been deleted under us
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)

def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

def main():
    key = sys.argv[1][len("--llmops-engine-process="):]
    state_path, log_path, spec_path = sys.argv[2:5]
    with open(spec_path) as f:
        spec = json.load(f)
    # spec.json holds the command with credentials masked; the real one comes on stdin
    given = json.loads(sys.stdin.read() or "{}")
    command = given.get("command") or spec["command"]
    log = open(log_path, "ab", buffering=0)
    log.write(("==== %s starting: %s\n" % (now(), " ".join(spec["command"]))).encode())
    state = {"state": "running", "key": key, "name": spec.get("name"), "supervisor_pid": os.getpid(),
             "supervisor_start": proc_start(os.getpid()), "started_at": time.time(), "spec_hash": spec["spec_hash"],
             "returncode": None, "signal": None}
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=spec.get("chdir") or None, start_new_session=True)
    except OSError as e:
        rc = 127 if e.errno == 2 else 126
        log.write(("==== %s cannot start %s: %s\n" % (now(), spec["command"][0], e.strerror)).encode())
        state.update({"state": "exited", "pid": None, "ended_at": time.time(), "returncode": rc, "stop_requested": False})
        write_state(state_path, state)
        sys.exit(0)
    state.update({"pid": child.pid, "pid_start": proc_start(child.pid)})
    write_state(state_path, state)
    stop_timeout = float(spec.get("stop_timeout", 60))
    stopping = {"requested": None}

    def on_signal(signum, frame):
        if stopping["requested"] is None:
            stopping["requested"] = time.time()
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        try:
            rc = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if stopping["requested"] and time.time() - stopping["requested"] > stop_timeout:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not os.path.exists(state_path):
                try:
                    write_state(state_path, state)
                except OSError:
                    pass
    try:  # reap anything the engine left in its process group (workers)
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    state.update({"state": "exited", "ended_at": time.time(), "returncode": rc,
                  "signal": (-rc if rc < 0 else None), "stop_requested": stopping["requested"] is not None})
    write_state(state_path, state)
    log.write(("==== %s exited: returncode=%s\n" % (now(), rc)).encode())
    sys.exit(0)

main()
'''


class ProcessError(Exception):
    """A failure with a message that names the cause; ``details`` goes into the module result."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


# --------------------------------------------------------------------------------------------- #
# Input rules: name, run_dir, environment
# --------------------------------------------------------------------------------------------- #

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


NO_LOG_PLACEHOLDER = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def mask_everywhere(env_name, value):
    """Whether Ansible should mask ``value`` inside every string of the result, not only where env is shown.

    True for credentials by the collection's one rule (:mod:`_secrets`: the name, or a token-shaped value).
    Plain settings are not: masking ``1`` everywhere would turn pids and times into the mask.
    """
    return _secrets.is_credential_name(env_name) or _secrets.token_shape(value) is not None


def command_secrets(command):
    """``(values, fields)``: credentials written in ``command`` (``--api-key X``, a token-shaped word).

    The collection's one rule (:class:`_secrets.Scan`, shell scripts split into words). They are masked in
    results and in every file this module writes, but stay readable to local users in the engine's
    ``/proc/<pid>/cmdline``.
    """
    scan = _secrets.Scan()
    scan.command(list(command or []))
    fields = []
    for f in scan.findings:
        if f.value and f.field not in fields:
            fields.append(f.field)
    return scan.secret_values(), fields


def redact(argv, values):
    """``argv`` with every occurrence of ``values`` replaced by ``********``."""
    out = []
    for tok in argv:
        for v in sorted(values, key=len, reverse=True):
            tok = tok.replace(v, "********")
        out.append(tok)
    return out


def check_env(env):
    """Validated ``env`` as ``{str: str}``. Messages name variables, never values."""
    clean = {}
    for k, v in (env or {}).items():
        k = str(k)
        if not ENV_NAME_RE.match(k):
            raise ProcessError("env: %r is not a valid environment variable name (letters, digits and '_', not "
                               "starting with a digit)" % k[:100], reason="bad_env")
        if k in (MARKER_ENV, SPEC_ENV):
            raise ProcessError("env: %s is set by engine_process to find the engine again; remove it" % k,
                               reason="bad_env")
        if v is None or isinstance(v, (dict, list)):
            raise ProcessError("env: %s must be a string, not %s; quote the value in YAML ('' for empty)"
                               % (k, "null" if v is None else type(v).__name__), reason="bad_env")
        v = str(v)
        if "\x00" in v:
            raise ProcessError("env: the value of %s contains a NUL byte" % k, reason="bad_env")
        clean[k] = v
    return clean


def masked_env(env):
    """``env`` with every value replaced, for anything shown to the user (names stay, values never)."""
    return {k: NO_LOG_PLACEHOLDER for k in env}


# --------------------------------------------------------------------------------------------- #
# Command rule: the engine is the foreground process, so its exit status is the one recorded
# --------------------------------------------------------------------------------------------- #

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh"}
# What a script may 'exec' last that is certainly not an engine: the status would be this command's
# ('...; exec true' exits 0, 'exec sleep infinity' keeps a container Running with no engine in it).
NOT_AN_ENGINE = {"true", "false", ":", "exit", "sleep", "tail", "echo", "printf", "wait", "cat"}
# Prefix commands that exec (or wait for) the command they are given and pass its status on.
PREFIXES = {"nohup", "nice", "ionice", "taskset", "numactl", "chrt", "stdbuf", "timeout", "sudo", "setpriv",
            "prlimit", "cgexec", "busybox", "unbuffer", "doas", "runuser", "time", "catchsegv"}
_OPERATORS = ["&>>", ";;&", "<<<", "<<-", "&&", "||", "|&", ";;", ";&", ">>", "<<", ">&", "<&", "<>", ">|", "&>",
              "|", "&", ";", "<", ">", "(", ")"]
_CONTROL = {"&&", "||", "|", "|&", "&", ";", ";;", ";&", ";;&", "\n"}
_FIX = ("Make the engine the foreground process: give it as plain argv (command: [vllm, serve, ...]), or end "
        "the script with 'exec ENGINE ARGS', e.g. bash -lc 'source /opt/venv/bin/activate && exec vllm serve ...'; "
        "engine_process already writes the engine's output to its log file, so no tee or '&' is needed")


class _ShellSyntax(ValueError):
    pass


def _scan_balanced(s, i, open_ch, close_ch):
    """Index after the ``close_ch`` matching ``s[i] == open_ch``, skipping quoted parts."""
    depth = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                raise _ShellSyntax("an unterminated ' quote")
            i = j + 1
            continue
        if c == '"':
            i = _scan_double(s, i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _ShellSyntax("an unterminated %s...%s" % (open_ch, close_ch))


def _scan_double(s, i):
    """Index after the double-quoted string starting at ``s[i] == '"'``."""
    i += 1
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif s.startswith("$(", i):
            i = _scan_balanced(s, i + 1, "(", ")")
        elif c == "`":
            j = s.find("`", i + 1)
            if j < 0:
                raise _ShellSyntax("an unterminated ` quote")
            i = j + 1
        else:
            i += 1
    raise _ShellSyntax('an unterminated " quote')


def shell_tokens(script):
    """``[(kind, text)]`` with kind ``word``, ``op`` (control operator or newline) or ``redir``.

    Enough of the POSIX shell grammar to find commands, pipelines and background jobs: quotes, backslashes,
    ``$(...)``, ``${...}``, backticks and process substitution stay inside their word; comments are dropped.
    """
    toks = []
    buf = []
    i = 0
    n = len(script)

    def flush():
        if buf:
            toks.append(("word", "".join(buf)))
            del buf[:]

    while i < n:
        c = script[i]
        if c in " \t\r":
            flush()
            i += 1
        elif c == "\n":
            flush()
            toks.append(("op", "\n"))
            i += 1
        elif c == "#" and not buf:
            while i < n and script[i] != "\n":
                i += 1
        elif c == "\\":
            if script.startswith("\\\n", i):
                i += 2
            else:
                buf.append(script[i:i + 2])
                i += 2
        elif c == "'":
            j = script.find("'", i + 1)
            if j < 0:
                raise _ShellSyntax("an unterminated ' quote")
            buf.append(script[i:j + 1])
            i = j + 1
        elif c == '"':
            j = _scan_double(script, i)
            buf.append(script[i:j])
            i = j
        elif c == "$" and script.startswith("$(", i):
            j = _scan_balanced(script, i + 1, "(", ")")
            buf.append(script[i:j])
            i = j
        elif c == "$" and script.startswith("${", i):
            j = _scan_balanced(script, i + 1, "{", "}")
            buf.append(script[i:j])
            i = j
        elif c == "`":
            j = script.find("`", i + 1)
            if j < 0:
                raise _ShellSyntax("an unterminated ` quote")
            buf.append(script[i:j + 1])
            i = j + 1
        elif c in "<>" and script.startswith("(", i + 1):
            j = _scan_balanced(script, i + 1, "(", ")")
            buf.append(script[i:j])
            i = j
        elif c in "|&;<>()":
            op = next(o for o in _OPERATORS if script.startswith(o, i))
            is_redir = op[0] in "<>" or op in ("&>", "&>>")
            if is_redir and buf and "".join(buf).isdigit():
                del buf[:]  # "2>&1": the digits are the file descriptor, not a word
            flush()
            if op in ("<<", "<<-"):
                raise _ShellSyntax("a here-document, which this check does not follow")
            toks.append(("redir" if is_redir else "op", op))
            i += len(op)
        else:
            buf.append(c)
            i += 1
    flush()
    return toks


def shell_commands(script):
    """Simple commands of ``script`` as ``[{"words", "before", "after"}]`` (``before``/``after``: the operators)."""
    cmds = []
    cur = {"words": [], "before": None, "after": None}
    want_target = False
    for kind, text in shell_tokens(script):
        if kind == "redir":
            want_target = True
            continue
        if kind == "word":
            if want_target:
                want_target = False
                continue
            cur["words"].append(text)
            continue
        if text in ("(", ")"):
            cur["words"].append(text)
            continue
        if cur["words"]:
            cur["after"] = text
            cmds.append(cur)
            cur = {"words": [], "before": text, "after": None}
        elif text not in ("\n", ";"):
            cur["before"] = text
    if cur["words"]:
        cmds.append(cur)
    return cmds


def _unquote(word):
    """Literal value of a shell word, or None when it expands something at run time."""
    if "$" in word or "`" in word:
        return None
    try:
        parts = shlex.split(word)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 else None


def _is_assignment(word):
    return re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word) is not None


def _shown(words):
    """The first word or two of a command, for a message (short literal words only)."""
    first = os.path.basename(_unquote(words[0]) or words[0])
    if len(words) > 1 and len(words[1]) <= 10 and re.match(r"^[A-Za-z0-9_.:-]+$", words[1]):
        return "%s %s" % (first, words[1])
    return first


def _exec_target(words):
    """Words after ``exec`` and its options when ``words`` is ``[VAR=x ...] exec [-a n] [-cl] CMD ...``."""
    i = 0
    while i < len(words) and _is_assignment(words[i]):
        i += 1
    if i >= len(words) or words[i] != "exec" or "(" in words or ")" in words:
        return None
    i += 1
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        i += 2 if words[i] == "-a" else 1
    if i < len(words) and words[i] == "--":
        i += 1
    return words[i:] or None


def _script_reasons(script):
    """Why ``script`` would hide the engine's exit status (empty: it does not), and the exec'd argv."""
    try:
        cmds = shell_commands(script)
        ops = [t for k, t in shell_tokens(script) if k == "op"]
    except _ShellSyntax as e:
        return ["the script cannot be checked: it has %s" % e], None
    reasons = []
    if "&" in ops:
        reasons.append("'&' runs a command in the background (nohup ... & included): the shell goes on without "
                       "waiting, so the engine is no longer the supervised process")
    if not cmds:
        return reasons + ["the script is empty"], None
    exec_idx = None
    for idx, cmd in enumerate(cmds):
        if _exec_target(cmd["words"]):
            exec_idx = idx
    last = cmds[-1]
    if exec_idx is None:
        first = _unquote(last["words"][0]) or last["words"][0]
        if "(" in last["words"] or ")" in last["words"]:
            reasons.append("the engine runs in a subshell '( ... )', so the shell is the supervised process")
        elif last["before"] in ("|", "|&"):
            reasons.append("the script pipes into '%s' ('|'): a pipeline's exit status is its last command's "
                           "(tee's 0 after the engine crashed), not the engine's" % os.path.basename(first))
        elif last["before"] == "||":
            reasons.append("'|| %s' at the end replaces the engine's failure with that command's status"
                           % _shown(last["words"]))
        else:
            reasons.append("its last command ('%s') does not 'exec' the engine ('exec ENGINE ...'), so the status "
                           "recorded would be that command's or the shell's, not the engine's" % _shown(last["words"]))
        return reasons, None
    ex = cmds[exec_idx]
    if ex["before"] in ("|", "|&") or ex["after"] in ("|", "|&"):
        piped = cmds[exec_idx + 1]["words"][0] if ex["after"] in ("|", "|&") and exec_idx + 1 < len(cmds) else "?"
        reasons.append("the engine's exec is part of a pipeline (into '%s'): a pipeline's exit status is its last "
                       "command's, not the engine's" % os.path.basename(_unquote(piped) or piped))
    elif exec_idx < len(cmds) - 1:
        after = cmds[exec_idx + 1]
        reasons.append("'%s %s' after the engine's exec: commands after the engine replace its exit status; exec "
                       "must be the script's last command" % (ex["after"].strip() or "newline", _shown(after["words"])))
    if ex["before"] == "||":
        reasons.append("'|| exec ...' starts the engine only when the command before it fails; otherwise the "
                       "script ends with success and no engine")
    target = [_unquote(w) for w in _exec_target(ex["words"])]
    name = os.path.basename(target[0]) if target and target[0] else ""
    if name in NOT_AN_ENGINE:
        reasons.append("its last 'exec' runs '%s', not the engine, so the status recorded would be that command's"
                       % name)
    return reasons, (target if all(t is not None for t in target) else None)


def _strip_env(argv):
    """The command ``env [OPTIONS] [NAME=VALUE]... COMMAND...`` runs (``[]`` when it runs none)."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-S", "--split-string") and i + 1 < len(argv):
            return shlex.split(argv[i + 1]) + argv[i + 2:]
        if a.startswith("--split-string="):
            return shlex.split(a.split("=", 1)[1]) + argv[i + 1:]
        if a.startswith("-S") and len(a) > 2:
            return shlex.split(a[2:]) + argv[i + 1:]
        if a in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif a.startswith("-") or _is_assignment(a):
            i += 1
        else:
            break
    return argv[i:]


def _shell_script(argv):
    """``(script text, where)`` run by the shell ``argv``, or ``(None, file)`` for a script file."""
    i = 1
    script_c = False
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("--rcfile", "--init-file"):
            i += 2
            continue
        if a.startswith("--"):
            i += 1
            continue
        if a[:1] in "-+" and len(a) > 1:
            letters = a[1:]
            script_c = script_c or "c" in letters
            i += 1 + sum(1 for ch in letters if ch in "oO")
            continue
        break
    if script_c:
        return (argv[i], "-c") if i < len(argv) else ("", "-c")
    return None, (argv[i] if i < len(argv) else None)


def read_part(path, size, from_end=False):
    """Up to ``size`` bytes from the start (or the end) of the regular file ``path``; None when it is absent,
    unreadable or not a regular file. Opened without blocking, so a FIFO or a device is refused at once (the
    rule of :mod:`_untrusted`, for reads that take only a part of a file that may be large)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if from_end and st.st_size > size:
            os.lseek(fd, st.st_size - size, os.SEEK_SET)
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _shebang_shell(path):
    """Shell argv of a ``#!`` line naming a shell (``/bin/bash -e``, ``/usr/bin/env bash``), else None."""
    head = read_part(path, 256)
    if head is None or not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if line and os.path.basename(line[0]) == "env":
        line = _strip_env(line)
    return line if line and os.path.basename(line[0]) in SHELLS else None


def _read_script(path):
    data = read_part(path, 1 << 20)
    return None if data is None else data.decode("utf-8", "replace")


def _resolve(cmd0, path_env, chdir):
    if "/" in cmd0:
        return os.path.join(chdir or os.getcwd(), cmd0)
    return shutil.which(cmd0, path=path_env)


def command_problems(argv, path_env=None, chdir=None, _depth=0, read_files=True):
    """Reasons why ``argv`` would hide the engine's exit status; empty when the engine is the foreground process.

    * ``env [NAME=VALUE]... CMD`` and prefix commands that exec or wait for their command (``nohup``, ``nice``,
      ``numactl``…) are looked through; ``env`` without a command (it prints the environment) is refused.
    * ``setsid`` without ``--wait`` is refused: the engine is started as a process-group leader, so setsid forks
      and exits 0 at once.
    * A shell (``bash -c SCRIPT``, ``sh script.sh``, or a file whose ``#!`` names a shell) must end its script
      with ``exec ENGINE ...``; a pipeline into the engine's output (``| tee``), a background job (``&``,
      ``nohup ... &``) or any command after the engine (``; true``, ``|| true``, ``; exit 0``) is refused.

    ``read_files=False`` is for a command that runs elsewhere (a container image): script files and ``#!`` lines
    are not read from this host; a shell running a script file is refused because it cannot be checked.
    """
    if _depth > 8 or not argv:
        return [] if argv else ["the command is empty"]
    base = os.path.basename(argv[0])
    if base == "env":
        rest = _strip_env(list(argv))
        if not rest:
            return ["'env' without a command prints the whole environment (secrets included) into the log and "
                    "starts no engine"]
        return command_problems(rest, path_env, chdir, _depth + 1, read_files)
    if base == "setsid":
        i = 1
        wait = False
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
            wait = wait or argv[i] == "--wait" or (not argv[i].startswith("--") and "w" in argv[i])
            i += 1
        if not wait:
            return ["'setsid' without --wait forks the engine away and exits 0 at once (engine_process already "
                    "gives the engine its own session; drop setsid)"]
        return command_problems(argv[i + (i < len(argv) and argv[i] == "--"):], path_env, chdir, _depth + 1, read_files)
    if base in PREFIXES:
        for i in range(1, len(argv)):
            if os.path.basename(argv[i]) in SHELLS | {"env", "setsid"}:
                return command_problems(argv[i:], path_env, chdir, _depth + 1, read_files)
        return []
    if base in SHELLS:
        script, where = _shell_script(list(argv))
        if script is None:
            if where is None:
                return ["the shell reads its script from standard input, which is empty for the engine"]
            if not read_files:
                return ["the shell runs the script file %s, which cannot be checked from here; put the script in "
                        "the command ('-c') with 'exec' before the engine, or run the engine directly" % where]
            target = _resolve(where, path_env, chdir) if "/" in where else os.path.join(chdir or os.getcwd(), where)
            script = _read_script(target) if target else None
            if script is None:
                return ["the shell runs the script file %s, which cannot be read to check it" % where]
    else:
        target = _resolve(argv[0], path_env, chdir) if read_files else None
        shell = _shebang_shell(target) if target else None
        if not shell:
            return []
        script = _read_script(target)
        if script is None:
            return []
    reasons, exec_argv = _script_reasons(script)
    if not reasons and exec_argv:
        reasons = command_problems(exec_argv, path_env, chdir, _depth + 1, read_files)
    return reasons


def check_command(argv, path_env=None, chdir=None, field="command"):
    """Raise :class:`ProcessError` naming ``field`` when ``argv`` would hide the engine's exit status."""
    if not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise ProcessError("%s: must be a non-empty list of strings (the engine's argv, no shell)" % field,
                           reason="bad_command")
    reasons = command_problems(list(argv), path_env, chdir)
    if reasons:
        raise ProcessError(
            "%s: the engine would not be the foreground process, so its crash would be recorded as the wrapper's "
            "status: %s. %s."
            % (field, "; ".join(reasons), _FIX), reason="masked_exit_status")


# --------------------------------------------------------------------------------------------- #
# Identity, lock, /proc
# --------------------------------------------------------------------------------------------- #


def spec_hash(command, env, chdir):
    """Stable hash of what is started; env values are hashed, never stored in clear."""
    payload = json.dumps({"command": list(command), "env": sorted((env or {}).items()), "chdir": chdir or ""},
                         sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def identity_key(run_dir, name):
    """The key of one engine: the same for every spelling of ``run_dir``, before and after it is deleted."""
    real = os.path.realpath(run_dir)
    return hashlib.sha256(("%s\0%s" % (real, name)).encode("utf-8", "surrogateescape")).hexdigest()[:24]


def paths(run_dir, name):
    base = os.path.join(run_dir, name)
    return {
        "dir": base,
        "supervisor": os.path.join(base, "supervisor.py"),
        "spec": os.path.join(base, "spec.json"),
        "state": os.path.join(base, "state.json"),
        "log": os.path.join(base, "%s.log" % name),
    }


class NameLock(object):
    """Exclusive lock for one ``(run_dir, name)``, held across check-and-spawn (or stop).

    An abstract Unix socket bound to the identity key: nothing on disk can be deleted to break it, and the
    kernel releases it when the holder exits or is killed. Waits up to ``timeout`` seconds.
    """

    def __init__(self, run_dir, name, timeout=120.0):
        self.key = identity_key(run_dir, name)
        self.name = name
        self.timeout = timeout
        self.sock = None

    def __enter__(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock.bind("\0llmops.serving/engine_process/" + self.key)
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    sock.close()
                    raise
                if time.monotonic() > deadline:
                    sock.close()
                    raise ProcessError(
                        "%s: another engine_process run for this name has been starting or stopping it for over "
                        "%d s; let it finish (or stop that run) and run again" % (self.name, self.timeout),
                        reason="locked")
                time.sleep(0.05)
        self.sock = sock
        return self

    def __exit__(self, *exc):
        self.sock.close()
        self.sock = None
        return False


def _proc_stat(pid, proc_root="/proc"):
    """``{state, ppid, pgrp, session, start}`` of a live process, or None."""
    try:
        with open("%s/%d/stat" % (proc_root, int(pid))) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return {"state": rest[0], "ppid": int(rest[1]), "pgrp": int(rest[2]), "session": int(rest[3]),
                "start": int(rest[19])}
    except (OSError, IndexError, ValueError, TypeError):
        return None


def _proc_environ(pid, proc_root="/proc"):
    """The two marker variables of ``pid`` (``{}`` when unreadable or absent)."""
    try:
        with open("%s/%d/environ" % (proc_root, pid), "rb") as f:
            data = f.read()
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        for var in (MARKER_ENV, SPEC_ENV):
            if item.startswith(var.encode() + b"="):
                out[var] = item[len(var) + 1:].decode("ascii", "replace")
    return out


def _proc_cmdline(pid, proc_root="/proc"):
    try:
        with open("%s/%d/cmdline" % (proc_root, pid), "rb") as f:
            return f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def _live(pid, start=None, proc_root="/proc"):
    """``pid`` runs (not a zombie) and, when ``start`` is known, is the same process that was recorded."""
    if not pid:
        return False
    st = _proc_stat(pid, proc_root)
    if st is None:
        if not os.path.isdir(proc_root):  # no /proc: existence only
            return pid_alive(pid)
        return False
    if st["state"] in ("Z", "X"):
        return False
    return start is None or st["start"] == start


def _started_at(start_ticks, proc_root="/proc"):
    try:
        with open("%s/stat" % proc_root) as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + start_ticks / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, StopIteration, ValueError):
        return None


def _mount_ns(pid, proc_root="/proc"):
    try:
        return os.readlink("%s/%d/ns/mnt" % (proc_root, pid))
    except OSError:
        return None


def _same_ns(my_ns, pid, proc_root="/proc"):
    """Same mount namespace as this run (a container with the same run_dir path holds another engine)."""
    other = _mount_ns(pid, proc_root)
    return my_ns is None or other is None or other == my_ns


def scan(key, proc_root="/proc"):
    """Processes of the engine ``key`` found in ``/proc``: supervisor, engine (session leader), its group."""
    found = {"supervisor": None, "supervisor_start": None, "engine": None, "engine_start": None, "group": [],
             "spec_hash": None}
    marked = []
    try:
        pids = [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return found
    me = os.getpid()
    my_ns = _mount_ns(me, proc_root)
    for pid in pids:
        if pid == me:
            continue
        st = _proc_stat(pid, proc_root)
        if st is None or st["state"] in ("Z", "X"):
            continue
        cmd = _proc_cmdline(pid, proc_root)
        if SUPERVISOR_FLAG + key in cmd:
            if _same_ns(my_ns, pid, proc_root):
                found.update(supervisor=pid, supervisor_start=st["start"])
            continue
        env = _proc_environ(pid, proc_root)
        if env.get(MARKER_ENV) == key and _same_ns(my_ns, pid, proc_root):
            marked.append((pid, st, env))
    leaders = [m for m in marked if m[0] == m[1]["session"] == m[1]["pgrp"]]
    if leaders:
        pid, st, env = min(leaders, key=lambda m: m[1]["start"])
        found.update(engine=pid, engine_start=st["start"])
        found["spec_hash"] = env.get(SPEC_ENV)
        pgrp = pid
    elif marked:
        pgrp = marked[0][1]["pgrp"]  # the leader is gone, its workers are not
        found["spec_hash"] = marked[0][2].get(SPEC_ENV)
    else:
        return found
    found["pgrp"] = pgrp
    found["group"] = sorted(m[0] for m in marked if m[1]["pgrp"] == pgrp)
    return found


def group_members(pgrp, proc_root="/proc", read_stat=None, leader=False):
    """``(pid, stat)`` of the processes of group ``pgrp`` under ``proc_root``, in ``/proc`` order; with ``leader``,
    process ``pgrp`` too when it has left its group. ``read_stat(pid, proc_root)`` parses ``/proc/<pid>/stat``
    into a dict with ``pgrp`` (:func:`_proc_stat` by default); an unreadable ``proc_root`` has no members."""
    read_stat = read_stat or _proc_stat
    try:
        pids = [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return []
    out = []
    for pid in pids:
        st = read_stat(pid, proc_root)
        if st and (st["pgrp"] == pgrp or (leader and pid == pgrp)):
            out.append((pid, st))
    return out


def _group_alive(pgrp, proc_root="/proc"):
    """Live (non-zombie) members of process group ``pgrp``."""
    return [pid for pid, st in group_members(pgrp, proc_root) if st["state"] not in ("Z", "X")]


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except OSError as e:
        return e.errno == errno.EPERM
    # A zombie is not alive.
    try:
        with open("/proc/%d/stat" % int(pid)) as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


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


def _runs_spec(pid, spec_path, proc_root="/proc"):
    """Process ``pid`` runs the command recorded in ``spec_path`` (masked credentials match any text)."""
    try:
        spec = load_json(spec_path, "spec file", max_bytes=STATE_MAX_BYTES)
    except (OSError, UntrustedInput):
        return False
    command = spec.get("command") if isinstance(spec, dict) else None
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        return False
    argv = _proc_cmdline(pid, proc_root)
    if argv and argv[-1] == "":
        argv = argv[:-1]
    if len(argv) != len(command):
        return False
    for want, got in zip(command, argv):
        pattern = ".*".join(re.escape(part) for part in want.split("********"))
        if not re.fullmatch(pattern, got, re.S):
            return False
    return True


def read_state(run_dir, name):
    """Current state: ``absent`` | ``running`` | ``exited`` (with returncode/signal) | ``lost``."""
    return locate(run_dir, name)


def read_state_file(path):
    """State from the state file alone (no /proc scan): what :mod:`engine_probe` polls."""
    st = read_state_doc(path)[0]
    if not st.get("state"):
        return {"state": "absent"}
    if st.get("state") == "running":
        if _live(st.get("pid"), st.get("pid_start")):
            return st
        if _live(st.get("supervisor_pid"), st.get("supervisor_start")):
            return st  # child just exited; the supervisor is about to record it
        st = dict(st, state="lost", returncode=None)
    return st


def locate(run_dir, name, proc_root="/proc"):
    """State of the engine ``name``, from ``state.json`` when it shows a live engine, else from ``/proc``.

    A running engine is found even when its run directory was deleted or its supervisor was killed;
    ``supervisor_lost: true`` says that nothing will record its exit status any more.
    """
    p = paths(run_dir, name)
    key = identity_key(run_dir, name)
    st, problem = read_state_doc(p["state"])
    if problem:
        st["state_file_error"] = problem
    eng = False
    if st.get("state") == "running":
        # an engine the file names without a marker in its environment (started before markers existed) is taken
        # only with its recorded start time, and only as its own session leader (as the supervisor starts it)
        # and running the command spec.json records
        known = (st.get("pid") or 0) > 1 and st.get("pid_start") is not None
        leader = _proc_stat(st["pid"], proc_root) if known else None
        eng = (bool(leader and leader["session"] == st["pid"]) and _live(st["pid"], st["pid_start"], proc_root)
               and _runs_spec(st["pid"], p["spec"], proc_root))
        # the supervisor named by the file is taken only when it carries this engine's identity on its command line
        sup = _live(st.get("supervisor_pid"), st.get("supervisor_start"), proc_root)
        if sup and SUPERVISOR_FLAG + key in _proc_cmdline(st["supervisor_pid"], proc_root):
            return dict(st, supervisor_lost=False, recovered=False)
        if sup:
            problem = ("state file: %s names supervisor pid %d, a process that does not carry this engine's "
                       "identity; it was not signalled" % (p["state"], st["supervisor_pid"]))
            st = {k: v for k, v in st.items() if k not in ("supervisor_pid", "supervisor_start")}
            st["state_file_error"] = problem
    elif not st.get("state"):
        st = {"state_file_error": problem} if problem else {}
    found = scan(key, proc_root)
    if found["engine"] or found["group"] or found["supervisor"]:
        out = dict(st) if st.get("state") == "running" else {"state": "running", "returncode": None,
                                                             "signal": None}
        if problem:
            out["state_file_error"] = problem
        out["state"] = "running"
        out["recovered"] = st.get("state") != "running"
        if found["engine"]:
            if out.get("pid") != found["engine"]:
                out.update(pid=found["engine"], pid_start=found["engine_start"],
                           started_at=_started_at(found["engine_start"], proc_root))
        elif found["group"]:
            out.update(pid=found["pgrp"], pid_start=None, leader_exited=True)
        if found["supervisor"]:
            out.update(supervisor_pid=found["supervisor"], supervisor_start=found["supervisor_start"],
                       supervisor_lost=False)
        else:
            out["supervisor_lost"] = True
        if found["spec_hash"]:
            out["spec_hash"] = found["spec_hash"]
        out["group"] = found["group"]
        return out
    if st.get("state") == "running" and eng:  # started before identities were recorded in the environment
        return dict(st, supervisor_lost=True)
    again = read_state_doc(p["state"])[0]
    if again.get("state") in ("exited", "lost") and again != {k: v for k, v in st.items() if k != "state_file_error"}:
        # the supervisor recorded the end while /proc was read
        return again
    if st.get("state") == "running":
        return dict(st, state="lost", returncode=None)
    if not st.get("state"):
        return dict(st, state="absent")
    return st


def log_tail(path, lines=40):
    data = read_part(path, 64 * 1024, from_end=True)
    return [] if data is None else data.decode("utf-8", "replace").splitlines()[-lines:]


def _write_private(path, data):
    _fsutil.atomic_write_json(path, data, mode=0o600, sort_keys=True)


# --------------------------------------------------------------------------------------------- #
# Start / stop (callers hold NameLock)
# --------------------------------------------------------------------------------------------- #


def start(run_dir, name, command, env=None, chdir=None, stop_timeout=60, startup_grace=2.0, python=None):
    """Start under a supervisor; fail with the exit status if the command dies within ``startup_grace``.

    ``env`` reaches the engine through the supervisor's environment only, never through a file.
    """
    check_name(name)
    p = paths(run_dir, name)
    os.makedirs(p["dir"], exist_ok=True)
    merged = dict(env or {})
    h = spec_hash(command, merged, chdir)
    key = identity_key(run_dir, name)
    spec = {"command": redact(command, command_secrets(command)[0]), "env_names": sorted(merged), "chdir": chdir,
            "stop_timeout": stop_timeout, "spec_hash": h, "name": name, "key": key}
    with open(p["supervisor"], "w") as f:
        f.write(SUPERVISOR_SOURCE)
    _write_private(p["spec"], spec)
    try:
        os.unlink(p["state"])
    except FileNotFoundError:
        pass
    proc_env = dict(os.environ)
    proc_env.update(merged)
    proc_env[MARKER_ENV] = key
    proc_env[SPEC_ENV] = h
    sup = subprocess.Popen([python or sys.executable, p["supervisor"], SUPERVISOR_FLAG + key, p["state"], p["log"],
                            p["spec"]], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, close_fds=True, env=proc_env)
    try:
        sup.stdin.write(json.dumps({"command": list(command)}).encode("utf-8"))
        sup.stdin.close()
    except OSError:
        pass
    deadline = time.monotonic() + max(startup_grace, 0.5) + 10
    st = {"state": "absent"}
    while time.monotonic() < deadline:  # wait for the supervisor to record the child
        st = read_state_file(p["state"])
        if st["state"] != "absent":
            break
        time.sleep(0.05)
    if st["state"] == "absent":
        raise ProcessError("%s: the supervisor did not start (see %s)" % (name, p["log"]), log_file=p["log"])
    end = time.monotonic() + startup_grace
    while time.monotonic() < end and st["state"] == "running":
        time.sleep(0.2)
        st = read_state_file(p["state"])
    if st["state"] == "running" and not _live(st.get("pid"), st.get("pid_start")):
        # child died; give the supervisor a moment to record the status
        for dummy in range(50):
            time.sleep(0.1)
            st = read_state_file(p["state"])
            if st["state"] != "running":
                break
    if st["state"] != "running":
        raise ProcessError(
            "%s exited during start-up with %s (log: %s)" % (name, describe_exit(st), p["log"]),
            returncode=st.get("returncode"), signal=st.get("signal"), log_file=p["log"], log_tail=log_tail(p["log"]))
    return dict(st, supervisor_lost=False, recovered=False)


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


def _signal_group(pgrp, sig):
    try:
        os.killpg(pgrp, sig)
    except (ProcessLookupError, PermissionError):
        pass


class PythonFailed(Exception):
    """:func:`python_json`'s interpreter exited non-zero; ``stderr`` is its error output."""

    def __init__(self, python, returncode, stderr):
        super(PythonFailed, self).__init__("%s exited %d" % (python, returncode))
        self.python = python
        self.returncode = returncode
        self.stderr = (stderr or "").strip()


def python_json(python, code, args=(), stdin=None, timeout=120, run=subprocess.run):
    """Run ``python -c code *args`` (``stdin``: text fed to it) and return the JSON its last stdout line holds.

    How the collection asks an engine's interpreter what it has installed without importing it here.
    Raises OSError when the interpreter cannot be started, :class:`PythonFailed` when it exits non-zero,
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds, ValueError when the last line is not JSON.
    """
    proc = run([python, "-c", code] + list(args), input=stdin, capture_output=True, text=True, check=False,
               timeout=timeout)
    if proc.returncode != 0:
        raise PythonFailed(python, proc.returncode, proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ValueError("%s printed nothing" % python)
    return loads_json(lines[-1], "the output of %s" % python)


def stop_group(pgrp, timeout, proc_root="/proc", poll=0.05):
    """End process group ``pgrp``: SIGTERM, then SIGKILL to what is left after ``timeout`` seconds; returns once
    no live member remains (or 10 s after SIGKILL). Returns the last signal sent, None when none was alive."""
    if not _group_alive(pgrp, proc_root):
        return None
    sent = signal.SIGTERM
    _signal_group(pgrp, signal.SIGTERM)
    end = time.monotonic() + timeout
    while _group_alive(pgrp, proc_root):
        if time.monotonic() > end:
            if sent == signal.SIGKILL:
                break
            sent = signal.SIGKILL
            _signal_group(pgrp, signal.SIGKILL)
            end = time.monotonic() + 10
        time.sleep(poll)
    return sent


class Child(object):
    """A command run to completion or until stopped (a warm-up, not a supervised engine).

    It runs in its own session, so its process group id is its pid and :meth:`stop` ends it together with
    every worker it started; stdout and stderr are appended to ``log_path``. Raises OSError when the
    command cannot be started.
    """

    def __init__(self, argv, log_path, env=None, cwd=None):
        self._log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(list(argv), env=env, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                         stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            self._log.close()
            raise
        self.pid = self.proc.pid

    @property
    def returncode(self):
        return self.proc.poll()

    def wait(self, timeout=None):
        """The exit status, or None when it still runs after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace=30):
        """SIGTERM to the whole process group, SIGKILL after ``grace`` seconds; reaps the command."""
        try:
            stop_group(self.pid, grace)
            self.wait(10)
        finally:
            self._log.close()


def _stop_orphan(run_dir, name, st, timeout, proc_root="/proc"):
    """Stop an engine whose supervisor is gone: SIGTERM to its process group, SIGKILL after ``timeout``."""
    if not st.get("pid"):
        return dict(st, state="lost", returncode=None)
    pgrp = int(st["pid"])
    if not _group_alive(pgrp, proc_root):
        return dict(st, state="lost", returncode=None)
    stop_requested = time.time()
    sent = stop_group(pgrp, timeout, proc_root) or signal.SIGTERM
    final = {k: v for k, v in st.items() if k not in ("group", "recovered")}
    final.update(state="exited", returncode=None, signal=None, ended_at=time.time(), stop_requested=True,
                 stop_requested_at=stop_requested, stop_signal=int(sent), supervisor_lost=True)
    p = paths(run_dir, name)
    try:
        os.makedirs(p["dir"], exist_ok=True)
        _write_private(p["state"], final)
    except OSError:
        pass
    return final


def stop(run_dir, name, timeout=60, proc_root="/proc"):
    """Stop the engine and return ``(final state, changed)``.

    With a live supervisor: SIGTERM to it (it sends SIGTERM to the engine's process group, SIGKILL after
    ``timeout``). Without one (killed): the same two steps, sent to the engine's process group from here.
    """
    st = locate(run_dir, name, proc_root)
    if st["state"] != "running":
        return st, False
    if not st.get("supervisor_lost"):
        try:
            os.kill(int(st["supervisor_pid"]), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        end = time.monotonic() + timeout + 15
        while time.monotonic() < end:
            cur = locate(run_dir, name, proc_root)
            if cur["state"] != "running":
                return cur, True
            if cur.get("supervisor_lost"):
                st = cur
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(int(st["supervisor_pid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, TypeError, KeyError):
                pass
            return _stop_orphan(run_dir, name, dict(st, supervisor_lost=True), 0, proc_root), True
    return _stop_orphan(run_dir, name, st, timeout, proc_root), True
