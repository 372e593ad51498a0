"""Kernel-cache manifests are read as untrusted input: every path stays inside its directory, and a
manifest of the wrong shape quarantines its directory instead of failing every run with a traceback."""
from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build, _kcache_gc
from ansible_collections.llmops.serving.plugins.modules import kernel_cache

FP = "0123456789abcdef"
COMPONENTS = {"engine": "vllm", "engine_version": "0.32.0", "tp": 8}
WRITER = ("import os\n"
          "for var in ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR'):\n"
          "    d = os.path.join(os.environ[var], 'k')\n"
          "    os.makedirs(d, exist_ok=True)\n"
          "    open(os.path.join(d, 'kernel.bin'), 'wb').write(var.encode() * 100)\n")


def build(root):
    w = {"command": [sys.executable, "-c", WRITER], "mode": "run", "timeout": 60}
    return _kcache_build.prebuild(str(root), "vllm", FP, COMPONENTS, w, host="builder")


def rewrite_manifest(d, change):
    path = os.path.join(str(d), "manifest.json")
    with open(path) as f:
        man = json.load(f)
    man = change(man)
    with open(path, "w") as f:
        if isinstance(man, str):
            f.write(man)
        else:
            json.dump(man, f)


def sha(data):
    return hashlib.sha256(data).hexdigest()


def add_entry(rel, data):
    def change(man):
        man["files"].append({"path": rel, "size": len(data), "sha256": sha(data)})
        return man
    return change


# ---- class 1: paths read from manifest.json are contained ------------------------------------------------

@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_bytes(b"a file outside every cache root\n")
    return v


def escaping_entries(tmp_path, victim):
    # store/vllm/<fp>/../../../victim.txt and node/vllm/.partial-*/../../../victim.txt are the same file
    return {"dotdot": "../../../victim.txt", "absolute": str(victim)}


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_sync_never_reads_or_truncates_a_file_outside_the_roots(tmp_path, victim, kind):
    store, node = tmp_path / "store", tmp_path / "node"
    build(store)
    before = victim.read_bytes()
    rel = escaping_entries(tmp_path, victim)[kind]
    rewrite_manifest(store / "vllm" / FP, add_entry(rel, before))
    with pytest.raises(_kcache.KCacheError, match=r"source_root: .*bad_manifest.*files\[\d\]\.path"):
        _kcache_build.sync(str(store), str(node), "vllm", FP, COMPONENTS)
    assert victim.read_bytes() == before
    assert not (node / "vllm").exists()  # refused before anything was created


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_verify_does_not_vouch_for_a_file_outside_the_directory(tmp_path, victim, kind):
    root = tmp_path / "node"
    build(root)
    rel = escaping_entries(tmp_path, victim)[kind]
    rewrite_manifest(root / "vllm" / FP, add_entry(rel, victim.read_bytes()))
    r = _kcache.restore(str(root), "vllm", FP, COMPONENTS)
    assert r["status"] == "quarantined" and r["verify"]["status"] == "bad_manifest"
    assert "files[2].path" in r["verify"]["problems"][0]
    assert victim.exists() and not (root / "vllm" / FP).exists()


def test_a_symlink_on_the_way_is_refused_never_followed(tmp_path):
    store, node = tmp_path / "store", tmp_path / "node"
    build(store)
    secret = tmp_path / "root-only.key"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
    d = store / "vllm" / FP
    os.symlink(str(secret), str(d / "triton" / "k" / "leak.bin"))
    rewrite_manifest(d, add_entry("triton/k/leak.bin", secret.read_bytes()))
    ver = _kcache.verify_dir(str(d), FP, COMPONENTS, allow_extra=False)
    assert ver["status"] == "tampered" and any("symlink" in p for p in ver["problems"])
    with pytest.raises(_kcache.KCacheError, match="source_root"):
        _kcache_build.sync(str(store), str(node), "vllm", FP, COMPONENTS)
    assert not (node / "vllm" / FP).exists()
    # a directory symlink inside the cache is seen too, not silently skipped
    os.unlink(str(d / "triton" / "k" / "leak.bin"))
    rewrite_manifest(d, lambda m: dict(m, files=[f for f in m["files"] if f["path"] != "triton/k/leak.bin"]))
    os.symlink(str(tmp_path), str(d / "triton" / "elsewhere"))
    ver = _kcache.verify_dir(str(d), FP, COMPONENTS, allow_extra=False)
    assert not ver["ok"] and "not in manifest: triton/elsewhere" in ver["problems"]


# ---- class 10: a manifest of the wrong shape is quarantined, never a traceback ---------------------------

BAD_MANIFESTS = {
    "entry without sha256": lambda m: dict(m, files=[{"path": f["path"], "size": f["size"]} for f in m["files"]]),
    "entry without path": lambda m: dict(m, files=[{"size": 1, "sha256": "0" * 64}]),
    "entry without size": lambda m: dict(m, files=[{"path": f["path"], "sha256": f["sha256"]} for f in m["files"]]),
    "entry not an object": lambda m: dict(m, files=[1, 2]),
    "size a string": lambda m: dict(m, files=[dict(f, size=str(f["size"])) for f in m["files"]]),
    "sha256 null": lambda m: dict(m, files=[dict(f, sha256=None) for f in m["files"]]),
    "components a list": lambda m: dict(m, components=["vllm"]),
    "nested too deeply": lambda m: "[" * 100000 + "]" * 100000,
}


@pytest.mark.parametrize("name", sorted(BAD_MANIFESTS))
def test_malformed_manifest_is_quarantined_then_rebuilt(tmp_path, name):
    root = tmp_path / "node"
    build(root)
    rewrite_manifest(root / "vllm" / FP, BAD_MANIFESTS[name])
    check = _kcache.restore(str(root), "vllm", FP, COMPONENTS, check_mode=True)
    assert check["status"] == "quarantined" and (root / "vllm" / FP).exists()
    r = _kcache.restore(str(root), "vllm", FP, COMPONENTS)
    assert r["status"] == "quarantined" and r["verify"]["status"] in ("bad_manifest", "no_manifest")
    assert os.path.isfile(r["quarantined_to"] + ".reason.json")
    # the next run builds a fresh directory instead of failing again
    assert build(root)["status"] == "built"
    assert _kcache.restore(str(root), "vllm", FP, COMPONENTS)["status"] == "hit"


@pytest.mark.parametrize("name", ["entry without sha256", "entry not an object", "components a list"])
def test_malformed_manifest_through_the_module_is_a_result_not_a_traceback(run_module, tmp_path, name):
    root = tmp_path / "node"
    build(root)
    rewrite_manifest(root / "vllm" / FP, BAD_MANIFESTS[name])
    args = dict(operation="verify", cache_root=str(root), engine="vllm", fingerprint=FP, components=COMPONENTS,
                proc_root=str(tmp_path / "no-proc"))
    r = run_module(kernel_cache, args)
    assert not r.get("failed"), r
    assert r["status"] == "quarantined" and r["changed"] and r["problems"]
    # a prebuild over such a directory replaces it too
    bad = tmp_path / "other"
    build(bad)
    rewrite_manifest(bad / "vllm" / FP, BAD_MANIFESTS[name])
    pre = dict(args, cache_root=str(bad), operation="prebuild", warmup_command=[sys.executable, "-c", WRITER])
    r = run_module(kernel_cache, pre)
    assert not r.get("failed"), r
    assert r["status"] == "built" and "/.quarantine/vllm-" in r["quarantined_to"]


def test_gc_orders_by_created_even_when_a_manifest_has_the_wrong_type(tmp_path):
    root = tmp_path / "cache"
    fps = ["%016x" % i for i in range(3)]
    for i, f in enumerate(fps):
        d = root / "vllm" / f
        d.mkdir(parents=True)
        created = 20260101 if i == 1 else "2026-01-0%dT00:00:00Z" % (i + 1)
        (d / "manifest.json").write_text(json.dumps({"fingerprint": f, "created": created, "files": []}))
        os.utime(str(d), (1, 1))
    r = _kcache_gc.gc(str(root), "vllm", keep=1, proc_root=str(tmp_path / "no-proc"))
    assert r["kept"] == [fps[2]] and sorted(r["removed"]) == sorted([fps[0], fps[1]])
