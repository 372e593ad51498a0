# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: processes the collection starts or watches, below any concern.

* :func:`proc_stat` / :func:`proc_cmdline` / :func:`live` / :func:`pid_alive` - one process read from ``/proc``
  (a zombie is not alive; a recorded start time tells a reused pid apart).
* :func:`group_members` / :func:`stop_group` - a process group: its members, SIGTERM then SIGKILL to all of them.
* :class:`Child` - a command run to completion or until stopped in its own session (a warm-up, a load client; not
  a supervised engine).
* :func:`run` - a short command waited for (``subprocess.run``'s arguments and result), bounded by its timeout.
* :func:`python_json` - ask an interpreter a question and read the JSON it prints (an engine's Python, without
  importing the engine here).
* :func:`scratch_dir` - a temporary directory (a ``.partial-*`` build) removed unless renamed away.

The one way a module starts a child (``tests/unit/test_process_layout.py`` fails on any other): every :class:`Child`
and :func:`run` command is registered while it may live, and so is every :func:`scratch_dir`. The first of them
installs :func:`install`'s handler for SIGTERM, SIGHUP and SIGINT in the module's process: on one of those
signals it stops every registered child (a :class:`Child`'s whole process group: SIGTERM, its grace period, then
SIGKILL; a :func:`run` command likewise), removes every registered scratch directory and then does what the
signal did before (a Python handler installed earlier is called; the default action, and Python's
KeyboardInterrupt for SIGINT, end the module with status 128 + signal number, through ``SystemExit`` so that locks
are released and files closed on the way out). A signal that was ignored (``nohup``) stays ignored. Starting a
child and registering it happen with the handler deferred, so a signal that arrives in between still finds the
child. A forked copy of the process (``os.fork`` without exec) forgets what its parent registered. SIGKILL cannot
be handled: what a killed module leaves is for its owner's own checks (kernel_cache's ``gc`` removes an abandoned
``.partial-*`` once ``partial_max_age`` old).
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import tempfile
import threading
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


def python_json(python, code, args=(), stdin=None, timeout=120, run=None):
    """Run ``python -c code *args`` (``stdin``: text fed to it) and return the JSON its last stdout line holds.

    How the collection asks an engine's interpreter what it has installed without importing it here.
    Raises OSError when the interpreter cannot be started, :class:`PythonFailed` when it exits non-zero,
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds, ValueError when the last line is not JSON.
    """
    run = run or globals()["run"]
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


# ---- the children of this process, stopped when it is signalled ----------------------------------------

#: The signals after which a module stops its children and removes its scratch directories: a stop request
#: (SIGTERM), a lost connection or terminal (SIGHUP), an interrupt (SIGINT).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
#: Seconds a :func:`run` command gets between SIGTERM and SIGKILL when the module is signalled.
RUN_GRACE = 5.0


class _Registry(object):
    """What this process started and must end when it is signalled (one per process: :data:`_REG`)."""

    def __init__(self):
        self.owner = None  # the pid that installed the handler; a forked copy is not it
        self.previous = {}  # signal -> the handler before ours
        self.children = {}  # id -> (Popen of a command in its own session, grace seconds)
        self.paths = {}  # id -> a scratch directory
        self.deferred = 0  # > 0 while a child or a directory is being created and registered
        self.pending = None  # the signal that arrived meanwhile
        self.stopping = False

    def forget(self):
        """In a forked copy of the process: what the parent started is the parent's to end."""
        self.children, self.paths, self.pending, self.stopping, self.deferred = {}, {}, None, False, 0


_REG = _Registry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REG.forget)


def install():
    """Install the stop handler for :data:`STOP_SIGNALS` in this process, once; True when it is installed.

    Only the main thread can install a handler (Python's rule): from another thread this returns False and the
    children it registers are stopped only when the main thread installed the handler. A signal that is ignored
    (``SIG_IGN``, as ``nohup`` leaves SIGHUP) is left ignored."""
    if _REG.owner == os.getpid():
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = {}
    for sig in STOP_SIGNALS:
        before = signal.getsignal(sig)
        if before is signal.SIG_IGN:
            continue
        previous[sig] = before
        signal.signal(sig, _on_signal)
    _REG.previous, _REG.owner = previous, os.getpid()
    return True


@contextlib.contextmanager
def _deferred():
    """Run the body with the stop handler deferred (a child between its start and its registration); a signal
    that arrived meanwhile is handled on the way out."""
    _REG.deferred += 1
    try:
        yield
    finally:
        _REG.deferred -= 1
        if not _REG.deferred and _REG.pending is not None:
            signum, _REG.pending = _REG.pending, None
            _on_signal(signum, None)


def _entry_alive(proc):
    """A member of the registered command's process group still runs (read in ``/proc``: ``Popen.poll`` answers
    None in a handler that interrupted ``Popen.wait``, which holds the lock ``poll`` needs)."""
    return bool(group_alive(proc.pid)) or (proc.returncode is None and live(proc.pid))


def _signal_entry(proc, sig):
    if proc.returncode is None or group_alive(proc.pid):  # a reaped leader's pid is reused only once its group is gone
        _signal_group(proc.pid, sig)


def stop_registered(poll=0.05):
    """Stop every registered child (SIGTERM, its grace period, SIGKILL; all of them at once) and remove every
    registered scratch directory. What the stop handler does; returns the number of children that were alive."""
    entries = list(_REG.children.items())
    running = [(proc, grace) for dummy, (proc, grace) in entries if _entry_alive(proc)]
    for proc, dummy in running:
        _signal_entry(proc, signal.SIGTERM)
    end = time.monotonic() + max([grace for dummy, grace in running] or [0])
    waiting = [proc for proc, dummy in running]
    killed = False
    while waiting:
        waiting = [proc for proc in waiting if _entry_alive(proc)]
        if not waiting:
            break
        if time.monotonic() > end:
            if killed:
                break
            killed = True
            for proc in waiting:
                _signal_entry(proc, signal.SIGKILL)
            end = time.monotonic() + 10
        time.sleep(poll)
    for key, dummy in entries:
        _REG.children.pop(key, None)
    for key, path in list(_REG.paths.items()):
        shutil.rmtree(path, ignore_errors=True)
        _REG.paths.pop(key, None)
    return len(running)


def _on_signal(signum, frame):
    """The stop handler: stop what is registered, then what the signal did before."""
    if _REG.owner != os.getpid():  # a forked copy of the module: the children are the parent's
        return _chain(signum, frame)
    if _REG.deferred:
        _REG.pending = signum
        return None
    if _REG.stopping:  # a second signal while stopping: no more grace
        for proc, dummy in list(_REG.children.values()):
            _signal_entry(proc, signal.SIGKILL)
        return None
    _REG.stopping = True
    try:
        stop_registered()
    finally:
        _REG.stopping = False
    return _chain(signum, frame)


def _chain(signum, frame):
    before = _REG.previous.get(signum, signal.SIG_DFL)
    if callable(before) and before is not signal.default_int_handler:
        return before(signum, frame)
    # the default action (ending the process), as an exit that still releases locks and closes files on the way
    raise SystemExit(128 + signum)


class Child(object):
    """A command run to completion or until stopped (a warm-up, a load client; not a supervised engine).

    It runs in its own session, so its process group id is its pid and :meth:`stop` ends it together with
    every worker it started; stdout and stderr are appended to ``log_path``. It is registered (module
    docstring) until it is stopped or has ended with its whole group, so a signalled module stops it with
    ``grace`` seconds between SIGTERM and SIGKILL. Raises OSError when the command cannot be started.
    """

    def __init__(self, argv, log_path, env=None, cwd=None, grace=30):
        install()
        self.grace = grace
        self._log = open(log_path, "ab")
        try:
            with _deferred():
                self.proc = subprocess.Popen(list(argv), env=env, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                             stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
                _REG.children[id(self)] = (self.proc, grace)
        except BaseException:
            self._log.close()
            raise
        self.pid = self.proc.pid

    def _settle(self):
        """Unregister once the command and every member of its group have ended (its pid may then be reused)."""
        if id(self) in _REG.children and self.proc.poll() is not None and not group_alive(self.pid):
            _REG.children.pop(id(self), None)
            self._log.close()

    @property
    def returncode(self):
        rc = self.proc.poll()
        if rc is not None:
            self._settle()
        return rc

    def wait(self, timeout=None):
        """The exit status, or None when it still runs after ``timeout`` seconds."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._settle()
        return rc

    def stop(self, grace=None):
        """SIGTERM to the whole process group, SIGKILL after ``grace`` seconds (default: the one it was started
        with); reaps the command."""
        try:
            stop_group(self.pid, self.grace if grace is None else grace)
            self.wait(10)
        finally:
            _REG.children.pop(id(self), None)
            self._log.close()


def run(args, timeout, input=None, capture_output=False, check=False, **popen_args):  # pylint: disable=redefined-builtin
    """``subprocess.run`` for a short command this module waits for (an interpreter's answer, a tool's banner).

    The same arguments and result (``CompletedProcess``; ``TimeoutExpired`` after ``timeout`` seconds;
    ``CalledProcessError`` with ``check``), but ``timeout`` is required, the command runs in its own session
    like a :class:`Child`, and on a timeout or any error its whole process group is killed (``subprocess.run``
    kills only the command, not what it started). It is registered while it runs: a signalled module ends it
    (SIGTERM, :data:`RUN_GRACE`, SIGKILL)."""
    install()
    if capture_output:
        popen_args["stdout"] = popen_args["stderr"] = subprocess.PIPE
    if input is not None:
        popen_args["stdin"] = subprocess.PIPE
    popen_args["start_new_session"] = True
    with _deferred():
        proc = subprocess.Popen(args, **popen_args)
        _REG.children[id(proc)] = (proc, RUN_GRACE)
    try:
        with proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                _signal_group(proc.pid, signal.SIGKILL)
                e.output, e.stderr = proc.communicate()
                raise
            except BaseException:
                _signal_group(proc.pid, signal.SIGKILL)
                raise
    finally:
        _REG.children.pop(id(proc), None)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


@contextlib.contextmanager
def scratch_dir(prefix, parent):
    """A new directory ``<parent>/<prefix>XXXXXXXX`` (``tempfile.mkdtemp``), yielded by path and removed with
    everything in it when the block ends, unless the block renamed it away (a build published into place). It is
    registered meanwhile, so a signalled module removes it too."""
    install()
    with _deferred():
        path = tempfile.mkdtemp(prefix=prefix, dir=parent)
        _REG.paths[id(path)] = path
    try:
        yield path
    finally:
        _REG.paths.pop(id(path), None)
        shutil.rmtree(path, ignore_errors=True)
