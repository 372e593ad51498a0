"""model_stage on small real checkpoints: publish, idempotence, resume, refusals, check/diff, pruning."""
from __future__ import annotations

import filecmp
import json
import os
import struct

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

MARKER = ".llmops-staged.json"


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "shared" / "m" / "rev1"
    info = _stage_synth.write_checkpoint(str(src), 512 * 1024, shards=3, seed=1)
    return {"src": str(src), "dest": str(tmp_path / "nvme" / "m" / "rev1"), "info": info, "tmp": tmp_path}


def same_tree(a, b):
    names = sorted(os.listdir(a))
    assert sorted(n for n in os.listdir(b) if n != MARKER) == names
    for n in names:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n


def test_stages_verified_copy_and_rerun_is_unchanged(run_module, tree):
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "progress_file": str(tree["tmp"] / "p.json")})
    assert r["changed"] is True, r
    assert r["files_total"] == r["files_copied"] == len(tree["info"]["files"])
    src_bytes = sum(os.path.getsize(os.path.join(tree["src"], f)) for f in tree["info"]["files"])
    assert r["bytes_copied"] == r["bytes_total"] == src_bytes
    assert 1 <= r["peak_read_streams"] <= 4 and r["verify"] == "headers"
    same_tree(tree["src"], tree["dest"])
    marker = json.load(open(os.path.join(tree["dest"], MARKER)))
    assert marker["source"] == tree["src"] and marker["verify"] == "headers"
    assert {f["path"] for f in marker["files"]} == set(tree["info"]["files"])
    assert not os.path.exists(tree["dest"] + ".partial")
    progress = json.load(open(tree["tmp"] / "p.json"))
    assert progress["state"] == "done" and progress["bytes_done"] == progress["bytes_total"] == r["bytes_copied"]
    assert "ETA" in progress["message"]

    again = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert again["changed"] is False and again["files_copied"] == 0 and again["files_skipped"] == r["files_total"]


def test_check_mode_and_diff_write_nothing(run_module, tree):
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "keep_revisions": 1},
                   check_mode=True, diff=True)
    assert r["changed"] is True and r["files_copied"] == len(tree["info"]["files"])
    assert "model-00001-of-00003.safetensors" in r["copied_files"]
    assert r["diff"]["before"] == "" and "SHA256SUMS" in r["diff"]["after"]
    assert not os.path.exists(os.path.dirname(tree["dest"]))


def test_changed_source_file_restages_only_that_file(run_module, tree):
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    cfg = os.path.join(tree["src"], "config.json")
    with open(cfg, "a") as f:
        f.write(" ")
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]}, diff=True)
    assert r["changed"] is True and r["copied_files"] == ["config.json"], r
    assert r["files_skipped"] == r["files_total"] - 1
    same_tree(tree["src"], tree["dest"])


def _interrupted_run(run_module, tree):
    """A real run that fails on its last file (wrong digest in the manifest), leaving a partial dir behind."""
    sums = os.path.join(tree["src"], "SHA256SUMS")
    good = open(sums).read()
    bad = "".join(("0" * 64 + line[64:]) if line.endswith("  tokenizer_config.json\n") else line
                  for line in good.splitlines(True))
    open(sums, "w").write(bad)
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "sha256", "read_streams": 1})
    assert r.get("failed") and "tokenizer_config.json" in r["msg"], r
    open(sums, "w").write(good)
    partial = tree["dest"] + ".partial"
    done = sorted(n for n in os.listdir(partial) if not n.startswith(".llmops"))
    # big files first, one stream: every other file is complete (the smallest, failing, one is not)
    assert "tokenizer_config.json" not in done and len(done) == len(tree["info"]["files"]) - 1, done
    return partial


def test_resume_reuses_complete_partial_files_and_drops_in_flight_ones(run_module, tree):
    partial = _interrupted_run(run_module, tree)
    with open(os.path.join(partial, "model-00001-of-00003.safetensors.llmops-part"), "wb") as f:
        f.write(b"half")
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    # SHA256SUMS was rewritten (a new source file), tokenizer_config.json never completed
    assert r["changed"] is True and sorted(r["copied_files"]) == ["SHA256SUMS", "tokenizer_config.json"], r
    assert r["files_skipped"] == len(tree["info"]["files"]) - 2
    same_tree(tree["src"], tree["dest"])
    assert not os.path.exists(partial)


def test_partial_file_with_wrong_header_is_recopied(run_module, tree):
    partial = _interrupted_run(run_module, tree)
    shard = "model-00002-of-00003.safetensors"
    dst = os.path.join(partial, shard)
    st = os.stat(dst)
    with open(dst, "r+b") as f:
        f.seek(8)
        f.write(b"[")
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert shard in r["copied_files"]
    same_tree(tree["src"], tree["dest"])


def _fails_untouched(run_module, tree, args, *needles):
    r = run_module(model_stage, dict({"src": tree["src"], "dest": tree["dest"]}, **args))
    assert r.get("failed") is True, r
    for n in needles:
        assert n in r["msg"], r["msg"]
    assert not os.path.exists(tree["dest"])
    return r


def test_truncated_shard_is_named(run_module, tree):
    p = os.path.join(tree["src"], "model-00003-of-00003.safetensors")
    os.truncate(p, os.path.getsize(p) - 100)
    _fails_untouched(run_module, tree, {}, "model-00003-of-00003.safetensors", "truncated")


def test_header_length_past_eof_is_named(run_module, tree):
    p = os.path.join(tree["src"], "model-00001-of-00003.safetensors")
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", 10 ** 7))
    _fails_untouched(run_module, tree, {}, "model-00001-of-00003.safetensors", "past end of file")


def test_shard_missing_from_src(run_module, tree):
    os.unlink(os.path.join(tree["src"], "model-00002-of-00003.safetensors"))
    _fails_untouched(run_module, tree, {"verify": "headers"}, "model-00002-of-00003.safetensors", "missing shard")


def test_tensor_missing_from_its_shard(run_module, tree):
    idx = os.path.join(tree["src"], "model.safetensors.index.json")
    doc = json.load(open(idx))
    doc["weight_map"]["model.layers.0.mlp.w0.weight"] = "model-00002-of-00003.safetensors"
    json.dump(doc, open(idx, "w"))
    _fails_untouched(run_module, tree, {}, "model-00002-of-00003.safetensors",
                     "tensor model.layers.0.mlp.w0.weight is missing from its shard")


def test_sha256_catches_corrupted_data_that_headers_cannot(run_module, tree):
    p = os.path.join(tree["src"], "model-00001-of-00003.safetensors")
    with open(p, "r+b") as f:
        f.seek(os.path.getsize(p) - 10)
        f.write(b"\xff" * 4)
    r = _fails_untouched(run_module, tree, {"verify": "sha256"}, "model-00001-of-00003.safetensors",
                         "checksum mismatch")
    assert r["file"].endswith("model-00001-of-00003.safetensors")
    ok = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert ok["changed"] is True  # headers mode cannot see data corruption, by design


def test_sha256_requires_every_file_in_manifest(run_module, tree):
    (tree["tmp"] / "shared" / "m" / "rev1" / "extra.txt").write_text("x")
    _fails_untouched(run_module, tree, {"verify": "sha256"}, "checksums:", "extra.txt")


def test_min_free_bytes_refuses_before_copying(run_module, tree):
    _fails_untouched(run_module, tree, {"min_free_bytes": 1 << 62}, "no space", "min_free_bytes")


def test_foreign_dest_is_not_overwritten(run_module, tree):
    os.makedirs(tree["dest"])
    (tree["tmp"] / "nvme" / "m" / "rev1" / "mine").write_text("keep")
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    assert r["failed"] and "not staged by this module" in r["msg"]
    assert os.listdir(tree["dest"]) == ["mine"]


def test_bad_options_are_named(run_module, tree):
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "read_streams": 0})
    assert r["failed"] and r["msg"].startswith("read_streams:")
    r = run_module(model_stage, {"src": str(tree["tmp"] / "nope"), "dest": tree["dest"]})
    assert r["failed"] and r["msg"].startswith("src:")
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["src"] + "/x"})
    assert r["failed"] and r["msg"].startswith("dest:")


def test_verify_upgrade_checks_published_copy_in_place(run_module, tree):
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "size"})
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "sha256"})
    assert r["changed"] is True and r["files_copied"] == 0
    assert json.load(open(os.path.join(tree["dest"], MARKER)))["verify"] == "sha256"
    assert run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "verify": "headers"})["changed"] is False


def test_absent_refuses_pinned_and_in_use_then_removes(run_module, tree):
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "state": "absent", "pinned": ["rev1"]})
    assert r["failed"] and "pinned" in r["msg"]
    proc = tree["tmp"] / "proc" / "4242" / "fd"
    proc.mkdir(parents=True)
    os.symlink(os.path.join(tree["dest"], "model-00001-of-00003.safetensors"), str(proc / "7"))
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "state": "absent",
                                 "proc_root": str(tree["tmp"] / "proc")})
    assert r["failed"] and "in use (pid 4242" in r["msg"]
    assert os.path.isdir(tree["dest"])
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "state": "absent"}, check_mode=True)
    assert r["changed"] is True and os.path.isdir(tree["dest"])
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "state": "absent"})
    assert r["changed"] is True and not os.path.exists(tree["dest"])
    assert run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "state": "absent"})["changed"] is False


def test_keep_revisions_prunes_oldest_but_not_pinned_or_in_use(run_module, tree):
    root = tree["tmp"]
    revs = []
    for i in range(4):
        src = root / "shared" / "m" / ("r%d" % i)
        _stage_synth.write_checkpoint(str(src), 64 * 1024, shards=1, seed=i, extra_files=False)
        revs.append((str(src), str(root / "nvme" / "m" / ("r%d" % i))))
    proc = root / "proc" / "77" / "fd"
    proc.mkdir(parents=True)
    for i, (src, dest) in enumerate(revs[:3]):
        run_module(model_stage, {"src": src, "dest": dest})
    os.symlink(os.path.join(revs[1][1], "SHA256SUMS"), str(proc / "3"))
    # r0 pinned, r1 in use, r2 newest older one (kept by keep=2), r3 staged now
    args = {"src": revs[3][0], "dest": revs[3][1], "keep_revisions": 2, "pinned": ["r0"],
            "proc_root": str(root / "proc")}
    r = run_module(model_stage, args, check_mode=True)
    assert r["pruned"] == [] and r["kept_in_use"][0]["path"] == revs[1][1]
    r = run_module(model_stage, args)
    assert r["changed"] is True
    assert sorted(os.listdir(root / "nvme" / "m")) == ["r0", "r0.lock", "r1", "r1.lock", "r2", "r2.lock", "r3", "r3.lock"]
    os.unlink(str(proc / "3"))
    r = run_module(model_stage, args)
    assert r["changed"] is True and r["pruned"] == [revs[1][1]]
    assert not os.path.exists(revs[1][1]) and os.path.isdir(revs[0][1]) and os.path.isdir(revs[2][1])


def test_absent_sees_mapped_files_too(run_module, tree):
    run_module(model_stage, {"src": tree["src"], "dest": tree["dest"]})
    proc = tree["tmp"] / "proc" / "9"
    proc.mkdir(parents=True)
    (proc / "maps").write_text("7f00-7f10 r--s 00000000 fd:00 12 %s/model-00001-of-00003.safetensors\n" % tree["dest"])
    r = run_module(model_stage, {"src": tree["src"], "dest": tree["dest"], "state": "absent",
                                 "proc_root": str(tree["tmp"] / "proc")})
    assert r["failed"] and "in use (pid 9 maps %s/model-00001" % tree["dest"] in r["msg"], r
    assert os.path.isdir(tree["dest"])


def test_fleet_slots_dir_needs_fleet_read_streams_before_anything_runs(tmp_path, run_module):
    # required_by in the argument spec: refused for state=absent too, and nothing is created
    for state in ("present", "absent"):
        r = run_module(model_stage, {"src": str(tmp_path / "src"), "dest": str(tmp_path / "dest"), "state": state,
                                     "fleet_slots_dir": str(tmp_path / "fleet")})
        assert r.get("failed") and "fleet_read_streams" in r["msg"], r
    assert not (tmp_path / "fleet").exists() and not (tmp_path / "dest").exists()


@pytest.mark.parametrize("dest", ["", "relative/m/rev1", "/", "//", "/tmp/.."])
def test_a_bad_dest_is_refused_alike_with_and_without_the_fan_out(tree, dest):
    # without fan-out options stage() checks dest itself (the fan-out is not imported); with them the fan-out's
    # option check does: the same rule, the same words
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
    msgs = []
    for extra in ({}, {"record_pieces": True}):
        with pytest.raises(_stage.StageError) as e:
            _stage.stage(tree["src"], dest, **extra)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1] and msgs[0].startswith("dest: ")


def test_a_plain_copy_does_not_import_the_fan_out_fleet_slots_pruning_or_http(tree):
    # Ansible compiles a module's imports from source in every run: a copy without peers, fleet slots or pruning
    # leaves those (and the HTTP client they pull in) alone
    import subprocess
    import sys
    code = ("import sys, json\n"
            "sys.argv = ['model_stage', sys.argv[1]]\n"
            "from ansible_collections.llmops.serving.plugins.modules import model_stage\n"
            "try:\n"
            "    model_stage.main()\n"
            "except SystemExit:\n"
            "    pass\n"
            "sys.stderr.write(json.dumps(sorted(m for m in sys.modules if m.rsplit('.', 1)[-1] in (\n"
            "    '_stage_fanout', '_stage_fanout_wire', '_stage_peer', '_fleet_slots', '_stage_prune', '_http',\n"
            "    'client', 'ssl'))))\n")
    args = tree["tmp"] / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"src": tree["src"], "dest": tree["dest"]}}))
    p = subprocess.run([sys.executable, "-c", code, str(args)], capture_output=True, text=True, timeout=120, check=False,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert '"changed": true' in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    assert json.loads(p.stderr.strip().splitlines()[-1]) == []
    same_tree(tree["src"], tree["dest"])
