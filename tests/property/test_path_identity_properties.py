"""Property-based harness for path identity: generated spellings of one directory, and generated cache roots with
symlinks where gc looks.

Invariants a user relies on:

* every spelling of a revision (through the real or the symlinked root, with ``.``, ``x/..`` detours, repeated
  and trailing slashes, relative to the working directory, or through a link to the revision) has that revision's
  identity and no other's; ``pinned`` given in that spelling keeps it from ``keep_revisions`` and from
  ``state: absent``, and its bytes survive;
* ``in_use`` given as any spelling of a fingerprint directory (or of a path below it) protects that fingerprint;
* whatever symlinks sit in a kernel-cache root (where fingerprint directories, engine copies or build directories
  go, pointing at caches, at other data, or nowhere), gc returns cleanly, never counts or follows them, reports
  each one, keeps the newest ``keep`` real fingerprints, and no byte outside the real directories it removes
  changes.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache_gc
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + (
    [Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _digest(root):
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            h.update(os.path.relpath(full, root).encode() + b"\0")
            if os.path.islink(full):
                h.update(b"link:" + os.readlink(full).encode())
            else:
                with open(full, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


# ---- spellings --------------------------------------------------------------------------------------------------

# A spelling: which root, then per component of "m/rev1" what decorates it, then how it ends and whether it is
# relative to the working directory. Detours ("sub/..") go only through real directories: through a symlink ".."
# leaves for the link target's parent, which is another directory (see test_path_identity).
component_decor = st.lists(st.sampled_from(["", "./", "/", "//", "sub/../", "./sub/./../"]), min_size=3, max_size=3)
spellings = st.fixed_dictionaries({
    "root": st.sampled_from(["real", "link", "rev_link", "sibling_link"]),
    "decor": component_decor,
    "end": st.sampled_from(["", "/", "//", "/.", "/./"]),
    "relative": st.booleans(),
    "lead": st.sampled_from(["/", "//"]),
})


def spell(box, how):
    """Spell ``<box>/nvme-real/m/rev1`` as ``how`` says."""
    if how["root"] == "sibling_link":  # pinned: [current], current -> rev1 beside the revisions
        return "current" + how["end"] if how["relative"] else os.path.join(box, "nvme", "m", "current") + how["end"]
    if how["root"] == "rev_link":
        path = os.path.join(box, "current") + how["end"]
    else:
        d0, d1, d2 = how["decor"]
        path = os.path.join(box, "nvme-real" if how["root"] == "real" else "nvme") + "/" + d0 + "m/" + d1 + "rev1"
        if d2:
            path += "/" + d2.rstrip("/")
        path += how["end"]
    if how["relative"]:
        return "./" + path[len(box) + 1:]  # a relative path holds a "/" (a bare word is a revision name)
    return how["lead"] + path.lstrip("/")


@pytest.fixture(scope="module")
def revs():
    """rev1, rev2 staged under ``nvme-real/m`` (each with a ``sub`` directory beside them), the symlinked root
    ``nvme`` and the link ``current`` -> rev1; the working directory is the box (for relative spellings)."""
    box = tempfile.mkdtemp(prefix="llmops-ident-")
    real = os.path.join(box, "nvme-real")
    os.makedirs(os.path.join(real, "sub"))
    os.makedirs(os.path.join(real, "m", "sub"))
    os.symlink(real, os.path.join(box, "nvme"))
    proc = os.path.join(box, "proc")
    os.mkdir(proc)
    for i, name in enumerate(("rev1", "rev2", "rev3")):
        src = os.path.join(box, "shared", name)
        _stage_synth.write_checkpoint(src, 8 * 1024, shards=1, seed=i + 1, extra_files=False)
        _stage.stage(src, os.path.join(real, "m", name), fsync=False, proc_root=proc)
    os.makedirs(os.path.join(real, "m", "rev1", "sub"))
    os.symlink(os.path.join(real, "m", "rev1"), os.path.join(box, "current"))
    os.symlink("rev1", os.path.join(real, "m", "current"))
    cwd = os.getcwd()
    os.chdir(box)
    try:
        yield {"box": box, "real": real, "proc": proc, "rev1": os.path.join(real, "m", "rev1"),
               "digest": _digest(os.path.join(real, "m", "rev1"))}
    finally:
        os.chdir(cwd)
        shutil.rmtree(box, ignore_errors=True)


@SETTINGS
@given(how=spellings)
def test_every_spelling_names_the_revision_and_pins_it(revs, how):
    p = spell(revs["box"], how)
    other = os.path.join(revs["real"], "m", "rev2")
    # keep_revisions (check mode: what a run would remove) and state: absent, both directions
    dest = os.path.join(revs["real"], "m", "rev3")
    pruned = _stage.prune(dest, 1, pinned=[p], check_mode=True, proc_root=revs["proc"])["removed"]
    assert pruned == [other], (p, pruned)
    with pytest.raises(_stage.StageError, match="pinned"):
        _stage.remove(revs["rev1"], pinned=[p], proc_root=revs["proc"])
    with pytest.raises(_stage.StageError) as e:
        _stage.remove(p, pinned=[revs["rev1"]], proc_root=revs["proc"])
    # as dest, a link is refused as a link and ".", ".." as not naming a directory, before pinned is looked at
    last = p.rstrip("/").rsplit("/", 1)[-1]
    assert "pinned" in str(e.value) or how["root"] in ("rev_link", "sibling_link") or last in (".", ".."), \
        (p, str(e.value))
    assert _digest(revs["rev1"]) == revs["digest"]
    assert _paths.same_path(p, revs["rev1"]), p
    assert not _paths.same_path(p, other), p
    assert _paths.is_within(p, os.path.join(revs["real"], "m")) and not _paths.is_within(p, other), p


# ---- kernel-cache gc --------------------------------------------------------------------------------------------

FP_NAMES = ["%016x" % i for i in range(6)]
link_targets = st.sampled_from(["cache", "outside", "dangling", "self_root"])
cache_roots = st.fixed_dictionaries({
    "real": st.lists(st.sampled_from(FP_NAMES), min_size=0, max_size=5, unique=True),
    "fp_links": st.lists(st.tuples(st.sampled_from(FP_NAMES), link_targets), max_size=3,
                         unique_by=lambda t: t[0]),
    "run_links": st.lists(st.tuples(st.sampled_from(FP_NAMES), link_targets), max_size=2,
                          unique_by=lambda t: t[0]),
    "partial_links": st.lists(link_targets, max_size=2),
    "keep": st.integers(1, 4),
    "in_use_how": st.sampled_from([None, "name", "path", "below", "link_root", "dotdot"]),
    "spelt_root": st.booleans(),
})


def _build_cache(box, spec):
    real = os.path.join(box, "nvme", "kernel-cache")
    eroot = os.path.join(real, "vllm")
    os.makedirs(os.path.join(eroot, ".run"))
    os.symlink(real, os.path.join(box, "kernel-cache"))
    outside = os.path.join(box, "home", "data")
    os.makedirs(outside)
    with open(os.path.join(outside, "notes.txt"), "wb") as f:
        f.write(b"x" * 1000)
    with open(os.path.join(outside, "manifest.json"), "w") as f:  # claims to be the newest cache
        json.dump({"fingerprint": "f" * 16, "created": "2099-01-01T00:00:00Z", "files": []}, f)
    elsewhere = os.path.join(box, "other-cache", "vllm", "e" * 16)
    os.makedirs(os.path.join(elsewhere, "triton"))
    with open(os.path.join(elsewhere, "manifest.json"), "w") as f:
        json.dump({"fingerprint": "e" * 16, "created": "2099-01-02T00:00:00Z", "files": []}, f)
    targets = {"cache": elsewhere, "outside": outside, "dangling": os.path.join(box, "nowhere"), "self_root": eroot}
    for i, fp in enumerate(spec["real"]):
        d = os.path.join(eroot, fp)
        os.makedirs(os.path.join(d, "triton"))
        with open(os.path.join(d, "triton", "k.so"), "wb") as f:
            f.write(bytes([i]) * 512)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"fingerprint": fp, "created": "2026-01-%02dT00:00:00Z" % (int(fp, 16) + 1), "files": []}, f)
    links = []
    for fp, t in spec["fp_links"]:
        if fp not in spec["real"]:
            os.symlink(targets[t], os.path.join(eroot, fp))
            links.append(os.path.join(eroot, fp))
    for fp, t in spec["run_links"]:
        os.symlink(targets[t], os.path.join(eroot, ".run", "%s-engine" % fp))
        links.append(os.path.join(eroot, ".run", "%s-engine" % fp))
    for i, t in enumerate(spec["partial_links"]):
        p = os.path.join(eroot, ".partial-%s-%d" % ("a" * 16, i))
        os.symlink(targets[t], p)
        links.append(p)
    return real, eroot, links, [os.path.join(box, "other-cache"), outside]


def _in_use(box, real, eroot, fp, how):
    if how == "name":
        return [fp]
    return [{"path": os.path.join(eroot, fp),
             "below": os.path.join(eroot, fp, "triton") + "/",
             "link_root": os.path.join(box, "kernel-cache", "vllm", fp),
             "dotdot": os.path.join(box, "kernel-cache", "vllm", ".run", "..", fp) + "//"}[how]]


@SETTINGS
@given(spec=cache_roots)
def test_gc_counts_only_real_fingerprints_and_reports_every_link(spec):
    box = tempfile.mkdtemp(prefix="llmops-gc-")
    try:
        real, eroot, links, untouchable = _build_cache(box, spec)
        proc = os.path.join(box, "proc")
        os.mkdir(proc)
        before = dict((d, _digest(d)) for d in untouchable)
        pinned_fp = spec["real"][0] if spec["real"] and spec["in_use_how"] else None
        in_use = _in_use(box, real, eroot, pinned_fp, spec["in_use_how"]) if pinned_fp else []
        root = os.path.join(box, "kernel-cache") if spec["spelt_root"] else real
        r = _kcache_gc.gc(root, "vllm", spec["keep"], in_use=in_use, proc_root=proc)
        reported = sorted(os.path.realpath(os.path.dirname(x["path"])) + "/" + os.path.basename(x["path"])
                          for x in r["links"])
        assert reported == sorted(links), (reported, links)
        assert all(os.path.islink(p) for p in links)
        assert r["errors"] == []
        newest = sorted((fp for fp in spec["real"] if fp != pinned_fp), reverse=True)
        assert r["kept"] == newest[:spec["keep"]], r
        assert sorted(r["removed"]) == sorted(newest[spec["keep"]:]), r
        assert r["protected"] == ([pinned_fp] if pinned_fp else [])
        for fp in spec["real"]:
            assert os.path.isdir(os.path.join(eroot, fp)) == (fp not in r["removed"])
        assert dict((d, _digest(d)) for d in untouchable) == before
    finally:
        shutil.rmtree(box, ignore_errors=True)
