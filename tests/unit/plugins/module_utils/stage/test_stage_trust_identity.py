"""A staged copy is that revision, or it is staged again.

The marker identifies every file by content and identity (size, safetensors header digest, sha256 where one
was computed, the source file's inode/mtime/ctime) and records each copy's lstat at publish, so a re-run sees
with ``lstat`` alone a copy removed, resized or rewritten after publish, and two revisions with identical
shapes and mtimes never reuse each other's files - across re-runs, concurrent runs and resumed runs.
(Issue "Trust", class 3.)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

MARKER = ".llmops-staged.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
MODULE = os.path.join(ROOT, "plugins", "modules", "model_stage.py")
PYCOLL = os.path.join(ROOT, ".build", "pycoll")
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def twins(tmp_path):
    a, b = str(tmp_path / "shared" / "m" / "rev-a"), str(tmp_path / "shared" / "m" / "rev-b")
    info = _stage_synth.write_twins(a, b, 256 * 1024, shards=2, seed=3)[0]
    return {"a": a, "b": b, "files": info["files"], "dest": str(tmp_path / "nvme" / "m" / "rev"), "tmp": tmp_path}


def tree_bytes(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, root)
            if rel != MARKER:
                with open(full, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def marker(dest):
    with open(os.path.join(dest, MARKER)) as f:
        return json.load(f)


def assert_is(dest, src):
    assert tree_bytes(dest) == tree_bytes(src), "dest does not hold exactly the bytes of %s" % src
    assert marker(dest)["source"] == os.path.realpath(src)


@pytest.mark.parametrize("verify", ["size", "headers"])
def test_revisions_with_identical_shapes_and_mtimes_do_not_share_files(run_module, twins, verify):
    assert tree_bytes(twins["a"]) != tree_bytes(twins["b"])
    run_module(model_stage, {"src": twins["a"], "dest": twins["dest"], "verify": verify})
    assert_is(twins["dest"], twins["a"])
    r = run_module(model_stage, {"src": twins["b"], "dest": twins["dest"], "verify": verify})
    assert r["changed"] is True and SHARD in r["copied_files"], r
    assert_is(twins["dest"], twins["b"])
    assert {e["path"] for e in r["restaged_files"]} >= {SHARD}
    assert "source file is not the one staged" in r["restaged_files"][0]["reason"]


def test_marker_identifies_files_by_header_digest_and_sha256(run_module, twins):
    run_module(model_stage, {"src": twins["a"], "dest": twins["dest"], "verify": "sha256"})
    entries = {e["path"]: e for e in marker(twins["dest"])["files"]}
    with open(os.path.join(twins["a"], SHARD), "rb") as f:
        _n, raw = _safetensors.read_header_bytes(f, SHARD, os.path.getsize(os.path.join(twins["a"], SHARD)))
    assert entries[SHARD]["header_sha256"] == hashlib.sha256(raw).hexdigest()
    sums = dict(reversed(line.split()) for line in open(os.path.join(twins["a"], "SHA256SUMS")))
    for name, digest in sums.items():
        assert entries[name]["sha256"] == digest and entries[name]["verify"] == "sha256"
    st = os.lstat(os.path.join(twins["dest"], SHARD))
    assert entries[SHARD]["copy"] == {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                      "ctime_ns": st.st_ctime_ns}


def test_source_swapped_in_place_with_same_shapes_and_mtimes_is_staged_again(run_module, twins):
    src = os.path.join(os.path.dirname(twins["a"]), "main")
    os.rename(twins["a"], src)
    run_module(model_stage, {"src": src, "dest": twins["dest"]})
    os.rename(src, twins["a"])
    os.rename(twins["b"], src)  # same path, same names, sizes and mtimes: another revision
    r = run_module(model_stage, {"src": src, "dest": twins["dest"]})
    assert r["changed"] is True and SHARD in r["copied_files"], r
    assert_is(twins["dest"], src)


def _remove(path):
    os.unlink(path)


def _truncate(path):
    os.truncate(path, os.path.getsize(path) - 1)


def _rewrite_same_size(path):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(b"\x5a\xa5\x5a\xa5")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replace_by_rename(path):
    st = os.stat(path)
    tmp = path + ".new"
    shutil.copyfile(path, tmp)
    with open(tmp, "r+b") as f:
        f.seek(st.st_size - 3)
        f.write(b"zzz")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(tmp, path)


@pytest.mark.parametrize("verify", ["size", "headers", "sha256"])
@pytest.mark.parametrize("how,reason", [
    (_remove, "removed from dest after publish"),
    (_truncate, "resized in dest after publish"),
    (_rewrite_same_size, "rewritten in dest after publish"),
    (_replace_by_rename, "rewritten in dest after publish"),
], ids=["removed", "truncated", "rewritten", "replaced"])
def test_copy_damaged_after_publish_is_staged_again_alone(run_module, twins, monkeypatch, verify, how, reason):
    src, dest = twins["a"], twins["dest"]
    run_module(model_stage, {"src": src, "dest": dest, "verify": verify})
    how(os.path.join(dest, SHARD))
    r = run_module(model_stage, {"src": src, "dest": dest, "verify": verify})
    assert r["changed"] is True and r["copied_files"] == [SHARD], r
    assert r["restaged_files"] == [{"path": SHARD, "reason": r["restaged_files"][0]["reason"]}]
    assert r["restaged_files"][0]["reason"].startswith(reason) and reason in r["reason"]
    assert r["files_skipped"] == len(twins["files"]) - 1
    assert_is(dest, src)

    # the next re-run is decided from lstat alone: no header is read
    def no_reads(*a, **k):
        raise AssertionError("a re-run of a published revision read a header")
    monkeypatch.setattr(_safetensors, "verify_file", no_reads)
    again = run_module(model_stage, {"src": src, "dest": dest, "verify": verify})
    assert again["changed"] is False and again["reason"] is None, again


def test_file_added_to_dest_after_publish_is_dropped(run_module, twins):
    run_module(model_stage, {"src": twins["a"], "dest": twins["dest"]})
    with open(os.path.join(twins["dest"], "planted.py"), "w") as f:
        f.write("import os\n")
    r = run_module(model_stage, {"src": twins["a"], "dest": twins["dest"]})
    assert r["changed"] is True and r["files_copied"] == 0 and "planted.py" in r["reason"], r
    assert_is(twins["dest"], twins["a"])


def test_dest_holding_only_a_copied_marker_is_not_staged(run_module, twins):
    first = twins["dest"] + "-first"
    run_module(model_stage, {"src": twins["a"], "dest": first})
    os.makedirs(twins["dest"])
    shutil.copy2(os.path.join(first, MARKER), os.path.join(twins["dest"], MARKER))
    r = run_module(model_stage, {"src": twins["a"], "dest": twins["dest"]})
    assert r["changed"] is True and r["files_copied"] == len(twins["files"]), r
    assert all(e["reason"].startswith("removed from dest") for e in r["restaged_files"])
    assert_is(twins["dest"], twins["a"])


def test_dest_symlinked_to_another_published_revision_is_refused_and_that_revision_kept(run_module, twins):
    rev_a = twins["dest"] + "-a"
    run_module(model_stage, {"src": twins["a"], "dest": rev_a})
    before = (tree_bytes(rev_a), open(os.path.join(rev_a, MARKER)).read())
    os.symlink(rev_a, twins["dest"])
    for _attempt in range(2):
        r = run_module(model_stage, {"src": twins["b"], "dest": twins["dest"]})
        assert r.get("failed") and r["msg"].startswith("dest: ") and "is a symlink" in r["msg"], r
    assert (tree_bytes(rev_a), open(os.path.join(rev_a, MARKER)).read()) == before
    assert os.path.islink(twins["dest"]) and not os.path.lexists(twins["dest"] + ".partial")


def _start(tmp_path, tag, args):
    path = tmp_path / ("%s.json" % tag)
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    return subprocess.Popen([sys.executable, MODULE, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=PYCOLL))


def _result(proc):
    out, err = proc.communicate(timeout=120)
    assert "{" in out, (out[-2000:], err[-2000:])
    return json.loads(out[out.index("{"):])


def test_concurrent_runs_from_different_sources_end_with_one_consistent_revision(twins):
    procs = [_start(twins["tmp"], tag, {"src": twins[tag], "dest": twins["dest"], "fsync": False})
             for tag in ("a", "b")]
    results = [_result(p) for p in procs]
    assert not any(r.get("failed") for r in results), results
    got = tree_bytes(twins["dest"])
    winner = [tag for tag in ("a", "b") if tree_bytes(twins[tag]) == got]
    assert len(winner) == 1, "dest mixes the two revisions"
    assert marker(twins["dest"])["source"] == os.path.realpath(twins[winner[0]])


def test_run_interrupted_mid_copy_then_another_source_publishes_only_that_source(run_module, twins):
    # revision a fails on its last (smallest) file: everything else is complete in the partial dir
    sums = os.path.join(twins["a"], "SHA256SUMS")
    good = open(sums).read()
    st = os.stat(sums)
    open(sums, "w").write("".join(("0" * 64 + ln[64:]) if ln.endswith("  tokenizer_config.json\n") else ln
                                  for ln in good.splitlines(True)))
    os.utime(sums, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = run_module(model_stage, {"src": twins["a"], "dest": twins["dest"], "verify": "sha256", "read_streams": 1})
    assert r.get("failed") and "tokenizer_config.json" in r["msg"], r
    assert SHARD in os.listdir(twins["dest"] + ".partial")
    # then the twin revision: same names, sizes, mtimes and headers, other bytes
    r = run_module(model_stage, {"src": twins["b"], "dest": twins["dest"]})
    assert r["changed"] is True and SHARD in r["copied_files"], r
    assert_is(twins["dest"], twins["b"])
