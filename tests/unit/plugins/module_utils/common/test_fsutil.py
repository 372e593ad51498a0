"""_fsutil: content hashes and atomic writes on real files (a failing write is a real EFBIG from RLIMIT_FSIZE)."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_state

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "..", ".."))


def _leftovers(directory, name):
    return sorted(n for n in os.listdir(directory) if n != name)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 17, 1 << 20])
def test_sha256_file_matches_hashlib_across_buffer_boundaries(tmp_path, size):
    data = os.urandom(size)
    p = tmp_path / "blob"
    p.write_bytes(data)
    assert _fsutil.sha256_file(str(p), bufsize=4096) == hashlib.sha256(data).hexdigest()
    assert _fsutil.sha256_file(str(p)) == hashlib.sha256(data).hexdigest()


def test_kernel_cache_manifest_digests_are_the_shared_hash(tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "k.cubin").write_bytes(b"\x7fELF" * 5000)
    entry = _kcache.scan_files(str(tmp_path))[0]
    assert entry == {"path": "triton/k.cubin", "size": 20000,
                     "sha256": hashlib.sha256(b"\x7fELF" * 5000).hexdigest()}


def test_atomic_write_replaces_content_and_leaves_no_temporary_file(tmp_path):
    p = tmp_path / "state.json"
    p.write_text("old")
    _fsutil.atomic_write_json(str(p), {"b": 1, "a": [1, 2]}, sort_keys=True, newline=True)
    assert p.read_text() == '{"a": [1, 2], "b": 1}\n'
    _fsutil.atomic_write_bytes(str(p), b"\x00\x01", fsync=False)
    assert p.read_bytes() == b"\x00\x01"
    assert _leftovers(str(tmp_path), "state.json") == []


def test_a_write_that_fails_midway_leaves_the_old_file_intact(tmp_path):
    """A write past RLIMIT_FSIZE fails with EFBIG after part of the data went out (a full disk, in effect)."""
    p = tmp_path / "manifest.json"
    p.write_text('{"files": ["intact"]}')
    script = textwrap.dedent("""
        import errno, resource, signal, sys
        sys.path.insert(0, %r)
        from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            _fsutil.atomic_write_json(sys.argv[1], {"files": ["x" * 100] * 1000})
        except OSError as e:
            sys.exit(10 if e.errno == errno.EFBIG else 11)
        sys.exit(0)
    """) % os.path.join(ROOT, ".build", "pycoll")
    rc = subprocess.run([sys.executable, "-c", script, str(p)], check=False, timeout=60).returncode
    assert rc == 10
    assert p.read_text() == '{"files": ["intact"]}'
    assert _leftovers(str(tmp_path), "manifest.json") == []


def test_a_document_json_cannot_hold_changes_nothing(tmp_path):
    p = tmp_path / "spec.json"
    p.write_text("{}")
    with pytest.raises(TypeError):
        _fsutil.atomic_write_json(str(p), {"when": object()})
    assert p.read_text() == "{}"
    assert _leftovers(str(tmp_path), "spec.json") == []


def test_private_mode_and_a_symlink_at_the_destination_is_replaced_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not yours")
    link = tmp_path / "state.json"
    link.symlink_to(elsewhere)
    _fsutil.atomic_write_json(str(link), {"state": "running"}, mode=0o600)
    assert elsewhere.read_text() == "not yours"
    assert not link.is_symlink() and json.loads(link.read_text()) == {"state": "running"}
    assert stat.S_IMODE(os.stat(str(link)).st_mode) == 0o600


def test_concurrent_writers_never_leave_a_torn_or_missing_file(tmp_path):
    """Writers in several processes replace one file; a reader always parses one whole document."""
    p = tmp_path / "state.json"
    _fsutil.atomic_write_json(str(p), {"writer": -1, "pad": ""})
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
        for i in range(150):
            _fsutil.atomic_write_json(sys.argv[1], {"writer": int(sys.argv[2]), "pad": "x" * (i * 97 %% 20000)},
                                      fsync=False)
    """) % os.path.join(ROOT, ".build", "pycoll")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(p), str(n)]) for n in range(3)]
    seen = set()
    while any(pr.poll() is None for pr in procs):
        with open(str(p)) as f:
            seen.add(json.load(f)["writer"])
    assert [pr.wait() for pr in procs] == [0, 0, 0]
    assert seen <= {-1, 0, 1, 2}
    assert _leftovers(str(tmp_path), "state.json") == []


def test_engine_process_private_files_are_written_through_the_helper(tmp_path):
    """spec.json / state.json: mode 0600 even over an older, wider file, and no fixed-name temp file."""
    path = str(tmp_path / "spec.json")
    with open(path, "w") as f:
        f.write("{}")
    os.chmod(path, 0o644)
    with open(path + ".tmp", "w") as f:  # what an interrupted older writer left behind
        f.write("stale")
    os.chmod(path + ".tmp", 0o644)
    _process_state.write_private(path, {"command": ["vllm", "serve"]})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        assert json.load(f) == {"command": ["vllm", "serve"]}


def test_wait_flock_waits_for_the_holder_and_gives_up_at_the_deadline(tmp_path):
    """Another process holds the lock for ~0.6 s: a short deadline gives up, a longer one gets it after release."""
    lock = str(tmp_path / "fp.lock")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(0.6)
    """), lock], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(lock, os.O_RDWR)
        try:
            assert _fsutil.try_flock(fd) is False
            t0 = time.monotonic()
            assert _fsutil.wait_flock(fd, time.monotonic() + 0.1, poll=0.02) is False
            assert time.monotonic() - t0 < 0.5
            assert _fsutil.wait_flock(fd, time.monotonic() + 10, poll=0.05, first_poll=0.01) is True
            assert holder.poll() is not None or time.monotonic() - t0 >= 0.4
        finally:
            os.close(fd)
    finally:
        holder.wait(10)
