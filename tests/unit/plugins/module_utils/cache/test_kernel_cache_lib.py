"""Kernel-cache directories: verify + quarantine, one builder per fingerprint, verified copy, gc, log audit."""
from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import (
    _kcache, _kcache_build, _kcache_gc, _kcache_log,
)

FP = "0123456789abcdef"
COMPONENTS = {"engine": "vllm", "engine_version": "0.32.0", "tp": 8, "triton": "3.6.0"}

# A warm-up that writes a kernel into every cache dir it is pointed at, and counts its runs.
WRITER = r"""
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write("x")
time.sleep(float(sys.argv[2]))
for var in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "DG_JIT_CACHE_DIR"):
    d = os.path.join(os.environ[var], "k")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "kernel.bin"), "wb") as f:
        f.write(var.encode() * 1000)
"""


def warmup(tmp_path, delay=0.0):
    # written whole under a temporary name and renamed: threads that build at once rewrite it while another's
    # warm-up may be starting, which must never read it half written (an empty script ran, exit 0, no kernel)
    script = tmp_path / "writer.py"
    tmp = tmp_path / ("writer.py.%d.%d" % (os.getpid(), threading.get_ident()))
    tmp.write_text(WRITER)
    os.replace(tmp, script)
    return {"command": [sys.executable, str(script), str(tmp_path / "runs.txt"), str(delay)], "mode": "run",
            "timeout": 60}


def build(tmp_path, root, delay=0.0):
    return _kcache_build.prebuild(str(root), "vllm", FP, COMPONENTS, warmup(tmp_path, delay), label="t", host="builder-1")


def runs(tmp_path):
    p = tmp_path / "runs.txt"
    return len(p.read_text()) if p.exists() else 0


def test_env_points_every_cache_inside_the_mount(tmp_path):
    env = _kcache.cache_env("vllm", "/cache")
    assert env == {
        "VLLM_CACHE_ROOT": "/cache/torch_compile", "TORCHINDUCTOR_CACHE_DIR": "/cache/inductor",
        "TRITON_CACHE_DIR": "/cache/triton", "DG_JIT_CACHE_DIR": "/cache/deep_gemm",
        "DG_CACHE_DIR": "/cache/deep_gemm", "FLASHINFER_WORKSPACE_BASE": "/cache/flashinfer",
    }
    env = _kcache.cache_env("sglang", "/cache")
    assert env["SGLANG_DG_CACHE_DIR"] == "/cache/deep_gemm" and env["SGLANG_JIT_CACHE_DIR"] == "/cache/jit"
    assert env["SGLANG_CACHE_DIR"] == "/cache/sglang" and env["TRITON_CACHE_DIR"] == "/cache/triton"
    assert all(v.startswith("/cache/") for v in env.values())


def test_prebuild_publishes_manifest_then_hits(tmp_path):
    root = tmp_path / "cache"
    r = build(tmp_path, root)
    assert r["status"] == "built" and r["built"] and runs(tmp_path) == 1
    d = root / "vllm" / FP
    man = json.loads((d / "manifest.json").read_text())
    assert man["fingerprint"] == FP and man["components"] == COMPONENTS
    assert man["producer_host"] == "builder-1" and man["created"].endswith("Z")
    paths = sorted(f["path"] for f in man["files"])
    assert paths == ["deep_gemm/k/kernel.bin", "inductor/k/kernel.bin", "torch_compile/k/kernel.bin",
                     "triton/k/kernel.bin"]
    assert all(len(f["sha256"]) == 64 for f in man["files"])
    assert not [p for p in os.listdir(root / "vllm") if p.startswith(".partial")]
    again = build(tmp_path, root)
    assert again["status"] == "hit" and not again["changed"] and runs(tmp_path) == 1


def test_failed_warmup_publishes_nothing(tmp_path):
    root = tmp_path / "cache"
    bad = {"command": [sys.executable, "-c", "import sys; sys.exit(3)"], "mode": "run", "timeout": 30}
    with pytest.raises(_kcache.KCacheError, match="exited 3"):
        _kcache_build.prebuild(str(root), "vllm", FP, COMPONENTS, bad)
    assert not (root / "vllm" / FP).exists()
    assert not [p for p in os.listdir(root / "vllm") if p.startswith(".partial")]


@pytest.mark.parametrize("mode", ["run", "serve"])
def test_a_warmup_that_fills_no_cache_is_refused_and_publishes_nothing(tmp_path, mode):
    """A warm-up that succeeds (exit 0, or a correct answer) but writes no file where TRITON_CACHE_DIR and the others
    point - a wrapper that resets them, an engine that compiles nothing - would publish an empty cache that verifies,
    a hit on every node that then compiles everything at start. Refused, naming the variables; nothing published,
    the lock free for the next builder."""
    root = tmp_path / "cache"
    quiet = [sys.executable, "-c", "import time; time.sleep(0 if %r == 'run' else 30)" % mode]
    spec = {"command": quiet, "mode": mode, "timeout": 30, "url": "http://127.0.0.1:9/v1/completions", "expect": "ok"}
    answer = (lambda url, body, timeout: (200, b"{\"choices\": [{\"text\": \"ok\"}]}")) if mode == "serve" else None
    with pytest.raises(_kcache.KCacheError) as err:
        _kcache_build.prebuild(str(root), "vllm", FP, COMPONENTS, spec, http_post=answer)
    msg = str(err.value)
    how = "exited 0" if mode == "run" else "answered correctly"
    assert msg.startswith("warmup_command: the warm-up %s but wrote no file" % how)
    assert "TRITON_CACHE_DIR" in msg and "VLLM_CACHE_ROOT" in msg and "nothing was published" in msg
    assert not (root / "vllm" / FP).exists()
    assert not [p for p in os.listdir(root / "vllm") if p.startswith(".partial")]
    r = build(tmp_path, root)  # the next builder, with a warm-up that fills the caches, is not held
    assert r["status"] == "built" and r["file_count"] == 4


@pytest.mark.parametrize("damage,status", [
    ("modify", "tampered"), ("truncate", "tampered"), ("delete", "incomplete"), ("manifest", "no_manifest"),
])
def test_tampered_or_incomplete_dir_is_quarantined_not_used(tmp_path, damage, status):
    root = tmp_path / "cache"
    build(tmp_path, root)
    f = root / "vllm" / FP / "triton" / "k" / "kernel.bin"
    if damage == "modify":
        data = bytearray(f.read_bytes())
        data[10] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "delete":
        f.unlink()
    else:
        (root / "vllm" / FP / "manifest.json").write_text("{not json")
    check = _kcache.restore(str(root), "vllm", FP, COMPONENTS, check_mode=True)
    assert check["status"] == "quarantined" and check["quarantined_to"] is None and (root / "vllm" / FP).exists()
    r = _kcache.restore(str(root), "vllm", FP, COMPONENTS)
    assert r["status"] == "quarantined" and r["verify"]["status"] == status
    assert not (root / "vllm" / FP).exists()
    q = r["quarantined_to"]
    assert q.startswith(str(root / ".quarantine" / ("vllm-" + FP)))
    assert status in json.loads(open(q + ".reason.json").read())["reason"]
    assert _kcache.restore(str(root), "vllm", FP, COMPONENTS)["status"] == "missing"


def test_dir_with_other_components_is_never_used(tmp_path):
    root = tmp_path / "cache"
    build(tmp_path, root)
    other = dict(COMPONENTS, triton="3.5.1")
    r = _kcache.restore(str(root), "vllm", FP, other)
    assert r["status"] == "quarantined" and "components differ: triton" in r["verify"]["problems"][0]


def test_extra_files_allowed_or_rejected(tmp_path):
    root = tmp_path / "cache"
    build(tmp_path, root)
    (root / "vllm" / FP / "triton" / "new.bin").write_bytes(b"added by a later miss")
    ok = _kcache.verify_dir(str(root / "vllm" / FP), FP, COMPONENTS, allow_extra=True)
    assert ok["ok"] and ok["extra_files"] == ["triton/new.bin"]
    strict = _kcache.verify_dir(str(root / "vllm" / FP), FP, COMPONENTS, allow_extra=False)
    assert not strict["ok"] and strict["status"] == "tampered"


def test_prebuild_replaces_a_tampered_dir(tmp_path):
    root = tmp_path / "cache"
    build(tmp_path, root)
    (root / "vllm" / FP / "triton" / "k" / "kernel.bin").write_bytes(b"evil")
    r = build(tmp_path, root)
    assert r["status"] == "built" and r["quarantined_to"] and runs(tmp_path) == 2
    assert _kcache.restore(str(root), "vllm", FP, COMPONENTS)["status"] == "hit"


def test_concurrent_prebuild_one_builder_others_wait(tmp_path):
    root = tmp_path / "cache"
    results, errors = [], []

    def worker():
        try:
            results.append(build(tmp_path, root, delay=1.0))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert runs(tmp_path) == 1
    assert sorted(r["status"] for r in results) == ["built", "hit", "hit", "hit"]
    waited = [r["waited_s"] for r in results if r["status"] == "hit"]
    assert min(waited) >= 0.5  # they really waited for the builder


def test_lock_timeout_names_the_option(tmp_path):
    root = tmp_path / "cache"
    with _kcache.fingerprint_lock(str(root), "vllm", FP, 5):
        with pytest.raises(_kcache.KCacheError, match="lock_timeout"):
            _kcache_build.prebuild(str(root), "vllm", FP, COMPONENTS, warmup(tmp_path), lock_timeout=0)
    assert runs(tmp_path) == 0


def test_sync_copies_verified_and_refuses_bad_source(tmp_path):
    store, node = tmp_path / "store", tmp_path / "node"
    build(tmp_path, store)
    r = _kcache_build.sync(str(store), str(node), "vllm", FP, COMPONENTS)
    assert r["status"] == "copied" and r["bytes"] > 0
    assert _kcache.restore(str(node), "vllm", FP, COMPONENTS)["status"] == "hit"
    log = open(r["log_path"]).read()
    assert "copied 4 files" in log
    assert _kcache_build.sync(str(store), str(node), "vllm", FP, COMPONENTS)["status"] == "hit"
    # a corrupt source is never copied
    (store / "vllm" / FP / "inductor" / "k" / "kernel.bin").write_bytes(b"bad")
    with pytest.raises(_kcache.KCacheError, match="source_root"):
        _kcache_build.sync(str(store), str(tmp_path / "node2"), "vllm", FP, COMPONENTS)
    assert not (tmp_path / "node2" / "vllm" / FP).exists()


def make_fp_dir(root, fp, created):
    d = root / "vllm" / fp
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"fingerprint": fp, "created": created, "files": []}))
    return d


def test_gc_keeps_newest_and_never_removes_mounted(tmp_path):
    root = tmp_path / "cache"
    fps = ["%016x" % i for i in range(5)]
    for i, f in enumerate(fps):
        make_fp_dir(root, f, "2026-01-0%dT00:00:00Z" % (i + 1))
    # the oldest is mounted by a running engine (its environment), the second oldest is declared in use
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "environ").write_bytes(
        b"HOME=/root\x00TRITON_CACHE_DIR=" + str(root / "vllm" / fps[0] / "triton").encode() + b"\x00")
    (proc / "4243").mkdir()
    (proc / "4243" / "maps").write_text("7f00-7f01 r-xp 0 0:0 1 %s/triton/x/k.so\n" % (root / "vllm" / fps[2]))
    (proc / "self").mkdir()
    dry = _kcache_gc.gc(str(root), "vllm", keep=2, in_use=[fps[1]], proc_root=str(proc), check_mode=True)
    assert dry["removed"] == [] or all((root / "vllm" / f).exists() for f in fps)
    r = _kcache_gc.gc(str(root), "vllm", keep=2, in_use=[fps[1]], proc_root=str(proc))
    assert r["kept"] == [fps[4], fps[3]]
    assert sorted(r["protected"]) == sorted([fps[0], fps[1], fps[2]])
    assert r["removed"] == [] and r["mounted"] == sorted([fps[0], fps[2]])
    r = _kcache_gc.gc(str(root), "vllm", keep=1, in_use=[], proc_root=str(proc))
    assert r["removed"] == [fps[3], fps[1]]
    assert (root / "vllm" / fps[0]).exists() and (root / "vllm" / fps[2]).exists()
    assert not (root / "vllm" / fps[1]).exists()


def test_gc_removes_stale_partials_only_when_unlocked(tmp_path):
    root = tmp_path / "cache"
    stale = root / "vllm" / (".partial-%s-abc" % FP)
    stale.mkdir(parents=True)
    os.utime(stale, (1, 1))
    with _kcache.fingerprint_lock(str(root), "vllm", FP, 5):
        assert _kcache_gc.gc(str(root), "vllm", keep=1, proc_root=str(tmp_path))["removed_partials"] == []
    assert _kcache_gc.gc(str(root), "vllm", keep=1, proc_root=str(tmp_path))["removed_partials"] == [stale.name]
    assert not stale.exists()


VLLM_HIT = """\
INFO [backends.py:1105] Using cache directory: /cache/torch_compile/torch_compile_cache/ab12/rank_0_0/backbone for vLLM's torch.compile
INFO [backends.py:296] Directly load the compiled graph(s) for compile range (1, 2048) from the cache, took 0.412 s
"""
VLLM_RECOMPILE = """\
INFO Directly load AOT compilation from path /cache/torch_compile/torch_compile_cache/torch_aot_compile/x/rank_0_0/model
WARNING [decorators.py:334] Compiling model again due to a load failure from /cache/x, reason: Compile cache file corrupted.
"""


def test_log_report_hit_miss_unknown():
    assert _kcache_log.analyze_log(VLLM_HIT, "vllm", "/cache")["result"] == "hit"
    r = _kcache_log.analyze_log(VLLM_RECOMPILE, "vllm", "/cache")
    assert r["result"] == "miss" and r["poisoned"] and "load failure" in r["miss_lines"][0]
    # a "warm" start whose compile cache lived somewhere else is a miss
    r = _kcache_log.analyze_log(VLLM_HIT, "vllm", "/mnt/nvme/kc/vllm/" + FP)
    assert r["result"] == "miss" and r["cache_dirs_outside"]
    assert _kcache_log.analyze_log("INFO started\n", "vllm")["result"] == "unknown"
    sg = ("[2026] Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins)\n"
          "[2026] Config file not found at /x/triton_3_6_0/E=256.json. Fallback to triton version 3.5.1 and use "
          "MoE kernel config from /x/triton_3_5_1/E=256.json. Performance might be sub-optimal!\n")
    r = _kcache_log.analyze_log(sg, "sglang")
    assert r["result"] == "miss" and r["moe_fallback_lines"]


def test_fingerprint_name_validated(tmp_path):
    with pytest.raises(_kcache.KCacheError, match="fingerprint"):
        _kcache.fingerprint_dir(str(tmp_path), "vllm", "../../etc")


# A warm-up that writes a Triton-style cache entry: kernel files plus a __grp__ file naming them by
# absolute path, exactly what Triton's FileCacheManager.put_group writes.
TRITON_WRITER = r"""
import json, os
d = os.path.join(os.environ["TRITON_CACHE_DIR"], "KEYHASH")
os.makedirs(d)
paths = {}
for name, data in (("k.cubin", b"\x7fELF" * 64), ("k.json", b'{"name": "k"}')):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    paths[name] = os.path.join(d, name)
with open(os.path.join(d, "__grp__k.json"), "w") as f:
    json.dump({"child_paths": paths}, f)
"""


def group_paths(cache_dir):
    with open(os.path.join(cache_dir, "triton", "KEYHASH", "__grp__k.json")) as f:
        return sorted(json.load(f)["child_paths"].values())


def test_triton_groups_follow_the_directory(tmp_path):
    """Triton ignores a group whose absolute member paths do not exist: publish, copy and checkout relocate them."""
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    w = {"command": [sys.executable, "-c", TRITON_WRITER], "mode": "run", "timeout": 30}
    r = _kcache_build.prebuild(str(node_a), "vllm", FP, COMPONENTS, w)
    final_a = r["cache_dir"]
    assert group_paths(final_a) == [os.path.join(final_a, "triton", "KEYHASH", n) for n in ("k.cubin", "k.json")]
    assert all(os.path.exists(p) for p in group_paths(final_a))
    _kcache_build.sync(str(node_a), str(node_b), "vllm", FP, COMPONENTS)
    final_b = str(node_b / "vllm" / FP)
    assert all(p.startswith(final_b + "/") and os.path.exists(p) for p in group_paths(final_b))
    # mounted at /cache inside a container: the engine's copy is rewritten for it, the published dir is not
    published = group_paths(final_b)
    r = _kcache_build.checkout(str(node_b), "vllm", FP, COMPONENTS, mount_path="/cache")
    assert r["status"] == "copied" and r["relocated_files"] == 1
    assert group_paths(r["engine_dir"]) == ["/cache/triton/KEYHASH/k.cubin", "/cache/triton/KEYHASH/k.json"]
    assert group_paths(final_b) == published
    assert _kcache.restore(str(node_b), "vllm", FP, COMPONENTS)["status"] == "hit"
    again = _kcache_build.checkout(str(node_b), "vllm", FP, COMPONENTS, mount_path="/cache")
    assert again["status"] == "ready" and again["relocated_files"] == 0 and not again["changed"]
    # a group that names other members is still tampering
    grp = os.path.join(final_b, "triton", "KEYHASH", "__grp__k.json")
    with open(grp, "w") as f:
        json.dump({"child_paths": {"k.cubin": "/cache/triton/KEYHASH/evil.cubin"}}, f)
    assert _kcache.verify_dir(final_b, FP, COMPONENTS)["status"] == "tampered"


def test_analyze_log_judges_only_the_latest_start():
    from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache_log

    old = ("==== 2026-11-29T23:52:00Z starting: python -m vllm.entrypoints.openai.api_server\n"
           "INFO [decorators.py:743] [backbone] saved AOT compiled function to /root/.cache/vllm/x\n"
           "Compiling model again due to a load failure\n"
           "==== 2026-11-29T23:59:00Z exited: returncode=0\n")
    new = "==== 2026-11-30T00:30:00Z starting: python -m vllm.entrypoints.openai.api_server\nINFO ready\n"
    both = _kcache_log.analyze_log(old + new, "vllm")
    assert both["miss_lines"] == []
    assert _kcache_log.analyze_log(old, "vllm")["result"] == "miss"
