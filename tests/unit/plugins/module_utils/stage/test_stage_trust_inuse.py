"""``state: absent`` and pruning see a revision used through any path: a symlinked dest root, a working
directory, a bind mount in another mount namespace (how a pod mounts a hostPath), files opened or mapped through
that mount. They refuse with the pid and how it uses the revision. Real processes, real /proc.
(Issue "Trust", class 5; proc(5) for fd, maps, cwd and mountinfo.)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def staged(run_module, tmp_path):
    real_root = tmp_path / "nvme-real"
    (real_root / "m").mkdir(parents=True)
    link_root = tmp_path / "nvme"
    os.symlink(str(real_root), str(link_root))  # the dest root engines and playbooks use is a symlink
    src = str(tmp_path / "shared" / "m" / "rev1")
    _stage_synth.write_checkpoint(src, 128 * 1024, shards=2, seed=2)
    dest = str(link_root / "m" / "rev1")
    assert run_module(model_stage, {"src": src, "dest": dest})["changed"] is True
    procs = []
    yield {"src": src, "dest": dest, "real": str(real_root / "m" / "rev1"), "tmp": tmp_path, "procs": procs,
           "root": link_root}
    for p in procs:
        p.kill()
        p.wait()


def _wait(cond, what, timeout=20):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting until %s" % what
        time.sleep(0.01)


def test_absent_and_prune_see_a_working_directory_through_a_symlinked_root(run_module, staged):
    p = subprocess.Popen(["sleep", "60"], cwd=staged["dest"])
    staged["procs"].append(p)
    _wait(lambda: os.path.realpath("/proc/%d/cwd" % p.pid) == staged["real"], "sleep runs in the revision")
    for dest in (staged["dest"], staged["real"]):
        r = run_module(model_stage, {"src": staged["src"], "dest": dest, "state": "absent"})
        assert r.get("failed") and "in use (pid %d works in %s)" % (p.pid, staged["real"]) in r["msg"], r
    assert os.path.isdir(staged["real"])

    src2 = str(staged["tmp"] / "shared" / "m" / "rev2")
    _stage_synth.write_checkpoint(src2, 64 * 1024, shards=1, seed=9, extra_files=False)
    r = run_module(model_stage, {"src": src2, "dest": str(staged["root"] / "m" / "rev2"), "keep_revisions": 1})
    assert r["pruned"] == [] and r["kept_in_use"] == [
        {"path": staged["real"], "pid": p.pid, "via": "cwd", "file": staged["real"]}], r
    assert os.path.isdir(staged["real"])


def _unshare_or_skip():
    if os.geteuid() != 0:
        pytest.skip("bind mounts in a new mount namespace need root")
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) is not installed")


def _in_other_namespace(staged, script):
    """A process in its own mount namespace with the revision bind-mounted at MNT (as a pod sees a hostPath)."""
    mnt = staged["tmp"] / "pod-models"
    mnt.mkdir()
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount --bind "$0" "$1" && exec "$2" -c "$3" "$1"',
                          staged["real"], str(mnt), sys.executable, script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    staged["procs"].append(p)
    line = p.stdout.readline()
    if p.poll() is not None or not line.startswith("ready"):
        pytest.skip("cannot bind-mount in a new mount namespace here: %s" % p.stderr.read()[-300:])
    assert not os.listdir(str(mnt)), "the bind mount leaked into this namespace"
    return p, str(mnt)


def test_absent_sees_a_bind_mount_in_another_mount_namespace(run_module, staged):
    _unshare_or_skip()
    p, mnt = _in_other_namespace(staged, "import sys, time; print('ready', flush=True); time.sleep(60)")
    r = run_module(model_stage, {"src": staged["src"], "dest": staged["dest"], "state": "absent"})
    assert r.get("failed") and "in use (pid %d mounts it at %s" % (p.pid, mnt) in r["msg"], r
    assert os.path.isdir(staged["real"])


def test_absent_sees_files_opened_and_mapped_through_a_mount_in_another_namespace(run_module, staged):
    _unshare_or_skip()
    script = ("import mmap, os, sys, time\n"
              "f = open(os.path.join(sys.argv[1], %r), 'rb')\n"
              "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n" % SHARD)
    p, mnt = _in_other_namespace(staged, script)
    r = run_module(model_stage, {"src": staged["src"], "dest": staged["dest"], "state": "absent"})
    assert r.get("failed") and "in use (pid %d has %s open)" % (p.pid, os.path.join(mnt, SHARD)) in r["msg"], r
    assert os.path.isdir(staged["real"])
    p.kill()
    p.wait()
    r = run_module(model_stage, {"src": staged["src"], "dest": staged["dest"], "state": "absent"})
    assert r["changed"] is True and not os.path.exists(staged["real"]), r
