"""Kernel-cache gc keeps the newest caches by the order they were published on this node, never by a clock.

Before: gc sorted by the manifest's ``created`` (the builder's wall clock, or the shared store's for a synced
cache, since ``sync`` copied the manifest as it was) and then by mtime, so a cache built while the clock was a year
ahead stayed "newest" and gc removed the newer ones; an abandoned ``.partial-*`` was judged by this host's clock
against a time the filesystem wrote. Now ``_kcache.publish`` records ``sequence`` (``_clock``) and gc orders by it.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build, _kcache_gc
from ansible_collections.llmops.serving.plugins.modules import kernel_cache

YEAR = 365 * 86400
COMPONENTS = {"engine": "vllm", "engine_version": "0.32.0", "tp": 8}
FPS = ["%016x" % (0xa0 + i) for i in range(4)]
WRITER = r"""
import os
d = os.path.join(os.environ["TRITON_CACHE_DIR"], "k")
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "kernel.bin"), "wb") as f:
    f.write(b"kernel")
"""


def _build(tmp_path, root, fp):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    warmup = {"command": [sys.executable, str(script)], "mode": "run", "timeout": 60}
    res = _kcache_build.prebuild(str(root), "vllm", fp, COMPONENTS, warmup, label="t", host="h")
    assert res["status"] == "built"
    return res


def _manifest(root, fp):
    with open(os.path.join(str(root), "vllm", fp, _kcache.MANIFEST)) as f:
        return json.load(f)


def _published(root):
    return sorted(d for d in os.listdir(os.path.join(str(root), "vllm")) if d in FPS)


def test_a_cache_built_while_the_clock_was_a_year_ahead_does_not_outlive_newer_ones(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + YEAR)
    _build(tmp_path, root, FPS[0])
    monkeypatch.setattr(time, "time", real)
    _build(tmp_path, root, FPS[1])
    _build(tmp_path, root, FPS[2])
    res = _kcache_gc.gc(str(root), "vllm", keep=2, proc_root=str(tmp_path))
    assert res["kept"] == [FPS[2], FPS[1]] and res["removed"] == [FPS[0]]
    assert _published(root) == [FPS[1], FPS[2]]
    assert [_manifest(root, fp)["sequence"] for fp in FPS[1:3]] == [2, 3]


def test_a_synced_cache_takes_this_nodes_next_sequence_not_the_stores_time(tmp_path, monkeypatch):
    """The store built FPS[0] long ago (its ``created`` and mtimes say so); synced last, it is this node's newest."""
    store, node = tmp_path / "store", tmp_path / "node"
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 2 * YEAR)
    _build(tmp_path, store, FPS[0])
    monkeypatch.setattr(time, "time", real)
    _build(tmp_path, store, FPS[3])  # the store's sequence 2
    _build(tmp_path, node, FPS[1])
    _build(tmp_path, node, FPS[2])
    assert _kcache_build.sync(str(store), str(node), "vllm", FPS[0], COMPONENTS)["status"] == "copied"
    assert _kcache.restore(str(node), "vllm", FPS[0], COMPONENTS)["status"] == "hit"  # still verifies
    res = _kcache_gc.gc(str(node), "vllm", keep=2, proc_root=str(tmp_path))
    assert res["removed"] == [FPS[1]] and _published(node) == [FPS[0], FPS[2]]
    assert _manifest(node, FPS[0])["sequence"] == 3 and _manifest(store, FPS[0])["sequence"] == 1


def _fp_dir(root, fp, **fields):
    d = root / "vllm" / fp
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(dict({"fingerprint": fp, "files": []}, **fields)))


def test_manifests_without_a_valid_sequence_are_older_than_every_sequenced_one(tmp_path):
    root = tmp_path / "cache"
    _fp_dir(root, FPS[0], created="2099-01-01T00:00:00Z")                # legacy, "in the future"
    _fp_dir(root, FPS[1], created="2098-01-01T00:00:00Z", sequence="7")  # not a sequence: legacy
    _fp_dir(root, FPS[2], created="2020-01-01T00:00:00Z", sequence=1)
    _fp_dir(root, FPS[3], created="2019-01-01T00:00:00Z", sequence=2)
    res = _kcache_gc.gc(str(root), "vllm", keep=3, proc_root=str(tmp_path), check_mode=True)
    assert res["kept"] == [FPS[3], FPS[2], FPS[0]] and res["removed"] == [FPS[1]]


def test_publish_numbers_after_the_largest_sequence_beside_it(tmp_path):
    root = tmp_path / "cache"
    _fp_dir(root, FPS[0], sequence=41)
    _fp_dir(root, FPS[1])
    partial = root / "vllm" / ".partial-x"
    partial.mkdir()
    _kcache.write_manifest(str(partial), "vllm", FPS[2], COMPONENTS)
    assert _kcache.publish(str(partial), str(root / "vllm" / FPS[2]), str(root), "vllm") == 42
    assert _manifest(root, FPS[2])["sequence"] == 42 and not partial.exists()
    assert _kcache.manifest_sequence(str(root / "vllm" / FPS[1])) is None


def test_an_abandoned_partial_is_aged_by_the_filesystems_clock_not_this_hosts(tmp_path, monkeypatch):
    """Before: with this host's clock a year ahead, a build directory created a moment ago was a year old."""
    root = tmp_path / "cache"
    fresh = root / "vllm" / (".partial-%s-abc" % FPS[0])
    fresh.mkdir(parents=True)
    old = root / "vllm" / (".partial-%s-def" % FPS[1])
    old.mkdir()
    os.utime(str(old), (1, 1))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + YEAR)
    res = _kcache_gc.gc(str(root), "vllm", keep=1, proc_root=str(tmp_path))
    assert res["removed_partials"] == [old.name]
    assert fresh.exists() and not old.exists()


def test_an_in_use_entry_that_names_no_fingerprint_is_reported_and_the_module_warns(tmp_path, run_module):
    root = tmp_path / "cache"
    _fp_dir(root, FPS[0], sequence=1)
    typo = str(root / "vllm" / "deadbeefdeadbeef" / "triton")
    res = _kcache_gc.gc(str(root), "vllm", keep=1, in_use=[FPS[0], "0badf00d0badf00d", typo],
                        proc_root=str(tmp_path))
    assert res["unmatched_in_use"] == ["0badf00d0badf00d", typo]
    out = run_module(kernel_cache, dict(operation="gc", cache_root=str(root), engine="vllm", keep=1,
                                        in_use=["0badf00d0badf00d"], proc_root=str(tmp_path)))
    assert out["details"]["unmatched_in_use"] == ["0badf00d0badf00d"]
    assert any("in_use: '0badf00d0badf00d' names no fingerprint directory" in w for w in out["warnings"])
