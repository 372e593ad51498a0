"""An engine never mutates a published fingerprint directory: it starts on its own copy (checkout), what it
compiles while starting is reported as new_files, and the published directory stays byte-identical."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build
from ansible_collections.llmops.serving.plugins.modules import kernel_cache

FP = "0123456789abcdef"
COMPONENTS = {"engine": "vllm", "engine_version": "0.32.0", "tp": 8, "torch": "2.9.0"}

WARMUP = r"""
import os
for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT"):
    d = os.path.join(os.environ[var], "k")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "kernel.bin"), "wb") as f:
        f.write(var.encode() * 100)
"""

# What inductor did in the field: a start from another torch installation compiles its C++ kernels again
# (the source embeds the torch include path), adding new entries and rewriting one it had loaded. The
# fake engine writes through the cache variables it was given, like the real one, then keeps running.
ENGINE = r"""
import os, sys, time
inductor = os.environ["TORCHINDUCTOR_CACHE_DIR"]
os.makedirs(os.path.join(inductor, "cpp"), exist_ok=True)
with open(os.path.join(inductor, "cpp", "kernel_other_torch.so"), "wb") as f:
    f.write(b"\x7fELF compiled against /other/checkout/.venv/lib/python3.11/site-packages/torch/include")
if sys.argv[1] == "rewrite":
    with open(os.path.join(inductor, "k", "kernel.bin"), "wb") as f:
        f.write(b"recompiled in place")
print("ready", flush=True)
if sys.argv[2] == "stay":
    time.sleep(60)
"""


def snapshot(path):
    """Every name and byte below ``path``: what 'byte-identical' means here."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), path) + "/"] = None
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = (f.read(), os.stat(full).st_mtime_ns)
    return out


@pytest.fixture
def published(tmp_path):
    root = tmp_path / "kc"
    w = {"command": [sys.executable, "-c", WARMUP], "mode": "run", "timeout": 60}
    r = _kcache_build.prebuild(str(root), "vllm", FP, COMPONENTS, w)
    return {"root": str(root), "dir": r["cache_dir"]}


def start_engine(env, how="add", stay="exit"):
    p = subprocess.Popen([sys.executable, "-c", ENGINE, how, stay], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, **env))
    assert p.stdout.readline().strip() == "ready"
    if stay == "exit":
        assert p.wait(30) == 0
    return p


def test_an_engine_writing_into_its_cache_leaves_the_published_dir_byte_identical(published):
    before = snapshot(published["dir"])
    co = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    assert co["status"] == "copied" and co["changed"] and co["file_count"] == 3
    engine_dir = co["engine_dir"]
    assert engine_dir != published["dir"] and not engine_dir.startswith(published["dir"] + "/")
    env = _kcache.cache_env("vllm", engine_dir)
    start_engine(env, "rewrite")
    assert snapshot(published["dir"]) == before
    rep = _kcache_build.start_report(published["root"], "vllm", FP, "INFO engine started\n")
    assert rep["result"] == "miss" and rep["published_unchanged"] and rep["engine_dir"] == engine_dir
    assert [(f["path"], f["change"]) for f in rep["new_files"]] == [
        ("inductor/cpp/kernel_other_torch.so", "added"), ("inductor/k/kernel.bin", "changed")]
    assert rep["new_file_count"] == 2 and rep["new_bytes"] == sum(f["size"] for f in rep["new_files"]) > 0
    assert "2 new or changed files" in rep["miss_lines"][-1]
    # rewritten published kernels say the fingerprint misses an input: publish only as a new fingerprint
    assert rep["worth_publishing"] and "does not record" in rep["publish_advice"]
    assert _kcache.restore(published["root"], "vllm", FP, COMPONENTS, allow_extra=False)["status"] == "hit"


def test_an_engine_pointed_at_the_published_dir_despite_a_copy_is_still_a_miss(published):
    _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    start_engine(_kcache.cache_env("vllm", published["dir"]), "add")
    rep = _kcache_build.start_report(published["root"], "vllm", FP, "INFO engine started\n")
    assert rep["result"] == "miss" and not rep["published_unchanged"] and rep["new_files"] == []
    assert "published directory changed during start" in rep["miss_lines"][-1]
    assert "not in manifest: inductor/cpp/kernel_other_torch.so" in rep["problems"][0]


def test_added_kernels_only_are_worth_publishing_and_a_clean_start_is_a_hit(published):
    co = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    log = "INFO Directly load the compiled graph(s) for compile range (1, 2048) from the cache, took 0.4 s\n"
    rep = _kcache_build.start_report(published["root"], "vllm", FP, log)
    assert rep["result"] == "hit" and rep["new_files"] == [] and not rep["worth_publishing"]
    start_engine(_kcache.cache_env("vllm", co["engine_dir"]), "add")
    rep = _kcache_build.start_report(published["root"], "vllm", FP, log)
    assert rep["result"] == "miss" and [f["change"] for f in rep["new_files"]] == ["added"]
    assert rep["worth_publishing"] and "warm-up did not compile" in rep["publish_advice"]
    poisoned = log + "ERROR failed to compile: corrupted compilation artifact\n"
    assert not _kcache_build.start_report(published["root"], "vllm", FP, poisoned)["worth_publishing"]


def test_a_running_engine_keeps_its_copy_and_a_stopped_ones_copy_is_replaced(published):
    co = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    engine_dir = co["engine_dir"]
    again = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    assert again["status"] == "ready" and not again["changed"] and again["engine_dir"] == engine_dir
    p = start_engine(_kcache.cache_env("vllm", engine_dir), "add", stay="stay")
    try:
        # the engine's environment points into its copy: the copy is in use and left exactly as it is
        for check_mode in (True, False):
            r = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS, check_mode=check_mode)
            assert r["status"] == "in_use" and not r["changed"] and r["in_use_by"][0]["pid"] == p.pid
        assert os.path.isfile(os.path.join(engine_dir, "inductor", "cpp", "kernel_other_torch.so"))
    finally:
        p.kill()
        p.wait()
    dry = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS, check_mode=True)
    assert dry["status"] == "would_copy" and dry["changed"]
    r = _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    assert r["status"] == "copied" and [f["path"] for f in r["discarded_files"]] == ["inductor/cpp/kernel_other_torch.so"]
    assert not os.path.exists(os.path.join(engine_dir, "inductor", "cpp"))
    assert _kcache_build.start_report(published["root"], "vllm", FP, "")["new_files"] == []


def test_checkout_refuses_an_unverified_directory_and_a_bad_instance(published, tmp_path):
    with pytest.raises(_kcache.KCacheError, match="instance"):
        _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS, instance="../escape")
    with pytest.raises(_kcache.KCacheError, match="checkout: .* not a verified cache .*missing"):
        _kcache_build.checkout(str(tmp_path / "empty"), "vllm", FP, COMPONENTS)
    with open(os.path.join(published["dir"], "triton", "k", "kernel.bin"), "ab") as f:
        f.write(b"tampered")
    with pytest.raises(_kcache.KCacheError, match="tampered"):
        _kcache_build.checkout(published["root"], "vllm", FP, COMPONENTS)
    assert not os.path.exists(_kcache.run_dir(published["root"], "vllm", FP))


def test_module_checkout_and_report_point_the_engine_at_its_copy(run_module, published, tmp_path):
    base = dict(cache_root=published["root"], engine="vllm", fingerprint=FP, instance="engine-a")
    co = run_module(kernel_cache, dict(base, operation="checkout", components=COMPONENTS, mount_path="/cache"))
    assert not co.get("failed"), co
    assert co["status"] == "copied" and co["changed"] and co["cache_dir"] == published["dir"]
    assert co["engine_dir"].endswith("/vllm/.run/%s-engine-a" % FP)
    assert co["env"]["TORCHINDUCTOR_CACHE_DIR"] == "/cache/inductor"
    local = run_module(kernel_cache, dict(base, operation="checkout", components=COMPONENTS))
    assert local["status"] == "ready" and local["env"]["TRITON_CACHE_DIR"] == co["engine_dir"] + "/triton"
    start_engine(local["env"], "add")
    log = tmp_path / "engine.log"
    log.write_text("INFO engine started\n")
    rep = run_module(kernel_cache, dict(base, operation="report", log_path=str(log)))
    assert not rep.get("failed"), rep
    assert rep["status"] == "miss" and rep["engine_dir"] == co["engine_dir"] and not rep["changed"]
    assert rep["details"]["new_files"][0]["path"] == "inductor/cpp/kernel_other_torch.so"
    assert rep["details"]["published_unchanged"] is True and rep["details"]["worth_publishing"] is True
