"""The one "who uses this directory" scan: real processes, real symlinks, a real bind mount in another namespace."""
from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _inuse
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import hold as _hold, hold_bind_mount as _hold_bind_mount, stop as _stop


@pytest.fixture
def tree(tmp_path):
    real = tmp_path / "nvme" / "cache" / "fp1"
    real.mkdir(parents=True)
    (real / "kernel.so").write_bytes(b"\0" * 4096)
    sibling = tmp_path / "nvme" / "cache" / "fp10"
    sibling.mkdir()
    (sibling / "kernel.so").write_bytes(b"\0" * 4096)
    link = tmp_path / "cache-link"
    link.symlink_to(tmp_path / "nvme" / "cache")
    return {"real": str(real), "sibling": str(sibling), "link": str(link / "fp1")}


def _pids(found, path):
    return {(u["pid"], u["via"]) for u in found if u["path"] == path}


@pytest.mark.parametrize("mode,via", [("open", "fd"), ("mmap", "map"), ("cwd", "cwd")])
def test_use_through_a_symlinked_root_is_seen_under_either_spelling(tree, mode, via):
    target = os.path.join(tree["link"], "kernel.so") if mode != "cwd" else tree["link"]
    p = _hold(mode, target)
    try:
        for asked in (tree["real"], tree["link"]):
            assert (p.pid, via) in _pids(_inuse.users_of([asked]), asked), asked
        # a sibling whose name shares the prefix is not "in use"
        assert not _pids(_inuse.users_of([tree["sibling"]]), tree["sibling"])
    finally:
        _stop(p)


def test_environment_path_counts_only_when_asked(tree):
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(tree["link"], "triton"))
    p = _hold("sleep", "-", env=env)
    try:
        assert (p.pid, "environ") in _pids(_inuse.users_of([tree["real"]], environ=True), tree["real"])
        assert not _pids(_inuse.users_of([tree["real"]]), tree["real"])
    finally:
        _stop(p)


def test_unused_directory_and_missing_directory_report_nobody(tree, tmp_path):
    assert _inuse.users_of([tree["real"], str(tmp_path / "absent")]) == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_bind_mount_in_another_mount_namespace_is_in_use(tree, tmp_path):
    # How a pod sees a hostPath: its own mount namespace holds a bind mount of the directory, at another
    # path, and it need not have a file open there. /proc/PID/mountinfo, proc(5).
    mnt = tmp_path / "pod-volume"
    mnt.mkdir()
    p = _hold_bind_mount(tree["real"], mnt)
    try:
        found = _inuse.users_of([tree["link"], tree["sibling"]])
        assert (p.pid, "mount") in _pids(found, tree["link"])
        assert not _pids(found, tree["sibling"])
    finally:
        _stop(p)


def test_fixture_proc_tree_with_fd_links(tmp_path, tree):
    # Modules take proc_root so their tests can use a fake /proc: fd links to real files still resolve.
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "fd" / "3").symlink_to(os.path.join(tree["real"], "kernel.so"))
    (proc / "4243" / "fd").mkdir(parents=True)
    (proc / "4243" / "fd" / "3").symlink_to(os.path.join(tree["sibling"], "kernel.so"))
    found = _inuse.users_of([tree["link"]], proc_root=str(proc))
    assert [(u["pid"], u["via"]) for u in found] == [(4242, "fd")]


def test_mountinfo_escapes_are_decoded():
    assert _inuse._unescape(r"/models/with\040space") == "/models/with space"
    assert _inuse._unescape("/plain") == "/plain"


def test_a_path_under_a_double_slash_in_a_process_that_is_gone_ends_the_scan(tree, tmp_path):
    """An environment value like ``http://host`` splits at ':' into ``//host``; POSIX dirname keeps ``//``, so the walk
    up to the nearest existing parent never reached "/" when the process's root could not be read (it had exited):
    the scan spun forever without a system call (every stat cached). It ends, and nothing is reported for that path."""
    import threading

    gone = str(tmp_path / "no-such-proc-root")
    scanner = _inuse._Scanner([_inuse._Target(tree["real"])], str(tmp_path))
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("hit", scanner.match(gone, "//127.0.0.1")), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the walk up from //127.0.0.1 did not end"
    assert box["hit"] is None
