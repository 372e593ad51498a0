"""_bench_stats: the benchmark's numbers are the ones vllm bench serve would give per round, and the
figures across rounds (pooled p95, mean of p95s, bootstrap interval, unstable flag, A/B verdict) have
known answers on crafted and simulated samples."""
from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_stats as bs

Z95 = statistics.NormalDist().inv_cdf(0.95)


def sample(ttft, tpot=10.0, out=32, seed=1, ok=True, error=None, itl=None):
    """One request as the benchmark records it (e2el = ttft + (out - 1) x tpot, as vllm defines TPOT)."""
    if not ok:
        return dict(ttft_ms=None, tpot_ms=None, itl_ms=[], e2el_ms=None, output_tokens=0, input_tokens=128,
                    seed=seed, ok=False, error=error or "HTTP 503")
    return dict(ttft_ms=float(ttft), tpot_ms=float(tpot), itl_ms=list(itl if itl is not None else [tpot] * (out - 1)),
                e2el_ms=float(ttft) + (out - 1) * float(tpot), output_tokens=out, input_tokens=128, seed=seed,
                ok=True, error=None)


def rnd(seed, samples, duration_s=10.0, rep=0, failed=None, evidence=None):
    return dict(seed=seed, rep=rep, samples=samples, failed=failed if failed is not None else
                sum(1 for s in samples if not s["ok"]), duration_s=duration_s, evidence=evidence)


def lognormal_round(seed, n, mu=3.0, sigma=0.5, rep=0):
    r = random.Random(seed * 1000 + rep)
    return rnd(seed, [sample(r.lognormvariate(mu, sigma), r.lognormvariate(2.0, 0.1), seed=seed) for _i in range(n)],
               rep=rep)


def test_percentile_matches_numpy_default_on_random_data():
    r = random.Random(7)
    for _i in range(120):
        xs = [r.expovariate(0.01) for _j in range(r.randint(1, 80))]
        for q in (0, 50, 95, 99, 100, r.uniform(0, 100)):
            assert bs.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-12)
    assert bs.percentile([3, 1, 2], 50) == 2.0
    assert bs.percentile([], 95) is None
    assert bs.percentile([None, 4.0], 95) == 4.0
    with pytest.raises(ValueError, match="^q: 101 is not a percentile"):
        bs.percentile([1.0], 101)


def test_round_summary_is_vllm_per_round_figures_over_successful_requests():
    samples = [sample(t, tpot=t / 10.0, seed=3) for t in range(1, 21)] + [sample(0, ok=False, seed=3)]
    rs = bs.round_summary(samples, duration_s=4.0)
    ttfts = list(range(1, 21))
    assert rs["p95_ttft_ms"] == pytest.approx(np.percentile(ttfts, 95))
    assert rs["p50_tpot_ms"] == pytest.approx(np.percentile([t / 10.0 for t in ttfts], 50))
    itls = [t / 10.0 for t in ttfts for _k in range(31)]
    assert rs["p99_itl_ms"] == pytest.approx(np.percentile(itls, 99))
    assert rs["p95_e2el_ms"] == pytest.approx(np.percentile([t + 31 * t / 10.0 for t in ttfts], 95))
    assert rs["output_tok_s"] == pytest.approx(20 * 32 / 4.0)  # the failed request generated nothing
    assert (rs["requests"], rs["completed"], rs["failed"]) == (21, 20, 1)
    # a request with one output token has no TPOT (vllm leaves it out of the TPOT percentiles)
    one = dict(sample(5.0), tpot_ms=None, output_tokens=1, itl_ms=[])
    assert bs.round_summary([one], 1.0)["p95_tpot_ms"] is None
    with pytest.raises(ValueError, match=r"samples\[1\]\.ttft_ms"):
        bs.round_summary([sample(1.0), dict(sample(1.0), ttft_ms="slow")], 1.0)
    with pytest.raises(ValueError, match=r"samples\[0\]\.ok"):
        bs.round_summary([dict(sample(1.0), ok=None)], 1.0)


def test_pooled_p95_and_mean_of_p95_differ_by_the_known_amount():
    # round 1: 1..20 ms, round 2: 101..120 ms. Per-round p95 = 19.05 and 119.05 -> mean 69.05;
    # pooled 40 values: position 39 x 0.95 = 37.05 between 118 and 119 -> 118.05; 49 ms apart.
    rounds = [rnd(1, [sample(t, seed=1) for t in range(1, 21)]),
              rnd(2, [sample(t, seed=2) for t in range(101, 121)])]
    c = bs.cell("colocated", 1, 128, 32, rounds, n_boot=200)
    assert c["p95_ttft_ms_mean_of_seeds"] == pytest.approx(69.05)
    assert c["p95_ttft_ms_pooled"] == pytest.approx(118.05)
    assert c["p95_ttft_ms_pooled"] - c["p95_ttft_ms_mean_of_seeds"] == pytest.approx(49.0)
    assert [r["p95_ttft_ms"] for r in c["rounds"]] == pytest.approx([19.05, 119.05])
    # two seeds that far apart are flagged, with the metric and the spread in the reason
    assert c["unstable"] is True
    assert any("TTFT" in r and "19.1..119.0" in r for r in c["unstable_reasons"]), c["unstable_reasons"]
    # every request is kept with its seed
    assert len(c["samples"]) == 40 and {s["seed"] for s in c["samples"]} == {1, 2}
    assert all(k in c["samples"][0] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "seed", "itl_ms"))


def test_bootstrap_interval_covers_the_true_p95_in_about_95_percent_of_trials():
    # lognormal(3, 0.5) latencies: true p95 = exp(3 + 0.5 z95). 2 seeds x 100 requests, 120 trials,
    # fixed seeds. The percentile bootstrap of a p95 runs a little narrow at this size
    # (0.91 with these seeds); a tolerance of 0.88..0.99 still fails an interval that is off by a lot.
    true = math.exp(3.0 + 0.5 * Z95)
    trials, hits, widths = 120, 0, []
    for trial in range(trials):
        gens = [random.Random(trial * 10 + s) for s in (1, 2)]
        strata = [[g.lognormvariate(3.0, 0.5) for _i in range(100)] for g in gens]
        lo, hi = bs.bootstrap_ci(strata, 95, n_boot=250, rng_seed=trial)
        hits += lo <= true <= hi
        widths.append(hi - lo)
    coverage = hits / float(trials)
    assert 0.88 <= coverage <= 0.99, coverage
    # the interval is an interval around the estimate, not a degenerate point
    assert min(widths) > 0


def test_bootstrap_interval_is_too_narrow_at_field_sizes_as_the_report_warns():
    # 2 seeds x 16 requests (the field protocol at C=1): the resampled p95 cannot pass the largest request,
    # so the interval misses the truth far more often than 5 % - the report's narrow_interval caveat
    true = math.exp(3.0 + 0.5 * Z95)
    trials, hits = 150, 0
    for trial in range(trials):
        gens = [random.Random(50000 + trial * 10 + s) for s in (1, 2)]
        lo, hi = bs.bootstrap_ci([[g.lognormvariate(3.0, 0.5) for _i in range(16)] for g in gens], 95,
                                 n_boot=200, rng_seed=trial)
        hits += lo <= true <= hi
    assert 0.65 <= hits / float(trials) <= 0.86  # 0.78 with these seeds


def test_bootstrap_is_stratified_and_deterministic():
    strata = [[1.0] * 50, [100.0] * 50]
    # resampling within each round keeps 50 of each: the pooled p95 is 100 in every resample
    assert bs.bootstrap_ci(strata, 95, n_boot=200, rng_seed=1) == [100.0, 100.0]
    assert bs.bootstrap_ci(strata, 5, n_boot=200, rng_seed=1) == [1.0, 1.0]
    r1 = lognormal_round(1, 40)
    r2 = lognormal_round(2, 40)
    a = bs.cell("t", 2, 128, 32, [r1, r2], n_boot=300, rng_seed=5)
    b = bs.cell("t", 2, 128, 32, [r1, r2], n_boot=300, rng_seed=5)
    assert a["p95_ttft_ms_ci95"] == b["p95_ttft_ms_ci95"]
    lo, hi = a["p95_ttft_ms_ci95"]
    assert lo <= a["p95_ttft_ms_pooled"] <= hi
    with pytest.raises(ValueError, match="n_boot"):
        bs.bootstrap_ci(strata, 95, n_boot=3)


def test_unstable_only_when_seeds_disagree_beyond_the_threshold():
    same = [rnd(s, [sample(t, seed=s) for t in range(10, 50)]) for s in (1, 2)]
    c = bs.cell("t", 1, 128, 32, same, n_boot=50)
    assert c["unstable"] is False and c["unstable_reasons"] == []
    # p95 TTFT 10 % apart: stable at the default 20 %, unstable at 5 %
    near = [rnd(1, [sample(t, seed=1) for t in range(10, 50)]),
            rnd(2, [sample(t * 1.1, seed=2) for t in range(10, 50)])]
    assert bs.cell("t", 1, 128, 32, near, n_boot=50)["unstable"] is False
    tight = bs.cell("t", 1, 128, 32, near, n_boot=50, unstable_threshold=0.05)
    assert tight["unstable"] is True and "TTFT" in tight["unstable_reasons"][0]
    assert tight["p95_ttft_ms_spread"] == pytest.approx(0.1 / 1.05)
    # a single round cannot disagree with itself
    assert bs.cell("t", 1, 128, 32, same[:1], n_boot=50)["unstable"] is False


def test_failed_requests_are_counted_never_dropped():
    r1 = rnd(1, [sample(t, seed=1) for t in range(1, 31)] + [sample(0, ok=False, seed=1, error="HTTP 500")] * 2)
    # the client reported 5 failures but kept samples for 2: all 5 count
    r2 = rnd(2, [sample(t, seed=2) for t in range(1, 31)] + [sample(0, ok=False, seed=2)] * 2, failed=5)
    c = bs.cell("t", 4, 128, 32, [r1, r2], n_boot=50)
    assert c["failed"] == 7
    assert c["requests"] == 30 + 2 + 30 + 5
    assert [r["failed"] for r in c["rounds"]] == [2, 5]
    assert c["rounds"][1]["failed_without_sample"] == 3
    assert c["rounds"][0]["errors"] == ["HTTP 500"]
    assert sum(1 for s in c["samples"] if not s["ok"]) == 4  # failed samples are kept in the cell
    # latencies are over successful requests only
    assert c["p95_ttft_ms_pooled"] == pytest.approx(np.percentile(list(range(1, 31)) * 2, 95))
    # a round where everything failed has no p95, and it does not count as 0 in the mean of p95s
    r3 = rnd(3, [sample(0, ok=False, seed=3)] * 4)
    c3 = bs.cell("t", 4, 128, 32, [r1, r3], n_boot=50)
    assert c3["rounds"][1]["p95_ttft_ms"] is None
    assert c3["p95_ttft_ms_mean_of_seeds"] == pytest.approx(c3["rounds"][0]["p95_ttft_ms"])
    assert c3["failed"] == 6


def test_cell_throughput_spread_and_evidence_per_round():
    ev1 = {"kv_bytes": 1000, "rdma_bytes": 1100, "tcp_bytes": 0, "kv_xfer_s": 0.5, "verdict": "pass"}
    ev2 = {"kv_bytes": 3000, "rdma_bytes": 3100, "tcp_bytes": 0, "kv_xfer_s": 1.5, "verdict": {"status": "pass"}}
    rounds = [rnd(1, [sample(10, seed=1)] * 10, duration_s=2.0, evidence=ev1),
              rnd(2, [sample(10, seed=2)] * 10, duration_s=4.0, evidence=ev2)]
    c = bs.cell("pd", 1, 128, 32, rounds, n_boot=50)
    assert (c["output_tok_s_min"], c["output_tok_s_max"], c["output_tok_s_mean"]) == (80.0, 160.0, 120.0)
    assert c["output_tok_s_spread"] == pytest.approx(80.0 / 120.0)
    assert [e["seed"] for e in c["evidence"]] == [1, 2] and c["rounds"][0]["evidence"] == ev1
    es = c["evidence_summary"]
    assert (es["kv_bytes"], es["rdma_bytes"], es["tcp_bytes"]) == (4000, 4200, 0)
    assert es["rdma_to_kv"] == pytest.approx(1.05)
    assert es["kv_rate_bytes_s"] == pytest.approx(2000.0)
    assert es["verdicts"] == ["pass", "pass"]


def test_cell_rejects_bad_rounds_naming_the_field():
    with pytest.raises(ValueError, match=r"^rounds: expected a non-empty list"):
        bs.cell("t", 1, 128, 32, [])
    with pytest.raises(ValueError, match=r"rounds\[0\]\.samples\[0\]\.e2el_ms"):
        bs.cell("t", 1, 128, 32, [rnd(1, [dict(sample(1.0), e2el_ms=None)])])
    with pytest.raises(ValueError, match=r"rounds\[0\]\.seed"):
        bs.cell("t", 1, 128, 32, [dict(rnd(1, [sample(1.0)]), seed="one")])
    with pytest.raises(ValueError, match=r"^concurrency"):
        bs.cell("t", 0, 128, 32, [rnd(1, [sample(1.0)])])
    with pytest.raises(ValueError, match=r"^target"):
        bs.cell("", 1, 128, 32, [rnd(1, [sample(1.0)])])
    with pytest.raises(ValueError, match=r"^rounds\[0\]\.duration_s"):
        bs.cell("t", 1, 128, 32, [dict(rnd(1, [sample(1.0)]), duration_s=None)])


def test_compare_says_differs_on_different_populations_and_cannot_tell_on_one_population():
    a = bs.cell("tcp", 8, 4096, 256, [lognormal_round(s, 60, mu=3.0) for s in (1, 2)], n_boot=50)
    b = bs.cell("rdma", 8, 4096, 256, [lognormal_round(s + 10, 60, mu=3.6) for s in (1, 2)], n_boot=50)
    same = bs.cell("tcp2", 8, 4096, 256, [lognormal_round(s + 20, 60, mu=3.0) for s in (1, 2)], n_boot=50)
    d = bs.compare(a, b, "ttft", n_boot=400, rng_seed=3)
    assert d["verdict"] == "differs"
    assert d["delta_ms"] == pytest.approx(b["p95_ttft_ms_pooled"] - a["p95_ttft_ms_pooled"])
    assert d["ratio"] == pytest.approx(b["p95_ttft_ms_pooled"] / a["p95_ttft_ms_pooled"])
    assert d["delta_ci95"][0] > 0 and (d["target_a"], d["target_b"]) == ("tcp", "rdma")
    assert bs.compare(b, a, "p95_ttft_ms", n_boot=400, rng_seed=3)["delta_ci95"][1] < 0
    n = bs.compare(a, same, "ttft", n_boot=400, rng_seed=3)
    assert n["verdict"] == "cannot tell"
    assert n["delta_ci95"][0] < 0 < n["delta_ci95"][1]
    # a cell against itself: resampled independently, the interval straddles 0
    s = bs.compare(a, a, "e2el", n_boot=400, rng_seed=3)
    assert s["delta_ms"] == 0 and s["verdict"] == "cannot tell" and s["delta_ci95"][0] < 0 < s["delta_ci95"][1]
    assert bs.compare(a, b, "ttft", n_boot=400, rng_seed=3) == d  # deterministic
    with pytest.raises(ValueError, match="metric"):
        bs.compare(a, b, "throughput")


def test_compare_without_successful_requests_cannot_tell():
    a = bs.cell("a", 1, 128, 32, [lognormal_round(1, 20)], n_boot=50)
    dead = bs.cell("b", 1, 128, 32, [rnd(1, [sample(0, ok=False)] * 3)], n_boot=50)
    out = bs.compare(a, dead, "ttft", n_boot=50)
    assert out["verdict"] == "cannot tell" and out["b"] is None and "no successful request on B" in out["reason"]


def test_a_cell_whose_latency_grew_with_its_queue_is_saturated_against_the_idle_latency():
    # 5 rounds of 16 requests offered at 4/s: 0.67/s achieved while each request took 21 s on average. Against its
    # own mean the cell allows 80 / (5 x 15 / 4 + 5 x 21) = 0.65/s and passes; against one request on the idle
    # target (the probe, 9.7 s) it allows 1.19/s and is saturated.
    rounds = [(16, 16, 16 / 0.67)] * 5
    own = bs.saturation(4.0, rounds, 21000.0)
    assert own["saturated"] is False and own["expected_rate"] == pytest.approx(80 / (18.75 + 105.0), abs=1e-3)
    idle = bs.saturation(4.0, rounds, 21000.0, unloaded_e2el_ms=9700.0)
    assert idle["saturated"] is True and idle["expected_rate"] == pytest.approx(80 / (18.75 + 48.5), abs=1e-3)
    # a cell faster than the probe keeps its own latency (a slow probe does not make it look saturated)
    fast = bs.saturation(1.0, [(16, 16, 16 / 0.67)] * 5, 7800.0, unloaded_e2el_ms=10400.0)
    assert fast["saturated"] is False and fast["expected_rate"] == pytest.approx(80 / (75.0 + 39.0), abs=1e-3)
    # cell() passes the probe's latency on
    samples = [{"ok": True, "ttft_ms": 900.0, "tpot_ms": 600.0, "itl_ms": [600.0], "e2el_ms": 21000.0,
                "output_tokens": 32, "input_tokens": 128, "error": ""}] * 16
    rs = [{"seed": s, "rep": 0, "samples": samples, "failed": 0, "duration_s": 16 / 0.67} for s in range(1, 6)]
    c = bs.cell("pd", 256, 128, 32, rs, n_boot=20, request_rate=4.0, unloaded_e2el_ms=9700.0)
    assert c["saturated"] is True and c["expected_rate"] == pytest.approx(idle["expected_rate"])
