# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark report document: its schema, checks and caveats.

* :func:`build` - the report document (``schema`` :data:`SCHEMA`) from the targets, the cells made by
  ``_bench_stats.cell``, the run's metadata, the A/B comparisons, the cold-start timelines and where a
  run stopped; it carries the caveats generated from that data and is validated before it is returned.
* :func:`validate` - raises ValueError naming the field path (``cells[2].p95_ttft_ms_ci95``) and the fix.
* :func:`caveats` - what the data does not prove, as ``{code, text}`` items, from the data itself.
* :func:`cell_name` / :func:`verdict_status` - a cell and a transport verdict as the caveats and the renderings
  (``_bench_render``) name them.

Document layout (``schema`` 1)::

    schema: 1
    targets: [{name, url, model, ...}]
    cells: [{target, concurrency, input_len, output_len, requests, failed, samples: [...], rounds: [...],
             p95_<m>_ms_pooled, p95_<m>_ms_mean_of_seeds, p95_<m>_ms_ci95: [low, high] | null,
             unstable, unstable_reasons, output_tok_s_mean, ..., evidence: [...], evidence_summary}]
    meta: {protocol: {...knobs}, client_host, client_same_host, started, ended, ...}
    comparisons: [{metric, target_a, target_b, concurrency, input_len, output_len, a, b, delta_ms,
                   ratio, delta_ci95, verdict}]
    coldstart: {states: [{state, reps: [{phases: {name: seconds}, total_s, marks}]}]} | null
    stopped: {reason, after_round, of_rounds} | null
    caveats: [{code, text}]
"""
from __future__ import annotations

import math

SCHEMA = 1
METRICS = ("ttft", "tpot", "e2el")
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL", "itl": "ITL"}
VERDICTS = ("differs", "cannot tell", "not comparable")
#: Measured rounds a fixed-rate or P/D cell needs at least (the field report: "at least five repetitions").
MIN_RAMP_ROUNDS = 5
#: Fewer successful requests than this in a round: its p95 is one of its two largest values.
FEW_REQUESTS = 30
#: Fewer successful requests than this in a cell: the percentile bootstrap of a p95 covers the truth less
#: often than 95 % (measured on lognormal latencies: about 78 % at 32 requests, 88 % at 80, 92 % at 200).
CI_MIN_REQUESTS = 100
#: Cold-start repetitions per state below this cannot show the spread of a start.
COLDSTART_MIN_REPS = 3


# --------------------------------------------------------------------------------------------------
# Validation


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _fail(path, msg):
    raise ValueError("%s: %s" % (path, msg))


def _need(doc, key, path):
    if not isinstance(doc, dict):
        _fail(path, "expected a mapping, got %s" % type(doc).__name__)
    if key not in doc:
        _fail("%s.%s" % (path, key) if path else key, "missing; the report needs it")
    return doc[key]


def _number_or_none(v, path):
    if v is not None and not _is_number(v):
        _fail(path, "expected a finite number or null, got %r" % (v,))


def _interval_or_none(v, path):
    if v is None:
        return
    if not isinstance(v, (list, tuple)) or len(v) != 2 or not all(_is_number(x) for x in v):
        _fail(path, "expected [low, high] (two finite numbers) or null, got %r" % (v,))
    if v[0] > v[1]:
        _fail(path, "low %r is above high %r" % (v[0], v[1]))


def _finite_everywhere(v, path):
    """JSON has no NaN or infinity: every float anywhere in the document must be finite."""
    if isinstance(v, float) and not math.isfinite(v):
        _fail(path, "%r cannot be written as JSON; a statistic without data is null" % v)
    elif isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                _fail(path, "key %r is not a string" % (k,))
            _finite_everywhere(x, "%s.%s" % (path, k) if path else k)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _finite_everywhere(x, "%s[%d]" % (path, i))


def _validate_cell(c, path, names):
    target = _need(c, "target", path)
    if target not in names:
        _fail(path + ".target", "%r is not one of the report's targets (%s)" % (target, ", ".join(sorted(names))))
    for k in ("concurrency", "input_len", "output_len"):
        v = _need(c, k, path)
        if not _is_int(v) or v < 1:
            _fail("%s.%s" % (path, k), "expected a positive integer, got %r" % (v,))
    for k in ("requests", "failed"):
        v = _need(c, k, path)
        if not _is_int(v) or v < 0:
            _fail("%s.%s" % (path, k), "expected a non-negative integer, got %r" % (v,))
    if c["failed"] > c["requests"]:
        _fail(path + ".failed", "%d failed requests out of %d sent" % (c["failed"], c["requests"]))
    samples = _need(c, "samples", path)
    if not isinstance(samples, list):
        _fail(path + ".samples", "expected the list of per-request samples, got %s" % type(samples).__name__)
    for i, s in enumerate(samples):
        sp = "%s.samples[%d]" % (path, i)
        for k in ("ttft_ms", "tpot_ms", "e2el_ms"):
            _number_or_none(_need(s, k, sp), "%s.%s" % (sp, k))
        seed = _need(s, "seed", sp)
        if seed is not None and not _is_int(seed):
            _fail(sp + ".seed", "expected an integer, got %r" % (seed,))
    for m in METRICS:
        _number_or_none(_need(c, "p95_%s_ms_pooled" % m, path), "%s.p95_%s_ms_pooled" % (path, m))
        _number_or_none(_need(c, "p95_%s_ms_mean_of_seeds" % m, path), "%s.p95_%s_ms_mean_of_seeds" % (path, m))
        _interval_or_none(_need(c, "p95_%s_ms_ci95" % m, path), "%s.p95_%s_ms_ci95" % (path, m))
    if not isinstance(_need(c, "unstable", path), bool):
        _fail(path + ".unstable", "expected true or false, got %r" % (c["unstable"],))
    rounds = c.get("rounds", [])
    if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
        _fail(path + ".rounds", "expected a list of round summaries")


def _validate_coldstart(cs, path):
    states = _need(cs, "states", path)
    if not isinstance(states, list):
        _fail(path + ".states", "expected a list of {state, reps}")
    for i, st in enumerate(states):
        sp = "%s.states[%d]" % (path, i)
        if not isinstance(_need(st, "state", sp), str) or not st["state"]:
            _fail(sp + ".state", "expected the state's name, got %r" % (st["state"],))
        reps = _need(st, "reps", sp)
        if not isinstance(reps, list):
            _fail(sp + ".reps", "expected a list of {phases, total_s, marks}")
        for j, rep in enumerate(reps):
            rp = "%s.reps[%d]" % (sp, j)
            phases = _need(rep, "phases", rp)
            if not isinstance(phases, dict):
                _fail(rp + ".phases", "expected a mapping of phase name to seconds")
            for name, v in phases.items():
                _number_or_none(v, "%s.phases.%s" % (rp, name))
                if v is not None and v < 0:
                    _fail("%s.phases.%s" % (rp, name), "a phase cannot last %r seconds" % v)
            _number_or_none(rep.get("total_s"), rp + ".total_s")


def validate(report):
    """Raise ValueError naming the first field path that does not follow schema :data:`SCHEMA`."""
    if not isinstance(report, dict):
        _fail("report", "expected a mapping, got %s" % type(report).__name__)
    schema = _need(report, "schema", "")
    if schema != SCHEMA or not _is_int(schema):
        _fail("schema", "%r is not schema %d; this code reads and writes schema %d only" % (schema, SCHEMA, SCHEMA))
    targets = _need(report, "targets", "")
    if not isinstance(targets, list) or not targets:
        _fail("targets", "expected a non-empty list of {name, url, model}")
    names = set()
    for i, t in enumerate(targets):
        name = _need(t, "name", "targets[%d]" % i)
        if not isinstance(name, str) or not name:
            _fail("targets[%d].name" % i, "expected a non-empty string, got %r" % (name,))
        if name in names:
            _fail("targets[%d].name" % i, "%r names two targets; give each target its own name" % name)
        names.add(name)
    cells = _need(report, "cells", "")
    if not isinstance(cells, list):
        _fail("cells", "expected a list of cells")
    seen = set()
    for i, c in enumerate(cells):
        _validate_cell(c, "cells[%d]" % i, names)
        rate = c.get("request_rate")
        if rate is not None and (not _is_number(rate) or rate <= 0):
            _fail("cells[%d].request_rate" % i, "expected requests per second above 0 or null, got %r" % (rate,))
        key = (c["target"], c["concurrency"], c["input_len"], c["output_len"], rate)
        if key in seen:
            _fail("cells[%d]" % i, "a second cell for target %r, C=%d, %d/%d%s" % (
                key[:4] + ((", R=%g/s" % rate) if rate else "",)))
        seen.add(key)
    if not isinstance(_need(report, "meta", ""), dict):
        _fail("meta", "expected a mapping of the run's protocol and host")
    comps = report.get("comparisons")
    if comps is not None:
        if not isinstance(comps, list):
            _fail("comparisons", "expected a list of A/B comparisons or null")
        for i, cp in enumerate(comps):
            p = "comparisons[%d]" % i
            if _need(cp, "metric", p) not in METRICS:
                _fail(p + ".metric", "%r is not one of %s" % (cp["metric"], ", ".join(METRICS)))
            for k in ("a", "b", "delta_ms"):
                _number_or_none(_need(cp, k, p), "%s.%s" % (p, k))
            _interval_or_none(_need(cp, "delta_ci95", p), p + ".delta_ci95")
            if _need(cp, "verdict", p) not in VERDICTS:
                _fail(p + ".verdict", "%r is not one of %s" % (cp["verdict"], ", ".join(VERDICTS)))
    if report.get("coldstart") is not None:
        _validate_coldstart(report["coldstart"], "coldstart")
    stopped = report.get("stopped")
    if stopped is not None:
        if not isinstance(_need(stopped, "reason", "stopped"), str):
            _fail("stopped.reason", "expected a sentence saying why the run stopped")
        for k in ("after_round", "of_rounds"):
            v = _need(stopped, k, "stopped")
            if not _is_int(v) or v < 0:
                _fail("stopped." + k, "expected a non-negative integer, got %r" % (v,))
        if stopped["after_round"] > stopped["of_rounds"]:
            _fail("stopped.after_round", "%d is past of_rounds %d" % (stopped["after_round"], stopped["of_rounds"]))
    cav = report.get("caveats")
    if cav is not None:
        if not isinstance(cav, list) or not all(isinstance(x, dict) and isinstance(x.get("text"), str) for x in cav):
            _fail("caveats", "expected a list of {code, text}")
    _finite_everywhere(report, "")
    return report


# --------------------------------------------------------------------------------------------------
# Caveats


def cell_name(c):
    """A cell as the caveats and the renderings name it: target, load (``C=8`` or ``R=2/s``) and lengths."""
    if c.get("request_rate"):
        return "%s R=%g/s %d/%d" % (c["target"], c["request_rate"], c["input_len"], c["output_len"])
    return "%s C=%d %d/%d" % (c["target"], c["concurrency"], c["input_len"], c["output_len"])


def _some(names, n=4):
    names = list(names)
    return ", ".join(names[:n]) + (" and %d more" % (len(names) - n) if len(names) > n else "")


def caveats(report):
    """What the report's data does not prove: ``[{code, text}]``, generated from the cells, the meta, the
    comparisons, the cold-start timelines and ``stopped``."""
    out = []

    def add(code, text):
        out.append({"code": code, "text": text})

    cells = report.get("cells") or []
    meta = report.get("meta") or {}
    protocol = meta.get("protocol") or {}
    stopped = report.get("stopped")
    unused = [u for u in meta.get("files_not_used") or [] if isinstance(u, dict)]
    if unused:
        add("files_not_used", "%d file(s) of the run could not be used and are left out of every figure: %s. "
            "Fix or remove them (a round is measured again by running playbooks/benchmark.yml from the start)."
            % (len(unused), "; ".join("%s: %s" % (u.get("file"), u.get("reason")) for u in unused[:8])
               + (" and %d more" % (len(unused) - 8) if len(unused) > 8 else "")))
    invalid = [(c, s) for c in cells for s in c.get("samples") or [] if isinstance(s, dict) and s.get("invalid")]
    if invalid:
        add("impossible_samples", "%d request(s) were recorded by the client with timings that cannot be (%s); "
            "they are kept as failed requests with the reason and left out of the latencies."
            % (len(invalid), _some("%s: %s" % (cell_name(c), s.get("error")) for c, s in invalid)))
    if stopped:
        add("stopped_early", "The run stopped after round %d of %d (%s): cells measured after that point are "
            "missing and the ladder is incomplete." % (stopped["after_round"], stopped["of_rounds"], stopped["reason"]))
    thin = [c for c in cells if (c.get("request_rate") or (c.get("phases") or {}).get("pd"))
            and len(c.get("rounds") or []) < MIN_RAMP_ROUNDS]
    if thin:
        add("few_rounds", "%d fixed-rate or P/D cell(s) have fewer than %d measured rounds (%s): one slow or "
            "lucky round moves their figures; the field report's protocol measures each cell at least %d times "
            "(more benchmark_seeds, or benchmark_repetitions; see the role's P/D ramp example)."
            % (len(thin), MIN_RAMP_ROUNDS, _some(cell_name(c) for c in thin), MIN_RAMP_ROUNDS))
    few = []
    for c in cells:
        per_round = [r.get("completed", r.get("requests", 0) - r.get("failed", 0)) for r in c.get("rounds") or []]
        if per_round and min(per_round) < FEW_REQUESTS:
            few.append((c, min(per_round)))
    if few:
        n = max(1, min(k for _c, k in few))
        add("few_requests", "%d cell(s) have rounds with fewer than %d successful requests (%s): the p95 of "
            "%d requests is read off its %d largest values, so it marks a trend, not a stable tail."
            % (len(few), FEW_REQUESTS, _some("%s: %d" % (cell_name(c), k) for c, k in few), n,
               n - int(math.floor((n - 1) * 0.95))))
    small = [c for c in cells if c.get("completed", c["requests"] - c["failed"]) < CI_MIN_REQUESTS]
    if small:
        add("narrow_interval", "%d cell(s) pool fewer than %d successful requests (%s): their bootstrap "
            "interval of the p95 is too narrow (it cannot reach past the largest request seen; on simulated "
            "latencies a 95 %% interval of 32 requests held the true p95 only about 78 %% of the time); read it "
            "as a lower bound on the uncertainty." % (len(small), CI_MIN_REQUESTS, _some(cell_name(c) for c in small)))
    unstable = [c for c in cells if c.get("unstable")]
    if unstable:
        add("unstable", "%d cell(s) are unstable, their rounds disagree by more than the threshold (%s): they "
            "support no claim of a gain or a regression." % (len(unstable), _some(cell_name(c) for c in unstable)))
    single = [c for c in cells if len(c.get("rounds") or []) < 2]
    if single:
        add("one_round", "%d cell(s) have a single measured round (%s): nothing shows whether another seed "
            "agrees, and the unstable check cannot run." % (len(single), _some(cell_name(c) for c in single)))
    failed = [c for c in cells if c.get("failed")]
    if failed:
        total = sum(c["failed"] for c in failed)
        add("failed_requests", "%d request(s) failed in %d cell(s) (%s); latencies are over the successful "
            "requests only, so a cell with failures looks better than what its users saw."
            % (total, len(failed), _some("%s: %d" % (cell_name(c), c["failed"]) for c in failed)))
    if meta.get("client_same_host"):
        add("client_same_host", "The load generator ran on the same host as the target (%s): it competed for CPU "
            "with the engine and skipped the network path users take." % (meta.get("client_host") or "this host"))
    if any(c.get("concurrency") for c in cells):
        add("concurrency_not_users", "C is the client's maximum number of requests in flight, not a number of "
            "users and not the server's batch size; real users arrive independently (a request-rate ladder "
            "shows that).")
    if cells:
        add("throughput_scope", "Output tok/s counts the round's generated tokens over its wall time, TTFT and "
            "round trips included; it is not the steady decode rate (1000 / TPOT).")
    pairs = sorted({(c["input_len"], c["output_len"]) for c in cells})
    if len(pairs) == 1:
        add("single_length", "Only one input/output length pair (%d/%d) was measured: long prompts, where "
            "prefill and KV transfer dominate, may behave differently." % pairs[0])
    if protocol.get("warmup_rounds_run", protocol.get("warmup_rounds")) == 0:
        add("no_warmup", "No warm-up round was run: the first round includes connection set-up, compile and "
            "cache warm-up.")
    comps = report.get("comparisons") or []
    cannot = [cp for cp in comps if cp.get("verdict") == "cannot tell"]
    if cannot:
        add("cannot_tell", "%d of %d A/B comparison(s) cannot tell the targets apart (the interval of the "
            "difference includes 0): %s. No gain or regression is shown there."
            % (len(cannot), len(comps), _some(_comparison_name(cp) for cp in cannot)))
    refused = [cp for cp in comps if cp.get("verdict") == "not comparable"]
    if refused:
        add("prompts_differ", "%d A/B comparison(s) were refused because the targets got different prompts: %s. %s"
            % (len(refused), _some(_comparison_name(cp) for cp in refused), refused[0].get("reason") or ""))
    if comps and protocol.get("interleave") is False:
        add("not_interleaved", "A and B rounds were not interleaved: a noisy period may have hit one target only.")
    if comps:
        add("interval_scope", "Intervals resample requests within the measured rounds; they do not cover another "
            "hour, another deployment or another client host.")
    ev_cells = [c for c in cells if c.get("evidence")]
    bad = [c for c in ev_cells if any(verdict_status(e.get("verdict")) in ("fail", "error") for e in c["evidence"])]
    if bad:
        add("transport_verdict", "The transport check failed or could not decide in %d cell(s) (%s): their "
            "latency is not evidence about the intended transport." % (len(bad), _some(cell_name(c) for c in bad)))
    holes = [c for c in ev_cells if any(e.get("kv_bytes") is None or e.get("rdma_bytes") is None or e.get("errors")
                                        for e in c["evidence"])]
    if holes:
        add("transport_incomplete", "Transport evidence is incomplete in %d cell(s) (%s): the engine's KV counters "
            "or the RDMA port counters could not be read for some rounds, so those rounds do not show which "
            "transport carried the KV." % (len(holes), _some(cell_name(c) for c in holes)))
    if ev_cells:
        add("kv_metric_scope", "KV bytes and NIXL rates are the engine's own counters summed over its ranks "
            "(bytes / sum of transfer time), a framework-level figure for an A/B on one topology, not a NIC's line "
            "rate.")
    cs = report.get("coldstart")
    if cs:
        fewreps = [st for st in cs.get("states") or [] if len(st.get("reps") or []) < COLDSTART_MIN_REPS]
        if fewreps:
            names = _some("%s (%d)" % (st["state"], len(st.get("reps") or [])) for st in fewreps)
            add("coldstart_reps", "Cold-start state(s) %s have fewer than %d repetitions: one slow or fast start "
                "decides the picture." % (names, COLDSTART_MIN_REPS))
    return out


def _comparison_name(cp):
    return "%s C=%s %s/%s" % (LABELS.get(cp["metric"], cp["metric"]), cp.get("concurrency"), cp.get("input_len"),
                              cp.get("output_len"))


def verdict_status(v):
    """The status of a round's transport verdict (``_bench_evidence.evidence``'s mapping, or the status itself)."""
    if isinstance(v, dict):
        return v.get("status")
    return v


# --------------------------------------------------------------------------------------------------
# Build


def build(targets, cells, meta, comparisons=None, coldstart=None, stopped=None):
    """The validated report document; raises ValueError naming the field path that is wrong."""
    report = {
        "schema": SCHEMA,
        "targets": [dict(t) if isinstance(t, dict) else t for t in (targets or [])],
        "cells": list(cells or []),
        "meta": dict(meta) if isinstance(meta, dict) else meta,
        "comparisons": list(comparisons) if comparisons is not None else [],
        "coldstart": coldstart,
        "stopped": stopped,
    }
    validate(report)
    report["caveats"] = caveats(report)
    return report
