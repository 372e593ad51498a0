"""``state: absent`` and pruning never leave a stager holding a lock file nobody else can see.

A stager that opened ``<dest>.lock`` just before an ``absent`` (or a prune) deleted it must not end up "holding"
the deleted file while the next run locks a new one: two stagers would copy into one ``<dest>.partial``. The
waiting stager here is a real process, paused between opening the lock file and calling ``flock`` - the window
every waiter goes through - and again inside its critical section, so the test can ask a third run for the lock
at exactly that moment. (Issue "Trust", class 4; flock(2): a lock belongs to the open file, not to the path.)
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
MODULE = os.path.join(ROOT, "plugins", "modules", "model_stage.py")
PYCOLL = os.path.join(ROOT, ".build", "pycoll")
MARKER = ".llmops-staged.json"

# Runs model_stage unchanged, with two pauses: before its first flock() (until GO exists) and at its first header
# read, which happens while it holds dest's lock (until RELEASE exists; INSIDE says it got there).
RUNNER = r'''
import fcntl, os, runpy, sys, time
go, inside, release, module, args = sys.argv[1:6]
seen = set()

def wait_for(path):
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > 60:
            raise SystemExit("timed out waiting for %s" % path)
        time.sleep(0.005)

real_flock = fcntl.flock

def flock(fd, op):
    if "flock" not in seen:
        seen.add("flock")
        wait_for(go)
    return real_flock(fd, op)

fcntl.flock = flock
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
real_verify = _safetensors.verify_file

def verify_file(*a, **k):
    if "verify" not in seen:
        seen.add("verify")
        open(inside, "w").close()
        wait_for(release)
    return real_verify(*a, **k)

_safetensors.verify_file = verify_file
sys.argv = [module, args]
runpy.run_path(module, run_name="__main__")
'''


def tree_bytes(root):
    out = {}
    for name in sorted(os.listdir(root)):
        if name != MARKER:
            with open(os.path.join(root, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def holds_open(pid, path):
    d = "/proc/%d/fd" % pid
    for fd in os.listdir(d):
        try:
            if os.readlink(os.path.join(d, fd)) in (path, path + " (deleted)"):
                return True
        except OSError:
            pass
    return False


def wait(cond, what, timeout=30):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting until %s" % what
        time.sleep(0.005)


@pytest.mark.parametrize("remover", ["absent", "prune"])
def test_stager_waiting_on_a_lock_file_deleted_by_absent_or_prune_does_not_share_dest(run_module, tmp_path, remover):
    shared = tmp_path / "shared" / "m"
    src_a, src_b = str(shared / "a"), str(shared / "b")
    _stage_synth.write_twins(src_a, src_b, 128 * 1024, shards=2, seed=5)
    nvme = tmp_path / "nvme" / "m"
    dest = str(nvme / "rev")
    assert run_module(model_stage, {"src": src_a, "dest": dest})["changed"] is True

    ctl = tmp_path / "ctl"
    ctl.mkdir()
    go, inside, release = str(ctl / "go"), str(ctl / "inside"), str(ctl / "release")
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    args = tmp_path / "b.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"src": src_b, "dest": dest, "lock_timeout": 60}}))
    stager = subprocess.Popen([sys.executable, str(runner), go, inside, release, MODULE, str(args)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=PYCOLL))
    try:
        wait(lambda: holds_open(stager.pid, dest + ".lock"), "the stager has opened the lock file")
        if remover == "absent":
            r = run_module(model_stage, {"src": src_a, "dest": dest, "state": "absent"})
            assert r["changed"] is True and not os.path.exists(dest), r
        else:
            r = run_module(model_stage, {"src": src_a, "dest": str(nvme / "rev2"), "keep_revisions": 1})
            assert r["pruned"] == [dest], r
        open(go, "w").close()
        wait(lambda: os.path.exists(inside), "the stager is inside its critical section")

        # a third run for the same dest must find it taken, not lock a fresh file beside the deleted one
        third = run_module(model_stage, {"src": src_a, "dest": dest, "lock_timeout": 0})
        assert third.get("failed") and third["msg"].startswith("lock_timeout: "), third
    finally:
        open(release, "w").close()
        out, err = stager.communicate(timeout=60)
    result = json.loads(out[out.index("{"):]) if "{" in out else {"stderr": err[-2000:]}
    assert result.get("changed") is True and not result.get("failed"), result
    assert tree_bytes(dest) == tree_bytes(src_b)
    assert json.load(open(os.path.join(dest, MARKER)))["source"] == src_b
    assert not os.path.exists(dest + ".partial")
