"""Staging's order never comes from a clock, and its names are compared, created and refused by one rule.

Order: pruning keeps the newest revisions by the ``sequence`` each marker records at publish (``_clock``,
``_stage_publish``), never by ``staged_at``: before, a revision staged while the clock was a year ahead stayed
"newest" and ``keep_revisions`` deleted the newer one. Names (``_names``): pins are compared after Unicode
normalisation and a pin that matches nothing is reported; a source name dest's filesystem cannot hold with
``.llmops-part``, or one that is not UTF-8, is refused before the lock is taken (before: ENAMETOOLONG mid-copy, the
lock and ``<dest>.partial`` left behind).
"""
from __future__ import annotations

import json
import os
import time
import unicodedata

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.modules import model_stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker

YEAR = 365 * 86400
NFC = unicodedata.normalize("NFC", "modèle-café")
NFD = unicodedata.normalize("NFD", "modèle-café")


def _src(root, name, files=None):
    src = os.path.join(str(root), "shared", name)
    os.makedirs(src)
    for rel, data in (files or {"config.json": name.encode()}).items():
        path = os.path.join(src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return src


def _stage_at(tmp_path, name, keep=0, pinned=(), **kw):
    src = _src(tmp_path, name) if not os.path.isdir(os.path.join(str(tmp_path), "shared", name)) \
        else os.path.join(str(tmp_path), "shared", name)
    return _stage.stage(src, os.path.join(str(tmp_path), "nvme", name), verify="size", fsync=False,
                        keep_revisions=keep, pinned=pinned, **kw)


def _marker(tmp_path, name):
    with open(os.path.join(str(tmp_path), "nvme", name, _stage.MARKER)) as f:
        return json.load(f)


def _revisions(tmp_path):
    return sorted(n for n in os.listdir(os.path.join(str(tmp_path), "nvme"))
                  if not n.endswith((_stage.LOCK_SUFFIX, _stage.PARTIAL_SUFFIX)))


# ---- order ---------------------------------------------------------------------------------------------

def test_a_revision_staged_while_the_clock_was_a_year_ahead_does_not_outlive_newer_ones(tmp_path, monkeypatch):
    """Before: r1's ``staged_at`` was a year ahead, so ``keep_revisions: 2`` staging r3 kept r1 and deleted r2."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + YEAR)
    _stage_at(tmp_path, "r1")
    monkeypatch.setattr(time, "time", real)
    _stage_at(tmp_path, "r2")
    res = _stage_at(tmp_path, "r3", keep=2)
    assert res["pruned"] == [os.path.join(str(tmp_path), "nvme", "r1")]
    assert _revisions(tmp_path) == ["r2", "r3"]
    assert [_marker(tmp_path, n)["sequence"] for n in ("r2", "r3")] == [2, 3]


def test_a_clock_that_went_backwards_does_not_make_the_newest_revision_the_oldest(tmp_path, monkeypatch):
    real = time.time
    _stage_at(tmp_path, "r1")
    _stage_at(tmp_path, "r2")
    monkeypatch.setattr(time, "time", lambda: real() - 10 * YEAR)  # r3 staged with the clock reset to 2016
    _stage_at(tmp_path, "r3")
    monkeypatch.setattr(time, "time", real)
    res = _stage_at(tmp_path, "r4", keep=3)
    assert res["pruned"] == [os.path.join(str(tmp_path), "nvme", "r1")]
    assert _revisions(tmp_path) == ["r2", "r3", "r4"]


def test_a_marker_without_a_sequence_counts_as_older_than_every_sequenced_one(tmp_path):
    """Markers written before sequences existed: older than all others, in ``staged_at`` order among themselves."""
    for name in ("old-a", "old-b"):
        _stage_at(tmp_path, name)
    for name, staged_at in (("old-a", 4e9), ("old-b", 5e9)):  # both "in the future", b the later
        path = os.path.join(str(tmp_path), "nvme", name, _stage.MARKER)
        doc = _marker(tmp_path, name)
        doc.pop("sequence")
        doc["staged_at"] = staged_at
        with open(path, "w") as f:
            json.dump(doc, f)
    _stage_at(tmp_path, "new-1")
    res = _stage_at(tmp_path, "new-2", keep=3)
    assert res["pruned"] == [os.path.join(str(tmp_path), "nvme", "old-a")]
    assert _marker(tmp_path, "new-1")["sequence"] == 1  # legacy markers carry none: numbering starts at 1
    res = _stage_at(tmp_path, "new-2", keep=2)
    assert res["pruned"] == [os.path.join(str(tmp_path), "nvme", "old-b")]


def test_restaging_a_revision_in_place_moves_it_to_the_top_of_the_order(tmp_path):
    _stage_at(tmp_path, "r1")
    _stage_at(tmp_path, "r2")
    with open(os.path.join(str(tmp_path), "shared", "r1", "extra.bin"), "wb") as f:
        f.write(b"new file")
    _stage_at(tmp_path, "r1")  # published again: the next sequence
    assert _marker(tmp_path, "r1")["sequence"] == 3
    res = _stage_at(tmp_path, "r3", keep=2)
    assert res["pruned"] == [os.path.join(str(tmp_path), "nvme", "r2")]


@pytest.mark.parametrize("value", ["3", 0, -1, True, 1.5, [1]])
def test_a_marker_whose_sequence_is_not_a_positive_integer_is_not_a_valid_marker(tmp_path, value):
    _stage_at(tmp_path, "r1")
    doc = _marker(tmp_path, "r1")
    doc["sequence"] = value
    with open(os.path.join(str(tmp_path), "nvme", "r1", _stage.MARKER), "w") as f:
        json.dump(doc, f)
    ms = _stage_marker.read_marker(os.path.join(str(tmp_path), "nvme", "r1"))
    assert ms.kind == "bad" and "sequence must be an integer of at least 1" in ms.reason


# ---- pins ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stored, typed", [(NFD, NFC), (NFC, NFD)])
def test_a_pin_in_one_unicode_spelling_protects_the_directory_stored_in_the_other(tmp_path, stored, typed):
    """Before: the NFD directory pinned as NFC compared unequal as strings and was pruned."""
    _stage_at(tmp_path, stored)
    _stage_at(tmp_path, "r2")
    res = _stage_at(tmp_path, "r3", keep=1, pinned=[typed])
    assert stored in _revisions(tmp_path)
    assert res["pruned"] == [os.path.join(str(tmp_path), "nvme", "r2")]
    assert res["unmatched_pins"] == []


@pytest.mark.parametrize("stored, typed", [(NFD, NFC), (NFC, NFD)])
def test_a_path_pin_in_another_spelling_protects_the_directory(tmp_path, stored, typed):
    _stage_at(tmp_path, stored)
    res = _stage_at(tmp_path, "r2", keep=1, pinned=[os.path.join(str(tmp_path), "nvme", typed) + "/"])
    assert stored in _revisions(tmp_path) and res["pruned"] == [] and res["unmatched_pins"] == []


def test_a_pin_that_names_no_revision_is_reported_and_the_module_warns(tmp_path, run_module):
    _stage_at(tmp_path, "r1")
    res = _stage_at(tmp_path, "r2", keep=1, pinned=["r1", "r-typo", "/nowhere/r9"])
    assert res["unmatched_pins"] == ["r-typo", "/nowhere/r9"]
    out = run_module(model_stage, dict(src=os.path.join(str(tmp_path), "shared", "r2"),
                                       dest=os.path.join(str(tmp_path), "nvme", "r2"), verify="size", fsync=False,
                                       keep_revisions=1, pinned=["r1", "r-typo"]))
    assert out["unmatched_pins"] == ["r-typo"]
    assert any("pinned: 'r-typo' names no staged revision" in w for w in out.get("warnings", []))


# ---- names ---------------------------------------------------------------------------------------------

def _nothing_created(tmp_path, name="r"):
    nvme = os.path.join(str(tmp_path), "nvme")
    return not os.path.exists(nvme) or os.listdir(nvme) == []


def test_a_source_name_too_long_with_the_in_flight_suffix_is_refused_before_the_lock(tmp_path):
    """Before: a legal 250-byte name became a 262-byte ``.llmops-part`` name: ENAMETOOLONG mid-copy, with the lock
    and ``<dest>.partial`` left behind."""
    long_name = "w" * 250 + ".bin"  # 254 bytes: legal; with ".llmops-part" 266
    _src(tmp_path, "r", {"config.json": b"{}", long_name: b"x" * 10})
    with pytest.raises(_stage.StageError) as e:
        _stage_at(tmp_path, "r")
    assert e.value.reason == "name_too_long"
    assert "src: %s" % os.path.join(str(tmp_path), "shared", "r", long_name) in str(e.value)
    assert "266 with the suffix .llmops-part" in str(e.value) and "255-byte limit" in str(e.value)
    assert _nothing_created(tmp_path)


def test_a_name_that_just_fits_with_the_suffix_is_staged(tmp_path):
    name = "w" * (255 - len(_stage.PART_SUFFIX) - 4) + ".bin"  # 255 bytes with ".llmops-part"
    _src(tmp_path, "r", {name: b"abc"})
    res = _stage_at(tmp_path, "r")
    assert res["files_copied"] == 1
    with open(os.path.join(str(tmp_path), "nvme", "r", name), "rb") as f:
        assert f.read() == b"abc"


def test_a_multibyte_name_is_measured_in_bytes(tmp_path):
    name = "é" * 122 + ".bin"  # 248 bytes in UTF-8 (126 characters): with the suffix 260
    _src(tmp_path, "r", {name: b"abc"})
    with pytest.raises(_stage.StageError) as e:
        _stage_at(tmp_path, "r")
    assert e.value.reason == "name_too_long" and "248-byte name" in str(e.value)
    assert _nothing_created(tmp_path)


def test_check_mode_refuses_the_same_name(tmp_path):
    _src(tmp_path, "r", {"d" * 250 + ".bin": b"x"})
    with pytest.raises(_stage.StageError) as e:
        _stage.stage(os.path.join(str(tmp_path), "shared", "r"), os.path.join(str(tmp_path), "nvme", "r"),
                     check_mode=True)
    assert e.value.reason == "name_too_long"


def test_a_path_over_path_max_in_the_build_directory_is_refused_up_front(tmp_path):
    """A source path that is readable (under 4096 bytes) but over PATH_MAX below ``<dest>.partial``."""
    deep = "/".join(["d" * 200] * 19) + "/f.bin"  # 3,824 bytes below src
    src = _src(tmp_path, "r", {deep: b"x"})
    with pytest.raises(_stage.StageError) as e:
        _stage.stage(src, os.path.join(str(tmp_path), "nvme", "v" * 200), verify="size", fsync=False)
    assert e.value.reason == "path_too_long" and "4096-byte limit of a path (PATH_MAX)" in str(e.value)
    assert _nothing_created(tmp_path)


def test_a_dest_name_too_long_for_its_removal_name_is_refused(tmp_path):
    """dest's name plus ``.removing-XXXXXXXX`` (18 bytes) must fit: otherwise pruning or absent fails mid-way."""
    _src(tmp_path, "r")
    with pytest.raises(_stage.StageError) as e:
        _stage.stage(os.path.join(str(tmp_path), "shared", "r"), os.path.join(str(tmp_path), "nvme", "v" * 240),
                     verify="size")
    assert e.value.reason == "name_too_long" and ".removing-" in str(e.value)
    assert _nothing_created(tmp_path)


def test_a_name_that_is_not_utf8_is_refused_up_front_and_shown_safely(tmp_path):
    src = _src(tmp_path, "r", {"config.json": b"{}"})
    with open(os.path.join(os.fsencode(src), b"caf\xe9.bin"), "wb") as f:
        f.write(b"latin-1 name")
    with pytest.raises(_stage.StageError) as e:
        _stage_at(tmp_path, "r")
    assert e.value.reason == "not_utf8"
    assert "caf\\xe9.bin" in str(e.value) and "\udce9" not in str(e.value)
    str(e.value).encode("utf-8")  # printable in a result as it is
    assert _nothing_created(tmp_path)


def test_a_name_that_is_not_utf8_is_refused_before_a_fan_out_receiver_starts(tmp_path):
    """The receiver never sees a name it could not put on the wire (before: a dead poll thread, a hang)."""
    src = _src(tmp_path, "r", {"config.json": b"{}"})
    with open(os.path.join(os.fsencode(src), b"w\xff.bin"), "wb") as f:
        f.write(b"x")
    t0 = time.monotonic()
    with pytest.raises(_stage.StageError) as e:
        _stage_at(tmp_path, "r", peers=[{"url": "http://127.0.0.1:9/r/m/r", "seed": True}], peer_token="t" * 32)
    assert e.value.reason == "not_utf8"
    assert time.monotonic() - t0 < 30
    assert _nothing_created(tmp_path)


@pytest.mark.parametrize("stored, typed", [(NFD, NFC), (NFC, NFD)])
def test_absent_refuses_a_revision_pinned_in_another_spelling(tmp_path, stored, typed):
    _stage_at(tmp_path, stored)
    with pytest.raises(_stage.StageError) as e:
        _stage.remove(os.path.join(str(tmp_path), "nvme", stored), pinned=[typed])
    assert str(e.value).startswith("pinned: ")
    assert stored in _revisions(tmp_path)


def test_the_module_fails_with_the_file_and_reason_of_a_name_refusal(tmp_path, run_module):
    long_name = "m" * 246 + ".bin"
    src = _src(tmp_path, "r", {long_name: b"x"})
    out = run_module(model_stage, dict(src=src, dest=os.path.join(str(tmp_path), "nvme", "r"), verify="size"))
    assert out["failed"] and out["reason"] == "name_too_long"
    assert out["file"] == os.path.join(src, long_name)
    assert out["msg"].startswith("src: %s has a 250-byte name (262 with the suffix .llmops-part" % out["file"])
    assert _nothing_created(tmp_path)
