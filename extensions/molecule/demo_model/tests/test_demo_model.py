"""demo_model: one published revision whose name is its content, files matching SHA256SUMS, loadable shards."""
from __future__ import annotations

import hashlib


def revision(tree, root):
    rev, hidden = tree.only_entry(root + "/shared/models/tiny-llama", "revision")
    assert hidden == [], "left-over build directories: %s" % hidden
    return rev, "%s/shared/models/tiny-llama/%s" % (root, rev)


def test_the_revision_is_named_by_its_checksums(host, tree, root):
    rev, path = revision(tree, root)
    assert hashlib.sha256(host.file(path + "/SHA256SUMS").content).hexdigest()[:12] == rev
    d = host.file(path)
    assert d.is_directory and d.mode == 0o755


def test_every_file_matches_sha256sums_and_nothing_else_is_there(host, tree, root):
    rev, path = revision(tree, root)
    sums = tree.sha256sums(path + "/SHA256SUMS")
    assert tree.files_below(path) == sorted(list(sums) + ["SHA256SUMS"])
    for name, digest in sums.items():
        f = host.file("%s/%s" % (path, name))
        assert f.is_file and not f.is_symlink, name
        assert f.sha256sum == digest, name
        assert f.mode & 0o022 == 0, "%s is writable by others (mode %o)" % (name, f.mode)


def test_the_index_names_shards_whose_headers_hold_those_tensors(tree, root):
    rev, path = revision(tree, root)
    weight_map = tree.json(path + "/model.safetensors.index.json")["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert shards == ["model-%05d-of-00003.safetensors" % (i + 1) for i in range(3)]  # demo_model_num_shards: 3
    for shard in shards:
        header = tree.safetensors_header("%s/%s" % (path, shard))
        assert sorted(k for k in header if k != "__metadata__") == sorted(t for t, s in weight_map.items() if s == shard)
    config = tree.json(path + "/config.json")
    assert (config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]) == (128, 2, 2)
    assert tree.json(path + "/tokenizer.json")["model"]["type"] == "BPE"
