"""demo_model: deterministic, content-addressed, atomic, idempotent."""
from __future__ import annotations

import hashlib
import json
import os
import struct

from ansible_collections.llmops.serving.plugins.modules import demo_model


def _tree(path):
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_same_inputs_give_bit_identical_files(run_module, tmp_path):
    a = run_module(demo_model, {"models_root": str(tmp_path / "a")})
    b = run_module(demo_model, {"models_root": str(tmp_path / "b")})
    assert a["changed"] and b["changed"]
    assert a["revision"] == b["revision"]
    assert _tree(a["path"]) == _tree(b["path"])
    assert a["path"] == str(tmp_path / "a" / "tiny-llama" / a["revision"])


def test_revision_follows_content(run_module, tmp_path):
    a = run_module(demo_model, {"models_root": str(tmp_path), "seed": 0})
    b = run_module(demo_model, {"models_root": str(tmp_path), "seed": 1})
    assert a["revision"] != b["revision"]
    assert sorted(os.listdir(tmp_path / "tiny-llama")) == sorted([a["revision"], b["revision"]])


def test_layout_index_and_checksums(run_module, tmp_path):
    r = run_module(demo_model, {"models_root": str(tmp_path), "num_shards": 3})
    d = r["path"]
    shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    assert len(shards) == 3
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    assert set(index["weight_map"].values()) == set(shards)
    # every tensor named in the index is in the header of the shard the index names
    for shard in shards:
        with open(os.path.join(d, shard), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        named = {t for t, s in index["weight_map"].items() if s == shard}
        assert named == set(header) - {"__metadata__"}
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    with open(os.path.join(d, "SHA256SUMS")) as f:
        for line in f:
            digest, name = line.split()
            assert _tree(d)[name] == digest
    assert r["revision"] == hashlib.sha256(open(os.path.join(d, "SHA256SUMS"), "rb").read()).hexdigest()[:12]


def test_rerun_is_unchanged_and_repairs_a_damaged_copy(run_module, tmp_path):
    r1 = run_module(demo_model, {"models_root": str(tmp_path)})
    r2 = run_module(demo_model, {"models_root": str(tmp_path)})
    assert r1["changed"] and not r2["changed"]
    shard = os.path.join(r1["path"], "model-00001-of-00003.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(100)
    r3 = run_module(demo_model, {"models_root": str(tmp_path)})
    assert r3["changed"]
    assert _tree(r1["path"]) == _tree(run_module(demo_model, {"models_root": str(tmp_path / "fresh")})["path"])
    assert not [n for n in os.listdir(tmp_path / "tiny-llama") if n.startswith(".partial")]


def test_check_mode_writes_nothing(run_module, tmp_path):
    r = run_module(demo_model, {"models_root": str(tmp_path / "m")}, check_mode=True)
    assert r["changed"]
    assert not (tmp_path / "m").exists()


def test_bad_shape_is_refused_naming_the_field(run_module, tmp_path):
    r = run_module(demo_model, {"models_root": str(tmp_path), "hidden_size": 130, "num_heads": 4})
    assert r["failed"] and r["msg"].startswith("hidden_size:")
    r = run_module(demo_model, {"models_root": str(tmp_path), "num_shards": 0})
    assert r["failed"] and r["msg"].startswith("num_shards:")
    assert not (tmp_path / "tiny-llama").exists()


def test_manifest_or_shard_replaced_by_a_fifo_or_link_is_regenerated_without_blocking(run_module, tmp_path):
    """Before: a FIFO in SHA256SUMS's place hung the module; a symlink of the right size counted as the file."""
    import threading
    r1 = run_module(demo_model, {"models_root": str(tmp_path)})
    expected = _tree(r1["path"])
    sums = os.path.join(r1["path"], "SHA256SUMS")
    os.unlink(sums)
    os.mkfifo(sums)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=run_module(demo_model, {"models_root": str(tmp_path)})),
                         daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "demo_model blocked on a FIFO"
    assert box["r"]["changed"] and _tree(r1["path"]) == expected
    shard = os.path.join(r1["path"], "model-00001-of-00003.safetensors")
    real = str(tmp_path / "elsewhere")
    os.rename(shard, real)
    os.symlink(real, shard)
    assert run_module(demo_model, {"models_root": str(tmp_path)})["changed"]
    assert not os.path.islink(shard) and _tree(r1["path"]) == expected
