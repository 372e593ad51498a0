"""model_stage reads src and never writes, moves or deletes it; what it cannot copy faithfully it refuses.

Every overlap between src and what a run writes (dest, ``<dest>.partial``, ``<dest>.lock``, the progress file,
the fleet lease directory, the checksums manifest inside dest) is refused before anything changes, with the
option and the fix; so are symlinks that leave src, directory symlinks, special files and names model_stage
reserves. (Issue "Trust", class 2.)
"""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

MARKER = ".llmops-staged.json"


def snapshot(root):
    """Everything under ``root``: {rel: bytes | ('link', target) | 'dir'}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = "dir"
            else:
                with open(full, "rb") as f:
                    out[rel] = f.read()
    return out


@pytest.fixture
def box(tmp_path):
    shared = tmp_path / "shared" / "m"
    nvme = tmp_path / "nvme" / "m"
    nvme.mkdir(parents=True)
    return {"tmp": tmp_path, "shared": shared, "nvme": nvme}


def make_src(path, seed=1):
    _stage_synth.write_checkpoint(str(path), 128 * 1024, shards=2, seed=seed)
    return str(path)


def refused(r, prefix, *needles):
    assert r.get("failed") is True, r
    assert r["msg"].startswith(prefix), r["msg"]
    for n in needles:
        assert n in r["msg"], r["msg"]


def test_src_named_like_dests_partial_dir_is_not_renamed_into_dest(run_module, box):
    src = make_src(box["nvme"] / "rev.partial")
    before = snapshot(src)
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev")})
    refused(r, "src: ", "build directory", "choose another dest")
    assert snapshot(src) == before
    assert not os.path.exists(str(box["nvme"] / "rev"))


def test_src_below_dests_partial_dir_is_not_deleted(run_module, box):
    src = make_src(box["nvme"] / "rev.partial" / "upload")
    before = snapshot(src)
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev")})
    refused(r, "src: ", "build directory")
    assert snapshot(src) == before


def test_src_named_like_dests_lock_file_is_refused(run_module, box):
    src = make_src(box["nvme"] / "rev.lock")
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev")})
    refused(r, "src: ", "lock file")


def test_dest_reached_through_a_symlink_into_src_is_refused(run_module, box):
    src = make_src(box["shared"] / "rev1")
    before = snapshot(src)
    link = box["tmp"] / "nvme" / "via-link"
    os.symlink(src, str(link))
    r = run_module(model_stage, {"src": src, "dest": str(link / "copy")})
    refused(r, "dest: ", "overlaps src", "outside src")
    assert snapshot(src) == before


def test_progress_file_inside_src_is_not_written(run_module, box):
    src = make_src(box["shared"] / "rev1")
    before = snapshot(src)
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev1"),
                                 "progress_file": os.path.join(src, "progress.json")})
    refused(r, "progress_file: ", "inside src", "outside the revision")
    assert snapshot(src) == before
    assert not os.path.exists(str(box["nvme"] / "rev1"))


@pytest.mark.parametrize("where", ["dest", "partial"])
def test_progress_file_inside_dest_is_refused_before_anything_is_written(run_module, box, where):
    src = make_src(box["shared"] / "rev1")
    dest = str(box["nvme"] / "rev1")
    inside = dest if where == "dest" else dest + ".partial"
    r = run_module(model_stage, {"src": src, "dest": dest, "progress_file": os.path.join(inside, "p.json")})
    refused(r, "progress_file: ", "staging replaces")
    assert os.listdir(str(box["nvme"])) == []


def test_checksums_inside_dest_is_refused(run_module, box):
    src = make_src(box["shared"] / "rev1")
    dest = str(box["nvme"] / "rev1")
    assert run_module(model_stage, {"src": src, "dest": dest, "verify": "size"})["changed"] is True
    published = snapshot(dest)
    r = run_module(model_stage, {"src": src, "dest": dest, "verify": "sha256",
                                 "checksums": os.path.join(dest, "SHA256SUMS")})
    refused(r, "checksums: ", "inside dest", "keep the manifest in src")
    assert snapshot(dest) == published


def test_fleet_slots_dir_inside_src_is_refused(run_module, box):
    src = make_src(box["shared"] / "rev1")
    before = snapshot(src)
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev1"),
                                 "fleet_slots_dir": os.path.join(src, ".slots"), "fleet_read_streams": 2})
    refused(r, "fleet_slots_dir: ", "overlaps src")
    assert snapshot(src) == before


@pytest.mark.parametrize("absolute", [True, False])
def test_symlink_inside_src_is_followed_and_one_leaving_src_is_refused(run_module, box, absolute):
    secret = box["tmp"] / "root-only"
    secret.write_text("shadow-like\n")
    os.chmod(str(secret), 0o600)
    src = make_src(box["shared"] / "rev1")
    dest = str(box["nvme"] / "rev1")
    os.symlink("config.json" if not absolute else os.path.join(src, "config.json"),
               os.path.join(src, "config-alias.json"))
    r = run_module(model_stage, {"src": src, "dest": dest})
    assert r["changed"] is True and "config-alias.json" in r["copied_files"], r
    assert not os.path.islink(os.path.join(dest, "config-alias.json"))
    assert open(os.path.join(dest, "config-alias.json"), "rb").read() == open(os.path.join(src, "config.json"), "rb").read()
    published = snapshot(dest)

    link = os.path.join(src, "extra.txt")
    os.symlink(str(secret) if absolute else os.path.relpath(str(secret), src), link)
    r = run_module(model_stage, {"src": src, "dest": dest})
    refused(r, "src: ", link, "leaves src")
    assert "shadow-like" not in json.dumps(r)
    assert snapshot(dest) == published


def test_directory_symlink_in_src_is_refused_not_silently_skipped(run_module, box):
    src = make_src(box["shared"] / "rev1")
    extra = box["tmp"] / "tokenizer"
    extra.mkdir()
    (extra / "vocab.json").write_text("{}")
    os.symlink(str(extra), os.path.join(src, "tokenizer"))
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev1")})
    refused(r, "src: ", "symlink to a directory", "replace the link")
    assert not os.path.exists(str(box["nvme"] / "rev1"))


def test_fifo_in_src_is_refused_not_silently_skipped(run_module, box):
    src = make_src(box["shared"] / "rev1")
    os.mkfifo(os.path.join(src, "pipe"))
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev1")})
    refused(r, "src: ", "a FIFO")


@pytest.mark.parametrize("name", [".llmops-staged.json.tmp", ".llmops-staged.journal", "w.bin.llmops-part",
                                  "sub.llmops-part/x"])
def test_source_file_with_a_reserved_name_is_refused(run_module, box, name):
    src = make_src(box["shared"] / "rev1")
    full = os.path.join(src, name)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(b"user data")
    r = run_module(model_stage, {"src": src, "dest": str(box["nvme"] / "rev1")})
    refused(r, "src: ", "reserves")
    assert not os.path.exists(str(box["nvme"] / "rev1"))


def test_a_staged_copy_used_as_src_is_neither_copied_nor_pruned(run_module, box):
    first = make_src(box["shared"] / "rev0")
    r0 = str(box["nvme"] / "rev0")
    run_module(model_stage, {"src": first, "dest": r0})
    before = snapshot(r0)
    # staging from the staged copy beside it, keeping one revision, would prune the source itself
    r = run_module(model_stage, {"src": r0, "dest": str(box["nvme"] / "rev1"), "keep_revisions": 1})
    refused(r, "src: ", MARKER, "staged copy")
    assert snapshot(r0) == before
