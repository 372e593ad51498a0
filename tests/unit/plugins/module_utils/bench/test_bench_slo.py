"""The upgrade's SLO gate: upgrade_slo checked before anything changes (_bench_slo), and B's round judged against A's
on the same prompts (_bench_slo_judge): each limit, its ratio, the figures it names, refusals with their reasons, and
failed requests counted honestly.

The rounds are records as benchmark_round saves them (samples as vllm bench serve's --save-detailed gives them);
p95s are numpy's default percentile (_bench_stats.percentile), as the client's own p95."""
from __future__ import annotations

import math

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_slo, _bench_slo_judge as judge
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError
from ansible_collections.llmops.serving.tests.lib.refusals import assert_refused

DIGEST = "ab" * 32
OUT = 8


def sample(ttft, tpot=10.0, ok=True, error="HTTP 503"):
    if not ok:
        return {"seed": 1, "ok": False, "error": error, "input_tokens": 16, "output_tokens": 0, "ttft_ms": None,
                "tpot_ms": None, "itl_ms": [], "e2el_ms": None}
    return {"seed": 1, "ok": True, "error": "", "input_tokens": 16, "output_tokens": OUT, "ttft_ms": float(ttft),
            "tpot_ms": float(tpot), "itl_ms": [float(tpot)] * (OUT - 1), "e2el_ms": float(ttft) + (OUT - 1) * tpot}


def record(samples, target="A", digest=DIGEST, goodput=None, num_prompts=None, failed=None, rate=2.0, seed=1):
    return {"index": 2, "kind": "measure", "target": target, "concurrency": 256, "request_rate": rate,
            "input_len": 16, "output_len": OUT, "seed": seed, "rep": 0,
            "num_prompts": len(samples) if num_prompts is None else num_prompts, "samples": samples,
            "failed": sum(1 for s in samples if not s["ok"]) if failed is None else failed,
            "duration_s": 8.0, "wall_s": 9.0,
            "client": {"request_goodput": goodput} if goodput is not None else {},
            "prompt_digest": None if digest is None else {"sha256": digest, "prompts": len(samples) if num_prompts is None
                                                          else num_prompts, "kind": "token_ids"}}


def flat(ttft, tpot=10.0, n=16, **kw):
    """A round whose requests all took the same time: its p95 is exactly that time."""
    return record([sample(ttft, tpot) for _i in range(n)], **kw)


def settings(**kw):
    return _bench_slo.check_settings(dict({"requests": 16}, **kw))


# --------------------------------------------------------------------------------------------- #
# upgrade_slo
# --------------------------------------------------------------------------------------------- #

def test_an_empty_setting_is_the_gate_off():
    assert _bench_slo.check_settings({}) == {} and _bench_slo.check_settings(None) == {}
    assert not _bench_slo.enabled({}) and _bench_slo.enabled({"requests": 8})


def test_missing_keys_take_the_documented_defaults():
    s = _bench_slo.check_settings({"ttft_p95_ratio": 2})
    assert s == dict(_bench_slo.DEFAULTS, ttft_p95_ratio=2.0)
    assert s["goodput"] == [] and s["ttft_p95_ms"] is None
    assert _bench_slo.round_line(s) == "32 requests at 2 req/s, 256 prompt + 128 output tokens, seed 1, 1 warm-up round"


def test_values_are_normalised():
    s = _bench_slo.check_settings({"requests": "8", "rate": "0.5", "warmup": 0, "goodput": ["ttft: 500", "tpot:50"],
                                   "ttft_p95_ms": 300})
    assert (s["requests"], s["rate"], s["warmup"], s["goodput"], s["ttft_p95_ms"]) == (8, 0.5, 0, ["ttft:500", "tpot:50"], 300.0)


@pytest.mark.parametrize("slo,key,words", [
    ({"rates": 2}, "upgrade_slo.rates", ["unknown key", "rate"]),
    ({"rate": 0}, "upgrade_slo.rate", ["above 0", "for example 2"]),
    ({"rate": -1}, "upgrade_slo.rate", ["above 0"]),
    ({"rate": float("nan")}, "upgrade_slo.rate", ["finite"]),
    ({"rate": True}, "upgrade_slo.rate", ["not a number"]),
    ({"rate": "fast"}, "upgrade_slo.rate", ["not a number"]),
    ({"ttft_p95_ratio": 0}, "upgrade_slo.ttft_p95_ratio", ["above 0", "largest B/A ratio"]),
    ({"tpot_p95_ratio": -0.5}, "upgrade_slo.tpot_p95_ratio", ["above 0"]),
    ({"goodput": ["ttft:500"], "goodput_min_ratio": 0}, "upgrade_slo.goodput_min_ratio", ["above 0"]),
    ({"ttft_p95_ms": -3}, "upgrade_slo.ttft_p95_ms", ["above 0", "leave it out"]),
    ({"timeout": 0}, "upgrade_slo.timeout", ["above 0"]),
    ({"requests": 0}, "upgrade_slo.requests", ["below 1"]),
    ({"requests": -4}, "upgrade_slo.requests", ["below 1"]),
    ({"requests": 2.5}, "upgrade_slo.requests", ["not an integer"]),
    ({"max_tokens": 1}, "upgrade_slo.max_tokens", ["below 2", "TPOT exists"]),
    ({"warmup": -1}, "upgrade_slo.warmup", ["below 0"]),
    ({"seed": -1}, "upgrade_slo.seed", ["below 0"]),
    ({"max_failed_requests": -1}, "upgrade_slo.max_failed_requests", ["below 0"]),
    ({"requests": 8, "max_failed_requests": 8}, "upgrade_slo.max_failed_requests", ["allows all 8 requests"]),
    ({"goodput": ["latency:500"]}, "upgrade_slo.goodput[0]", ["not metric:milliseconds"]),
    ({"goodput": ["ttft:0"]}, "upgrade_slo.goodput[0]", ["above 0"]),
    ({"goodput": "ttft:500"}, "upgrade_slo.goodput", ["must be a list"]),
    ({"goodput_min_ratio": 0.9}, "upgrade_slo.goodput_min_ratio", ["without upgrade_slo.goodput"]),
])
def test_a_bad_setting_is_refused_naming_the_key_and_the_fix(slo, key, words):
    with pytest.raises(BenchError) as e:
        _bench_slo.check_settings(slo)
    assert_refused(e.value, option=key, reason="bad_input", words=words)
    assert e.value.field.startswith("upgrade_slo")


def test_a_setting_that_is_not_a_mapping_is_refused():
    with pytest.raises(BenchError) as e:
        _bench_slo.check_settings([1, 2])
    assert_refused(e.value, option="upgrade_slo", words=["not a mapping"])


# --------------------------------------------------------------------------------------------- #
# The judge
# --------------------------------------------------------------------------------------------- #

def test_ratio_math():
    assert judge.ratio(412.0, 217.0) == pytest.approx(1.8986, abs=1e-4)
    assert judge.ratio(0.0, 0.0) == 1.0
    assert math.isinf(judge.ratio(3.0, 0.0))
    assert judge.ratio(None, 2.0) is None and judge.ratio(2.0, None) is None


def test_the_same_round_passes_with_every_ratio_one():
    v = judge.judge(flat(200.0), flat(200.0, target="B"), settings())
    assert v["verdict"] == "pass" and v["passed"] and v["breached"] == [] and v["reason"] is None
    by = dict((x["key"], x) for x in v["limits"])
    assert sorted(by) == ["max_failed_requests", "tpot_p95_ratio", "ttft_p95_ratio"]
    assert by["ttft_p95_ratio"]["measured"] == 1.0 and by["tpot_p95_ratio"]["measured"] == 1.0
    assert "goodput not judged (no upgrade_slo.goodput)" in v["line"] and v["line"].endswith(": pass")
    assert v["msg"].startswith("upgrade_slo: B met every limit")


def test_a_slower_first_token_breaches_the_ttft_ratio_naming_both_figures_and_the_limit():
    v = judge.judge(flat(217.0), flat(412.0, target="B"), settings())
    assert v["verdict"] == "breach" and not v["passed"] and v["reason"] == "slo_breach"
    assert v["breached"] == ["ttft_p95_ratio"]
    assert v["msg"] == "upgrade_slo.ttft_p95_ratio: B's p95 TTFT 412 ms is 1.9x A's 217 ms, limit 1.5x"
    assert "p95 TTFT A 217 ms, B 412 ms = 1.9x (limit 1.5x)" in v["line"]
    assert v["line"].endswith("breach of ttft_p95_ratio")


def test_the_p95_is_the_clients_percentile_not_the_worst_request():
    # 19 requests at 100 ms and one at 1000 ms: numpy's p95 of 20 values interpolates between the two largest
    a = record([sample(100.0) for _i in range(20)])
    b = record([sample(100.0) for _i in range(19)] + [sample(1000.0)], target="B")
    v = judge.judge(a, b, settings(requests=20))
    by = dict((x["key"], x) for x in v["limits"])
    assert by["ttft_p95_ratio"]["b"] == pytest.approx(100.0 + 0.05 * 900.0)
    assert by["ttft_p95_ratio"]["measured"] == pytest.approx(1.45)
    assert v["passed"]


def test_tpot_and_absolute_limits():
    v = judge.judge(flat(100.0, tpot=10.0), flat(100.0, tpot=14.0, target="B"),
                    settings(tpot_p95_ratio=1.25, ttft_p95_ms=90, tpot_p95_ms=20))
    assert v["breached"] == ["ttft_p95_ms", "tpot_p95_ratio"]
    assert ("upgrade_slo.ttft_p95_ms: B's p95 TTFT 100 ms is above the limit 90.0 ms; "
            "upgrade_slo.tpot_p95_ratio: B's p95 TPOT 14.0 ms is 1.4x A's 10.0 ms, limit 1.25x") == v["msg"]
    by = dict((x["key"], x) for x in v["limits"])
    assert by["tpot_p95_ms"]["passed"] and by["tpot_p95_ms"]["measured"] == 14.0
    assert "(limit 1.5x, at most 90.0 ms)" in v["line"]


def test_goodput_is_judged_only_with_its_slo_and_as_b_over_a():
    s = settings(goodput=["ttft:500"], goodput_min_ratio=0.9)
    v = judge.judge(flat(100.0, goodput=2.0), flat(100.0, target="B", goodput=0.9), s)
    assert v["breached"] == ["goodput_min_ratio"]
    assert v["msg"] == ("upgrade_slo.goodput_min_ratio: B's goodput 0.9 req/s is 0.45x A's 2 req/s (SLO ttft:500), "
                        "limit 0.9x")
    v = judge.judge(flat(100.0, goodput=2.0), flat(100.0, target="B", goodput=1.9), s)
    assert v["passed"] and "goodput A 2 req/s, B 1.9 req/s = 0.95x (at least 0.9x)" in v["line"]
    # both at zero: B is no worse than A
    assert judge.judge(flat(100.0, goodput=0.0), flat(100.0, target="B", goodput=0.0), s)["passed"]
    # a goodput the client did not report is not a pass
    v = judge.judge(flat(100.0, goodput=2.0), flat(100.0, target="B"), s)
    assert v["breached"] == ["goodput_min_ratio"] and "the client reported no goodput for B" in v["msg"]


def test_failed_requests_of_b_count_honestly_against_its_limit():
    b = record([sample(100.0) for _i in range(14)] + [sample(0, ok=False, error="HTTP 500: boom")] * 2, target="B")
    v = judge.judge(flat(100.0), b, settings())
    assert v["breached"] == ["max_failed_requests"]
    assert v["msg"] == ("upgrade_slo.max_failed_requests: B failed 2 of 16 requests (first error: 'HTTP 500: boom'), "
                        "limit 0")
    assert v["b"]["failed"] == 2 and v["b"]["completed"] == 14
    # one failure allowed: the same round passes; its latencies are those of the requests that succeeded
    assert judge.judge(flat(100.0), b, settings(max_failed_requests=2))["passed"]


def test_a_request_the_client_left_no_result_of_is_a_failed_request():
    b = record([sample(100.0) for _i in range(15)], target="B", num_prompts=16)
    v = judge.judge(flat(100.0), b, settings())
    # the two rounds planned the same 16 requests; B has a result for 15
    assert v["b"]["failed"] == 1 and v["b"]["unsampled"] == 1 and v["b"]["requests"] == 16
    assert v["breached"] == ["max_failed_requests"] and "1 request(s) left no result" in v["msg"]


def test_a_rounds_own_failed_count_wins_over_fewer_failed_samples():
    b = record([sample(100.0) for _i in range(16)], target="B", failed=3)
    assert judge.figures(b)["failed"] == 3


def test_b_with_no_successful_request_breaches_every_latency_limit():
    b = record([sample(0, ok=False)] * 16, target="B")
    v = judge.judge(flat(100.0), b, settings())
    assert v["breached"] == ["max_failed_requests", "ttft_p95_ratio", "tpot_p95_ratio"]
    assert "upgrade_slo.ttft_p95_ratio: B has no p95 TTFT (no request of B succeeded), limit 1.5x" in v["msg"]


@pytest.mark.parametrize("a_digest,b_digest,reason,words", [
    (DIGEST, "cd" * 32, "prompts_differ", ["different prompts", "abababababab", "cdcdcdcdcdcd"]),
    (DIGEST, None, "no_prompt_digest", ["B's round has no prompt digest"]),
    (None, DIGEST, "no_prompt_digest", ["A's round has no prompt digest"]),
])
def test_rounds_on_other_prompts_are_refused(a_digest, b_digest, reason, words):
    v = judge.judge(flat(100.0, digest=a_digest), flat(100.0, target="B", digest=b_digest), settings())
    assert v["verdict"] == "refused" and not v["passed"] and v["reason"] == reason and v["limits"] == []
    assert v["msg"].startswith("upgrade_slo: ")
    for w in words:
        assert w in v["msg"], v["msg"]


def test_rounds_at_another_rate_or_seed_are_refused():
    v = judge.judge(flat(100.0), flat(100.0, target="B", rate=4.0), settings())
    assert v["reason"] == "rounds_differ" and "their request_rate differs (A 2.0, B 4.0)" in v["msg"]
    v = judge.judge(flat(100.0), flat(100.0, target="B", seed=2), settings())
    assert v["reason"] == "rounds_differ" and "seed" in v["msg"]


def test_a_baseline_with_failed_requests_is_refused():
    a = record([sample(100.0) for _i in range(15)] + [sample(0, ok=False, error="timeout")])
    v = judge.judge(a, flat(100.0, target="B"), settings())
    assert v["verdict"] == "refused" and v["reason"] == "baseline_failed"
    assert "A failed 1 of 16 requests of its round (first error: 'timeout')" in v["msg"]
    # within max_failed_requests A is a baseline
    assert judge.judge(a, flat(100.0, target="B"), settings(max_failed_requests=1))["passed"]


def test_judging_with_the_gate_off_or_impossible_samples_is_an_error():
    with pytest.raises(ValueError, match="the gate is off"):
        judge.judge(flat(1.0), flat(1.0), {})
    bad = flat(100.0, target="B")
    bad["samples"][0]["ttft_ms"] = -1.0
    with pytest.raises(ValueError, match=r"samples\[0\]\.ttft_ms"):
        judge.judge(flat(100.0), bad, settings())
