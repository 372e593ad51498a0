"""Property-based harness for engine_process's state file and the benchmark's saved files and client results.

Generated documents and file types come from the shared reader's harness (test_untrusted_properties). The
invariants a user relies on:

* a state file of any content or type never hangs or raises: engine_process reads a state (absent, exited,
  lost, running), names the file when it refused it, and never reports running without a live engine;
* a round file of any content or type is used or named with its reason, and the report is built all the same;
* a client result of any shape gives samples whose statistics can be taken (a request with impossible timings
  is flagged, never passed on), or the client's clean error.
"""
from __future__ import annotations

import json
import os
import uuid

from hypothesis import given, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_assemble, _bench_client, _bench_inputs, _bench_outdir, _bench_stats
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process, _process_state
from ansible_collections.llmops.serving.tests.property.test_untrusted_properties import (
    FILE_KINDS, SETTINGS, VALUES, json_documents, outcome, place, scratch)

STATE_KEYS = sorted(_process_state._STATE_FIELDS)  # pylint: disable=protected-access
HOSTILE = st.one_of(VALUES, st.sampled_from([-1, 0, 1, 2 ** 63, True, "1", [1], {"pid": 1}, None, 1.5, -0.0]))


@st.composite
def state_documents(draw):
    """A state file's bytes: a generated document, or the supervisor's fields with hostile values."""
    if draw(st.booleans()):
        return draw(json_documents())
    doc = {k: draw(HOSTILE) for k in draw(st.lists(st.sampled_from(STATE_KEYS), max_size=8, unique=True))}
    doc["state"] = draw(st.sampled_from(["running", "exited", "lost", "absent", "", 3, None]))
    return json.dumps(doc).encode()


@SETTINGS
@given(data=state_documents(), kind=FILE_KINDS)
def test_any_state_file_gives_a_state_never_a_hang_or_a_traceback(data, kind):
    with scratch() as d:
        name = "eng-%s" % uuid.uuid4().hex[:8]  # no engine carries this identity
        os.makedirs(os.path.join(d, name))
        path = _process_state.paths(d, name)["state"]
        place(path, kind, data)
        box = outcome(lambda: _process.locate(d, name), ())
        st_ = box["value"]
        assert st_["state"] in ("absent", "exited", "lost")  # nothing runs under this name
        for key, kind_ in _process_state._STATE_FIELDS.items():  # pylint: disable=protected-access
            v = st_.get(key)
            assert v is None or (isinstance(v, kind_) and (kind_ is bool or not isinstance(v, bool))), (key, v)
        if kind not in ("regular", "missing", "dangling"):
            assert path in st_["state_file_error"]
        assert outcome(lambda: _process_state.read_state_file(path), ())["value"]["state"] in ("absent", "exited", "lost")
        outcome(lambda: _process_state.describe_exit(st_), ())


def _plan(out):
    rounds = [{"index": 1, "kind": "measure", "target": "a", "concurrency": 1, "input_len": 8, "output_len": 4,
               "num_prompts": 2, "seed": 1, "rep": 0}]
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump({"schema": _bench_outdir.PLAN_SCHEMA, "targets": [{"name": "a", "url": "http://x", "model": "m"}],
                   "rounds": rounds, "protocol": {}, "started_at": 1.0, "tokenizer": "/t"}, f)
    os.makedirs(os.path.join(out, "rounds"))
    return rounds[0]


@st.composite
def round_documents(draw):
    """A round file's bytes: a generated document, or a saved round with one field made hostile."""
    if draw(st.booleans()):
        return draw(json_documents())
    rec = {"index": 1, "kind": "measure", "target": "a", "concurrency": 1, "input_len": 8, "output_len": 4,
           "num_prompts": 2, "seed": 1, "rep": 0, "duration_s": 1.0, "wall_s": 1.0, "failed": 0, "client": {},
           "evidence": None, "samples": [{"ok": True, "ttft_ms": 10.0, "e2el_ms": 50.0, "tpot_ms": 13.3,
                                          "itl_ms": [13.3, 13.3, 13.4], "output_tokens": 4, "input_tokens": 8,
                                          "error": "", "seed": 1}]}
    where = draw(st.sampled_from(sorted(rec) + ["sample"]))
    if where == "sample":
        rec["samples"][0][draw(st.sampled_from(sorted(rec["samples"][0])))] = draw(HOSTILE)
    else:
        rec[where] = draw(HOSTILE)
    return json.dumps(rec).encode()


@SETTINGS
@given(data=round_documents(), kind=FILE_KINDS, stopped=st.one_of(st.none(), json_documents()))
def test_any_round_file_is_used_or_named_and_the_report_is_built(data, kind, stopped):
    with scratch() as d:
        _plan(d)
        path = os.path.join(d, "rounds", "001.json")
        place(path, kind, data)
        if stopped is not None:
            place(os.path.join(d, "stopped.json"), "regular", stopped)
        box = outcome(lambda: _bench_outdir.read_rounds(d, _bench_outdir.read_plan(d)), ())
        done, problems = box["value"]
        named = [p["file"] for p in problems]
        if kind in ("missing", "dangling"):
            assert not done and (not named or kind == "dangling")
        else:
            assert (1 in done) != ("rounds/001.json" in named)
        report = outcome(lambda: _bench_assemble.build_report(d, n_boot=10), ())["value"]
        stopped_named = [p for p in report["meta"]["files_not_used"] if p["file"] == "stopped.json"]
        assert report["meta"]["files_not_used"] == problems + stopped_named
        if problems:
            assert any(c["code"] == "files_not_used" for c in report["caveats"])


NUMBERLIKE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10 ** 6), st.none(),
                       st.text(max_size=3), st.booleans())


@st.composite
def client_results(draw):
    n = draw(st.integers(0, 5))
    lists = {k: draw(st.lists(NUMBERLIKE, min_size=0, max_size=n + 1))
             for k in ("ttfts", "latencies", "input_lens", "output_lens")}
    lists["itls"] = draw(st.lists(st.one_of(st.lists(NUMBERLIKE, max_size=3), NUMBERLIKE), max_size=n + 1))
    lists["errors"] = draw(st.lists(st.one_of(st.just(""), st.text(max_size=5), st.none(), st.integers()),
                                    min_size=n, max_size=n))
    if draw(st.integers(0, 9)) == 0:
        lists.pop(draw(st.sampled_from(sorted(lists))))
    return lists


@SETTINGS
@given(doc=client_results())
def test_any_client_result_gives_usable_samples_or_the_clients_clean_error(doc):
    box = outcome(lambda: _bench_client.samples_from_result(doc, 1), _bench_inputs.BenchError)
    if "clean" in box:
        assert box["clean"].reason == "client_result"
        return
    samples = box["value"]
    assert len(samples) == len(doc["errors"])
    rs = _bench_stats.round_summary(samples, 1.0)  # never refuses what samples_from_result produced
    assert rs["completed"] + rs["failed"] == len(samples)
    for s in samples:
        if s.get("invalid"):
            assert not s["ok"] and s["error"].startswith("impossible timings from the client for request ")
