"""model_stage's copy paths: O_DIRECT at unaligned sizes, and each fallback (direct refused, kernel copy refused)."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage

# sizes around every boundary the direct path cares about: empty, sub-block, one block, the buffer, a tail
SIZES = {
    "empty.bin": 0,
    "tiny.bin": 1,
    "block-1.bin": _stage.DIRECT_ALIGN - 1,
    "block.bin": _stage.DIRECT_ALIGN,
    "buffer.bin": _stage.DIRECT_BUF,
    "buffer-tail.bin": 2 * _stage.DIRECT_BUF + 12345,
}


def _direct_supported(path):
    probe = os.path.join(path, ".direct-probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    os.unlink(probe)
    return True


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "shared" / "rev"
    src.mkdir(parents=True)
    sums = []
    for i, (name, size) in enumerate(sorted(SIZES.items())):
        data = os.urandom(min(size, 1 << 20)) * (size // (1 << 20) + 1)
        data = bytes([i]) + data[1:size] if size else b""
        (src / name).write_bytes(data)
        sums.append("%s  %s\n" % (hashlib.sha256(data).hexdigest(), name))
    (src / "SHA256SUMS").write_text("".join(sums))
    return {"src": str(src), "dest": str(tmp_path / "nvme" / "rev"), "tmp": str(tmp_path)}


def _assert_identical(src, dest):
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as a, open(os.path.join(dest, name), "rb") as b:
            assert a.read() == b.read(), name


@pytest.mark.parametrize("verify", ["size", "sha256"])
def test_direct_copy_is_byte_identical_at_every_boundary(tree, verify):
    if not _direct_supported(tree["tmp"]):
        pytest.skip("this filesystem refuses O_DIRECT")
    r = _stage.stage(tree["src"], tree["dest"], verify=verify)
    assert r["changed"] and r["files_copied"] == len(SIZES) + 1
    _assert_identical(tree["src"], tree["dest"])
    # every file went direct at both ends, the unaligned tails included (their tails are written buffered)
    assert r["direct_io_files"] == len(SIZES) + 1


def test_direct_io_false_uses_buffered_copies(tree):
    r = _stage.stage(tree["src"], tree["dest"], verify="sha256", direct_io=False)
    assert r["direct_io_files"] == 0
    _assert_identical(tree["src"], tree["dest"])


def test_filesystem_refusing_o_direct_at_open_falls_back(tree, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    r = _stage.stage(tree["src"], tree["dest"], verify="sha256")
    assert r["changed"] and r["direct_io_files"] == 0
    _assert_identical(tree["src"], tree["dest"])


def _is_direct(fd):
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


@pytest.mark.parametrize("call", ["preadv", "pwrite"])
def test_direct_io_refused_mid_file_switches_that_descriptor_to_buffered(tree, monkeypatch, call):
    if not _direct_supported(tree["tmp"]):
        pytest.skip("this filesystem refuses O_DIRECT")
    real = getattr(os, call)
    refused = []

    def flaky(fd, data, offset):
        if offset > 0 and _is_direct(fd):
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, call, flaky)
    r = _stage.stage(tree["src"], tree["dest"], verify="sha256")
    assert refused, "the direct path was never taken"
    _assert_identical(tree["src"], tree["dest"])
    # files that needed a second request lost O_DIRECT on one end; single-request files kept it
    assert r["direct_io_files"] < len(SIZES) + 1


def test_other_io_errors_are_not_swallowed_by_the_fallback(tree, monkeypatch):
    real = os.preadv

    def failing(fd, bufs, offset):
        if offset > 0:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(_stage.StageError, match="copy of .*buffer.* failed: .*Input/output error"):
        _stage.stage(tree["src"], tree["dest"], verify="size")
    assert not os.path.exists(tree["dest"])


def test_buffered_copy_falls_back_from_copy_file_range_to_sendfile_to_read_write(tree, monkeypatch):
    calls = {"copy_file_range": 0, "sendfile": 0}

    def refuse(name, err):
        def call(*args):
            calls[name] += 1
            raise OSError(err, os.strerror(err))
        return call

    monkeypatch.setattr(os, "copy_file_range", refuse("copy_file_range", errno.EXDEV))
    monkeypatch.setattr(os, "sendfile", refuse("sendfile", errno.EINVAL))
    r = _stage.stage(tree["src"], tree["dest"], verify="headers", direct_io=False)
    assert r["changed"] and r["direct_io_files"] == 0
    assert calls["copy_file_range"] and calls["sendfile"]
    _assert_identical(tree["src"], tree["dest"])
