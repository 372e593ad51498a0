"""model_stage's copy engine keeps the device busy: reads overlap writes within a stream, big files are split into
ranges that several streams copy at once, and every guarantee of a whole-file copy holds for a split one."""
from __future__ import annotations

import errno
import hashlib
import os
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_copy
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError
from ansible_collections.llmops.serving.tests.lib import stage_synth

BLOCK = 4 * _stage_copy.DIRECT_ALIGN


@pytest.fixture
def small_blocks(monkeypatch):
    """Small buffers and ranges, so a few hundred KiB exercise what 700 GiB does."""
    monkeypatch.setattr(_stage_copy, "DIRECT_BUF", BLOCK)
    monkeypatch.setattr(_stage_copy, "RANGE", 3 * BLOCK)


make_tree = stage_synth.write_tree


def copier(src, partial, mode, streams, piece=None, direct_io=True, journal=None):
    return stage_synth.copier(src, partial, mode, streams, piece=piece, direct_io=direct_io, journal=journal)


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("mode", ["size", "headers", "sha256"])
def test_split_files_are_byte_identical_recorded_and_journaled(tmp_path, small_blocks, mode, direct_io):
    sizes = {"big.bin": 10 * BLOCK + 123, "exact.bin": 6 * BLOCK, "one-range.bin": 3 * BLOCK, "tiny.bin": 5}
    src, partial = make_tree(tmp_path, sizes)
    journal = _stage_marker.Journal(partial, src)
    piece = 2 * _stage_copy.DIRECT_ALIGN
    files, c = copier(src, partial, mode, 4, piece=piece, direct_io=direct_io, journal=journal)
    if mode == "sha256":  # hashed in order by one stream
        assert c.ranges(10 * BLOCK + 123) == [(0, 10 * BLOCK + 123)]
    else:
        ranges = c.ranges(10 * BLOCK + 123)
        assert len(ranges) == 4 and ranges[0] == (0, 3 * BLOCK) and ranges[-1][1] == 10 * BLOCK + 123
        assert all(start % piece == 0 for start, dummy in ranges)
    c.run(files)
    journal.close()
    for f in files:
        data = read(os.path.join(src, f["path"]))
        assert read(os.path.join(partial, f["path"])) == data, f["path"]
        assert c.piece_digests[f["path"]] == [hashlib.sha256(data[i:i + piece]).hexdigest()
                                              for i in range(0, len(data), piece)]
        assert os.stat(os.path.join(partial, f["path"])).st_mtime_ns == f["mtime_ns"]
    assert sorted(c.records) == sorted(f["path"] for f in files)
    assert sorted(_stage_marker.partial_records(partial)) == sorted(f["path"] for f in files)
    assert not [n for n in os.listdir(partial) if n.endswith(_stage_copy.PART_SUFFIX)]
    if mode == "sha256":
        assert c.records["big.bin"].sha256 == hashlib.sha256(read(os.path.join(src, "big.bin"))).hexdigest()


@pytest.mark.parametrize("mode, peak", [("headers", 4), ("sha256", 1)])
def test_one_big_file_keeps_every_stream_busy(tmp_path, small_blocks, monkeypatch, mode, peak):
    src, partial = make_tree(tmp_path, {"only.bin": 24 * BLOCK})
    files, c = copier(src, partial, mode, 4)
    files = [f for f in files if f["path"] == "only.bin"]
    # hold each range until all four streams are in, so peak_streams shows them at once
    barrier = threading.Barrier(peak, timeout=10)
    real = _stage_copy.Copier._pipe

    def wait_for_all(self, fin, fout, start, end, *rest):
        if start == 0 or mode == "headers" and start < 4 * 3 * BLOCK:
            barrier.wait()
        return real(self, fin, fout, start, end, *rest)

    monkeypatch.setattr(_stage_copy.Copier, "_pipe", wait_for_all)
    c.run(files)
    assert c.peak_streams == peak
    assert read(os.path.join(partial, "only.bin")) == read(os.path.join(src, "only.bin"))


def test_reading_runs_ahead_of_writing_within_a_stream(tmp_path, small_blocks, monkeypatch):
    src, partial = make_tree(tmp_path, {"a.bin": 2 * BLOCK})
    # with a piece size the bytes go through the user-space loop even where O_DIRECT is refused
    files, c = copier(src, partial, "size", 1, piece=BLOCK)
    files = [f for f in files if f["path"] == "a.bin"]
    second_read = threading.Event()
    real_preadv, real_pwrite = os.preadv, os.pwrite

    def preadv(fd, bufs, offset):
        if offset >= BLOCK:
            second_read.set()
        return real_preadv(fd, bufs, offset)

    def pwrite(fd, data, offset):
        # the first block is not written until the second is being read: one read and one write in flight
        if offset == 0 and not second_read.wait(10):
            raise AssertionError("block 2 was not read while block 1 was being written")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "pwrite", pwrite)
    c.run(files)
    assert read(os.path.join(partial, "a.bin")) == read(os.path.join(src, "a.bin"))


def test_a_failed_range_cancels_the_file_and_leaves_nothing_half_written(tmp_path, small_blocks, monkeypatch):
    src, partial = make_tree(tmp_path, {"big.bin": 12 * BLOCK})
    files, c = copier(src, partial, "headers", 4)
    files = [f for f in files if f["path"] == "big.bin"]
    real = os.preadv

    def failing(fd, bufs, offset):
        if offset == 7 * BLOCK:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(StageError, match="copy of .*big.bin failed: .*Input/output error"):
        c.run(files)
    assert c.records == {} and os.listdir(partial) == []


def test_no_space_for_a_split_file_fails_before_copying(tmp_path, small_blocks, monkeypatch):
    src, partial = make_tree(tmp_path, {"big.bin": 12 * BLOCK})
    files, c = copier(src, partial, "size", 2)
    files = [f for f in files if f["path"] == "big.bin"]

    def full(fd, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_stage_copy, "_preallocate", full)
    with pytest.raises(StageError, match="no space left on device while writing .*big.bin"):
        c.run(files)
    assert c.progress.bytes_done == 0 and os.listdir(partial) == []


def _checkpoint(tmp_path, tensors_per_shard=4):
    """A 2-shard checkpoint in ``shared/rev`` and an empty ``nvme/rev.partial``; ``(src, partial)``."""
    src = os.path.join(str(tmp_path), "shared", "rev")
    stage_synth.write_checkpoint(src, 64 * BLOCK, shards=2, tensors_per_shard=tensors_per_shard, seed=5)
    partial = os.path.join(str(tmp_path), "nvme", "rev.partial")
    os.makedirs(partial)
    return src, partial


@pytest.mark.parametrize("mode", ["headers", "sha256"])
def test_a_copy_header_is_checked_in_the_buffers_it_was_written_from(tmp_path, monkeypatch, mode):
    # one-block buffers and two-block ranges: a header of ~9 KiB spans buffers and ranges
    monkeypatch.setattr(_stage_copy, "DIRECT_BUF", _stage_copy.DIRECT_ALIGN)
    monkeypatch.setattr(_stage_copy, "RANGE", 2 * _stage_copy.DIRECT_ALIGN)
    src, partial = _checkpoint(tmp_path, tensors_per_shard=100)
    files, c = copier(src, partial, mode, 4)
    shards = [f["path"] for f in files if f["path"].endswith(".safetensors")]
    assert all(len(c.headers[s]) + 8 > 2 * _stage_copy.DIRECT_ALIGN for s in shards)

    def read_back(*args):
        raise AssertionError("the copy's header was read back from disk")

    monkeypatch.setattr(_stage_copy._verify, "check_copy_header", read_back)
    c.run(files)
    for f in files:
        assert read(os.path.join(partial, f["path"])) == read(os.path.join(src, f["path"])), f["path"]
    assert sorted(c.records) == sorted(f["path"] for f in files)


def test_a_header_that_differs_from_the_one_read_before_the_copy_fails_that_file(tmp_path, monkeypatch):
    src, partial = _checkpoint(tmp_path)
    files, c = copier(src, partial, "headers", 2)
    shard = sorted(c.headers)[0]
    raw = c.headers[shard]
    # as if src's header had changed between its check and the copy (same length, one byte off)
    c.headers[shard] = raw[:-2] + (b"x" if raw[-2:-1] != b"x" else b"y") + raw[-1:]
    writes = []
    real = os.pwrite

    def pwrite(fd, data, offset):
        writes.append((os.path.basename(os.readlink("/proc/self/fd/%d" % fd)), offset))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(_stage_copy._safetensors.CheckpointError,
                       match=r"%s%s: header differs from the source file's header"
                       % (shard.replace(".", r"\."), _stage_copy.PART_SUFFIX)):
        c.run(files)
    # refused in the buffer, before it was written; the file is gone, the other shard is untouched
    assert (shard + _stage_copy.PART_SUFFIX, 0) not in writes
    assert shard not in c.records
    assert not [n for n in os.listdir(partial) if n.startswith(shard)]


def test_a_kernel_copy_reads_the_copy_header_back(tmp_path, monkeypatch):
    # direct_io off and nothing to hash: copy_file_range, no buffers, so the header is read back from the copy
    src, partial = _checkpoint(tmp_path)
    files, c = copier(src, partial, "headers", 2, direct_io=False)
    checked = []
    real = _stage_copy._verify.check_copy_header

    def check(path, size, header):
        checked.append(os.path.basename(path))
        return real(path, size, header)

    monkeypatch.setattr(_stage_copy._verify, "check_copy_header", check)
    c.run(files)
    assert sorted(checked) == sorted(s + _stage_copy.PART_SUFFIX for s in c.headers)
