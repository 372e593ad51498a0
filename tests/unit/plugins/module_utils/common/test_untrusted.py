"""The shared reader refuses what would hang, exhaust memory or crash a module, and names the file and the limit.

Each case is a file or body a user, a peer or a broken disk can really hand the collection: a FIFO left where
``config.json`` was, a manifest linked to ``/dev/zero``, a nesting bomb, ``taken_at: 10**400``.
"""
from __future__ import annotations

import json
import os
import socket

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _untrusted
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, check_value, load_json, load_yaml, loads_json, loads_yaml, read_bytes, read_text)
from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang as _in_thread


# ---------------------------------------------------------------------------------------------------- file type

def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # no writer: an open() without O_NONBLOCK would wait forever
    box = _in_thread(lambda: load_json(str(fifo), "config"))
    err = box.get("error")
    assert isinstance(err, UntrustedInput), box
    assert err.limit == "type" and err.file == str(fifo)
    assert "a FIFO" in str(err) and str(fifo) in str(err) and "config" in str(err)


def test_fifo_with_a_writer_is_still_refused(tmp_path):
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(wfd, b'{"files": []}')
        box = _in_thread(lambda: read_bytes(str(fifo)))
    finally:
        os.close(wfd)
        os.close(rfd)
    assert isinstance(box.get("error"), UntrustedInput) and box["error"].limit == "type"


def test_dev_zero_behind_a_symlink_is_refused_before_reading(tmp_path):
    link = tmp_path / "manifest.json"
    link.symlink_to("/dev/zero")
    box = _in_thread(lambda: load_json(str(link), "manifest"))
    err = box.get("error")
    assert isinstance(err, UntrustedInput), box
    assert err.limit == "type" and "a character device" in str(err)


def test_socket_is_refused_as_a_file_type(tmp_path):
    path = tmp_path / "s.json"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    try:
        with pytest.raises(UntrustedInput) as e:
            read_text(str(path), "state")
    finally:
        srv.close()
    assert e.value.limit == "type" and "a socket" in str(e.value)


def test_directory_is_refused(tmp_path):
    d = tmp_path / "config.json"
    d.mkdir()
    with pytest.raises(UntrustedInput) as e:
        load_json(str(d), "config")
    assert e.value.limit == "type" and "a directory" in str(e.value)


def test_symlink_is_refused_when_not_followed(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "marker.json"
    link.symlink_to(real)
    assert load_json(str(link)) == {}  # followed by default
    with pytest.raises(UntrustedInput) as e:
        load_json(str(link), "marker", follow=False)
    assert e.value.limit == "type" and "symlink" in str(e.value)


def test_missing_file_stays_a_file_not_found_error(tmp_path):
    # callers tell "absent" (first run) from "hostile"
    with pytest.raises(FileNotFoundError):
        read_bytes(str(tmp_path / "absent.json"))
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        read_bytes(str(dangling))


def test_unreadable_file_names_the_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file")
    f = tmp_path / "x.json"
    f.write_text("{}")
    f.chmod(0)
    with pytest.raises(UntrustedInput) as e:
        read_bytes(str(f), "x")
    assert e.value.limit == "read" and str(f) in str(e.value)


# ---------------------------------------------------------------------------------------------------- size

def test_size_cap_refuses_a_larger_file_and_reads_one_at_the_cap(tmp_path):
    f = tmp_path / "big.json"
    f.write_bytes(b"x" * 101)
    with pytest.raises(UntrustedInput) as e:
        read_bytes(str(f), "big", max_bytes=100)
    assert e.value.limit == "size" and "100-byte" in str(e.value) and "101 bytes" in str(e.value)
    f.write_bytes(b"x" * 100)
    assert read_bytes(str(f), max_bytes=100) == b"x" * 100


def test_size_cap_of_a_text_body_counts_its_utf8_bytes():
    body = '["%s"]' % ("\u6a21" * 30)  # 30 characters of 3 bytes each
    assert loads_json(body, "x", max_bytes=94) == ["\u6a21" * 30]
    with pytest.raises(UntrustedInput) as e:
        loads_json(body, "x", max_bytes=93)
    assert e.value.limit == "size" and "94 bytes" in str(e.value)


def test_size_cap_applies_to_bodies(tmp_path):
    with pytest.raises(UntrustedInput) as e:
        loads_json(b"[" + b"1," * 100 + b"1]", "/pieces", max_bytes=64)
    assert e.value.limit == "size"
    with pytest.raises(UntrustedInput) as e:
        loads_yaml("a: " + "b" * 100, "doc", max_bytes=64)
    assert e.value.limit == "size"


# ---------------------------------------------------------------------------------------------------- depth

@pytest.mark.parametrize("depth", [100, 100000])
def test_json_nesting_bomb_is_a_clean_depth_error(depth):
    for body in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        with pytest.raises(UntrustedInput) as e:
            loads_json(body, "config.json")
        assert e.value.limit == "depth" and "64 levels" in str(e.value)


def test_json_depth_counts_containers_and_skips_brackets_in_strings():
    assert loads_json("[" * 64 + "]" * 64, "x") is not None  # exactly at the cap
    with pytest.raises(UntrustedInput):
        loads_json("[" * 65 + "]" * 65, "x")
    # brackets inside strings (escaped quotes too) are text, not nesting
    body = json.dumps({"s": '[[[[\\"{{{{' * 50, "l": [[1]]})
    assert loads_json(body, "x", max_depth=3)["l"] == [[1]]
    assert loads_json('["a\\\\", [[1]]]', "x", max_depth=3) == ["a\\", [[1]]]
    with pytest.raises(UntrustedInput) as e:
        loads_json('["a\\\\", [[[1]]]]', "x", max_depth=3)
    assert e.value.limit == "depth"


def test_unterminated_string_is_a_syntax_error():
    with pytest.raises(UntrustedInput) as e:
        loads_json('["abc', "x")
    assert e.value.limit == "syntax"


@pytest.mark.parametrize("flow", [True, False])
def test_yaml_nesting_bomb_is_a_clean_depth_error(flow):
    n = 5000 if flow else 300  # block style: 300 levels of indentation is already 90 KB
    body = "[" * n + "]" * n if flow else "".join("%sa:\n" % ("  " * i) for i in range(n)) + "  " * n + "b: 1\n"
    with pytest.raises(UntrustedInput) as e:
        loads_yaml(body, "values.yaml")
    assert e.value.limit == "depth"


def test_check_value_walks_without_recursion():
    doc = leaf = []
    for dummy in range(100000):
        nxt = []
        leaf.append(nxt)
        leaf = nxt
    with pytest.raises(UntrustedInput) as e:
        check_value(doc, "arg")
    assert e.value.limit == "depth"
    assert check_value({"a": [{"b": 1}]}, "arg", max_depth=3) == {"a": [{"b": 1}]}


# ---------------------------------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("body", ['{"taken_at": 1e400}', '{"taken_at": -1e400}', '{"x": NaN}', '{"x": Infinity}',
                                  '{"x": -Infinity}', '{"taken_at": 1%s}' % ("0" * 400),
                                  '{"x": 1%s}' % ("0" * 5000), '{"x": 18446744073709551617}',
                                  '{"x": -18446744073709551617}', '{"x": 1e30}', '{"x": [-1.9e19]}'])
def test_json_numbers_out_of_range_are_refused(body):
    with pytest.raises(UntrustedInput) as e:
        loads_json(body, "state.json")
    assert e.value.limit == "number" and "state.json" in str(e.value)


@pytest.mark.parametrize("body,words", [('{"a": {"b": [1e400]}}', "not finite"), ('{"a": [[18446744073709551617]]}', "beyond"),
                                        ('{"a": 2e19}', "beyond"), ('[{"x": NaN}]', "finite")])
def test_json_numbers_are_refused_as_they_are_parsed_with_a_pairs_hook_too(body, words):
    # the document is not walked after parsing: each number is judged by the parser's hooks, a caller's
    # object_pairs_hook (the safetensors header's duplicate-key check) included
    for hook in (None, dict):
        with pytest.raises(UntrustedInput) as e:
            loads_json(body, "header", object_pairs_hook=hook)
        assert e.value.limit == "number" and words in str(e.value), str(e.value)


def test_json_numbers_in_range_are_kept():
    doc = loads_json('{"ns": 1764633600000000000, "neg": -9223372036854775808, "f": 1.5e18, "z": -0.0, '
                     '"saturated_u64": 18446744073709551615}', "x")
    assert doc["ns"] == 1764633600000000000 and doc["neg"] == -2 ** 63 and doc["f"] == 1.5e18
    assert doc["saturated_u64"] == 2 ** 64 - 1


@pytest.mark.parametrize("body", ["x: .nan", "x: .inf", "x: -.Inf", "x: 1.0e+400", "x: %s" % ("9" * 400),
                                  "x: %s" % ("1" * 5000), "x: !!int '%s'" % ("1" * 5000), "x: !!set {? .inf}",
                                  "{%s: 1}" % ("9" * 30)])
def test_yaml_numbers_out_of_range_are_refused(body):
    with pytest.raises(UntrustedInput) as e:
        loads_yaml(body, "values.yaml")
    assert e.value.limit == "number"


def test_yaml_value_the_constructor_cannot_build_is_a_clean_error():
    with pytest.raises(UntrustedInput) as e:
        loads_yaml("when: 2024-13-45", "values.yaml")
    assert e.value.limit == "syntax"


def test_long_yaml_strings_are_not_numbers():
    assert loads_yaml("x: '%s'" % ("1" * 5000), "v")["x"] == "1" * 5000
    assert loads_yaml("x: %s" % ("a" * 5000), "v")["x"] == "a" * 5000


def test_check_value_refuses_python_numbers_out_of_range():
    with pytest.raises(UntrustedInput) as e:
        check_value({"taken_at": 10 ** 400}, "baseline")
    assert e.value.limit == "number"
    with pytest.raises(UntrustedInput):
        check_value([float("nan")], "x")


# ---------------------------------------------------------------------------------------------------- text

def test_invalid_utf8_is_refused_and_replaced_only_on_request(tmp_path):
    f = tmp_path / "log.txt"
    f.write_bytes(b"ok \xff\xfe end")
    with pytest.raises(UntrustedInput) as e:
        read_text(str(f), "log")
    assert e.value.limit == "encoding"
    assert read_text(str(f), "log", errors="replace") == "ok \ufffd\ufffd end"
    with pytest.raises(UntrustedInput) as e:
        loads_json(b'{"a": "\xc3"}', "body")
    assert e.value.limit == "encoding"


def test_utf8_text_round_trips(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"name": "mod\u00e8le \u6a21\u578b"}, ensure_ascii=False), encoding="utf-8")
    assert load_json(str(f))["name"] == "mod\u00e8le \u6a21\u578b"


def test_syntax_error_names_the_place_never_the_content(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"token": "hf_SECRETVALUE" oops}')
    with pytest.raises(UntrustedInput) as e:
        load_json(str(f), "config")
    assert e.value.limit == "syntax" and "line 1" in str(e.value)
    assert "SECRETVALUE" not in str(e.value)


# ---------------------------------------------------------------------------------------------------- YAML aliases

def test_yaml_aliases_are_refused():
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\n"
    with pytest.raises(UntrustedInput) as e:
        loads_yaml(bomb, "values.yaml")
    assert e.value.limit == "syntax" and "alias" in str(e.value)


def test_yaml_file_is_read_under_every_rule(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text("a:\n  b: [1, 2]\n")
    assert load_yaml(str(f), "values") == {"a": {"b": [1, 2]}}
    with pytest.raises(UntrustedInput) as e:
        load_yaml(str(f), "values", max_depth=1)
    assert e.value.limit == "depth"
    f.write_text("a: !!python/object:os.system {}\n")
    with pytest.raises(UntrustedInput) as e:
        load_yaml(str(f), "values")
    assert e.value.limit == "syntax"


def test_error_is_a_value_error_carrying_file_and_limit():
    e = UntrustedInput("x", file="/f", limit="size")
    assert isinstance(e, ValueError) and e.file == "/f" and e.limit == "size"
    assert _untrusted.MAX_ABS_NUMBER == 2 ** 64
