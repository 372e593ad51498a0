"""The one rule for paths read from files (manifests, markers, checksum lists)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common._paths import PathEscape, contained, is_within, overlaps


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "", ".", "a//b", "./a", "a/./b", "a\x00b",
                                 None, 3, ["a"]])
def test_entries_that_leave_or_are_not_one_spelling_are_refused(tmp_path, rel):
    with pytest.raises(PathEscape) as e:
        contained(str(tmp_path), rel, field="manifest.json files[0].path")
    assert "manifest.json files[0].path" in str(e.value)


def test_symlinks_in_the_entry_are_refused_even_when_they_stay_inside(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "inside").mkdir()
    (tmp_path / "root" / "esc").symlink_to(tmp_path / "out")
    (tmp_path / "root" / "in").symlink_to(tmp_path / "root" / "inside")
    (tmp_path / "root" / "f").symlink_to(tmp_path / "out" / "secret")
    for rel in ("esc/x", "in/x", "f"):
        with pytest.raises(PathEscape, match="symlink"):
            contained(str(tmp_path / "root"), rel)


def test_plain_entries_resolve_under_the_real_root(tmp_path):
    (tmp_path / "real" / "a").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert contained(str(tmp_path / "link"), "a/b.bin") == os.path.join(str(tmp_path / "real"), "a", "b.bin")
    with pytest.raises(PathEscape, match="through a file"):
        (tmp_path / "real" / "file").write_text("x")
        contained(str(tmp_path / "real"), "file/child")


def test_error_never_shows_a_long_or_binary_entry(tmp_path):
    with pytest.raises(PathEscape) as e:
        contained(str(tmp_path), "/" + "A" * 5000)
    assert "A" * 300 not in str(e.value)


def test_overlap_is_decided_after_resolving_symlinks(tmp_path):
    (tmp_path / "src" / "rev").mkdir(parents=True)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "rev").symlink_to(tmp_path / "src" / "rev")
    assert overlaps(str(tmp_path / "dst" / "rev"), str(tmp_path / "src"))
    assert is_within(str(tmp_path / "dst" / "rev" / "x"), str(tmp_path / "src"))
    assert not overlaps(str(tmp_path / "src2"), str(tmp_path / "src"))
