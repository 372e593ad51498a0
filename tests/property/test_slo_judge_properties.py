"""Property-based tests of the upgrade's SLO judge (_bench_slo_judge) over generated rounds.

The invariants a release manager relies on:

* B's latencies A's scaled by k: the judged ratio is k, and the limit holds exactly when k is within it;
* A round judged against itself meets every limit of 1 or more;
* every failed request of B is counted (a failed sample, a planned request without a result), and more of them
  than allowed is a breach whatever the latencies;
* rounds whose prompt digests differ are refused whatever their figures: no limit is judged on other prompts.
"""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings as hsettings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_slo, _bench_slo_judge as judge
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_stats

OUT = 8
LATENCY = st.floats(min_value=0.5, max_value=5000.0, allow_nan=False, allow_infinity=False)


def _sample(ttft, tpot, ok=True):
    if not ok:
        return {"seed": 1, "ok": False, "error": "HTTP 503", "input_tokens": 8, "output_tokens": 0, "ttft_ms": None,
                "tpot_ms": None, "itl_ms": [], "e2el_ms": None}
    return {"seed": 1, "ok": True, "error": "", "input_tokens": 8, "output_tokens": OUT, "ttft_ms": ttft,
            "tpot_ms": tpot, "itl_ms": [], "e2el_ms": ttft + tpot * (OUT - 1)}


def _record(samples, num_prompts, digest="ab" * 32):
    return {"index": 1, "kind": "measure", "target": "X", "concurrency": 256, "request_rate": 2.0, "input_len": 8,
            "output_len": OUT, "seed": 1, "rep": 0, "num_prompts": num_prompts, "samples": samples,
            "failed": sum(1 for s in samples if not s["ok"]), "duration_s": 4.0, "wall_s": 5.0, "client": {},
            "prompt_digest": {"sha256": digest, "prompts": num_prompts, "kind": "token_ids"}}


ROUNDS = st.lists(st.tuples(LATENCY, st.floats(min_value=0.5, max_value=200.0)), min_size=1, max_size=40)


@hsettings(max_examples=200, deadline=None)
@given(pairs=ROUNDS, k=st.floats(min_value=0.05, max_value=20.0), limit=st.floats(min_value=0.1, max_value=10.0))
def test_b_scaled_by_k_is_judged_k_and_passes_exactly_within_the_limit(pairs, k, limit):
    assume(abs(k - limit) > 1e-6 * limit)
    n = len(pairs)
    a = _record([_sample(t, p) for t, p in pairs], n)
    b = _record([_sample(t * k, p) for t, p in pairs], n)
    s = _bench_slo.check_settings({"requests": max(n, 1), "ttft_p95_ratio": limit, "tpot_p95_ratio": 1.0})
    v = judge.judge(a, b, s)
    ttft = next(x for x in v["limits"] if x["key"] == "ttft_p95_ratio")
    assert ttft["measured"] == pytest.approx(k, rel=1e-9)
    assert ttft["a"] == _bench_stats.percentile([t for t, _p in pairs], 95)
    assert ttft["passed"] is (k <= limit)
    assert ("ttft_p95_ratio" in v["breached"]) is (k > limit)
    assert v["passed"] is (k <= limit)


@hsettings(max_examples=100, deadline=None)
@given(pairs=ROUNDS, ttft_limit=st.floats(min_value=1.0, max_value=10.0),
       tpot_limit=st.floats(min_value=1.0, max_value=10.0))
def test_a_round_against_itself_meets_every_limit_of_one_or_more(pairs, ttft_limit, tpot_limit):
    a = _record([_sample(t, p) for t, p in pairs], len(pairs))
    s = _bench_slo.check_settings({"requests": len(pairs), "ttft_p95_ratio": ttft_limit, "tpot_p95_ratio": tpot_limit})
    v = judge.judge(a, dict(a, target="B"), s)
    assert v["verdict"] == "pass" and all(x["measured"] in (1.0, 0) for x in v["limits"])


@hsettings(max_examples=200, deadline=None)
@given(pairs=ROUNDS, failed=st.lists(st.booleans(), min_size=1, max_size=40), missing=st.integers(0, 5),
       allowed=st.integers(0, 3))
def test_every_failed_request_of_b_counts(pairs, failed, missing, allowed):
    flags = (failed * (len(pairs) // len(failed) + 1))[:len(pairs)]
    samples = [_sample(t, p, ok=not f) for (t, p), f in zip(pairs, flags)]
    n = len(samples) + missing
    assume(allowed < n)
    a = _record([_sample(t, p) for t, p in pairs] + [_sample(10.0, 1.0)] * missing, n)
    b = _record(samples, n)
    v = judge.judge(a, b, _bench_slo.check_settings({"requests": n, "max_failed_requests": allowed,
                                                     "ttft_p95_ratio": 1e6, "tpot_p95_ratio": 1e6}))
    want = sum(flags) + missing
    assert v["b"]["failed"] == want and v["b"]["requests"] == n
    assert ("max_failed_requests" in v["breached"]) is (want > allowed)
    if want > allowed:
        assert not v["passed"]


@hsettings(max_examples=100, deadline=None)
@given(pa=ROUNDS, pb=ROUNDS, da=st.text("0123456789abcdef", min_size=64, max_size=64),
       db=st.text("0123456789abcdef", min_size=64, max_size=64))
def test_rounds_on_other_prompts_are_refused_whatever_their_figures(pa, pb, da, db):
    assume(da != db)
    n = max(len(pa), len(pb))
    a = _record([_sample(t, p) for t, p in pa], n, digest=da)
    b = _record([_sample(t, p) for t, p in pb], n, digest=db)
    v = judge.judge(a, b, _bench_slo.check_settings({"requests": n, "max_failed_requests": n - 1}))
    assert v["verdict"] == "refused" and v["reason"] == "prompts_differ" and v["limits"] == [] and not v["passed"]
