"""``_names``: names compared after Unicode normalisation, created within the filesystem's limits, and UTF-8."""
from __future__ import annotations

import os
import unicodedata

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _names

NFC = unicodedata.normalize("NFC", "Llama-3-Instruct-café")
NFD = unicodedata.normalize("NFD", "Llama-3-Instruct-café")


def test_the_two_spellings_differ_as_strings_and_are_one_name():
    assert NFC != NFD and len(NFD) == len(NFC) + 1
    assert _names.normal(NFD) == NFC and _names.normal(NFC) == NFC
    assert _names.same_name(NFC, NFD) and _names.same_name(NFD, NFC)
    assert not _names.same_name(NFC, "Llama-3-Instruct-cafe")


def test_shown_keeps_a_printable_utf8_name_and_escapes_anything_else():
    assert _names.shown("config.json") == "config.json"
    assert _names.shown("caf\udce9.bin") == "b'caf\\xe9.bin'"  # os.listdir's spelling of b"caf\xe9.bin"
    assert _names.shown("a\nb") == "b'a\\nb'"
    assert _names.shown(b"\xff") == "b'\\xff'"


@pytest.mark.parametrize("name", ["caf\udce9.bin", b"caf\xe9.bin"])
def test_check_encoding_refuses_a_name_that_is_not_utf8(name):
    with pytest.raises(_names.NameRefused) as e:
        _names.check_encoding(name, "src", "/shared/m/r/" + os.fsdecode(name))
    assert e.value.reason == "not_utf8" and e.value.field == "src"
    assert "src: b'/shared/m/r/caf\\xe9.bin' has a name that is not valid UTF-8" in str(e.value)


def test_check_encoding_accepts_utf8_in_either_normalisation():
    _names.check_encoding(NFC, "src")
    _names.check_encoding(NFD, "src")


def test_check_component_counts_bytes_with_the_longest_suffix():
    _names.check_component("a" * 243, (".llmops-part",), "src", limit=255)  # 255 with the suffix
    with pytest.raises(_names.NameRefused) as e:
        _names.check_component("a" * 244, (".x", ".llmops-part"), "src", limit=255, path="/s/" + "a" * 244)
    assert e.value.reason == "name_too_long"
    msg = str(e.value)
    assert "244-byte name (256 with the suffix .llmops-part" in msg and "255-byte limit" in msg
    assert "shorten the name by 1 bytes" in msg


def test_check_component_without_suffix_refuses_only_over_the_limit():
    _names.check_component("a" * 255, (), "src", limit=255)
    with pytest.raises(_names.NameRefused):
        _names.check_component("é" * 128, (), "src", limit=255)  # 128 characters, 256 bytes


def test_name_max_is_the_filesystems_and_falls_back_to_255(tmp_path):
    assert _names.name_max(str(tmp_path)) == os.pathconf(str(tmp_path), "PC_NAME_MAX")
    assert _names.name_max(str(tmp_path / "not" / "yet")) == os.pathconf(str(tmp_path), "PC_NAME_MAX")
    assert _names.path_max(str(tmp_path)) == os.pathconf(str(tmp_path), "PC_PATH_MAX")


def test_check_path_refuses_at_path_max_counting_the_nul():
    _names.check_path("/" + "a" * 4094, "src", limit=4096)
    with pytest.raises(_names.NameRefused) as e:
        _names.check_path("/" + "a" * 4095, "src", limit=4096, shown_as="/short")
    assert e.value.reason == "path_too_long" and "src: /short would be written as a 4096-byte path" in str(e.value)


@pytest.mark.parametrize("stored, typed", [(NFC, NFD), (NFD, NFC)])
def test_find_spelling_finds_the_stored_spelling(tmp_path, stored, typed):
    (tmp_path / stored / "sub").mkdir(parents=True)
    assert _names.find_spelling(str(tmp_path / typed)) == str(tmp_path / stored)
    assert _names.find_spelling(str(tmp_path / typed / "sub")) == str(tmp_path / stored / "sub")
    assert _names.find_spelling(str(tmp_path / typed / "other")) is None


def test_find_spelling_is_none_when_two_entries_match(tmp_path):
    both_nfc = unicodedata.normalize("NFC", "modèle-café")
    both_nfd = unicodedata.normalize("NFD", "modèle-café")
    mixed = unicodedata.normalize("NFC", "modèle-") + unicodedata.normalize("NFD", "café")  # a third spelling
    (tmp_path / both_nfc).mkdir()
    (tmp_path / both_nfd).mkdir()
    assert len({both_nfc, both_nfd, mixed}) == 3
    assert _names.find_spelling(str(tmp_path / mixed)) is None  # ambiguous: never a guess
    assert _names.find_spelling(str(tmp_path / both_nfc)) == str(tmp_path / both_nfc)  # exists: itself


def test_find_spelling_of_a_relative_path(tmp_path, monkeypatch):
    (tmp_path / NFD).mkdir()
    monkeypatch.chdir(str(tmp_path))
    assert _names.find_spelling(NFC) == os.path.join(str(tmp_path), NFD)
