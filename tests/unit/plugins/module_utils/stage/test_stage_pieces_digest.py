"""Per-piece sha256 digests from model_stage's copy engine (the chain of trust for pieces fetched from peers).

With ``piece_size`` set, every file the Copier copies gets the sha256 of each piece of the bytes it read from the
source, in every verify mode and on every copy path (O_DIRECT or buffered), from the one read; a resumed run gets
them for the files an earlier run completed by reading those copies back.
"""
from __future__ import annotations

import hashlib
import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_copy
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_progress
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError
from ansible_collections.llmops.serving.tests.lib import stage_synth

PIECE = 3 * _stage_copy.DIRECT_ALIGN  # not a power of two: pieces straddle every read buffer boundary
SIZES = {
    "empty.bin": 0,
    "small.bin": PIECE - 1,
    "one.bin": PIECE,
    "multiple.bin": 5 * PIECE,
    "multiple-plus-1.bin": 5 * PIECE + 1,
    "many.bin": 37 * PIECE + 1234,
}


def expected(data, piece):
    return [hashlib.sha256(data[i:i + piece]).hexdigest() for i in range(0, len(data), piece)]


make_tree = stage_synth.write_tree


def copier(src, partial, mode, piece, direct_io=True, streams=2, progress=None):
    return stage_synth.copier(src, partial, mode, streams, piece=piece, direct_io=direct_io, progress=progress)


def source_bytes(src, rel):
    with open(os.path.join(src, rel), "rb") as f:
        return f.read()


@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("mode", ["size", "headers", "sha256"])
def test_piece_digests_equal_sha256_of_source_slices(tmp_path, mode, direct_io):
    src, partial = make_tree(tmp_path, SIZES)
    files, c = copier(src, partial, mode, PIECE, direct_io=direct_io)
    c.run(files)
    assert sorted(c.piece_digests) == sorted(f["path"] for f in files)
    for f in files:
        data = source_bytes(src, f["path"])
        assert c.piece_digests[f["path"]] == expected(data, PIECE), f["path"]
    assert c.piece_digests["empty.bin"] == []
    assert len(c.piece_digests["multiple.bin"]) == 5 and len(c.piece_digests["multiple-plus-1.bin"]) == 6
    # the digests are of the bytes that were published: the copies are the source
    for f in files:
        assert source_bytes(partial, f["path"]) == source_bytes(src, f["path"])


def test_pieces_larger_than_the_read_buffer(tmp_path, monkeypatch):
    # production pieces (64 MiB) span several O_DIRECT buffers; the same here with a small buffer
    monkeypatch.setattr(_stage_copy, "DIRECT_BUF", 2 * _stage_copy.DIRECT_ALIGN)
    piece = 5 * _stage_copy.DIRECT_ALIGN
    src, partial = make_tree(tmp_path, {"a.bin": 3 * piece + 7, "b.bin": 2 * piece, "c.bin": piece - 3})
    files, c = copier(src, partial, "headers", piece)
    c.run(files)
    for f in files:
        assert c.piece_digests[f["path"]] == expected(source_bytes(src, f["path"]), piece), f["path"]


def test_no_piece_size_no_digests(tmp_path):
    src, partial = make_tree(tmp_path, {"a.bin": 2 * PIECE})
    files, c = copier(src, partial, "headers", None)
    c.run(files)
    assert c.piece_digests == {} and "a.bin" in c.records


class CancelAfter(_stage_progress.Progress):
    """Progress that cancels the copy once ``limit`` bytes are done (a run killed mid-file)."""

    def __init__(self, limit, *args):
        super().__init__(None, *args)
        self.limit, self.copier = limit, None

    def add(self, nbytes=0, files=0):
        super().add(nbytes, files)
        if self.bytes_done >= self.limit:
            self.copier.cancel.set()


@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
def test_resumed_run_has_digests_for_every_piece(tmp_path, monkeypatch, direct_io):
    monkeypatch.setattr(_stage_copy, "DIRECT_BUF", 4 * _stage_copy.DIRECT_ALIGN)
    monkeypatch.setattr(_stage_copy, "HASH_BUF", 4 * _stage_copy.DIRECT_ALIGN)
    sizes = {"big.bin": 40 * PIECE + 5, "mid.bin": 20 * PIECE, "small.bin": PIECE + 1}
    src, partial = make_tree(tmp_path, sizes)
    total = sum(sizes.values()) + os.path.getsize(os.path.join(src, "SHA256SUMS"))
    # run 1: one stream, biggest first; cancelled part way through mid.bin, after big.bin completed
    progress = CancelAfter(sizes["big.bin"] + 7 * PIECE, partial, total, 4)
    files, first = copier(src, partial, "headers", PIECE, direct_io=direct_io, streams=1, progress=progress)
    progress.copier = first
    with pytest.raises(StageError, match="cancelled"):
        first.run(files)
    done = sorted(first.records)
    assert done == ["big.bin"]
    assert not os.path.exists(os.path.join(partial, "mid.bin" + _stage_copy.PART_SUFFIX))
    # run 2 copies the rest and reads back the piece digests of what run 1 completed
    files, second = copier(src, partial, "headers", PIECE, direct_io=direct_io)
    second.run([f for f in files if f["path"] not in done])
    second.digest_copies(done)
    assert sorted(second.piece_digests) == sorted(f["path"] for f in files)
    for f in files:
        assert second.piece_digests[f["path"]] == expected(source_bytes(src, f["path"]), PIECE), f["path"]


@pytest.mark.parametrize("bad", [0, -4096, 1000, 4097, True, 4096.0, "64MiB"])
def test_piece_size_must_be_a_positive_multiple_of_the_alignment(tmp_path, bad):
    src, partial = make_tree(tmp_path, {"a.bin": 10})
    with pytest.raises(StageError, match="piece_size: must be a positive multiple of 4096"):
        copier(src, partial, "size", bad)
