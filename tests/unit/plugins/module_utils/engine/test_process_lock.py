"""engine_process's lock per name cannot be taken first by another local user, and is never held by the engine.

The lock was an abstract Unix socket bound to a name any user could compute (a hash of run_dir and name): uid
65534 could bind it first and keep root from starting or stopping the engine. It is now an ``flock`` on
``<run_dir>/<name>/lock`` (mode 0600, in a directory of mode 0700): another user cannot open it, and what another
user could have planted (the directory, the file, a run_dir they own or may write) is refused at once with
``reason=not_owned``, never waited on. The tests that need a second user run a real process as uid 65534 (root
only); the others run as any user.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process, _process_state
from ansible_collections.llmops.serving.plugins.modules import engine_process
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import engines

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
# a Python another user can run (the test's own interpreter may live under a directory only root can enter)
OTHER_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def sleeper(tok):
    return [sys.executable, "-c", "import time; time.sleep(60)", tok]


@pytest.fixture(name="shared")
def shared_dir():
    """A directory every user can reach (pytest's tmp_path is only root's), like /var/tmp."""
    path = tempfile.mkdtemp(prefix="llmops-lock-test-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_other_user(code, *args):
    """Run ``code`` as uid 65534 until it prints a line; returns (process, that line)."""
    proc = subprocess.Popen([OTHER_PYTHON, "-c", code] + list(args), user=NOBODY, group=NOBODY,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    return proc, proc.stdout.readline().strip()


def _stop(proc):
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_a_squatted_abstract_socket_name_no_longer_blocks_the_lock(tmp_path):
    """The old lock's name is computable: any user could bind it first. Bound here, it changes nothing."""
    run_dir = str(tmp_path / "run")
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind("\0llmops.serving/engine_process/" + _process.identity_key(run_dir, "eng"))
    try:
        t0 = time.monotonic()
        with _process.NameLock(run_dir, "eng", timeout=2) as lock:
            assert lock.check()
        assert time.monotonic() - t0 < 1.5
    finally:
        squatter.close()


@ROOT_ONLY
def test_another_user_can_take_neither_the_old_lock_nor_the_new_one_and_stop_still_works(run_module, shared, token):
    run_dir = os.path.join(shared, "run")
    args = {"name": "eng", "run_dir": run_dir, "command": sleeper(token), "startup_grace": 0.5, "stop_timeout": 5}
    started = run_module(engine_process, args)
    assert started["changed"] and started["state"] == "running", started
    lock = _process_state.paths(run_dir, "eng")["lock"]
    assert oct(os.stat(lock).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(lock)).st_mode & 0o777) == "0o700"
    # uid 65534 binds the old lock's name and tries to open and flock the new lock file
    attacker, said = as_other_user(
        "import fcntl, socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind('\\0' + sys.argv[1])\n"
        "try:\n"
        "    f = open(sys.argv[2], 'rb')\n"
        "    fcntl.flock(f, fcntl.LOCK_EX)\n"
        "    print('holding', flush=True)\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, flush=True)\n"
        "time.sleep(60)\n",
        "llmops.serving/engine_process/" + _process.identity_key(run_dir, "eng"), lock)
    try:
        assert said == "PermissionError"
        t0 = time.monotonic()
        stopped = run_module(engine_process, dict(args, state="stopped"))
        assert not stopped.get("failed"), stopped
        assert stopped["changed"] and stopped["state"] == "exited"
        assert time.monotonic() - t0 < 15  # not the lock's timeout (stop_timeout + startup_grace + 60 s)
        assert engines(token) == []
    finally:
        _stop(attacker)


@ROOT_ONLY
def test_a_lock_planted_by_another_user_is_refused_at_once_not_waited_on(run_module, shared, token):
    """In a run_dir everyone may write (sticky, like /tmp), uid 65534 creates <run_dir>/eng/lock and holds it."""
    run_dir = os.path.join(shared, "tmp")
    os.mkdir(run_dir)
    os.chmod(run_dir, 0o1777)
    holder, said = as_other_user(
        "import fcntl, os, sys, time\n"
        "os.mkdir(sys.argv[1], 0o755)\n"
        "f = open(os.path.join(sys.argv[1], 'lock'), 'w')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('holding', flush=True)\n"
        "time.sleep(60)\n", os.path.join(run_dir, "eng"))
    try:
        assert said == "holding"
        t0 = time.monotonic()
        r = run_module(engine_process, {"name": "eng", "run_dir": run_dir, "command": sleeper(token),
                                        "startup_grace": 0.5, "stop_timeout": 5})
        assert time.monotonic() - t0 < 5
        assert r["failed"] and r["reason"] == "not_owned", r
        assert "%s/eng belongs to uid %d" % (run_dir, NOBODY) in r["msg"] and "remove" in r["msg"]
        assert engines(token) == []
    finally:
        _stop(holder)


@ROOT_ONLY
def test_a_lock_file_of_another_user_in_our_directory_is_refused(tmp_path):
    run_dir = str(tmp_path / "run")
    with _process.NameLock(run_dir, "eng", timeout=1):
        pass
    lock = _process_state.paths(run_dir, "eng")["lock"]
    os.chown(lock, NOBODY, NOBODY)
    with pytest.raises(_process_state.ProcessError) as e:
        _process.NameLock(run_dir, "eng", timeout=1).__enter__()
    assert e.value.details["reason"] == "not_owned" and e.value.details["file"] == lock
    assert "uid %d" % NOBODY in str(e.value)


@ROOT_ONLY
def test_a_run_dir_of_another_user_is_refused_before_anything_is_created(run_module, tmp_path, token):
    run_dir = tmp_path / "theirs"
    run_dir.mkdir()
    os.chown(str(run_dir), NOBODY, NOBODY)
    r = run_module(engine_process, {"name": "eng", "run_dir": str(run_dir), "command": sleeper(token),
                                    "startup_grace": 0.5})
    assert r["failed"] and r["reason"] == "not_owned" and r["file"] == str(run_dir), r
    assert r["msg"].startswith("run_dir: %s belongs to uid %d" % (run_dir, NOBODY))
    assert os.listdir(str(run_dir)) == [] and engines(token) == []


def test_a_run_dir_others_may_write_without_the_sticky_bit_is_refused(run_module, tmp_path, token):
    run_dir = tmp_path / "open"
    run_dir.mkdir()
    os.chmod(str(run_dir), 0o777)
    r = run_module(engine_process, {"name": "eng", "run_dir": str(run_dir), "command": sleeper(token),
                                    "startup_grace": 0.5})
    assert r["failed"] and r["reason"] == "not_owned", r
    assert "mode 0777" in r["msg"] and "chmod go-w %s" % run_dir in r["msg"]
    assert os.listdir(str(run_dir)) == [] and engines(token) == []


def test_a_group_writable_engine_directory_of_ours_is_tightened(tmp_path):
    """A directory engine_process made under umask 002 is not refused: it is made private."""
    run_dir = tmp_path / "run"
    (run_dir / "eng").mkdir(parents=True)
    os.chmod(str(run_dir / "eng"), 0o775)
    with _process.NameLock(str(run_dir), "eng", timeout=1):
        assert os.stat(str(run_dir / "eng")).st_mode & 0o022 == 0


def _fd_targets(pid):
    d = "/proc/%d/fd" % pid
    out = []
    for fd in os.listdir(d):
        try:
            out.append(os.readlink(os.path.join(d, fd)))
        except OSError:
            pass
    return out


def test_neither_the_supervisor_nor_the_engine_holds_the_lock(run_module, tmp_path, token):
    run_dir = str(tmp_path / "run")
    r = run_module(engine_process, {"name": "eng", "run_dir": run_dir, "command": sleeper(token),
                                    "startup_grace": 0.5, "stop_timeout": 5})
    assert r["state"] == "running", r
    lock = _process_state.paths(run_dir, "eng")["lock"]
    for pid in (r["pid"], r["supervisor_pid"]):
        assert lock not in _fd_targets(pid)
    t0 = time.monotonic()
    with _process.NameLock(run_dir, "eng", timeout=2):  # free while the engine runs
        assert time.monotonic() - t0 < 1
    run_module(engine_process, {"name": "eng", "run_dir": run_dir, "state": "stopped", "stop_timeout": 5})


def test_a_run_whose_run_dir_was_deleted_under_its_lock_starts_nothing(tmp_path, token):
    """Run A holds the lock; the run dir is deleted; run B takes the new lock. A must not spawn a second engine."""
    run_dir = str(tmp_path / "run")
    with _process.NameLock(run_dir, "eng", timeout=1) as a:
        gone = run_dir + ".deleted"
        os.rename(run_dir, gone)
        shutil.rmtree(gone)
        with _process.NameLock(run_dir, "eng", timeout=1) as b:
            assert b.check() and not a.check()
            with pytest.raises(_process_state.ProcessError) as e:
                _process.start(run_dir, "eng", sleeper(token), startup_grace=0.2, lock=a)
            assert e.value.details["reason"] == "locked" and "was deleted or replaced" in str(e.value)
    assert engines(token) == []


def test_a_waiter_whose_file_was_deleted_locks_the_new_one(tmp_path):
    """The waiter had opened the old file; the holder's run dir was deleted and the holder left: the waiter ends
    up holding the lock the path names now, not a lock on a deleted file."""
    run_dir = str(tmp_path / "run")
    with _process.NameLock(run_dir, "eng", timeout=1):
        pass
    lock = _process_state.paths(run_dir, "eng")["lock"]
    old = os.open(lock, os.O_RDWR)
    fcntl.flock(old, fcntl.LOCK_EX)
    child = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                              "fd = int(sys.argv[1])\n"
                              "time.sleep(0.5)\n"
                              "os.rename(sys.argv[2], sys.argv[2] + '.old')\n"
                              "os.close(fd)\n", str(old), run_dir], pass_fds=[old])
    os.close(old)  # the lock now lives in the child's copy of the descriptor
    try:
        with _process.NameLock(run_dir, "eng", timeout=10) as waiter:
            assert waiter.check()
            st = os.fstat(waiter.fd)
            assert (st.st_dev, st.st_ino) == (os.stat(lock).st_dev, os.stat(lock).st_ino)
    finally:
        child.wait()


def test_a_run_dir_that_cannot_be_created_is_a_clean_refusal(run_module):
    r = run_module(engine_process, {"name": "eng", "run_dir": "/proc/llmops-no-such-dir", "state": "stopped"})
    assert r["failed"] and r["reason"] == "bad_run_dir" and r["file"] == "/proc/llmops-no-such-dir", r
    assert r["msg"].startswith("run_dir: cannot create or open /proc/llmops-no-such-dir/eng/lock")
