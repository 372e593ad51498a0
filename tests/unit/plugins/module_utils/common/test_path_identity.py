"""A path has one identity, however it is spelt.

``pinned``, ``state: absent``, ``keep_revisions`` and kernel-cache ``gc`` (its ``in_use``) compare resolved
identities (realpath, then device and inode), never strings: a symlinked root, a trailing slash, ``..``, ``//``,
a relative spelling, a link to the revision or a bind mount all name the same revision, and the pinned revision's
bytes survive. A symlink inside a managed root (a fingerprint directory, an engine copy, a build directory) is
never followed or counted by gc: it is reported with its path and the fix, and gc goes on with the rest.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import (
    _kcache, _kcache_build, _kcache_gc, _kcache_log,
)
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.modules import kernel_cache, model_stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

# Each spelling of <real root>/m/rev1 a playbook may use: ``t`` is the test's tmp dir, ``L`` the symlinked root.
SPELLINGS = {
    "symlinked_root": lambda t, L: os.path.join(L, "m", "rev1"),
    "trailing_slash": lambda t, L: os.path.join(L, "m", "rev1") + "/",
    "dotdot": lambda t, L: os.path.join(L, "m", "..", "m", "rev1"),
    "double_slash": lambda t, L: "/" + os.path.join(L, "m", "rev1").replace("/", "//"),
    "dot": lambda t, L: os.path.join(L, ".", "m", ".", "rev1"),
    "relative": lambda t, L: os.path.join(os.path.relpath(L, t), "m", "rev1"),
    "link_to_revision": lambda t, L: os.path.join(t, "current"),
}


def tree_digest(root):
    """sha256 over every file's relative path and bytes below ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            h.update(os.path.relpath(full, root).encode() + b"\0")
            with open(full, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


@pytest.fixture
def revs(tmp_path, monkeypatch):
    """rev1, rev2 staged under the real root ``nvme-real/m``, reached through the symlinked root ``nvme``; the
    working directory is the tmp dir (for the relative spelling); ``current`` links to rev1."""
    real = tmp_path / "nvme-real"
    (real / "m").mkdir(parents=True)
    link = tmp_path / "nvme"
    link.symlink_to(real)
    proc = tmp_path / "proc"
    proc.mkdir()
    out = {"tmp": str(tmp_path), "real": str(real), "link": str(link), "proc": str(proc), "src": {}}
    for i, name in enumerate(("rev1", "rev2", "rev3")):
        src = str(tmp_path / "shared" / "m" / name)
        _stage_synth.write_checkpoint(src, 16 * 1024, shards=1, seed=i + 1, extra_files=False)
        out["src"][name] = src
    for name in ("rev1", "rev2"):
        _stage.stage(out["src"][name], str(real / "m" / name), fsync=False, proc_root=str(proc))
    (tmp_path / "current").symlink_to(real / "m" / "rev1")
    out["rev1"] = str(real / "m" / "rev1")
    out["rev1_digest"] = tree_digest(out["rev1"])
    monkeypatch.chdir(tmp_path)
    return out


def spell(revs, how):
    return SPELLINGS[how](revs["tmp"], revs["link"])


# ---- the helper ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", sorted(SPELLINGS))
def test_every_spelling_has_the_revision_identity(revs, how):
    p = spell(revs, how)
    st = os.stat(revs["rev1"])
    assert _paths.identity(p) == (revs["rev1"], (st.st_dev, st.st_ino))
    assert _paths.same_path(p, revs["rev1"]) and _paths.same_path(revs["rev1"], p)
    assert not _paths.same_path(p, os.path.join(revs["real"], "m", "rev2"))
    assert _paths.is_within(os.path.join(p, "config.json"), revs["real"])
    assert _paths.overlaps(p, revs["rev1"])


def test_a_path_not_created_yet_is_compared_by_its_resolved_spelling(revs):
    new_real = os.path.join(revs["real"], "m", "rev9")
    assert _paths.identity(new_real)[1] is None
    assert _paths.same_path(os.path.join(revs["link"], "m", "rev9/"), new_real)
    assert not _paths.same_path(os.path.join(revs["link"], "m", "rev8"), new_real)
    assert _paths.is_within(os.path.join(revs["link"], "m", "rev9", "x"), os.path.join(revs["real"], "m"))


def test_dotdot_after_a_symlink_resolves_like_the_kernel(revs, tmp_path):
    # "m/hop/../rev1" where hop links into another root is that root's rev1, not this root's
    (tmp_path / "other" / "m" / "deep").mkdir(parents=True)
    os.symlink(str(tmp_path / "other" / "m" / "deep"), os.path.join(revs["real"], "m", "hop"))
    spelt = os.path.join(revs["link"], "m", "hop", "..", "rev1")
    assert not _paths.same_path(spelt, revs["rev1"])
    assert _paths.same_path(spelt, str(tmp_path / "other" / "m" / "rev1"))


# ---- keep_revisions and state: absent -----------------------------------------------------------------------

@pytest.mark.parametrize("how", sorted(SPELLINGS))
def test_prune_keeps_the_pinned_revision_however_pinned_is_spelt(revs, how):
    r = _stage.stage(revs["src"]["rev3"], os.path.join(revs["link"], "m", "rev3"), fsync=False, keep_revisions=1,
                     pinned=[spell(revs, how)], proc_root=revs["proc"])
    assert r["pruned"] == [os.path.join(revs["real"], "m", "rev2")], r["pruned"]
    assert tree_digest(revs["rev1"]) == revs["rev1_digest"]


def test_model_stage_keeps_a_revision_pinned_through_the_symlinked_dest_root(run_module, revs):
    # the incident: dest and pinned both spelt through the symlinked root; prune lists the real root
    r = run_module(model_stage, {"src": revs["src"]["rev3"], "dest": os.path.join(revs["link"], "m", "rev3"),
                                 "keep_revisions": 1, "pinned": [os.path.join(revs["link"], "m", "rev1")],
                                 "proc_root": revs["proc"], "fsync": False})
    assert not r.get("failed"), r
    assert r["pruned"] == [os.path.join(revs["real"], "m", "rev2")]
    assert tree_digest(revs["rev1"]) == revs["rev1_digest"]


@pytest.mark.parametrize("how", sorted(SPELLINGS))
def test_absent_refuses_a_pinned_revision_however_either_is_spelt(revs, how):
    for dest, pinned in ((revs["rev1"], spell(revs, how)), (spell(revs, how), revs["rev1"])):
        if how == "link_to_revision" and dest != revs["rev1"]:
            continue  # a link as dest is refused as a link (see test_stage_trust_overlap), not as pinned
        with pytest.raises(_stage.StageError, match="pinned"):
            _stage.remove(dest, pinned=[pinned], proc_root=revs["proc"])
    assert tree_digest(revs["rev1"]) == revs["rev1_digest"]


def test_absent_removes_the_revision_the_kernel_resolves_not_a_lexical_neighbour(revs, tmp_path):
    # dest "m/hop/../rev1" with hop -> other/m/hop names other/m/rev1; this root's rev1 must survive
    other = tmp_path / "other" / "m"
    other.mkdir(parents=True)
    _stage.stage(revs["src"]["rev2"], str(other / "rev1"), fsync=False, proc_root=revs["proc"])
    (other / "hop").mkdir()
    os.symlink(str(other / "hop"), os.path.join(revs["real"], "m", "hop"))
    r = _stage.remove(os.path.join(revs["link"], "m", "hop", "..", "rev1"), proc_root=revs["proc"])
    assert r["changed"] and r["dest"] == str(other / "rev1")
    assert not (other / "rev1").exists()
    assert tree_digest(revs["rev1"]) == revs["rev1_digest"]


def test_pinned_entries_are_checked_before_anything_changes(revs):
    with pytest.raises(_stage.StageError, match=r"pinned\[1\]"):
        _stage.stage(revs["src"]["rev3"], os.path.join(revs["real"], "m", "rev3"), fsync=False, keep_revisions=1,
                     pinned=["rev1", "a\x00b"], proc_root=revs["proc"])
    assert not os.path.exists(os.path.join(revs["real"], "m", "rev3"))
    assert os.path.isdir(os.path.join(revs["real"], "m", "rev2"))


BIND_SCRIPT = r"""
import json, os, sys
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
real, bind, proc = sys.argv[1:4]
refused = []
for dest, pinned in ((os.path.join(real, "m", "rev1"), os.path.join(bind, "m", "rev1")),
                     (os.path.join(bind, "m", "rev1"), os.path.join(real, "m", "rev1"))):
    try:
        _stage.remove(dest, pinned=[pinned], proc_root=proc)
    except _stage.StageError as e:
        refused.append("pinned" in str(e))
pruned = _stage.prune(os.path.join(real, "m", "rev3"), 1, pinned=[os.path.join(bind, "m", "rev1") + "/"],
                      proc_root=proc)["removed"]
print(json.dumps({"absent_refused": refused, "pruned": pruned}), flush=True)
print(json.dumps({
    "same": _paths.same_path(os.path.join(bind, "m", "rev1"), os.path.join(real, "m", "rev1")),
    "realpaths_differ": os.path.realpath(os.path.join(bind, "m")) != os.path.realpath(os.path.join(real, "m")),
    "within": _paths.is_within(os.path.join(bind, "m", "rev1", "x"), os.path.join(real, "m", "rev1"))}))
"""


def test_a_bind_mount_spelling_is_the_same_revision(revs, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a bind mount in a private mount namespace needs root and unshare(1)")
    _stage.stage(revs["src"]["rev3"], os.path.join(revs["real"], "m", "rev3"), fsync=False, proc_root=revs["proc"])
    bind = tmp_path / "bind"
    bind.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount --bind "$1" "$2" && exec "$0" -c "$3" "$1" "$2" "$4"', sys.executable,
                        revs["real"], str(bind), BIND_SCRIPT, revs["proc"]],
                       capture_output=True, text=True, env=env, timeout=60, check=False)
    if p.returncode != 0 and "mount" in p.stderr and "Traceback" not in p.stderr:
        pytest.skip("mount --bind is not permitted here: %s" % p.stderr.strip()[-200:])
    lines = p.stdout.splitlines()
    assert json.loads(lines[0]) == {"absent_refused": [True, True], "pruned": [os.path.join(revs["real"], "m", "rev2")]}
    assert p.returncode == 0, p.stderr
    assert json.loads(lines[1]) == {"same": True, "realpaths_differ": True, "within": True}
    assert tree_digest(revs["rev1"]) == revs["rev1_digest"]


# ---- kernel-cache gc ------------------------------------------------------------------------------------------

FPS = ["%016x" % i for i in range(3)]  # FPS[0] oldest


@pytest.fixture
def kc(tmp_path):
    """Three published fingerprints under the real cache root, reached through a symlinked cache_root, and a
    directory outside the cache that links may point at."""
    real = tmp_path / "nvme" / "kernel-cache"
    for i, fp in enumerate(FPS):
        d = real / "vllm" / fp
        (d / "triton").mkdir(parents=True)
        (d / "triton" / "k.so").write_bytes(bytes([i]) * 4096)
        (d / "manifest.json").write_text(json.dumps({"fingerprint": fp, "created": "2026-01-0%dT00:00:00Z" % (i + 1),
                                                     "files": []}))
    link = tmp_path / "kernel-cache"
    link.symlink_to(real)
    outside = tmp_path / "home" / "work"
    outside.mkdir(parents=True)
    (outside / "notes.txt").write_bytes(b"not a cache\n" * 100)
    proc = tmp_path / "proc"
    proc.mkdir()
    return {"real": str(real), "link": str(link), "eroot": str(real / "vllm"), "outside": str(outside),
            "outside_digest": tree_digest(str(outside)), "proc": str(proc)}


def test_gc_never_counts_a_newer_symlinked_directory_as_a_fingerprint(kc):
    fake = os.path.join(kc["eroot"], "f" * 16)
    os.symlink(kc["outside"], fake)
    # the link target even claims to be the newest cache
    with open(os.path.join(kc["outside"], "manifest.json"), "w") as f:
        json.dump({"fingerprint": "f" * 16, "created": "2099-01-01T00:00:00Z", "files": []}, f)
    digest = tree_digest(kc["outside"])
    r = _kcache_gc.gc(kc["link"], "vllm", keep=1, proc_root=kc["proc"])
    assert r["kept"] == [FPS[2]] and r["removed"] == [FPS[1], FPS[0]], r
    assert [(x["path"], x["target"]) for x in r["links"]] == [(os.path.join(kc["link"], "vllm", "f" * 16),
                                                               kc["outside"])]
    assert "rm " in r["links"][0]["fix"] and "not rm -r" in r["links"][0]["fix"]
    assert os.path.isdir(os.path.join(kc["eroot"], FPS[2])) and os.path.islink(fake)
    assert tree_digest(kc["outside"]) == digest


def test_gc_reports_links_where_copies_and_builds_would_be_and_goes_on(kc):
    old = os.path.join(kc["eroot"], "0" * 15 + "9")  # sorts oldest: the link would be the one removed
    os.symlink(kc["outside"], old)
    os.utime(kc["outside"], (1, 1))
    runs = os.path.join(kc["eroot"], ".run")
    os.makedirs(runs)
    os.symlink(kc["outside"], os.path.join(runs, "%s-engine" % FPS[0]))
    partial = os.path.join(kc["eroot"], ".partial-%s-abc" % FPS[0])
    os.symlink(kc["outside"], partial)
    r = _kcache_gc.gc(kc["real"], "vllm", keep=2, proc_root=kc["proc"])
    assert r["removed"] == [FPS[0]] and r["removed_partials"] == [] and r["errors"] == [], r
    assert sorted(x["path"] for x in r["links"]) == sorted([old, os.path.join(runs, "%s-engine" % FPS[0]), partial])
    assert all(os.path.islink(p) for p in (old, partial, os.path.join(runs, "%s-engine" % FPS[0])))
    assert tree_digest(kc["outside"]) == kc["outside_digest"]


def test_kernel_cache_gc_warns_about_a_link_with_its_path_and_the_fix(run_module, kc):
    old = os.path.join(kc["eroot"], "0" * 15 + "9")
    os.symlink(kc["outside"], old)
    os.utime(kc["outside"], (1, 1))
    r = run_module(kernel_cache, {"operation": "gc", "cache_root": kc["link"], "engine": "vllm", "keep": 1,
                                  "proc_root": kc["proc"]})
    assert not r.get("failed"), r
    assert r["details"]["removed"] == [FPS[1], FPS[0]]
    shown = os.path.join(kc["link"], "vllm", "0" * 15 + "9")  # as cache_root is spelt
    assert any(shown in w and "not rm -r" in w for w in r["warnings"]), r["warnings"]
    assert tree_digest(kc["outside"]) == kc["outside_digest"]


def test_gc_records_a_directory_it_cannot_remove_and_goes_on(kc, monkeypatch):
    real_rmtree = shutil.rmtree

    def refuse_one(path, *a, **kw):
        if path.endswith(FPS[1]):
            raise PermissionError(13, "Permission denied")
        return real_rmtree(path, *a, **kw)

    monkeypatch.setattr(_kcache_gc.shutil, "rmtree", refuse_one)
    r = _kcache_gc.gc(kc["real"], "vllm", keep=1, proc_root=kc["proc"])
    assert r["removed"] == [FPS[0]] and r["changed"]
    assert r["errors"] == [{"path": os.path.join(kc["eroot"], FPS[1]),
                            "reason": "not removed: Permission denied; fix its permissions or remove it by hand"}]


KC_SPELLINGS = {
    "symlinked_root": lambda kc, fp: os.path.join(kc["link"], "vllm", fp),
    "trailing_slash": lambda kc, fp: os.path.join(kc["link"], "vllm", fp) + "/",
    "dotdot": lambda kc, fp: os.path.join(kc["link"], "vllm", "..", "vllm", fp),
    "double_slash": lambda kc, fp: "/" + os.path.join(kc["link"], "vllm", fp).replace("/", "//"),
    "below": lambda kc, fp: os.path.join(kc["link"], "vllm", fp, "triton"),
    "relative": lambda kc, fp: os.path.relpath(os.path.join(kc["link"], "vllm", fp)),
}


@pytest.mark.parametrize("how", sorted(KC_SPELLINGS))
def test_gc_keeps_a_fingerprint_declared_in_use_by_any_spelling_of_its_path(kc, how):
    digest = tree_digest(os.path.join(kc["eroot"], FPS[0]))
    r = _kcache_gc.gc(kc["real"], "vllm", keep=1, in_use=[KC_SPELLINGS[how](kc, FPS[0])], proc_root=kc["proc"])
    assert r["protected"] == [FPS[0]] and r["removed"] == [FPS[1]], r
    assert tree_digest(os.path.join(kc["eroot"], FPS[0])) == digest


@pytest.mark.parametrize("entry", ["", "latest", "a\x00b"])
def test_gc_refuses_an_in_use_entry_that_is_neither_a_fingerprint_nor_a_path(kc, entry):
    with pytest.raises(_kcache.KCacheError, match=r"in_use\[1\]"):
        _kcache_gc.gc(kc["real"], "vllm", keep=1, in_use=[FPS[0], entry], proc_root=kc["proc"])
    assert all(os.path.isdir(os.path.join(kc["eroot"], fp)) for fp in FPS)


def test_checkout_replaces_a_symlinked_engine_copy_without_touching_its_target(kc):
    fp = FPS[2]
    pub = os.path.join(kc["eroot"], fp)
    comps = {"engine": "vllm"}
    _kcache.write_manifest(pub, "vllm", fp, comps)
    runs = os.path.join(kc["eroot"], ".run")
    os.makedirs(runs)
    rd = os.path.join(runs, "%s-engine" % fp)
    os.symlink(kc["outside"], rd)
    r = _kcache_build.checkout(kc["real"], "vllm", fp, comps, proc_root=kc["proc"])
    assert r["status"] == "copied" and r["replaced_link"]["path"] == rd, r
    assert not os.path.islink(rd) and os.path.isfile(os.path.join(rd, "triton", "k.so"))
    assert tree_digest(kc["outside"]) == kc["outside_digest"]


def test_report_refuses_a_fifo_log_without_blocking_and_reads_only_the_tail(tmp_path):
    fifo = str(tmp_path / "engine.log")
    os.mkfifo(fifo)
    with pytest.raises(_kcache.KCacheError, match="log_path: .*FIFO"):
        _kcache_log.read_log(fifo)
    big = tmp_path / "big.log"
    data = b"old line\n" * 1000 + b"==== t starting: x\nlatest\n"
    big.write_bytes(data)
    assert _kcache_log.read_log(str(big), tail=30) == data[-30:].decode()


def _within(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread; fails (instead of hanging the run) when it blocks past ``seconds``."""
    import threading

    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # pylint: disable=broad-except
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "%s blocked for %ss" % (fn.__name__, seconds)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_fifo_or_device_manifest_is_refused_without_blocking(kc):
    fifo_dir = os.path.join(kc["eroot"], FPS[0])
    os.unlink(os.path.join(fifo_dir, "manifest.json"))
    os.mkfifo(os.path.join(fifo_dir, "manifest.json"))
    os.unlink(os.path.join(kc["eroot"], FPS[1], "manifest.json"))
    os.symlink("/dev/zero", os.path.join(kc["eroot"], FPS[1], "manifest.json"))
    for fp in FPS[:2]:
        ver = _within(10, _kcache.verify_dir, os.path.join(kc["eroot"], fp), fp)
        assert ver["status"] == "no_manifest" and "manifest.json" in ver["problems"][0], ver
    r = _within(10, _kcache_gc.gc, kc["real"], "vllm", keep=1, proc_root=kc["proc"])
    assert len(r["kept"]) == 1 and sorted(r["kept"] + r["removed"]) == FPS and r["errors"] == []


def test_pinned_by_the_name_of_a_link_beside_the_revisions(revs):
    # "current" -> rev1 next to the revisions: pinned: [current] keeps what it points at
    os.symlink("rev1", os.path.join(revs["real"], "m", "current"))
    r = _stage.stage(revs["src"]["rev3"], os.path.join(revs["real"], "m", "rev3"), fsync=False, keep_revisions=1,
                     pinned=["current"], proc_root=revs["proc"])
    assert r["pruned"] == [os.path.join(revs["real"], "m", "rev2")]
    assert tree_digest(revs["rev1"]) == revs["rev1_digest"]
    assert os.path.islink(os.path.join(revs["real"], "m", "current"))


def test_gc_keeps_in_use_fingerprints_on_top_of_the_newest_keep(kc):
    r = _kcache_gc.gc(kc["real"], "vllm", keep=2, in_use=[FPS[2]], proc_root=kc["proc"])
    assert r["protected"] == [FPS[2]] and r["kept"] == [FPS[1], FPS[0]] and r["removed"] == [], r


def test_log_report_counts_the_cache_dir_itself_and_its_spellings_as_inside(kc):
    cache_dir = os.path.join(kc["eroot"], FPS[0])
    for used in (cache_dir, cache_dir + "/", os.path.join(kc["link"], "vllm", FPS[0], "torch_compile")):
        log = "INFO Using cache directory: %s for vLLM's torch.compile\n" % used
        assert _kcache_log.analyze_log(log, "vllm", cache_dir)["cache_dirs_outside"] == [], used
    log = "INFO Using cache directory: /root/.cache/vllm for vLLM's torch.compile\n"
    assert _kcache_log.analyze_log(log, "vllm", cache_dir)["cache_dirs_outside"] == ["/root/.cache/vllm"]
