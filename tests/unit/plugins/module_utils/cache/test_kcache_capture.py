"""A kernel cache captured from the engine's first start and published after its first correct answer.

Before: on a miss with no prebuild (a Kubernetes engine, whose compilers are in its image) the role did no checkout,
the pod got no cache volume or env, compiled into its container filesystem and lost it; nothing published it back.
Now ``_kcache_capture.prepare`` gives the engine an empty per-start directory (the path a checkout has) and
``publish_capture`` publishes what it compiled there, with prebuild's guarantees: the fingerprint lock (the first
publisher wins), a hashed copy, a manifest, verification, the publish sequence, quarantine of a directory that does
not verify, and never under another fingerprint or other components.
"""
from __future__ import annotations

import json
import os
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import (
    _kcache, _kcache_build, _kcache_capture, _kcache_gc,
)
from ansible_collections.llmops.serving.plugins.modules import kernel_cache

FP = "0c1d2e3f4a5b6c7d"
COMPONENTS = {"engine": "vllm", "engine_version": "0.26.0", "tp": 8, "gpu_name": "NVIDIA H20"}


def _prepare(root, proc, instance="engine"):
    return _kcache_capture.prepare(str(root), "vllm", FP, COMPONENTS, instance, label="t", proc_root=str(proc),
                                   host="h")


def _compile(engine_dir, name="kernel.bin", data=b"sm90 kernel"):
    """What the engine's first start writes through its cache env (TRITON_CACHE_DIR and friends)."""
    env = _kcache.cache_env("vllm", engine_dir)
    d = os.path.join(env["TRITON_CACHE_DIR"], "ab" * 8)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    os.makedirs(os.path.join(env["DG_JIT_CACHE_DIR"], "cache"), exist_ok=True)
    with open(os.path.join(env["DG_JIT_CACHE_DIR"], "cache", "kernel.gemm"), "wb") as f:
        f.write(b"deepgemm " + data)


def test_a_miss_gets_an_empty_per_start_directory_at_the_checkout_path(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    res = _prepare(root, proc)
    rd = _kcache.run_dir(str(root), "vllm", FP, "engine")
    assert res["status"] == "created" and res["engine_dir"] == rd
    assert sorted(os.listdir(rd)) == sorted(list(_kcache.KINDS["vllm"]) + [_kcache_capture.MARKER])
    marker = _kcache_capture.read_marker(rd)
    assert marker["fingerprint"] == FP and marker["components"] == COMPONENTS
    assert not os.path.exists(_kcache.fingerprint_dir(str(root), "vllm", FP))  # nothing published yet
    assert _prepare(root, proc)["status"] == "ready"  # an empty capture of this fingerprint is kept as it is


def test_what_a_stopped_start_left_is_discarded_by_the_next_prepare(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    rd = _prepare(root, proc)["engine_dir"]
    _compile(rd)
    res = _prepare(root, proc)
    assert res["status"] == "created" and len(res["discarded_files"]) == 2
    assert _kcache_capture.captured_files(rd) == ([], [])


def test_the_first_correct_answer_publishes_the_capture_verified_and_the_next_start_is_a_checkout(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    rd = _prepare(root, proc)["engine_dir"]
    _compile(rd)
    res = _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, "engine", "t", proc_root=str(proc))
    assert res["status"] == "published" and res["sequence"] == 1 and res["file_count"] == 2
    final = _kcache.fingerprint_dir(str(root), "vllm", FP)
    assert _kcache.verify_dir(final, FP, COMPONENTS, allow_extra=False)["ok"]
    assert _kcache.restore(str(root), "vllm", FP, COMPONENTS, proc_root=str(proc))["status"] == "hit"
    # the per-start directory is now this instance's checkout of what was published: kept, not copied again
    assert not os.path.exists(os.path.join(rd, _kcache_capture.MARKER))
    co = _kcache_build.checkout(str(root), "vllm", FP, COMPONENTS, "engine", proc_root=str(proc))
    assert co["status"] == "ready" and co["engine_dir"] == rd
    # a rerun of the publish finds it published
    again = _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, "engine", proc_root=str(proc))
    assert again["status"] == "hit" and not again["changed"]
    # and a capture is refused while the fingerprint is published
    with pytest.raises(_kcache.KCacheError, match="published and verifies"):
        _prepare(root, proc)


def test_an_empty_capture_publishes_nothing(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    _prepare(root, proc)
    res = _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, proc_root=str(proc))
    assert res["status"] == "empty" and not res["changed"]
    assert not os.path.exists(_kcache.fingerprint_dir(str(root), "vllm", FP))


def test_a_capture_of_other_components_is_never_published_under_this_fingerprint(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    rd = _prepare(root, proc)["engine_dir"]
    _compile(rd)
    other = dict(COMPONENTS, engine_version="0.27.0")
    with pytest.raises(_kcache.KCacheError, match="components differ: engine_version"):
        _kcache_capture.publish_capture(str(root), "vllm", FP, other, proc_root=str(proc))
    marker = os.path.join(rd, _kcache_capture.MARKER)
    with open(marker) as f:
        data = json.load(f)
    data["fingerprint"] = "ffffffffffffffff"
    with open(marker, "w") as f:
        json.dump(data, f)
    with pytest.raises(_kcache.KCacheError, match="fingerprint is 'ffffffffffffffff'"):
        _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, proc_root=str(proc))
    assert not os.path.exists(_kcache.fingerprint_dir(str(root), "vllm", FP))


def test_a_capture_holding_a_symlink_is_refused(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    rd = _prepare(root, proc)["engine_dir"]
    _compile(rd)
    os.symlink("/etc/passwd", os.path.join(rd, "triton", "leak"))
    with pytest.raises(_kcache.KCacheError, match="holds symlinks"):
        _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, proc_root=str(proc))


def test_triton_scratch_directories_are_left_out(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    rd = _prepare(root, proc)["engine_dir"]
    _compile(rd)
    scratch = os.path.join(rd, "triton", "tmp.pid_42_abc")
    os.makedirs(scratch)
    with open(os.path.join(scratch, "half.cubin"), "wb") as f:
        f.write(b"half")
    res = _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, proc_root=str(proc))
    assert res["status"] == "published" and res["skipped_files"] == ["triton/tmp.pid_42_abc/half.cubin"]
    man = _kcache.read_manifest(_kcache.fingerprint_dir(str(root), "vllm", FP))
    assert all("tmp.pid_" not in e["path"] for e in man["files"])


def test_a_published_directory_that_does_not_verify_is_quarantined_before_the_capture_is_published(tmp_path):
    root, proc = tmp_path / "kc", tmp_path / "proc"
    final = _kcache.fingerprint_dir(str(root), "vllm", FP)
    os.makedirs(os.path.join(final, "triton"))
    with open(os.path.join(final, "triton", "junk"), "w") as f:
        f.write("no manifest")
    rd = _kcache.run_dir(str(root), "vllm", FP, "engine")
    assert _prepare(root, proc)["engine_dir"] == rd
    _compile(rd)
    res = _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, proc_root=str(proc))
    assert res["status"] == "published" and res["quarantined_to"]
    assert os.path.exists(os.path.join(res["quarantined_to"], "triton", "junk"))
    assert _kcache.verify_dir(final, FP, COMPONENTS, allow_extra=False)["ok"]


def test_two_starts_missing_at_once_on_one_store_publish_once(tmp_path):
    """Two engine instances (two pods' per-start directories on one store) publish at the same moment: the lock
    lets one publish; the other finds it published and publishes nothing."""
    root, proc = tmp_path / "kc", tmp_path / "proc"
    for instance, data in (("engine-a", b"a"), ("engine-b", b"b")):
        _compile(_prepare(root, proc, instance)["engine_dir"], data=data)
    barrier, out = threading.Barrier(2), {}

    def publish(instance):
        barrier.wait()
        out[instance] = _kcache_capture.publish_capture(str(root), "vllm", FP, COMPONENTS, instance,
                                                        proc_root=str(proc))["status"]

    threads = [threading.Thread(target=publish, args=(i,)) for i in ("engine-a", "engine-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out.values()) == ["hit", "published"], out
    assert [d for d in os.listdir(os.path.join(str(root), "vllm")) if _kcache.FP_RE.match(d)] == [FP]
    assert _kcache.read_manifest(_kcache.fingerprint_dir(str(root), "vllm", FP))["sequence"] == 1


def test_gc_right_after_a_capture_keeps_the_per_start_directory_of_the_fingerprint_in_use(tmp_path):
    """The role's gc runs after the capture, before the engine starts: the capture (a .run/ directory of a
    fingerprint with nothing published yet) is the engine's, named in in_use; gc removed it before."""
    root, proc = tmp_path / "kc", tmp_path / "proc"
    rd = _prepare(root, proc)["engine_dir"]
    res = _kcache_gc.gc(str(root), "vllm", keep=3, in_use=[FP], proc_root=str(proc))
    assert res["removed_runs"] == [] and os.path.isdir(rd)
    other = "1" * 16
    os.rename(rd, _kcache.run_dir(str(root), "vllm", other, "engine"))  # a fingerprint nobody names still goes
    res = _kcache_gc.gc(str(root), "vllm", keep=3, in_use=[FP], proc_root=str(proc))
    assert res["removed_runs"] == ["%s-engine" % other]


def test_the_module_captures_and_publishes(run_module, tmp_path):
    base = dict(cache_root=str(tmp_path / "kc"), engine="vllm", fingerprint=FP, components=COMPONENTS,
                proc_root=str(tmp_path / "proc"))
    cap = run_module(kernel_cache, dict(base, operation="capture", mount_path="/cache"))
    assert not cap.get("failed"), cap.get("msg")
    assert cap["status"] == "created" and cap["env"]["TRITON_CACHE_DIR"] == "/cache/triton"
    assert cap["engine_dir"] == _kcache.run_dir(base["cache_root"], "vllm", FP, "engine")
    empty = run_module(kernel_cache, dict(base, operation="publish_capture"))
    assert empty["status"] == "empty" and not empty["changed"]
    _compile(cap["engine_dir"])
    would = run_module(kernel_cache, dict(base, operation="publish_capture"), check_mode=True)
    assert would["status"] == "would_publish"
    assert not os.path.exists(_kcache.fingerprint_dir(base["cache_root"], "vllm", FP))
    pub = run_module(kernel_cache, dict(base, operation="publish_capture"))
    assert pub["status"] == "published" and pub["changed"] and pub["problems"] == []
    bad = run_module(kernel_cache, dict(base, operation="publish_capture", components=dict(COMPONENTS, engine="sglang")))
    assert bad["failed"] and "components: computed for engine sglang" in bad["msg"]
