"""model_stage trusts nothing it reads back: the stage marker, its entries and checksum manifests.

A malformed marker means "not staged" (the revision is staged again) or a clean error, never a traceback,
a hang, or a path outside dest; a checksums manifest names files inside src only, and errors never echo its
content. (Issue "Trust", classes 1 and 10.)
"""
from __future__ import annotations

import filecmp
import json
import os
import struct
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

MARKER = ".llmops-staged.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
MODULE = os.path.join(ROOT, "plugins", "modules", "model_stage.py")
PYCOLL = os.path.join(ROOT, ".build", "pycoll")


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "shared" / "m" / "rev1"
    info = _stage_synth.write_checkpoint(str(src), 256 * 1024, shards=2, seed=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious\n")
    return {"src": str(src), "dest": str(tmp_path / "nvme" / "m" / "rev1"), "info": info, "tmp": tmp_path,
            "outside": outside}


def identical(src, dest):
    names = sorted(os.listdir(src))
    assert sorted(n for n in os.listdir(dest) if n != MARKER) == names
    for n in names:
        assert filecmp.cmp(os.path.join(src, n), os.path.join(dest, n), shallow=False), n


def run_proc(tmp_path, args, timeout=20):
    """The module as Ansible runs it, in its own process: a hang is a failure, not a stuck test run."""
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    try:
        p = subprocess.run([sys.executable, MODULE, str(path)], capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, PYTHONPATH=PYCOLL), check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("model_stage hung for %d s" % timeout)
    assert "{" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    return json.loads(p.stdout[p.stdout.index("{"):])


ESCAPING_ENTRY = {"format": 2, "source": "/", "verify": "headers", "staged_at": 1, "files": [
    {"path": "../../outside/victim", "size": 9, "mtime_ns": 1, "verify": "headers",
     "src": {"dev": 1, "ino": 1, "mtime_ns": 1, "ctime_ns": 1}, "copy": {"ino": 1, "size": 9, "mtime_ns": 1, "ctime_ns": 1}}]}


@pytest.mark.parametrize("doc", [
    "[]",
    '{"files": "abc"}',
    '{"files": [1, 2]}',
    '{"files": [{"path": "config.json"}]}',
    '{"source": 7, "files": [{"path": null, "size": "x", "mtime_ns": []}]}',
    "[" * 200000 + "]" * 200000,
    "\xff\xfe not json",
    json.dumps(ESCAPING_ENTRY),
], ids=["list", "files-str", "files-ints", "entry-missing-fields", "wrong-types", "nesting-bomb", "not-utf8",
        "entry-escapes"])
def test_malformed_marker_means_not_staged_and_is_restaged(run_module, tree, doc):
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    with open(os.path.join(tree["dest"], MARKER), "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(doc)
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]}, diff=True)
    assert not r.get("failed"), r
    assert r["changed"] is True and r["reason"].startswith("not staged: "), r
    assert r["files_copied"] == len(tree["info"]["files"])
    assert "outside" not in r["diff"]["before"] and "victim" not in json.dumps(r)
    identical(tree["src"], tree["dest"])
    assert json.load(open(os.path.join(tree["dest"], MARKER)))["source"] == tree["src"]
    assert (tree["outside"] / "victim").read_text() == "precious\n"
    assert run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})["changed"] is False


def test_marker_that_is_a_fifo_is_refused_not_waited_on(tree):
    os.makedirs(tree["dest"])
    os.mkfifo(os.path.join(tree["dest"], MARKER))
    r = run_proc(tree["tmp"], {"src": tree["src"], "dest": tree["dest"]})
    assert r.get("failed") and r["msg"].startswith("dest: ") and "not a marker file" in r["msg"], r
    assert os.listdir(tree["dest"]) == [MARKER]


def test_marker_symlinked_from_a_published_revision_is_not_a_staged_dest(run_module, tree):
    other = str(tree["tmp"] / "nvme" / "m" / "published")
    run_module(model_stage, {"src": tree["src"], "dest": other})
    os.makedirs(tree["dest"])
    os.symlink(os.path.join(other, MARKER), os.path.join(tree["dest"], MARKER))
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert r.get("failed") and "symlink, not a marker file" in r["msg"], r
    assert os.listdir(tree["dest"]) == [MARKER]
    identical(tree["src"], other)


def test_marker_entry_reached_through_a_planted_symlink_is_restaged(run_module, tree):
    sub = os.path.join(tree["src"], "tokenizer")
    os.makedirs(sub)
    with open(os.path.join(sub, "vocab.bin"), "wb") as f:
        f.write(b"v" * 4096)
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    # a same-sized file outside dest, and dest's directory swapped for a link to it
    (tree["outside"] / "vocab.bin").write_bytes(b"X" * 4096)
    st = os.stat(os.path.join(sub, "vocab.bin"))
    os.utime(str(tree["outside"] / "vocab.bin"), ns=(st.st_atime_ns, st.st_mtime_ns))
    staged = os.path.join(tree["dest"], "tokenizer")
    os.unlink(os.path.join(staged, "vocab.bin"))
    os.rmdir(staged)
    os.symlink(str(tree["outside"]), staged)
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert r["changed"] is True and r["copied_files"] == ["tokenizer/vocab.bin"], r
    assert r["restaged_files"][0]["path"] == "tokenizer/vocab.bin"
    assert "symlink" in r["restaged_files"][0]["reason"]
    assert not os.path.islink(staged)
    assert open(os.path.join(staged, "vocab.bin"), "rb").read() == b"v" * 4096
    assert (tree["outside"] / "vocab.bin").read_bytes() == b"X" * 4096
    assert (tree["outside"] / "victim").read_text() == "precious\n"


# ---- checksums manifests -------------------------------------------------------------------------------
def _manifest(tree, lines):
    path = str(tree["tmp"] / "sums.txt")
    with open(path, "w") as f:
        f.write("".join(lines))
    return path


def _good_lines(tree):
    with open(os.path.join(tree["src"], "SHA256SUMS")) as f:
        return list(f)


@pytest.mark.parametrize("name,why", [
    ("/etc/hostname", "is absolute"),
    ("../../../outside/victim", "climbs out with '..'"),
    ("config.json/../../x", "climbs out with '..'"),
])
def test_checksums_entry_leaving_src_is_named_as_a_checksums_error(run_module, tree, name, why):
    lines = _good_lines(tree) + ["%s  %s\n" % ("ab" * 32, name)]
    path = _manifest(tree, lines)
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "sha256", "checksums": path})
    assert r.get("failed") and r["msg"].startswith("checksums: %s line %d" % (path, len(lines))), r
    assert why in r["msg"] and "missing shard" not in r["msg"]
    assert not os.path.exists(tree["dest"])


def test_checksums_that_is_not_text_is_a_clean_error(run_module, tree):
    path = str(tree["tmp"] / "sums.bin")
    with open(path, "wb") as f:
        f.write(b"\xff\xfe\x00\x81" * 64)
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "sha256", "checksums": path})
    assert r.get("failed") and r["msg"].startswith("checksums: ") and "not UTF-8" in r["msg"], r
    assert not os.path.exists(tree["dest"])


def test_checksums_that_is_a_fifo_is_refused_not_waited_on(tree):
    path = str(tree["tmp"] / "sums.fifo")
    os.mkfifo(path)
    r = run_proc(tree["tmp"], {"src": tree["src"], "dest": tree["dest"], "verify": "sha256", "checksums": path})
    assert r.get("failed") and r["msg"].startswith("checksums: ") and "not a regular file" in r["msg"], r


def test_checksums_error_does_not_echo_the_file(run_module, tree):
    secret = "hf_" + "Q" * 34
    path = _manifest(tree, _good_lines(tree) + ["token=%s\n" % secret])
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "sha256", "checksums": path})
    assert r.get("failed") and r["msg"].startswith("checksums: ") and "line" in r["msg"], r
    assert secret not in json.dumps(r)


# ---- safetensors headers as staging sees them (class 10) ------------------------------------------------
def _replace_header(path, raw):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def test_nested_json_bomb_in_a_shard_header_is_a_clean_error_naming_the_shard(run_module, tree):
    shard = os.path.join(tree["src"], "model-00001-of-00002.safetensors")
    _replace_header(shard, b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}")
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert r.get("failed") is True, r
    assert r["file"] == shard and "header" in r["msg"], r
    assert not os.path.exists(tree["dest"])


@pytest.mark.parametrize("value,needle", [("1" + "0" * 400, "refused"), ("1e400", "not finite"),
                                          ("NaN", "not a finite JSON number"),
                                          ("[" * 100 + "]" * 100, "nests deeper than 64 levels")],
                         ids=["10**400", "1e400", "NaN", "nested-100"])
def test_marker_number_out_of_range_or_deep_nesting_means_not_staged(run_module, tree, value, needle):
    """Before: ``staged_at: 10**400`` raised OverflowError (float()), NaN was accepted, and a nesting within the
    interpreter's recursion limit was walked."""
    import re
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    path = os.path.join(tree["dest"], MARKER)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(re.sub(r'"staged_at": [0-9.e+]+', '"staged_at": %s' % value, text))
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert not r.get("failed"), r
    assert r["changed"] is True and r["reason"].startswith("not staged: ") and needle in r["reason"], r["reason"]
    identical(tree["src"], tree["dest"])


def test_journal_lines_out_of_range_or_deep_are_ignored_not_a_traceback(tmp_path):
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as m
    good = {"path": "a.bin", "size": 3, "verify": "size", "source": "/src",
            "src": {"dev": 1, "ino": 2, "mtime_ns": 3, "ctime_ns": 4},
            "copy": {"ino": 5, "size": 3, "mtime_ns": 6, "ctime_ns": 7}}
    bad = [json.dumps(dict(good, path="b.bin")).replace('"size": 3', '"size": 1' + "0" * 400),
           json.dumps(dict(good, path="c.bin", x=[[[[[[[[[[]]]]]]]]]])).replace("[[", "[" * 100).replace("]]", "]" * 100),
           json.dumps(dict(good, path="d.bin")).replace('"dev": 1', '"dev": NaN'),
           '{"path": "e.bin", "size": 1e400}',
           "[" * 100000]
    (tmp_path / m.JOURNAL).write_text("\n".join(bad + [json.dumps(good)]) + "\n")
    out = m.partial_records(str(tmp_path))
    assert sorted(out) == ["a.bin"] and out["a.bin"][1] == "/src"


def test_journal_that_is_a_fifo_is_skipped_without_blocking(tmp_path):
    import threading
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as m
    os.mkfifo(tmp_path / m.JOURNAL)
    box = {}
    t = threading.Thread(target=lambda: box.update(out=m.partial_records(str(tmp_path))), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and box["out"] == {}
