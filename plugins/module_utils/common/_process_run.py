# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: processes the collection starts or watches, below any concern.

* :func:`proc_stat` / :func:`proc_cmdline` / :func:`live` / :func:`pid_alive` - one process read from ``/proc``
  (a zombie is not alive; a recorded start time tells a reused pid apart).
* :func:`group_members` / :func:`stop_group` - a process group: its members, SIGTERM then SIGKILL to all of them.
* :class:`Child` - a command run to completion or until stopped in its own session (a warm-up, not a supervised
  engine).
* :func:`python_json` - ask an interpreter a question and read the JSON it prints (an engine's Python, without
  importing the engine here).
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import time

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import loads_json


def proc_stat(pid, proc_root="/proc"):
    """``{state, ppid, pgrp, session, start}`` of a live process, or None."""
    try:
        with open("%s/%d/stat" % (proc_root, int(pid))) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return {"state": rest[0], "ppid": int(rest[1]), "pgrp": int(rest[2]), "session": int(rest[3]),
                "start": int(rest[19])}
    except (OSError, IndexError, ValueError, TypeError):
        return None


def proc_cmdline(pid, proc_root="/proc"):
    try:
        with open("%s/%d/cmdline" % (proc_root, pid), "rb") as f:
            return f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def live(pid, start=None, proc_root="/proc"):
    """``pid`` runs (not a zombie) and, when ``start`` is known, is the same process that was recorded."""
    if not pid:
        return False
    st = proc_stat(pid, proc_root)
    if st is None:
        if not os.path.isdir(proc_root):  # no /proc: existence only
            return pid_alive(pid)
        return False
    if st["state"] in ("Z", "X"):
        return False
    return start is None or st["start"] == start


def group_members(pgrp, proc_root="/proc", read_stat=None, leader=False):
    """``(pid, stat)`` of the processes of group ``pgrp`` under ``proc_root``, in ``/proc`` order; with ``leader``,
    process ``pgrp`` too when it has left its group. ``read_stat(pid, proc_root)`` parses ``/proc/<pid>/stat``
    into a dict with ``pgrp`` (:func:`proc_stat` by default); an unreadable ``proc_root`` has no members."""
    read_stat = read_stat or proc_stat
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


def group_alive(pgrp, proc_root="/proc"):
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
    if not group_alive(pgrp, proc_root):
        return None
    sent = signal.SIGTERM
    _signal_group(pgrp, signal.SIGTERM)
    end = time.monotonic() + timeout
    while group_alive(pgrp, proc_root):
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
