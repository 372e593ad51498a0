# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: statistics of serving benchmark rounds, from per-request samples.

Pure Python (standard library only): the controller and the execution environment need nothing new.

* :func:`percentile` - the ``q``-th percentile with linear interpolation between closest ranks, the
  default of ``numpy.percentile``, which ``vllm bench serve`` uses for its p50/p95/p99
  (``vllm/benchmarks/serve.py``, ``calculate_metrics``: ``np.percentile(ttfts or 0, p) * 1000``).
  Unlike that code an empty list gives ``None``, not 0: a round where every request failed has no p95.
* :func:`round_summary` - one round (one seed, one repetition): p50/p95/p99 of TTFT, TPOT, ITL, E2EL over
  the requests that succeeded, output tok/s, requests sent and failed.
* :func:`cell` - every round of one target x concurrency x length pair: the samples kept, the per-round
  summaries, and for TTFT/TPOT/E2EL the pooled p95 (one p95 over all requests of all rounds), the mean of
  the per-round p95s (what the field report quoted), a 95 % bootstrap interval of the pooled p95 and an
  ``unstable`` flag when the rounds disagree.
* :func:`compare` - an A/B of two cells on one metric: the difference of pooled p95s with its bootstrap
  interval and a plain verdict, ``differs`` or ``cannot tell``.

The bootstrap is stratified: every resample draws, within each round, as many requests as that round has
(with replacement), so each seed keeps its weight and the interval reflects request-to-request variation
inside the measured rounds. It says nothing about another hour, another deployment or another client
host. The resampling uses its own ``random.Random(rng_seed)``: one input and one seed give one answer.

Per-request semantics follow ``vllm bench serve``: TPOT is ``(e2el - ttft) / (output_tokens - 1)`` and is
absent (``None``) for a request with at most one output token; ITL is pooled over every token gap of every
successful request; output tok/s is the successful requests' output tokens over the round's duration.
"""
from __future__ import annotations

import math
import random
import statistics

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_phases

#: Latency metrics a cell reports p95s, intervals and the unstable check for.
METRICS = ("ttft", "tpot", "e2el")
#: Percentiles per round, as ``--metric-percentiles 50,95,99``.
ROUND_PERCENTILES = (50, 95, 99)
#: Per-request fields read from a sample.
SAMPLE_NUMBERS = ("ttft_ms", "tpot_ms", "e2el_ms", "output_tokens", "input_tokens")


def _lerp(a, b, t):
    # numpy's _lerp: the form that is exact at both ends
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


def percentile(values, q):
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation like ``numpy.percentile``.

    ``None`` entries are skipped; ``None`` when nothing is left. Raises ValueError for q outside 0..100.
    """
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 100:
        raise ValueError("q: %r is not a percentile; give a number from 0 to 100" % (q,))
    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    if not n:
        return None
    pos = (n - 1) * (q / 100.0)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return float(_lerp(xs[lo], xs[hi], pos - lo))


def _sorted_percentile(xs, q):
    """:func:`percentile` of an already sorted, non-empty list of numbers (the bootstrap's inner loop)."""
    pos = (len(xs) - 1) * (q / 100.0)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return _lerp(xs[lo], xs[hi], pos - lo)


def _mean(values):
    values = [v for v in values if v is not None]
    return float(statistics.fmean(values)) if values else None


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: Slack when comparing TTFT with E2EL: both are rounded to 0.1 us when samples are written.
TIMING_SLACK_MS = 0.001


def sample_problem(ttft_ms, e2el_ms, itl_ms=(), tpot_ms=None):
    """Why these timings of one request cannot be (a sentence), or None: a latency that is negative or not
    finite, a TTFT above the end-to-end latency, an inter-token gap that is negative or not finite."""
    for name, v in (("TTFT", ttft_ms), ("end-to-end latency", e2el_ms), ("TPOT", tpot_ms)):
        if v is None:
            continue
        if not _is_number(v):
            return "its %s is %r, not a finite number" % (name, v)
        if v < 0:
            return "its %s is negative (%r ms)" % (name, v)
        if name == "end-to-end latency" and ttft_ms is not None and ttft_ms > e2el_ms + TIMING_SLACK_MS:
            return "its TTFT (%r ms) is above its end-to-end latency (%r ms)" % (ttft_ms, e2el_ms)
    for i, v in enumerate(itl_ms or ()):
        if not _is_number(v) or v < 0:
            return "its inter-token gap %d is %r, not a non-negative finite number" % (i, v)
    return None


def _check_sample(s, where):
    if not isinstance(s, dict):
        raise ValueError("%s: expected a dict of per-request fields, got %s" % (where, type(s).__name__))
    if not isinstance(s.get("ok"), bool):
        raise ValueError("%s.ok: expected true or false, got %r" % (where, s.get("ok")))
    for k in SAMPLE_NUMBERS:
        v = s.get(k)
        if v is not None and (not _is_number(v) or v < 0):
            raise ValueError("%s.%s: expected a non-negative number or null, got %r" % (where, k, v))
    if s["ok"] and s.get("e2el_ms") is None:
        raise ValueError("%s.e2el_ms: a successful request needs its end-to-end latency" % where)
    itl = s.get("itl_ms")
    if itl is not None:
        if not isinstance(itl, (list, tuple)):
            raise ValueError("%s.itl_ms: expected a list of numbers, got %s" % (where, type(itl).__name__))
        for i, v in enumerate(itl):
            if not _is_number(v) or v < 0:
                raise ValueError("%s.itl_ms[%d]: expected a non-negative number, got %r" % (where, i, v))
    if s["ok"] and s.get("ttft_ms") is not None and s["ttft_ms"] > s["e2el_ms"] + TIMING_SLACK_MS:
        raise ValueError("%s.ttft_ms: %r ms is above the request's end-to-end latency e2el_ms %r ms; a first token "
                         "cannot come after the last" % (where, s["ttft_ms"], s["e2el_ms"]))
    err = s.get("error")
    if err is not None and not isinstance(err, str):
        raise ValueError("%s.error: expected a string or null, got %s" % (where, type(err).__name__))


def round_summary(samples, duration_s, where="samples", duration_where="duration_s"):
    """One round's figures from its per-request ``samples`` and its wall time ``duration_s``.

    Returns ``p50/p95/p99_<m>_ms`` for ttft, tpot, itl and e2el (successful requests only; ``None`` when
    there are none), ``mean_<m>_ms``, ``output_tok_s``, ``requests`` (all samples), ``completed`` and
    ``failed`` (samples with ``ok`` false). Raises ValueError naming the sample and field that is wrong.
    """
    if not isinstance(samples, (list, tuple)):
        raise ValueError("%s: expected a list of per-request samples, got %s" % (where, type(samples).__name__))
    if not _is_number(duration_s) or duration_s < 0:
        raise ValueError("%s: expected the round's wall time, a non-negative number of seconds, got %r"
                         % (duration_where, duration_s))
    for i, s in enumerate(samples):
        _check_sample(s, "%s[%d]" % (where, i))
    ok = [s for s in samples if s["ok"]]
    series = {
        "ttft": [s.get("ttft_ms") for s in ok],
        "tpot": [s.get("tpot_ms") for s in ok],
        "e2el": [s.get("e2el_ms") for s in ok],
        "itl": [v for s in ok for v in (s.get("itl_ms") or ())],
    }
    out = {}
    for m in ("ttft", "tpot", "itl", "e2el"):
        for q in ROUND_PERCENTILES:
            out["p%d_%s_ms" % (q, m)] = percentile(series[m], q)
        out["mean_%s_ms" % m] = _mean(series[m])
    tokens = sum(int(s.get("output_tokens") or 0) for s in ok)
    out["output_tokens"] = tokens
    out["output_tok_s"] = (tokens / float(duration_s)) if duration_s > 0 else None
    out["requests"] = len(samples)
    out["completed"] = len(ok)
    out["failed"] = len(samples) - len(ok)
    out["duration_s"] = float(duration_s)
    return out


def bootstrap_ci(strata, q=95, n_boot=2000, rng_seed=0, level=0.95):
    """Percentile-bootstrap interval ``[low, high]`` of the pooled ``q``-th percentile of ``strata``.

    ``strata`` is a list of lists of numbers (one per round; ``None`` skipped, empty strata ignored). Each
    of ``n_boot`` resamples draws ``len(stratum)`` values with replacement from every stratum, pools them
    and takes the percentile; the interval is the central ``level`` of those. ``None`` without data.
    """
    strata = [[v for v in s if v is not None] for s in strata]
    strata = [s for s in strata if s]
    if not strata:
        return None
    if not isinstance(n_boot, int) or isinstance(n_boot, bool) or n_boot < 10:
        raise ValueError("n_boot: %r resamples are too few for an interval; use at least 10 (2000 is usual)" % (n_boot,))
    rng = random.Random(rng_seed)
    choices = rng.choices
    stats = []
    for _i in range(n_boot):
        pooled = []
        for s in strata:
            pooled.extend(choices(s, k=len(s)))
        pooled.sort()
        stats.append(_sorted_percentile(pooled, q))
    return _interval(stats, level)


def _interval(stats, level):
    tail = (1.0 - level) / 2.0 * 100.0
    return [float(percentile(stats, tail)), float(percentile(stats, 100.0 - tail))]


def _check_rounds(rounds):
    if not isinstance(rounds, (list, tuple)) or not rounds:
        raise ValueError("rounds: expected a non-empty list of measured rounds (warm-up rounds excluded), got %r"
                         % (rounds,))
    for i, r in enumerate(rounds):
        where = "rounds[%d]" % i
        if not isinstance(r, dict):
            raise ValueError("%s: expected a dict with seed, rep, samples, failed, duration_s, evidence" % where)
        for k in ("seed", "rep"):
            if r.get(k) is not None and (not isinstance(r[k], int) or isinstance(r[k], bool)):
                raise ValueError("%s.%s: expected an integer, got %r" % (where, k, r[k]))
        if r.get("failed") is not None and (not isinstance(r["failed"], int) or isinstance(r["failed"], bool)
                                            or r["failed"] < 0):
            raise ValueError("%s.failed: expected a non-negative integer, got %r" % (where, r["failed"]))
        if r.get("evidence") is not None and not isinstance(r["evidence"], dict):
            raise ValueError("%s.evidence: expected a dict or null, got %s" % (where, type(r["evidence"]).__name__))


def _spread(values):
    """``(min, max, (max - min) / mean)`` of the numbers in ``values``; relative spread None below 2 values."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    lo, hi = min(values), max(values)
    mean = statistics.fmean(values)
    rel = ((hi - lo) / abs(mean)) if len(values) > 1 and mean else (0.0 if len(values) > 1 else None)
    return float(lo), float(hi), (float(rel) if rel is not None else None)


#: Standard deviations of the Poisson spread of a round's arrival span the saturation rule allows.
SATURATION_SIGMAS = 2.0


def saturation(offered, rounds, e2el_ms_mean, burstiness=1.0, tolerance=0.1, unloaded_e2el_ms=None):
    """``{achieved_rate, expected_rate, allowance, saturated}`` of a fixed-rate cell.

    ``rounds``: ``[(requests sent, requests completed, duration_s)]``. Unsaturated, a round of N requests offered
    at R per second takes about ``(N - 1) / R`` for the arrivals plus one request's latency, so the rate it can
    show is ``expected = sum N / sum((N - 1) / R + E2EL)``; ``achieved`` = completed requests / the rounds'
    duration. The cell is saturated when ``achieved < expected x (1 - allowance)``, ``allowance`` the larger of
    ``tolerance`` and :data:`SATURATION_SIGMAS` relative standard deviations of the arrival span (gamma arrivals:
    ``1 / sqrt(burstiness x (N - 1))``), so a short Poisson round is not called saturated by chance.

    ``unloaded_e2el_ms``: one request's latency on the idle target (the plan's probe). The E2EL used is the lesser
    of it and the cell's own mean: a saturated cell's mean grows with the queueing it should reveal, and would
    lower its own bar."""
    sent = sum(n for n, _c, _d in rounds)
    done = sum(c for _n, c, _d in rounds)
    duration = sum(d for _n, _c, d in rounds)
    gaps = sum(max(0, n - 1) for n, _c, _d in rounds)
    e2el_s = (e2el_ms_mean or 0.0) / 1000.0
    if _is_number(unloaded_e2el_ms) and unloaded_e2el_ms > 0:
        e2el_s = min(e2el_s, unloaded_e2el_ms / 1000.0) if e2el_s > 0 else unloaded_e2el_ms / 1000.0
    span = gaps / float(offered) + e2el_s * len(rounds)
    out = {"achieved_rate": round(done / duration, 4) if duration > 0 else None,
           "expected_rate": round(sent / span, 4) if span > 0 else None, "allowance": None, "saturated": None}
    if out["achieved_rate"] is None or out["expected_rate"] is None:
        return out
    spread = SATURATION_SIGMAS / math.sqrt(burstiness * gaps) if gaps > 0 else 1.0
    out["allowance"] = round(max(tolerance, spread), 4)
    out["saturated"] = out["achieved_rate"] < out["expected_rate"] * (1.0 - out["allowance"])
    return out


def cell(target, concurrency, input_len, output_len, rounds, unstable_threshold=0.2, n_boot=2000, rng_seed=0,
         request_rate=None, burstiness=1.0, saturation_tolerance=0.1, ready_checks_per_round=0,
         unloaded_e2el_ms=None):
    """The report's cell for one target x concurrency x length pair from its measured ``rounds``.

    ``rounds``: ``[{seed, rep, samples, failed, duration_s, evidence}]`` (warm-up rounds are not passed).
    A round's failures are the larger of its ``failed`` and its samples with ``ok`` false: requests the
    client reported as failed without a sample still count. ``ready_checks_per_round``: the requests the client
    sends per round outside its samples (its ready check), which the engines' phase figures count too.
    ``unloaded_e2el_ms``: one request's latency on the idle target (the probe), for :func:`saturation`.
    Raises ValueError naming the field.
    """
    if not isinstance(target, str) or not target:
        raise ValueError("target: expected the target's name, got %r" % (target,))
    for name, v in (("concurrency", concurrency), ("input_len", input_len), ("output_len", output_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError("%s: expected a positive integer, got %r" % (name, v))
    if not _is_number(unstable_threshold) or unstable_threshold <= 0:
        raise ValueError("unstable_threshold: expected a positive fraction of the mean (0.2 = 20 %%), got %r"
                         % (unstable_threshold,))
    _check_rounds(rounds)
    summaries, samples, evidence, strata = [], [], [], {m: [] for m in METRICS}
    for i, r in enumerate(rounds):
        where = "rounds[%d].samples" % i
        rs = round_summary(r.get("samples"), r.get("duration_s"), where=where, duration_where="rounds[%d].duration_s" % i)
        failed = max(rs["failed"], int(r.get("failed") or 0))
        unsampled = failed - rs["failed"]
        rs.update(seed=r.get("seed"), rep=r.get("rep"), failed=failed, requests=rs["completed"] + failed,
                  failed_without_sample=unsampled, errors=sorted({s.get("error") for s in r["samples"]
                                                                  if not s["ok"] and s.get("error")}))
        if r.get("evidence") is not None:
            rs["evidence"] = r["evidence"]
            evidence.append(dict(r["evidence"], seed=r.get("seed"), rep=r.get("rep")))
        summaries.append(rs)
        for s in r["samples"]:
            kept = dict(s)
            kept.setdefault("seed", r.get("seed"))
            kept.setdefault("rep", r.get("rep"))
            samples.append(kept)
        ok = [s for s in r["samples"] if s["ok"]]
        for m in METRICS:
            strata[m].append([s.get("%s_ms" % m) for s in ok])

    out = {
        "target": target,
        "concurrency": concurrency,
        "input_len": input_len,
        "output_len": output_len,
        "requests": sum(rs["requests"] for rs in summaries),
        "completed": sum(rs["completed"] for rs in summaries),
        "failed": sum(rs["failed"] for rs in summaries),
        "seeds": sorted({rs["seed"] for rs in summaries if rs["seed"] is not None}),
        "n_rounds": len(summaries),
        "min_requests_per_round": min(rs["completed"] for rs in summaries),
        "rounds": summaries,
        "samples": samples,
        "evidence": evidence,
    }
    reasons = []
    for m in METRICS:
        pooled = [v for stratum in strata[m] for v in stratum]
        out["p50_%s_ms_pooled" % m] = percentile(pooled, 50)
        out["p95_%s_ms_pooled" % m] = percentile(pooled, 95)
        out["p99_%s_ms_pooled" % m] = percentile(pooled, 99)
        per_round = [rs["p95_%s_ms" % m] for rs in summaries]
        out["p95_%s_ms_mean_of_seeds" % m] = _mean(per_round)
        out["p95_%s_ms_ci95" % m] = bootstrap_ci(strata[m], 95, n_boot=n_boot, rng_seed=rng_seed)
        lo, hi, rel = _spread(per_round)
        out["p95_%s_ms_spread" % m] = rel
        if rel is not None and rel > unstable_threshold:
            reasons.append("p95 %s of the rounds ranges %.1f..%.1f ms, %.0f %% of their mean (threshold %.0f %%)"
                           % (m.upper(), lo, hi, rel * 100, unstable_threshold * 100))
    itl_pooled = [v for r in rounds for s in r["samples"] if s["ok"] for v in (s.get("itl_ms") or ())]
    out["p95_itl_ms_pooled"] = percentile(itl_pooled, 95)
    out["p95_itl_ms_mean_of_seeds"] = _mean([rs["p95_itl_ms"] for rs in summaries])
    lo, hi, rel = _spread([rs["output_tok_s"] for rs in summaries])
    out.update(output_tok_s_mean=_mean([rs["output_tok_s"] for rs in summaries]), output_tok_s_min=lo,
               output_tok_s_max=hi, output_tok_s_spread=rel)
    out["ci95_method"] = {"method": "percentile bootstrap of the pooled p95, requests resampled within each round",
                          "n_boot": n_boot, "rng_seed": rng_seed}
    out["unstable"] = bool(reasons)
    out["unstable_reasons"] = reasons
    out["unstable_threshold"] = float(unstable_threshold)
    out["evidence_summary"] = evidence_summary(evidence)
    e2el = [s.get("e2el_ms") for stratum in [[s for s in r["samples"] if s["ok"]] for r in rounds] for s in stratum]
    out["prompt_digests"] = prompt_digests(rounds)
    out["request_rate"] = request_rate
    sat = saturation(request_rate or 1.0, [(rs["requests"], rs["completed"], r.get("duration_s") or 0.0)
                                           for rs, r in zip(summaries, rounds)], _mean(e2el), burstiness,
                     saturation_tolerance, unloaded_e2el_ms=unloaded_e2el_ms)
    out["achieved_rate"] = sat["achieved_rate"]
    if request_rate:
        out.update(expected_rate=sat["expected_rate"], saturated=sat["saturated"],
                   saturation_allowance=sat["allowance"])
    else:
        out.update(expected_rate=None, saturated=None, saturation_allowance=None)
    goodputs = [(r.get("client") or {}).get("request_goodput") for r in rounds]
    goodputs = [g for g in goodputs if _is_number(g)]
    out["goodput_rate"] = _mean(goodputs) if goodputs else None
    out["phases"] = _bench_phases.cell_phases([r.get("phases") for r in rounds], client_e2el_ms_mean=_mean(e2el),
                                              client_requests=out["requests"],
                                              ready_checks_per_round=ready_checks_per_round)
    out["phases_ms"] = out["phases"]["phases_ms"] if out["phases"] else None
    return out


def evidence_summary(evidence):
    """Totals of the rounds' transport evidence: ``kv_bytes``, ``rdma_bytes``, ``tcp_bytes``,
    ``kv_xfer_s`` (sum of NIXL transfer time, when given), ``kv_rate_bytes_s``, ``rdma_to_kv`` (RDMA port
    bytes over NIXL KV bytes: about 1 or more when the KV went over RDMA, about 0 over TCP) and the
    rounds' verdicts. ``None`` without evidence."""
    if not evidence:
        return None
    out = {}
    for k in ("kv_bytes", "rdma_bytes", "tcp_bytes", "kv_xfer_s"):
        vals = [e.get(k) for e in evidence if _is_number(e.get(k))]
        out[k] = (sum(vals) if vals else None)
    out["kv_rate_bytes_s"] = (out["kv_bytes"] / out["kv_xfer_s"]) if out["kv_bytes"] is not None and out["kv_xfer_s"] else None
    out["rdma_to_kv"] = (out["rdma_bytes"] / float(out["kv_bytes"])) if out["rdma_bytes"] is not None and out["kv_bytes"] else None
    verdicts = [e.get("verdict") for e in evidence]
    out["verdicts"] = [v.get("status") if isinstance(v, dict) else v for v in verdicts]
    out["rounds"] = len(evidence)
    return out


def _metric_name(metric):
    m = metric
    if isinstance(m, str) and m.startswith("p95_") and m.endswith("_ms"):
        m = m[4:-3]
    if m not in METRICS:
        raise ValueError("metric: %r is not compared; use one of %s" % (metric, ", ".join(METRICS)))
    return m


def _strata(c, m, where):
    rounds = c.get("rounds") if isinstance(c, dict) else None
    samples = c.get("samples") if isinstance(c, dict) else None
    if not isinstance(samples, list) or not isinstance(rounds, list):
        raise ValueError("%s: expected a cell from cell() (with rounds and samples)" % where)
    keys = [(r.get("seed"), r.get("rep")) for r in rounds]
    by_round = dict((k, []) for k in keys)
    for s in samples:
        if s.get("ok", True) and s.get("%s_ms" % m) is not None:
            by_round.setdefault((s.get("seed"), s.get("rep")), []).append(s["%s_ms" % m])
    return [v for v in by_round.values() if v]


PROMPTS_DIFFER_FIX = ("give both targets the same tokenizer and client (the client aligns prompts to a server's "
                      "/tokenize when their token counts disagree, which a gateway may not serve)")


def prompt_digests(rounds):
    """``{seed: [sha256, ...]}`` of the rounds' prompt digests (rounds without one are left out)."""
    out = {}
    for r in rounds:
        d = r.get("prompt_digest")
        if isinstance(d, dict) and isinstance(d.get("sha256"), str):
            out.setdefault(str(r.get("seed")), [])
            if d["sha256"] not in out[str(r.get("seed"))]:
                out[str(r.get("seed"))].append(d["sha256"])
    return out


def prompts_differ(cell_a, cell_b):
    """Seeds whose prompt digests differ between the cells (sorted), ``[]`` when every seed both know agrees,
    None when no seed has a digest on both sides."""
    da, db = cell_a.get("prompt_digests") or {}, cell_b.get("prompt_digests") or {}
    common = sorted(set(da) & set(db))
    if not common:
        return None
    return [s for s in common if sorted(da[s]) != sorted(db[s])]


def compare(cell_a, cell_b, metric, n_boot=2000, rng_seed=0, q=95):
    """A/B of the pooled ``q``-th percentile of ``metric`` (ttft, tpot or e2el) between two cells.

    Returns ``{metric, q, target_a, target_b, concurrency, input_len, output_len, a, b, delta_ms (b - a),
    ratio (b / a), delta_ci95, verdict}``. The interval comes from resampling both cells (stratified by
    round, independently, one ``random.Random(rng_seed)``); ``verdict`` is ``differs`` when it excludes 0,
    else ``cannot tell`` (also when either side has no successful request), and ``not comparable`` (no
    figures) when the cells' prompt digests differ for a seed (:func:`prompts_differ`).
    """
    m = _metric_name(metric)
    sa, sb = _strata(cell_a, m, "cell_a"), _strata(cell_b, m, "cell_b")
    a = percentile([v for s in sa for v in s], q)
    b = percentile([v for s in sb for v in s], q)
    out = {"metric": m, "q": q, "target_a": cell_a.get("target"), "target_b": cell_b.get("target"),
           "concurrency": cell_a.get("concurrency"), "request_rate": cell_a.get("request_rate"),
           "input_len": cell_a.get("input_len"),
           "output_len": cell_a.get("output_len"), "a": a, "b": b, "delta_ms": None, "ratio": None,
           "delta_ci95": None, "verdict": "cannot tell"}
    for k in ("concurrency", "request_rate", "input_len", "output_len"):
        if cell_a.get(k) != cell_b.get(k):
            out[k + "_b"] = cell_b.get(k)
    differ = prompts_differ(cell_a, cell_b)
    out["same_prompts"] = None if differ is None else not differ
    if differ:
        out.update(verdict="not comparable", reason="the targets got different prompts (token-ID digests differ "
                   "for seed %s): %s" % (", ".join(str(s) for s in differ), PROMPTS_DIFFER_FIX))
        return out
    if a is None or b is None:
        out["reason"] = "no successful request on %s" % ("A" if a is None else "B")
        return out
    if not isinstance(n_boot, int) or isinstance(n_boot, bool) or n_boot < 10:
        raise ValueError("n_boot: %r resamples are too few for an interval; use at least 10 (2000 is usual)" % (n_boot,))
    rng = random.Random(rng_seed)
    choices = rng.choices
    deltas = []
    for _i in range(n_boot):
        pa, pb = [], []
        for s in sa:
            pa.extend(choices(s, k=len(s)))
        for s in sb:
            pb.extend(choices(s, k=len(s)))
        pa.sort()
        pb.sort()
        deltas.append(_sorted_percentile(pb, q) - _sorted_percentile(pa, q))
    ci = _interval(deltas, 0.95)
    out.update(delta_ms=b - a, ratio=(b / a) if a else None, delta_ci95=ci,
               verdict="differs" if ci[0] > 0 or ci[1] < 0 else "cannot tell")
    return out
