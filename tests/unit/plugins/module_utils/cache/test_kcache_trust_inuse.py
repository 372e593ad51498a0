"""In use means in use: gc and the verify quarantine see a fingerprint directory (or an engine's copy of it)
that a real process uses through another path: a symlinked cache_root, an open file, a mapping, its
working directory, a cache variable in its environment, or a bind mount in another mount namespace."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build, _kcache_gc
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import hold, hold_bind_mount, stop

COMPONENTS = {"engine": "vllm", "engine_version": "0.32.0", "tp": 8}
FPS = ["%016x" % i for i in range(4)]  # FPS[0] oldest


@pytest.fixture
def cache(tmp_path):
    """Four published fingerprints on the real root, reached through a symlinked cache_root."""
    real = tmp_path / "nvme" / "kernel-cache"
    for i, fp in enumerate(FPS):
        d = real / "vllm" / fp
        (d / "triton").mkdir(parents=True)
        (d / "triton" / "k.so").write_bytes(b"\0" * 4096)
        (d / "manifest.json").write_text(json.dumps({"fingerprint": fp, "created": "2026-01-0%dT00:00:00Z" % (i + 1),
                                                     "files": []}))
    link = tmp_path / "kernel-cache"
    link.symlink_to(real)
    return {"real": str(real), "link": str(link)}


@pytest.mark.parametrize("mode", ["open", "mmap", "cwd", "environ"])
def test_gc_keeps_a_fingerprint_used_through_a_symlinked_root(cache, mode):
    # the engine was pointed at the symlink spelling; gc is asked about the real root
    used = os.path.join(cache["link"], "vllm", FPS[0])
    if mode == "environ":
        p = hold("sleep", "-", env=dict(os.environ, TRITON_CACHE_DIR=os.path.join(used, "triton")))
    else:
        p = hold(mode, used if mode == "cwd" else os.path.join(used, "triton", "k.so"))
    try:
        r = _kcache_gc.gc(cache["real"], "vllm", keep=1)
        assert FPS[0] in r["protected"] and FPS[0] in r["mounted"]
        assert r["in_use_by"][FPS[0]][0]["pid"] == p.pid
        assert sorted(r["removed"]) == sorted(FPS[1:3])
        assert os.path.isdir(os.path.join(cache["real"], "vllm", FPS[0]))
    finally:
        stop(p)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_gc_keeps_a_fingerprint_bind_mounted_in_a_pod_namespace(cache, tmp_path):
    # How a pod holds a hostPath volume: a bind mount in its own mount namespace, at another path, with no
    # file open (proc(5), /proc/PID/mountinfo).
    volume = tmp_path / "pod-cache"
    volume.mkdir()
    p = hold_bind_mount(os.path.join(cache["link"], "vllm", FPS[1]), volume)
    try:
        r = _kcache_gc.gc(cache["link"], "vllm", keep=1)
        assert FPS[1] in r["protected"] and r["in_use_by"][FPS[1]][0]["via"] == "mount"
        assert sorted(r["removed"]) == sorted([FPS[0], FPS[2]])
        assert os.path.isdir(os.path.join(cache["real"], "vllm", FPS[1]))
    finally:
        stop(p)


def test_gc_keeps_a_fingerprint_whose_engine_copy_is_in_use(cache):
    run = os.path.join(cache["real"], "vllm", _kcache.RUNS, FPS[0] + "-engine")
    os.makedirs(os.path.join(run, "triton"))
    stale = os.path.join(cache["real"], "vllm", _kcache.RUNS, FPS[1] + "-engine")
    os.makedirs(os.path.join(stale, "triton"))
    p = hold("cwd", os.path.join(run, "triton"))
    try:
        r = _kcache_gc.gc(cache["real"], "vllm", keep=1)
        assert FPS[0] in r["protected"] and FPS[0] in r["mounted"]
        # the copy of a removed fingerprint goes with it when nobody uses it; the used copy stays
        assert r["removed"] == [FPS[2], FPS[1]] and r["removed_runs"] == [FPS[1] + "-engine"]
        assert os.path.isdir(run) and not os.path.exists(stale)
    finally:
        stop(p)


def build(root, fp):
    w = {"command": [sys.executable, "-c",
                     "import os; open(os.path.join(os.environ['TRITON_CACHE_DIR'], 'k.bin'), 'wb').write(b'k' * 64)"],
         "mode": "run", "timeout": 60}
    return _kcache_build.prebuild(root, "vllm", fp, COMPONENTS, w)


def test_a_tampered_dir_in_use_is_reported_not_moved_from_under_its_user(tmp_path):
    real = tmp_path / "nvme"
    link = tmp_path / "link"
    link.symlink_to(real)
    d = build(str(real), FPS[0])["cache_dir"]
    with open(os.path.join(d, "triton", "k.bin"), "wb") as f:
        f.write(b"x" * 64)
    p = hold("open", os.path.join(str(link), "vllm", FPS[0], "triton", "k.bin"))
    try:
        for check_mode in (True, False):
            r = _kcache.restore(str(real), "vllm", FPS[0], COMPONENTS, check_mode=check_mode)
            assert r["status"] == "tampered" and r["quarantined_to"] is None and not r["changed"]
            assert r["in_use_by"][0]["pid"] == p.pid and r["in_use_by"][0]["via"] == "fd"
            assert "not quarantined: in use by pid %d" % p.pid in r["verify"]["problems"][-1]
        assert os.path.isdir(d) and not (real / ".quarantine").exists()
        # a prebuild or a copy over it refuses clearly instead of moving it
        with pytest.raises(_kcache.InUse, match="in use by pid %d .*stop it" % p.pid):
            build(str(real), FPS[0])
        assert os.path.isdir(d)
    finally:
        stop(p)
    # once the process is gone it is quarantined as usual
    r = _kcache.restore(str(real), "vllm", FPS[0], COMPONENTS)
    assert r["status"] == "quarantined" and not os.path.exists(d)
