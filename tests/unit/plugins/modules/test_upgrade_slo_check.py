"""upgrade_slo_check: upgrade_slo checked before anything changes, and B's round judged against A's from the run
directories benchmark_plan and benchmark_round write (the plan written by benchmark_plan itself, the rounds as
benchmark_round saves them)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_outdir
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.modules import benchmark_plan, upgrade_slo_check
from ansible_collections.llmops.serving.tests.lib.refusals import assert_refused

SLO = {"requests": 8, "rate": 4, "prompt_tokens": 16, "max_tokens": 8, "warmup": 1, "ttft_p95_ratio": 1.5}
OUT = 8


def _sample(ttft, ok=True):
    if not ok:
        return {"seed": 1, "ok": False, "error": "HTTP 503", "input_tokens": 16, "output_tokens": 0, "ttft_ms": None,
                "tpot_ms": None, "itl_ms": [], "e2el_ms": None}
    return {"seed": 1, "ok": True, "error": "", "input_tokens": 16, "output_tokens": OUT, "ttft_ms": ttft,
            "tpot_ms": 5.0, "itl_ms": [5.0] * (OUT - 1), "e2el_ms": ttft + 5.0 * (OUT - 1)}


def _side(run_module, tmp_path, side, ttft, digest="ab" * 32, measured=True, stopped=None):
    """A run directory as the role's slo_round.yml leaves it: benchmark_plan's plan (no target contacted), the
    warm-up round and the measured round of ``ttft`` ms per request."""
    out_dir = str(tmp_path / side)
    r = run_module(benchmark_plan, {
        "targets": [{"name": side.upper(), "url": "http://127.0.0.1:9", "model": "m"}], "concurrency": [],
        "request_rates": [SLO["rate"]], "seeds": [1], "lengths": [[SLO["prompt_tokens"], SLO["max_tokens"]]],
        "requests_per_round": SLO["requests"], "warmup_rounds": SLO["warmup"], "repetitions": 1,
        "interleave": False, "transport_warmup_requests": 0, "out_dir": out_dir, "check_targets": False})
    assert not r.get("failed"), r
    plan = _bench_outdir.read_plan(out_dir)
    for rnd in plan["rounds"]:
        if rnd["kind"] == "measure" and not measured:
            continue
        samples = [_sample(ttft) for _i in range(rnd["num_prompts"])]
        rec = dict(rnd, schema=_bench_outdir.ROUND_SCHEMA, started_at=1.0, samples=samples, failed=0, duration_s=3.0,
                   wall_s=4.0, client={}, evidence=None, phases=None,
                   prompt_digest={"sha256": digest, "prompts": rnd["num_prompts"], "kind": "token_ids"})
        _fsutil.atomic_write_json(_bench_outdir.round_path(out_dir, rnd["index"]), rec)
    if stopped:
        _fsutil.atomic_write_json(os.path.join(out_dir, "stopped.json"), dict(
            plan["rounds"][-1], reason="target_down", message=stopped, at=2.0))
    return out_dir


def test_an_empty_setting_is_the_gate_off(run_module):
    r = run_module(upgrade_slo_check, {"slo": {}})
    assert not r.get("failed") and r["enabled"] is False and r["settings"] == {} and not r["changed"]
    assert r["msg"] == "SLO gate: off (upgrade_slo is empty)"


def test_the_settings_come_back_complete_in_check_mode(run_module):
    r = run_module(upgrade_slo_check, {"slo": {"requests": 8}}, check_mode=True)
    assert r["enabled"] and r["settings"]["requests"] == 8 and r["settings"]["ttft_p95_ratio"] == 1.5
    assert r["msg"] == "SLO gate: 8 requests at 2 req/s, 256 prompt + 128 output tokens, seed 1, 1 warm-up round"


@pytest.mark.parametrize("slo,option,words", [
    ({"rate": 0}, "upgrade_slo.rate", ["above 0"]),
    ({"ttft_p95_ratio": -1}, "upgrade_slo.ttft_p95_ratio", ["above 0"]),
    ({"requests": 8, "reqests": 8}, "upgrade_slo.reqests", ["unknown key"]),
])
def test_a_bad_setting_fails_naming_the_key(run_module, slo, option, words):
    r = run_module(upgrade_slo_check, {"slo": slo})
    assert_refused(r, option=option, reason="bad_input", words=words)


def test_b_within_the_limits_passes(run_module, tmp_path):
    r = run_module(upgrade_slo_check, {"slo": SLO, "a_dir": _side(run_module, tmp_path, "a", 100.0),
                                       "b_dir": _side(run_module, tmp_path, "b", 120.0)})
    assert not r.get("failed"), r
    assert r["passed"] is True and r["verdict"] == "pass" and r["reason"] is None and not r["changed"]
    assert r["a"]["p95_ttft_ms"] == 100.0 and r["b"]["p95_ttft_ms"] == 120.0 and r["b"]["requests"] == 8
    assert "p95 TTFT A 100 ms, B 120 ms = 1.2x (limit 1.5x)" in r["line"]


def test_a_breach_names_the_limit_and_does_not_fail_the_task(run_module, tmp_path):
    r = run_module(upgrade_slo_check, {"slo": SLO, "a_dir": _side(run_module, tmp_path, "a", 100.0),
                                       "b_dir": _side(run_module, tmp_path, "b", 190.0)})
    assert not r.get("failed"), r
    assert r["passed"] is False and r["verdict"] == "breach" and r["reason"] == "slo_breach"
    assert r["msg"] == "upgrade_slo.ttft_p95_ratio: B's p95 TTFT 190 ms is 1.9x A's 100 ms, limit 1.5x"


def test_rounds_on_other_prompts_are_refused(run_module, tmp_path):
    r = run_module(upgrade_slo_check, {"slo": SLO, "a_dir": _side(run_module, tmp_path, "a", 100.0),
                                       "b_dir": _side(run_module, tmp_path, "b", 100.0, digest="cd" * 32)})
    assert r["passed"] is False and r["verdict"] == "refused" and r["reason"] == "prompts_differ"


def test_a_round_that_was_not_measured_fails_with_its_reason(run_module, tmp_path):
    b = _side(run_module, tmp_path, "b", 100.0, measured=False,
              stopped="target B stopped answering before round 2 of 2: connection refused")
    r = run_module(upgrade_slo_check, {"slo": SLO, "a_dir": _side(run_module, tmp_path, "a", 100.0), "b_dir": b})
    msg = assert_refused(r, option="b_dir", reason="round_not_measured")
    assert msg == ("upgrade_slo: B's round was not measured: target B stopped answering before round 2 of 2: "
                   "connection refused")


def test_a_directory_without_a_plan_fails_naming_it(run_module, tmp_path):
    r = run_module(upgrade_slo_check, {"slo": SLO, "a_dir": str(tmp_path / "none"),
                                       "b_dir": _side(run_module, tmp_path, "b", 100.0)})
    assert_refused(r, reason="missing_file", words=["plan.json does not exist"])


def test_judging_needs_both_directories_and_a_gate(run_module, tmp_path):
    r = run_module(upgrade_slo_check, {"slo": SLO, "a_dir": str(tmp_path)})
    assert r.get("failed") and "b_dir" in r["msg"]
    a, b = _side(run_module, tmp_path, "a", 100.0), _side(run_module, tmp_path, "b", 100.0)
    r = run_module(upgrade_slo_check, {"slo": {}, "a_dir": a, "b_dir": b})
    assert_refused(r, option="slo", reason="bad_input", words=["no limit to judge"])
