"""playbooks/benchmark.yml against the session's real vLLM CPU engine (``local_engine``): a short protocol
(C = 1, 2; two seeds; 128/32; one warm-up round) through the role with the real client, and bad input refused
before any load, naming the variable.
"""
from __future__ import annotations

import glob
import json
import os
import socket

import pytest

from llmops_testlib import run_playbook

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_report


def _tokenizer(local_engine):
    revs = glob.glob(os.path.join(local_engine["root"], "nvme", "models", "tiny-llama", "*", "config.json"))
    assert revs, "the session engine staged no revision under %s" % local_engine["root"]
    return os.path.dirname(revs[0])


def _run(local_engine, tmp_path, out_dir, **overrides):
    assert local_engine["first_rc"] == 0, local_engine["first_output"][-3000:]
    doc = {
        "benchmark_targets": [{"name": "colocated", "url": local_engine["base_url"], "model": "tiny-llama"}],
        "benchmark_concurrency": [1, 2],
        "benchmark_seeds": [1, 2],
        "benchmark_lengths": [[128, 32]],
        "benchmark_requests_per_round": 4,
        "benchmark_warmup_rounds": 1,
        "benchmark_tokenizer": _tokenizer(local_engine),
        "benchmark_out_dir": str(out_dir),
    }
    doc.update(overrides)
    path = tmp_path / "vars.json"
    path.write_text(json.dumps(doc))
    return run_playbook("playbooks/benchmark.yml", local_engine["root"], local_engine["port"], "-e", "@%s" % path,
                        timeout=900)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_short_protocol_writes_a_report_that_follows_the_contract(local_engine, tmp_path):
    out = tmp_path / "bench"
    rc, output = _run(local_engine, tmp_path, out)
    assert rc == 0, output[-4000:]
    # progress: round k of n with an ETA, for each of the 6 rounds (2 warm-up + 4 measured)
    assert "round 1 of 6" in output and "round 6 of 6" in output and "ETA" in output, output[-3000:]
    with open(out / "report.json") as f:
        report = json.load(f)
    _bench_report.validate(report)
    assert isinstance(report["schema"], int)
    assert [t["name"] for t in report["targets"]] == ["colocated"]
    cells = sorted(report["cells"], key=lambda c: c["concurrency"])
    assert [(c["target"], c["concurrency"], c["input_len"], c["output_len"]) for c in cells] == [
        ("colocated", 1, 128, 32), ("colocated", 2, 128, 32)]
    for c in cells:
        # warm-up rounds are not in the cell: 2 seeds x 4 requests
        assert c["requests"] == 8 and c["failed"] == 0, c["rounds"]
        assert sorted({s["seed"] for s in c["samples"]}) == [1, 2]
        assert len(c["samples"]) == 8
        for s in c["samples"]:
            assert s["ok"] and s["ttft_ms"] > 0 and s["e2el_ms"] >= s["ttft_ms"] and s["tpot_ms"] > 0
            # ITL is per streamed chunk (vllm bench serve): a chunk may carry several tokens, so at most 31 gaps
            assert s["output_tokens"] == 32 and 1 <= len(s["itl_ms"]) <= 31
        for m in ("ttft", "tpot", "e2el"):
            lo, hi = c["p95_%s_ms_ci95" % m]
            assert lo <= c["p95_%s_ms_pooled" % m] <= hi
            assert c["p95_%s_ms_mean_of_seeds" % m] > 0
        assert isinstance(c["unstable"], bool)
    md = (out / "report.md").read_text()
    assert "What this does not prove" in md
    assert "C is the client's maximum number of requests in flight" in md
    assert glob.glob(str(out / "*.png"))
    # per-round records and the client's raw results are kept
    assert len(glob.glob(str(out / "rounds" / "*.json"))) == 6
    assert len(glob.glob(str(out / "raw" / "*.json"))) == 6


@pytest.mark.parametrize("case", ["unreachable", "wrong_model", "tokenizer", "budget"])
def test_bad_input_is_refused_before_any_load(local_engine, tmp_path, case):
    out = tmp_path / "bench"
    over, expect = {}, None
    if case == "unreachable":
        over["benchmark_targets"] = [{"name": "gone", "url": "http://127.0.0.1:%d" % _free_port(),
                                      "model": "tiny-llama"}]
        expect = "benchmark_targets[0].url"
    elif case == "wrong_model":
        over["benchmark_targets"] = [{"name": "colocated", "url": local_engine["base_url"], "model": "tiny-lama"}]
        expect = "benchmark_targets[0].model: 'tiny-lama' is not served"
    elif case == "tokenizer":
        over["benchmark_tokenizer"] = str(tmp_path / "no-such-model")
        expect = "benchmark_tokenizer: %s does not exist" % (tmp_path / "no-such-model")
    else:
        over.update(benchmark_time_budget=1, benchmark_requests_per_round=64)
        expect = "benchmark_time_budget: the ladder cannot finish in 1s"
    rc, output = _run(local_engine, tmp_path, out, **over)
    assert rc != 0, output[-3000:]
    assert expect in output, output[-3000:]
    # nothing was planned or sent: no plan, no round
    assert not os.path.exists(out / "plan.json")
    assert not glob.glob(str(out / "rounds" / "*.json"))
