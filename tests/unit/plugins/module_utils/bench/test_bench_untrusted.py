"""Benchmark inputs the collection does not control: the client's result, saved round files, stopped.json and
the cold-start file. A request whose timings cannot be is flagged (or, in a saved round, the round is refused)
with the request named; a round file that cannot be read is named in the report, never silently dropped and
never a traceback.
"""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_coldstart as bc
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_assemble, _bench_client, _bench_inputs, _bench_outdir
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_stats as bs


def _result(ttfts, latencies, itls=None, outs=None, errors=None):
    n = len(latencies)
    return {"ttfts": ttfts, "latencies": latencies, "itls": itls if itls is not None else [[0.01]] * n,
            "input_lens": [8] * n, "output_lens": outs if outs is not None else [2] * n,
            "errors": errors if errors is not None else [""] * n}


IMPOSSIBLE = {
    "negative TTFT": (_result([0.1, -0.5], [1.0, 1.0]), "TTFT is negative"),
    "TTFT above E2EL": (_result([0.1, 3.0], [1.0, 1.0]), "above its end-to-end latency"),
    "negative latency": (_result([0.1, 0.1], [1.0, -1.0]), "end-to-end latency is negative"),
    "NaN latency": (_result([0.1, 0.1], [1.0, float("nan")]), "not a finite number"),
    "infinite TTFT": (_result([0.1, float("inf")], [1.0, 1.0]), "not a finite number"),
    "latency of the wrong type": (_result([0.1, 0.1], [1.0, "1.0"]), "end-to-end latency is a str"),
    "latency missing": (dict(_result([0.1, 0.1], [1.0, 1.0]), latencies=[1.0]), "end-to-end latency is missing"),
    "negative inter-token gap": (_result([0.1, 0.1], [1.0, 1.0], itls=[[0.01], [-0.2]]), "inter-token gap 0"),
    "token count not a count": (_result([0.1, 0.1], [1.0, 1.0], outs=[2, "many"]), "token counts"),
}


@pytest.mark.parametrize("kind", sorted(IMPOSSIBLE))
def test_impossible_client_timings_are_flagged_with_the_request_named(kind):
    doc, words = IMPOSSIBLE[kind]
    samples = _bench_client.samples_from_result(doc, seed=3)
    assert samples[0]["ok"] and samples[0]["ttft_ms"] == 100.0 and not samples[0].get("invalid")
    bad = samples[1]
    assert bad["ok"] is False and bad["invalid"] is True
    assert bad["error"].startswith("impossible timings from the client for request 1: ") and words in bad["error"]
    assert bad["ttft_ms"] is None and bad["e2el_ms"] is None and bad["itl_ms"] == []
    # the round's statistics use the whole request only, and the flagged one counts as failed
    rs = bs.round_summary(samples, 2.0)
    assert rs["completed"] == 1 and rs["failed"] == 1 and rs["p95_ttft_ms"] == 100.0


def test_a_saved_sample_with_ttft_above_e2el_is_refused_naming_it():
    s = {"ok": True, "ttft_ms": 900.0, "e2el_ms": 500.0, "tpot_ms": None, "itl_ms": [], "output_tokens": 1}
    good = dict(s, ttft_ms=500.0)
    with pytest.raises(ValueError, match=r"^samples\[1\]\.ttft_ms: 900\.0 ms is above .* e2el_ms 500\.0 ms"):
        bs.round_summary([good, s], 1.0)
    with pytest.raises(ValueError, match=r"^samples\[0\]\.itl_ms\[1\]: expected a non-negative number"):
        bs.round_summary([dict(good, itl_ms=[1.0, -1.0])], 1.0)


# ---- a run directory with round files that cannot be used ------------------------------------------------ #

TARGET = {"name": "a", "url": "http://127.0.0.1:1", "model": "m", "headers": {}}


def _plan_round(index, seed):
    return {"index": index, "kind": "measure", "target": "a", "concurrency": 2, "input_len": 8, "output_len": 4,
            "num_prompts": 3, "seed": seed, "rep": 0}


def _saved(rnd, ttft=0.1):
    samples = [{"seed": rnd["seed"], "ok": True, "error": "", "input_tokens": 8, "output_tokens": 4,
                "ttft_ms": ttft * 1000 + i, "tpot_ms": 10.0, "itl_ms": [10.0, 10.0, 10.0], "e2el_ms": 200.0 + i}
               for i in range(3)]
    return dict(rnd, schema=_bench_outdir.ROUND_SCHEMA, started_at=1.0, samples=samples, failed=0, duration_s=1.0, wall_s=1.2,
                client={}, raw="raw/x.json", log="logs/x.log", evidence=None)


def _write(path, data):
    with open(str(path), "wb") as f:
        f.write(data if isinstance(data, bytes) else json.dumps(data).encode())


BAD_ROUNDS = {
    2: ("fifo", "is a FIFO"),
    3: (b"[" * 5000 + b"]" * 5000, "nests deeper than"),
    4: (b'{"index": 4, "samples": [{"e2el_ms": 1' + b"0" * 400 + b'}]}', "refused"),
    5: ("wrong types", "round.concurrency: expected an integer >= 1, got '2'"),
    6: ("impossible sample", "round.samples[0].ttft_ms: 900.0 ms is above"),
    7: ("truncated", "is not JSON"),
    8: ("not the planned round", "round.target: differs from round 8 of plan.json"),
    9: ("samples not a list", "round.samples: expected a list"),
}


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "bench"
    (out / "rounds").mkdir(parents=True)
    rounds = [_plan_round(i, i) for i in range(1, 10)]
    _write(out / "plan.json", {"schema": _bench_outdir.PLAN_SCHEMA, "targets": [TARGET], "rounds": rounds, "started_at": 1.0,
                               "protocol": {"repetitions": 1}, "tokenizer": "/t", "client": "control node"})
    _write(out / "rounds" / "001.json", _saved(rounds[0]))
    for index, (kind, _words) in BAD_ROUNDS.items():
        path = out / "rounds" / ("%03d.json" % index)
        rec = _saved(rounds[index - 1])
        if kind == "fifo":
            os.mkfifo(str(path))
        elif isinstance(kind, bytes):
            _write(path, kind)
        elif kind == "wrong types":
            _write(path, dict(rec, concurrency="2"))
        elif kind == "impossible sample":
            rec["samples"][0]["ttft_ms"] = 900.0
            _write(path, rec)
        elif kind == "truncated":
            _write(path, json.dumps(rec).encode()[:-40])
        elif kind == "not the planned round":
            _write(path, dict(rec, target="b"))
        elif kind == "samples not a list":
            _write(path, dict(rec, samples={"0": 1}))
    return out


def test_round_files_that_cannot_be_used_are_named_in_the_report(run_dir):
    done, problems = _bench_outdir.read_rounds(str(run_dir), _bench_outdir.read_plan(str(run_dir)))
    assert sorted(done) == [1]
    named = dict((p["file"], p["reason"]) for p in problems)
    assert sorted(named) == ["rounds/%03d.json" % i for i in sorted(BAD_ROUNDS)]
    for index, (_kind, words) in BAD_ROUNDS.items():
        reason = named["rounds/%03d.json" % index]
        assert words in reason and str(run_dir / "rounds" / ("%03d.json" % index)) in reason, reason
        assert "1" * 5 not in reason and "[[[[" not in reason  # the document is never quoted

    report = _bench_assemble.build_report(str(run_dir), n_boot=50)
    assert report["meta"]["files_not_used"] == problems
    assert [c["requests"] for c in report["cells"]] == [3]  # the usable round still makes its cell
    cav = dict((c["code"], c["text"]) for c in report["caveats"])
    assert all("rounds/%03d.json" % i in cav["files_not_used"] for i in BAD_ROUNDS)


def test_a_stopped_file_that_cannot_be_used_is_named_not_a_traceback(run_dir):
    _write(run_dir / "stopped.json", {"index": "7", "reason": "x"})
    report = _bench_assemble.build_report(str(run_dir), n_boot=50)
    assert report["stopped"] is None
    assert any(p["file"] == "stopped.json" and "stopped.index" in p["reason"]
               for p in report["meta"]["files_not_used"])


@pytest.mark.parametrize("content, words", [
    ({"schema": 1, "targets": [TARGET], "rounds": [{"index": 1}], "protocol": {}, "started_at": 1}, "rounds[0]"),
    ({"schema": 1, "targets": "a", "rounds": [], "protocol": {}, "started_at": 1}, "targets"),
    (b"[" * 100000, "nests deeper"),
])
def test_a_plan_that_cannot_be_used_is_a_clear_error(tmp_path, content, words):
    _write(tmp_path / "plan.json", content)
    with pytest.raises(_bench_inputs.BenchError) as e:
        _bench_outdir.read_plan(str(tmp_path))
    assert words in str(e.value) and e.value.file == str(tmp_path / "plan.json")


def test_the_jobs_result_line_goes_through_the_reader():
    line = _bench_client.RESULT_MARKER + '{"latencies": [1' + "0" * 400 + "]}"
    assert _bench_client.result_from_output("log\n" + line + "\n") is None
    assert _bench_client.result_from_output(_bench_client.RESULT_MARKER + '{"duration": 1.5}') == {"duration": 1.5}


@pytest.mark.parametrize("content, words", [
    ("fifo", "FIFO"),
    ({"states": [{"state": "nvme", "reps": "x"}]}, "states[0]"),
    ({"states": 5}, "expected {states"),
])
def test_a_coldstart_file_that_cannot_be_used_is_a_clear_error(tmp_path, content, words):
    log = tmp_path / "engine.log"
    log.write_text("INFO starting\n")
    cs = tmp_path / "coldstart.json"
    if content == "fifo":
        os.mkfifo(str(cs))
    else:
        _write(cs, content)
    with pytest.raises(bc.ColdstartError) as e:
        bc.record(str(cs), "nvme", 1, {"first_correct": 3.0}, str(log))
    assert words in str(e.value) and str(cs) in str(e.value)


def test_a_fifo_engine_log_is_refused_without_blocking(tmp_path):
    log = tmp_path / "engine.log"
    os.mkfifo(str(log))
    with pytest.raises(bc.ColdstartError, match="not a regular file"):
        bc.record(str(tmp_path / "cs.json"), "nvme", 1, {"first_correct": 3.0}, str(log))


def test_flagged_requests_are_a_caveat_of_the_report():
    from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_report

    samples = _bench_client.samples_from_result(_result([0.1, 3.0, 0.2], [1.0, 1.0, 1.0]), seed=1)
    rnd = dict(_plan_round(1, 1), samples=samples, failed=1, duration_s=1.0, evidence=None)
    cell = bs.cell("a", 2, 8, 4, [rnd], n_boot=20)
    report = _bench_report.build([TARGET], [cell], {})
    cav = dict((c["code"], c["text"]) for c in report["caveats"])
    assert "request 1: its TTFT (3000.0 ms) is above its end-to-end latency (1000.0 ms)" in cav["impossible_samples"]
    assert "a C=2 8/4" in cav["impossible_samples"]
