"""Property-based harness for the one reader of untrusted files and bodies (``_untrusted``) and every input of
the modules that read through it.

Generated documents vary in nesting depth, size, number range (``1e400``, ``NaN``, ``10**400``, the 64-bit
edges), junk bytes, truncation and encoding; generated paths vary in file type (regular file, FIFO, symlink to
``/dev/zero``, directory, dangling symlink, missing). The invariants a user relies on:

* every read returns or raises the owning module's clean error (the one it turns into ``fail_json`` naming the
  file and the limit): never another exception, never a hang (each call runs under a deadline);
* what the shared reader returns obeys its rules (depth, finite numbers within +/-2**64);
* a credential key in a JSON engine argument is found at any depth, or the argument is refused as too deep:
  it is never passed silently.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more
(``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
import threading

from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.action import model_stage_follow as _follow
from ansible_collections.llmops.serving.plugins.module_utils.cache import _fingerprint, _moe
from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets, _untrusted
from ansible_collections.llmops.serving.plugins.module_utils.kube import _render_dir
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors, _stage_marker
from ansible_collections.llmops.serving.plugins.module_utils.transport import _rdma

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# A call that has not returned after this long is a hang (a FIFO opened for reading, /dev/zero read whole).
DEADLINE_S = 10
FAKE = "sk-fake-0a1b2c3d4e5f-llmops"

# ---- documents -------------------------------------------------------------------------------------------

NUMBERS = st.sampled_from([
    "0", "-1", "0.5", "1e18", "1764633600000000000", "18446744073709551615", "18446744073709551616",
    "18446744073709551617", "-18446744073709551617", "1e400", "-1e400", "1" + "0" * 400, "9" * 5000, "NaN",
    "Infinity", "-Infinity", "1e-400", "0." + "0" * 300 + "1",
])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=20)


@st.composite
def nested_text(draw):
    """A JSON text nesting ``depth`` containers around a leaf (a number literal, perhaps out of range)."""
    depth = draw(st.integers(0, 3000))
    opener = draw(st.sampled_from(["[", '{"k": ', "mixed"]))
    leaf = draw(NUMBERS)
    if opener == "mixed":
        kinds = [draw(st.booleans()) for dummy in range(min(depth, 8))] or [True]
        opens = "".join('{"k": ' if kinds[i % len(kinds)] else "[" for i in range(depth))
        closes = "".join("}" if kinds[i % len(kinds)] else "]" for i in reversed(range(depth)))
    else:
        opens, closes = opener * depth, ("]" if opener == "[" else "}") * depth
    return opens + leaf + closes


@st.composite
def json_documents(draw):
    """Bytes of a document a hostile or broken writer could leave: valid JSON with a hostile number, a nesting
    bomb, junk, a truncation, invalid UTF-8, a YAML alias bomb."""
    kind = draw(st.sampled_from(["valid", "number", "nested", "junk", "truncated", "latin1", "alias"]))
    if kind == "valid":
        return json.dumps(draw(VALUES)).encode()
    if kind == "number":
        doc = json.dumps({"taken_at": 0, "files": [], "weight_map": {}, "x": [0]})
        return doc.replace("0", draw(NUMBERS), 1).encode()
    if kind == "nested":
        return draw(nested_text()).encode()
    if kind == "junk":
        return draw(st.binary(max_size=300))
    if kind == "truncated":
        text = json.dumps(draw(VALUES)).encode()
        return text[:draw(st.integers(0, len(text)))]
    if kind == "latin1":
        return json.dumps({"name": draw(st.text(max_size=10))}).encode() + b"\xff\xfe"
    return b"a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"


FILE_KINDS = st.sampled_from(["regular", "regular", "regular", "fifo", "dev-zero", "directory", "dangling",
                              "missing"])


def place(path, kind, data):
    """Put ``data`` at ``path`` as a ``kind`` (a FIFO has no writer: opening it to read would block)."""
    if kind == "regular":
        with open(path, "wb") as f:
            f.write(data)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "dangling":
        os.symlink(path + ".nowhere", path)


@contextlib.contextmanager
def scratch():
    d = tempfile.mkdtemp(prefix="llmops-untrusted-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def outcome(fn, clean):
    """Run ``fn`` under the deadline; its value, or the clean error it raised. Any other exception (or a hang)
    fails the property."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except clean as e:
            box["clean"] = e
        except BaseException as e:  # the property: nothing else escapes
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    assert not t.is_alive(), "blocked for over %d s" % DEADLINE_S
    if "error" in box:
        raise AssertionError("%s escaped: %r" % (type(box["error"]).__name__, box["error"])) from box["error"]
    return box


def obeys_the_rules(doc, max_depth=_untrusted.MAX_DEPTH):
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, float):
            assert math.isfinite(v) and abs(v) <= _untrusted.MAX_ABS_NUMBER
        elif isinstance(v, int) and not isinstance(v, bool):
            assert abs(v) <= _untrusted.MAX_ABS_NUMBER
        elif isinstance(v, (dict, list)):
            assert depth <= max_depth
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


# ---- the shared reader -----------------------------------------------------------------------------------

@SETTINGS
@given(data=json_documents(), kind=FILE_KINDS, cap=st.integers(1, 1 << 16), depth=st.integers(1, 80))
def test_shared_reader_returns_a_document_within_the_rules_or_a_clean_refusal(data, kind, cap, depth):
    with scratch() as d:
        path = os.path.join(d, "doc.json")
        place(path, kind, data)
        for reader in (_untrusted.load_json, _untrusted.load_yaml):
            box = outcome(lambda: reader(path, "doc", max_bytes=cap, max_depth=depth),
                          (_untrusted.UntrustedInput, FileNotFoundError))
            if "value" in box:
                assert kind == "regular" and len(data) <= cap
                obeys_the_rules(box["value"], depth)
            elif isinstance(box["clean"], _untrusted.UntrustedInput):
                e = box["clean"]
                assert e.file == path and path in str(e) and e.limit in (
                    "type", "size", "depth", "number", "encoding", "syntax", "read")
                if kind not in ("regular", "missing", "dangling"):
                    assert e.limit == "type"
            else:
                assert kind in ("missing", "dangling")
        for parse in (_untrusted.loads_json, _untrusted.loads_yaml):
            box = outcome(lambda: parse(data, "body", max_depth=depth, max_bytes=cap), _untrusted.UntrustedInput)
            if "value" in box:
                obeys_the_rules(box["value"], depth)


# ---- each module's untrusted input -----------------------------------------------------------------------

@SETTINGS
@given(data=json_documents(), kind=FILE_KINDS)
def test_config_json_is_read_by_fingerprint_and_moe_or_refused_cleanly(data, kind):
    with scratch() as d:
        place(os.path.join(d, "config.json"), kind, data)
        outcome(lambda: _fingerprint.read_model_config(d), _fingerprint.FingerprintError)
        box = outcome(lambda: _moe.load_config(d), _moe.MoeError)
        if "value" in box:
            outcome(lambda: _moe.check("vllm", box["value"], 8, "NVIDIA H20", d), _moe.MoeError)


@SETTINGS
@given(data=json_documents(), kind=FILE_KINDS, header=json_documents())
def test_safetensors_index_and_header_are_checked_or_refused_cleanly(data, kind, header):
    with scratch() as d:
        index = os.path.join(d, _safetensors.INDEX_NAME)
        place(index, kind, data)
        box = outcome(lambda: _safetensors.load_index(index), _safetensors.CheckpointError)
        if "clean" in box:
            assert box["clean"].path == index
        shard = os.path.join(d, "model.safetensors")
        place(shard, kind, struct.pack("<Q", len(header)) + header)
        box = outcome(lambda: _safetensors.verify_file(shard), _safetensors.CheckpointError)
        if "clean" in box:
            assert box["clean"].path == shard


@SETTINGS
@given(data=json_documents(), kind=FILE_KINDS, journal=st.lists(json_documents(), max_size=4))
def test_stage_marker_and_journal_mean_staged_not_staged_or_foreign_never_a_traceback(data, kind, journal):
    with scratch() as d:
        place(os.path.join(d, _stage_marker.MARKER), kind, data)
        with open(os.path.join(d, _stage_marker.JOURNAL), "wb") as f:
            f.write(b"\n".join(journal))
        state = outcome(lambda: _stage_marker.read_marker(d), ())["value"]
        assert state.kind in ("none", "foreign", "bad", "ok")
        records = outcome(lambda: _stage_marker.partial_records(d), ())["value"]
        assert isinstance(records, dict)


@SETTINGS
@given(data=json_documents(), kind=FILE_KINDS)
def test_render_manifest_marker_is_used_or_refused_before_anything_changes(data, kind):
    with scratch() as d:
        out = os.path.join(d, "render")
        os.mkdir(out)
        marker = os.path.join(out, _render_dir.MARKER)
        place(marker, kind, data)
        box = outcome(lambda: _render_dir.plan(out, {"10-service-x.yaml": "---\nkind: Service\n"}),
                      _render_dir.RenderDirError)
        if "clean" in box:
            assert box["clean"].file == marker and "Nothing was changed" in str(box["clean"])


BIG = st.sampled_from([10 ** 400, -10 ** 400, 2 ** 64, float("inf"), float("nan"), 1])


@SETTINGS
@given(data=json_documents(), kind=FILE_KINDS, doc=VALUES, big=BIG)
def test_rdma_baseline_from_a_file_or_the_option_is_validated_or_refused_cleanly(data, kind, doc, big):
    with scratch() as d:
        path = os.path.join(d, "baseline.json")
        place(path, kind, data)
        box = outcome(lambda: _rdma.load_snapshot_file(path), _rdma.RdmaError)
        if "clean" in box:
            assert box["clean"].file == path and str(box["clean"]).startswith("baseline_file: %s" % path)
    option = {"schema": _rdma.SCHEMA, "taken_at": big, "host": {"boot_id": None, "hostname": None},
              "selection": {"devices": [], "ports": []}, "ports": {}, "kv": doc}
    outcome(lambda: _rdma.validate_snapshot(option), _rdma.RdmaError)


@st.composite
def credential_arguments(draw):
    """A JSON engine argument holding a credential-named key at a generated depth, in objects and arrays."""
    depth = draw(st.integers(0, 400))
    shape = [draw(st.booleans()) for dummy in range(min(depth, 6))] or [True]
    opens = "".join('{"k%d": ' % i if shape[i % len(shape)] else "[" for i in range(depth))
    closes = "".join("}" if shape[i % len(shape)] else "]" for i in reversed(range(depth)))
    key = draw(st.sampled_from(["api_key", "hf_token", "secret_key", "password", "AWS_SECRET_ACCESS_KEY"]))
    leaf = json.dumps({key: FAKE, "n": json.loads(draw(st.sampled_from(["1", "1e300", "0.5"])))})
    return opens + leaf + closes


@SETTINGS
@given(arg=credential_arguments(), spelling=st.sampled_from(["pair", "equals", "positional"]))
def test_a_credential_nested_in_a_json_argument_is_found_or_refused_never_passed(arg, spelling):
    argv = {"pair": ["--hf-overrides", arg], "equals": ["--hf-overrides=" + arg], "positional": ["serve", arg]}[spelling]
    scan = _secrets.Scan()
    outcome(lambda: scan.argv(argv, "extra_args"), ())
    assert scan.findings, "a credential %s levels deep passed unchecked" % arg.count("[")
    box = outcome(scan.refuse, ValueError)
    assert FAKE not in str(box["clean"])


@SETTINGS
@given(data=json_documents(), value=VALUES)
def test_secret_scan_of_any_argument_or_flag_value_never_raises(data, value):
    text = data.decode("utf-8", "replace")
    scan = _secrets.Scan()
    outcome(lambda: scan.argv(["--kv-transfer-config", text, "--x=" + text, text], "extra_args"), ())
    outcome(lambda: scan.flags({"hf-overrides": value, "api-key": value}, "engine_args"), ())
    outcome(lambda: _secrets.redact_rendered_text(text), ())


@SETTINGS
@given(data=json_documents())
def test_progress_text_off_the_target_is_a_line_or_waiting_never_a_traceback(data):
    text = data.decode("utf-8", "replace")
    record = outcome(lambda: _follow._load(text), ())["value"]
    outcome(lambda: _follow.progress_line(record), ())
    outcome(lambda: _follow._job_running(text), ())


@SETTINGS
@given(text=st.one_of(nested_text(), st.text(max_size=200)))
def test_json_engine_argument_is_counted_or_refused_cleanly_by_the_fingerprint(text):
    for args in (["--compilation-config", text], ["--compilation-config.level", text],
                 ["--speculative-config=" + text], ["--max-num-batched-tokens", text]):
        outcome(lambda: _fingerprint.parse_engine_args("vllm", args), _fingerprint.FingerprintError)
