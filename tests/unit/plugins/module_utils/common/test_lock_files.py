"""No other local user can hold the collection's locks (_fsutil.open_lock_file).

``flock`` needs only a descriptor, read-only or not (flock(2)). The kernel-cache builder's lock, the staging lock
and the fleet host lock were created 0644: uid 65534 could open one read-only, flock it and make every root run
wait for ``lock_timeout`` (the fleet host lock: forever). They are now created 0600, and an older 0644 one of the
same user is made 0600 when it is next opened. The tests that need a second user run a real process as uid 65534
(root only).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots, _stage_lock

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
OTHER_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
FP = "0123456789abcdef"
# try to open each path read-only and hold an flock on it; print what happened to each, then sleep
HOLD = ("import fcntl, sys, time\n"
        "out, held = [], []\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        f = open(p, 'rb'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); held.append(f); out.append('held')\n"
        "    except OSError as e:\n"
        "        out.append(type(e).__name__)\n"
        "print(' '.join(out), flush=True)\n"
        "time.sleep(60)\n")


@pytest.fixture(name="shared")
def shared_dir():
    """A directory every user can reach (pytest's tmp_path is only root's)."""
    path = tempfile.mkdtemp(prefix="llmops-lockfile-test-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _other_user_tries(*paths):
    proc = subprocess.Popen([OTHER_PYTHON, "-c", HOLD] + list(paths), user=NOBODY, group=NOBODY,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    return proc, proc.stdout.readline().split()


def _stop(proc):
    proc.kill()
    proc.wait()
    proc.stdout.close()


# a warm-up that compiles one kernel where it is pointed (one that writes nothing is refused: test_kernel_cache_lib.py)
WRITES_A_KERNEL = "import os; open(os.path.join(os.environ['TRITON_CACHE_DIR'], 'k.bin'), 'wb').write(b'k')"


def _locks(shared):
    """The three lock files, each created once by its owner (as a run leaves it)."""
    cache = os.path.join(shared, "cache")
    with _kcache.fingerprint_lock(cache, "vllm", FP, 5):
        pass
    stage = os.path.join(shared, "models", "m.lock")
    with _stage_lock.DestLock(stage, timeout=5):
        pass
    fleet = _fleet_slots.FleetSlots(os.path.join(shared, "fleet"), 1, lock_dir=shared, acquire_timeout=5)
    with fleet:
        fleet.release(fleet.acquire())
    return cache, stage, fleet


@ROOT_ONLY
def test_another_user_can_hold_none_of_the_locks_and_runs_go_on(shared):
    cache, stage, fleet = _locks(shared)
    paths = [os.path.join(cache, "vllm", ".locks", FP + ".lock"), stage, fleet._host_lock_path]  # pylint: disable=protected-access
    holder, said = _other_user_tries(*paths)
    try:
        assert said == ["PermissionError"] * 3  # was: held, held, held
        assert [oct(os.stat(p).st_mode & 0o777) for p in paths] == ["0o600"] * 3
        t0 = time.monotonic()
        built = _kcache_build.prebuild(cache, "vllm", FP, {"engine": "vllm"},
                                       {"command": [sys.executable, "-c", WRITES_A_KERNEL], "mode": "run", "timeout": 30},
                                       lock_timeout=2)
        assert built["status"] == "built"
        with _stage_lock.DestLock(stage, timeout=2):
            pass
        with fleet:
            fleet.release(fleet.acquire())
        assert time.monotonic() - t0 < 10
    finally:
        _stop(holder)


@ROOT_ONLY
def test_a_lock_file_left_0644_by_an_older_run_is_made_private_when_next_used(shared):
    """The lock files of runs before this rule are 0644: the first run after it closes the hole."""
    cache, stage, fleet = _locks(shared)
    paths = [os.path.join(cache, "vllm", ".locks", FP + ".lock"), stage, fleet._host_lock_path]  # pylint: disable=protected-access
    for p in paths:
        os.chmod(p, 0o644)
    _locks(shared)
    assert [oct(os.stat(p).st_mode & 0o777) for p in paths] == ["0o600"] * 3
    holder, said = _other_user_tries(*paths)
    _stop(holder)
    assert said == ["PermissionError"] * 3


def test_open_lock_file_refuses_a_symlink_and_what_is_not_a_file(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(str(target), str(tmp_path / "link.lock"))
    with pytest.raises(OSError):  # ELOOP: never through a symlink
        _fsutil.open_lock_file(str(tmp_path / "link.lock"))
    os.mkfifo(str(tmp_path / "fifo.lock"))
    with pytest.raises(ValueError, match="fifo.lock is not a regular file"):
        _fsutil.open_lock_file(str(tmp_path / "fifo.lock"))
    fd = _fsutil.open_lock_file(str(tmp_path / "new.lock"))
    os.close(fd)
    assert oct(os.stat(str(tmp_path / "new.lock")).st_mode & 0o777) == "0o600"


@ROOT_ONLY
def test_a_lock_file_another_user_put_first_where_both_may_write_is_refused_not_waited_on(shared):
    """The fleet host lock lives in /tmp under a name anyone can compute; uid 65534 creates it first and holds
    it. Root's run is refused at once, naming the file (it waited forever: that flock has no timeout)."""
    tmp = os.path.join(shared, "tmp")
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    fleet = _fleet_slots.FleetSlots(os.path.join(shared, "fleet"), 1, lock_dir=tmp, acquire_timeout=5)
    path = fleet._host_lock_path  # pylint: disable=protected-access
    holder = subprocess.Popen([OTHER_PYTHON, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'w')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n", path],
                              user=NOBODY, group=NOBODY, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(_fleet_slots.FleetSlotError) as e:
            with fleet:
                fleet.acquire()
        assert time.monotonic() - t0 < 5
        assert e.value.reason == "not_writable" and e.value.file == path
        assert "of uid %d, not of uid 0" % NOBODY in str(e.value) and "remove it" in str(e.value)
        with pytest.raises(_kcache.KCacheError, match=r"^cache_root: lock file .* of uid %d" % NOBODY):
            ldir = os.path.join(tmp, "vllm", ".locks")
            os.makedirs(ldir)
            os.chmod(os.path.join(tmp, "vllm"), 0o1777)
            os.chmod(ldir, 0o1777)
            subprocess.run([OTHER_PYTHON, "-c", "open(%r, 'w')" % os.path.join(ldir, FP + ".lock")], user=NOBODY,
                           group=NOBODY, check=True, cwd="/")
            with _kcache.fingerprint_lock(tmp, "vllm", FP, 5):
                pass
    finally:
        _stop(holder)
