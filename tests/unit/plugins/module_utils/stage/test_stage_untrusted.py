"""model_stage reads what src and dest hold through the shared reader: a FIFO, a device or a symlink in a file's
place is a clean refusal naming the file, never a hang; a hostile index or manifest is a clean error."""
from __future__ import annotations

import hashlib
import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_plan
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify
from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang


def listed(root, rel, size=0):
    return {"path": rel, "size": size, "dev": 0, "ino": 0, "mtime_ns": 0, "ctime_ns": 0}


@pytest.mark.parametrize("name", ["model-00001.safetensors", _safetensors.INDEX_NAME])
def test_verify_source_refuses_a_fifo_shard_or_index_without_blocking(tmp_path, name):
    os.mkfifo(tmp_path / name)
    box = no_hang(lambda: _stage_verify.verify_source(str(tmp_path), [listed(tmp_path, name, 64)], "headers"))
    err = box.get("error")
    assert isinstance(err, _safetensors.CheckpointError), box
    assert err.path == str(tmp_path / name) and "FIFO" in err.reason


def test_verify_source_refuses_a_nested_index_cleanly(tmp_path):
    (tmp_path / _safetensors.INDEX_NAME).write_text('{"weight_map": %s}' % ("[" * 50000 + "]" * 50000))
    with pytest.raises(_safetensors.CheckpointError) as e:
        _stage_verify.verify_source(str(tmp_path), [listed(tmp_path, _safetensors.INDEX_NAME)], "headers")
    assert "nests deeper than 64 levels" in e.value.reason


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_checksums_manifest_that_is_not_a_file_is_refused_without_blocking(tmp_path, kind):
    sums = tmp_path / "SHA256SUMS"
    if kind == "fifo":
        os.mkfifo(sums)
    else:
        sums.symlink_to("/dev/zero")
    err = no_hang(lambda: _stage_marker.load_checksums(str(sums))).get("error")
    assert isinstance(err, _stage_marker.StageError)
    assert str(err).startswith("checksums: %s is not a regular file" % sums)
    assert err.file == str(sums) and err.reason == "not_regular"


def test_checksums_manifest_over_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(_stage_marker, "MAX_CHECKSUMS_BYTES", 100)
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(("0" * 64 + "  a.bin\n") * 3)
    with pytest.raises(_stage_marker.StageError) as e:
        _stage_marker.load_checksums(str(sums))
    assert "over 100 bytes" in str(e.value) and e.value.reason == "too_large"


def test_published_copy_is_hashed_only_as_a_regular_file(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc" * 1000)
    assert _stage_plan._sha256_copy(str(f)) == hashlib.sha256(b"abc" * 1000).hexdigest()
    fifo = tmp_path / "b.bin"
    os.mkfifo(fifo)
    err = no_hang(lambda: _stage_plan._sha256_copy(str(fifo))).get("error")
    assert isinstance(err, _safetensors.CheckpointError) and "FIFO" in err.reason
    link = tmp_path / "c.bin"
    link.symlink_to(f)
    with pytest.raises(_safetensors.CheckpointError, match="symlink"):
        _stage_plan._sha256_copy(str(link))


def test_journal_in_place_of_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / _stage_marker.JOURNAL)
    err = no_hang(lambda: _stage_marker.Journal(str(tmp_path), "/src")).get("error")
    # no reader: the non-blocking open fails at once (ENXIO) instead of waiting for one
    assert isinstance(err, _stage_marker.StageError) and err.reason == "not_regular", err
    assert str(err).startswith("dest: %s is not a regular file" % (tmp_path / _stage_marker.JOURNAL))
    rfd = os.open(tmp_path / _stage_marker.JOURNAL, os.O_RDONLY | os.O_NONBLOCK)
    try:
        err = no_hang(lambda: _stage_marker.Journal(str(tmp_path), "/src")).get("error")
    finally:
        os.close(rfd)
    assert isinstance(err, _stage_marker.StageError) and err.reason == "not_regular"


def test_journal_is_appended_to_as_a_regular_file(tmp_path):
    j = _stage_marker.Journal(str(tmp_path), "/src")
    rec = _stage_marker.FileRecord("a.bin", 3, (1, 2, 3, 4), (5, 3, 6, 7), "size")
    j.append(rec)
    j.close()
    assert sorted(_stage_marker.partial_records(str(tmp_path))) == ["a.bin"]
