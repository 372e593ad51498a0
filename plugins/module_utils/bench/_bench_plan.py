# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark's plan and the time it needs.

* :func:`make_plan` - the ordered rounds: a P/D target's transport warm-up first, then per length pair and
  concurrency (or fixed request rate), the warm-up rounds of every target, then the measured rounds (repetitions x
  seeds), A and B interleaved (ABAB) so a noisy period hits both.
* :func:`estimate` / :func:`check_budget` - the plan's lower bound from the probes (:func:`round_lower_bound`),
  refused when it exceeds the time budget.
* :func:`elapsed` - the time since the plan was written, on this host's monotonic clock (the budget and the
  progress line), never a difference of wall-clock times.
* :func:`progress` - after a round: round k of n, the time elapsed and the ETA from the rounds done so far.
"""
from __future__ import annotations

import math
import time

from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError
from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _units

#: Warm-up rounds draw prompts from seeds no measured round uses (a prefix cache must not see them again).
WARMUP_SEED_BASE = 1000003
#: The seed a P/D target's transport warm-up is recorded under (its prompts are its own, see _bench_evidence.transport_warmup).
TRANSPORT_WARMUP_SEED = 1000002


def requests_for(concurrency, proto, rate=None):
    if rate:
        return proto["requests_per_round"]
    return max(proto["requests_per_round"], proto["requests_per_concurrency"] * concurrency)


def _ladder(proto):
    """``[(concurrency, request_rate or None)]``: the concurrency ladder (closed loop), then the fixed-rate ladder
    (open loop, at most ``rate_max_concurrency`` in flight)."""
    return ([(c, None) for c in proto["concurrency"]]
            + [(proto.get("rate_max_concurrency", 256), r) for r in proto.get("request_rates") or []])


def make_plan(proto):
    """The ordered rounds: ``[{index, kind, target, concurrency, request_rate, input_len, output_len, seed, rep,
    num_prompts}]``.

    Per length pair, per concurrency (as given), then per fixed request rate (as given; ``request_rate`` set,
    ``concurrency`` its in-flight cap): every target's warm-up rounds first (``kind: warmup``, ``C`` requests each,
    or two seconds of arrivals at a fixed rate, at most a measured round's; seeds no measured round uses), then the measured rounds, rep by rep
    and seed by seed; with two targets and ``interleave`` each (rep, seed) runs A then B (ABAB), else all of A then
    all of B.
    """
    rounds = []
    names = [t["name"] for t in proto["targets"]]
    n_warm = proto.get("transport_warmup_requests") or 0
    for t in proto["targets"]:
        if t.get("decode_metrics_url") and n_warm:
            # one request at a time, each with its own NIXL counters: the first transfers (connection set-up) and
            # those after, apart (``_bench_evidence.transport_warmup``)
            input_len, output_len = proto["lengths"][0]
            rounds.append({"kind": "warmup", "transport_warmup": True, "target": t["name"], "concurrency": 1,
                           "request_rate": None, "input_len": input_len, "output_len": output_len,
                           "seed": TRANSPORT_WARMUP_SEED, "rep": 0, "num_prompts": n_warm})
    for input_len, output_len in proto["lengths"]:
        for c, rate in _ladder(proto):
            warm_n = c if rate is None else min(max(2, int(math.ceil(2 * rate))), proto["requests_per_round"])
            for w in range(proto["warmup_rounds"]):
                for name in names:
                    rounds.append({"kind": "warmup", "target": name, "concurrency": c, "request_rate": rate,
                                   "input_len": input_len, "output_len": output_len, "seed": WARMUP_SEED_BASE + w,
                                   "rep": w, "num_prompts": warm_n})
            measured = [(rep, seed) for rep in range(proto["repetitions"]) for seed in proto["seeds"]]
            order = ([(rs, n) for rs in measured for n in names] if proto["interleave"]
                     else [(rs, n) for n in names for rs in measured])
            for (rep, seed), name in order:
                rounds.append({"kind": "measure", "target": name, "concurrency": c, "request_rate": rate,
                               "input_len": input_len, "output_len": output_len, "seed": seed, "rep": rep,
                               "num_prompts": requests_for(c, proto, rate)})
    for i, r in enumerate(rounds):
        r["index"] = i + 1
    return rounds


def round_lower_bound(rnd, probe_s):
    """Seconds a round takes at least: its requests in ``ceil(N / C)`` waves of one request's time alone; at a
    fixed rate at least the time the arrivals take (``(N - 1) / rate``) plus one request."""
    waves = math.ceil(rnd["num_prompts"] / float(rnd["concurrency"])) * probe_s
    if rnd.get("request_rate"):
        return max(waves, (rnd["num_prompts"] - 1) / float(rnd["request_rate"]) + probe_s)
    return waves


def estimate(plan, probes):
    """``probes``: ``{(target, input_len, output_len): seconds}``; the plan's lower-bound seconds."""
    return sum(round_lower_bound(r, probes[(r["target"], r["input_len"], r["output_len"])]) for r in plan)


def check_budget(plan, probes, budget_s):
    """Refuse a ladder whose lower bound exceeds ``budget_s`` (0 = no limit); returns the estimate."""
    need = estimate(plan, probes)
    if budget_s and need > budget_s:
        raise BenchError(
            "benchmark_time_budget: the ladder cannot finish in %s: %d rounds need at least %s (each round's "
            "requests in waves of C, at the time one request took alone in the probe). Raise "
            "benchmark_time_budget above %d, or shorten the ladder (fewer benchmark_concurrency steps, "
            "benchmark_seeds, benchmark_repetitions or benchmark_lengths pairs, or a smaller "
            "benchmark_requests_per_round)"
            % (_units.human_seconds(budget_s), len(plan), _units.human_seconds(need), int(math.ceil(need))),
            reason="over_budget", field="benchmark_time_budget")
    return need


def elapsed(plan_doc, done, proc_root="/proc", clock=time.monotonic):
    """``(seconds, exact)``: the time since the plan was written, for the time budget and the progress line.

    Exact: the plan's ``started_host`` (``_clock.host_instant`` when benchmark_plan wrote it) against now on this
    host's monotonic clock (``_clock.elapsed_since``); every round runs where the plan was written
    (benchmark_client_host). Where that is unknown (the host rebooted since, or an older version wrote the plan)
    the rounds ``done`` so far (``{index: record}``) added up, each its own ``wall_s`` measured on the monotonic
    clock: a lower bound, ``exact`` False. Never ``now - started_at``: ``started_at`` is a wall time for people,
    and a clock stepped a year ahead between plan and round read as a spent budget, one stepped back as no time
    passing at all.
    """
    seconds = _clock.elapsed_since(plan_doc.get("started_host"), proc_root, clock)
    if seconds is not None:
        return seconds, True
    spent = 0.0
    for rec in (done or {}).values():
        wall = rec.get("wall_s")
        if isinstance(wall, (int, float)) and not isinstance(wall, bool) and math.isfinite(wall) and wall > 0:
            spent += wall
    return spent, False


def describe_elapsed(seconds, exact):
    """``"5m elapsed"``, or what a lower bound is: the rounds' own time."""
    if exact:
        return "%s elapsed" % _units.human_seconds(seconds)
    return ("at least %s elapsed, the rounds' own time: the time since the plan is unknown, written in another "
            "boot of this host or by an older version" % _units.human_seconds(seconds))


def progress(plan_doc, done, index, proc_root="/proc", clock=time.monotonic):
    """``{k, n, elapsed_s, eta_s, line}`` after round ``index``: the time since the plan
    (:func:`elapsed`; the line says when it is only a lower bound), and the ETA, which scales the seconds per request of the rounds done at each (target, C,
    lengths) to what is left (the probe's bound where nothing was measured yet)."""
    rounds = plan_doc["rounds"]
    n = len(rounds)
    per_req, overhead = {}, []
    for rec in done.values():
        key = (rec["target"], rec["concurrency"], rec["input_len"], rec["output_len"], rec.get("request_rate"))
        per_req.setdefault(key, []).append(rec["duration_s"] / max(1, rec["num_prompts"]))
        overhead.append(max(0.0, rec["wall_s"] - rec["duration_s"]))
    start_s = sum(overhead) / len(overhead) if overhead else 0.0
    probes = dict(((p["target"], p["input_len"], p["output_len"]), p["seconds"]) for p in plan_doc.get("probes", []))
    eta = 0.0
    for r in rounds[index:]:
        key = (r["target"], r["concurrency"], r["input_len"], r["output_len"], r.get("request_rate"))
        if key in per_req:
            eta += start_s + sum(per_req[key]) / len(per_req[key]) * r["num_prompts"]
        else:
            eta += start_s + round_lower_bound(r, probes.get((r["target"], r["input_len"], r["output_len"]), 0.0))
    spent, exact = elapsed(plan_doc, done, proc_root, clock)
    line = "round %d of %d done, %s, ETA %s" % (index, n, describe_elapsed(spent, exact),
                                                _units.human_seconds(eta) if index < n else "0s")
    return {"k": index, "n": n, "elapsed_s": round(spent, 1), "eta_s": round(eta, 1), "line": line}
