# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the upgrade's SLO gate, judged: A's round and B's round on the same prompts.

* :func:`read_side` - the measured round of one side's run directory (``benchmark_plan`` + ``benchmark_round``:
  ``plan.json``, ``rounds/NNN.json``), or why there is none (the round stopped: ``stopped.json``).
* :func:`figures` - one side's figures from its samples (``_bench_stats.round_summary``): p50/p95 TTFT and TPOT
  over the requests that succeeded, the client's goodput, and the failed requests counted honestly: a sample with
  ``ok`` false, the round's own ``failed`` count, and a planned request the client left no sample of.
* :func:`judge` - pass, breach or refused, with each limit (its value, the measured ones, whether it held and a
  sentence), the one-line comparison and the message. Refused: the two rounds are not the same measurement (their
  prompts' token-ID digests differ or one is missing, their rate, lengths, seed or size differ), or A's round is no
  baseline (more failed requests than ``max_failed_requests``, or none succeeded).

Ratios are B over A. Where A's figure is 0, B's 0 is a ratio of 1 and any more is infinite (B is not "equal" to
nothing). A limit that cannot be measured on B (no successful request, so no p95) is breached, never skipped.
"""
from __future__ import annotations

import math

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_outdir, _bench_slo, _bench_stats
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import excerpt

VAR = _bench_slo.VAR
#: Fields of the two measured rounds that must be equal for the rounds to be one measurement.
SAME = ("num_prompts", "request_rate", "input_len", "output_len", "seed")


def read_side(out_dir, side):
    """``(record, problem)``: the measured round in ``out_dir`` (with its samples), or None and why not, naming
    ``side`` (``A`` or ``B``): the round stopped (``stopped.json``'s message), its file cannot be used, or the
    plan has no measured round. Raises :class:`BenchError` for a directory that holds no plan of this version."""
    plan = _bench_outdir.read_plan(out_dir)
    measured = [r["index"] for r in plan["rounds"] if r["kind"] == "measure"]
    if len(measured) != 1:
        raise BenchError("%s's round: %s plans %d measured rounds, not one; write it with benchmark_plan from the "
                         "upgrade_slo settings" % (side, out_dir, len(measured)), reason="bad_file", file=out_dir)
    rounds, problems = _bench_outdir.read_rounds(out_dir, plan)
    rec = rounds.get(measured[0])
    if rec is not None:
        return rec, None
    stopped = _bench_outdir.read_stopped(out_dir)
    if problems:
        return None, "%s's round cannot be used: %s" % (side, problems[0]["reason"])
    if stopped is not None:
        return None, "%s's round was not measured: %s" % (side, stopped["message"])
    return None, "%s's round was not measured: %s has no rounds/%03d.json" % (side, out_dir, measured[0])


def figures(rec):
    """One side's figures: ``requests`` (planned, or the samples when more), ``completed``, ``failed``,
    ``p50/p95_ttft_ms``, ``p50/p95_tpot_ms``, ``goodput`` (the client's request goodput, req/s, or None),
    ``duration_s``, ``digest`` and ``first_error``. Raises ValueError naming a sample that cannot be."""
    samples = rec.get("samples")
    s = _bench_stats.round_summary(samples, rec.get("duration_s"), where="samples", duration_where="duration_s")
    planned = rec.get("num_prompts") if isinstance(rec.get("num_prompts"), int) else 0
    recorded = rec.get("failed") if isinstance(rec.get("failed"), int) and not isinstance(rec.get("failed"), bool) else 0
    unsampled = max(0, planned - len(samples))
    failed = max(s["failed"], recorded) + unsampled
    goodput = (rec.get("client") or {}).get("request_goodput")
    errors = [x.get("error") for x in samples if not x["ok"] and x.get("error")]
    return {"requests": s["completed"] + failed, "completed": s["completed"], "failed": failed,
            "unsampled": unsampled,
            "p50_ttft_ms": s["p50_ttft_ms"], "p95_ttft_ms": s["p95_ttft_ms"],
            "p50_tpot_ms": s["p50_tpot_ms"], "p95_tpot_ms": s["p95_tpot_ms"],
            "goodput": float(goodput) if _number(goodput) else None, "duration_s": s["duration_s"],
            "digest": rec.get("prompt_digest"),
            "first_error": excerpt(errors[0], 160) if errors else
            ("%d request(s) left no result" % unsampled if unsampled else None)}


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def ratio(b, a):
    """B over A; where A is 0, 1.0 for B 0 and infinity for more. None when either is unknown."""
    if a is None or b is None:
        return None
    if a == 0:
        return 1.0 if b == 0 else float("inf")
    return float(b) / float(a)


def _ms(v):
    if v is None:
        return "n/a"
    return "%.0f ms" % v if v >= 100 else "%.1f ms" % v if v >= 1 else "%.2f ms" % v


def _x(r):
    return "n/a" if r is None else "inf" if math.isinf(r) else "%.3gx" % r


def _rate(v):
    return "n/a" if v is None else "%.3g req/s" % v


def _refused(reason, msg, a=None, b=None):
    return {"verdict": "refused", "passed": False, "reason": reason, "msg": msg, "limits": [], "breached": [],
            "a": a, "b": b, "line": msg}


def _limit(key, limit, a, b, measured, passed, msg, unit):
    return {"name": "%s.%s" % (VAR, key), "key": key, "limit": limit, "a": a, "b": b, "measured": measured,
            "passed": passed, "unit": unit, "msg": msg}


def _latency_limits(fa, fb, settings):
    out = []
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        a, b = fa["p95_%s_ms" % metric], fb["p95_%s_ms" % metric]
        key = "%s_p95_ratio" % metric
        r = ratio(b, a)
        limit = settings[key]
        ok = r is not None and r <= limit
        if b is None:
            msg = "%s.%s: B has no p95 %s (no request of B succeeded), limit %s" % (VAR, key, label, _x(limit))
        else:
            msg = ("%s.%s: B's p95 %s %s is %s A's %s, limit %s"
                   % (VAR, key, label, _ms(b), _x(r), _ms(a), _x(limit)))
        out.append(_limit(key, limit, a, b, r, ok, msg, "ratio"))
        key = "%s_p95_ms" % metric
        limit = settings[key]
        if limit is not None:
            ok = b is not None and b <= limit
            msg = ("%s.%s: B's p95 %s %s is %s the limit %s"
                   % (VAR, key, label, _ms(b), "within" if ok else "above", _ms(limit)) if b is not None else
                   "%s.%s: B has no p95 %s (no request of B succeeded), limit %s" % (VAR, key, label, _ms(limit)))
            out.append(_limit(key, limit, a, b, b, ok, msg, "ms"))
    return out


def _goodput_limit(fa, fb, settings):
    key = "goodput_min_ratio"
    limit = settings[key]
    slo = ", ".join(settings["goodput"])
    a, b = fa["goodput"], fb["goodput"]
    r = ratio(b, a)
    ok = r is not None and r >= limit
    if r is None:
        msg = ("%s.%s: the client reported no goodput for %s (SLO %s), limit %s"
               % (VAR, key, "A" if a is None else "B", slo, _x(limit)))
    else:
        msg = ("%s.%s: B's goodput %s is %s A's %s (SLO %s), limit %s"
               % (VAR, key, _rate(b), _x(r), _rate(a), slo, _x(limit)))
    return _limit(key, limit, a, b, r, ok, msg, "ratio")


def _failed_limit(fb, settings):
    key = "max_failed_requests"
    limit = settings[key]
    ok = fb["failed"] <= limit
    msg = "%s.%s: B failed %d of %d requests%s, limit %d" % (
        VAR, key, fb["failed"], fb["requests"],
        " (first error: %s)" % fb["first_error"] if fb["failed"] and fb["first_error"] else "", limit)
    return _limit(key, limit, 0, fb["failed"], fb["failed"], ok, msg, "requests")


def _same_round(a_rec, b_rec):
    """Why the two rounds are not one measurement (a sentence), or None."""
    for k in SAME:
        if a_rec.get(k) != b_rec.get(k):
            return "their %s differs (A %r, B %r)" % (k, a_rec.get(k), b_rec.get(k))
    return None


def judge(a_rec, b_rec, settings):
    """A's and B's measured rounds (records as ``_bench_round`` saves them, with samples) against ``settings``
    (``_bench_slo.check_settings``): ``{verdict, passed, reason, msg, line, limits, breached, a, b}``.

    ``verdict``: ``pass`` (every limit held), ``breach`` (``breached`` names the limits; ``msg`` says each, B's
    and A's figures and the limit), or ``refused`` (``reason``: ``rounds_differ``, ``no_prompt_digest``,
    ``prompts_differ``, ``baseline_failed``): the rounds cannot be compared, so B is not proven either.
    Raises ValueError for a round whose samples cannot be (``_bench_stats``)."""
    if not settings:
        raise ValueError("%s: the gate is off ({}); there is nothing to judge" % VAR)
    fa, fb = figures(a_rec), figures(b_rec)
    differs = _same_round(a_rec, b_rec)
    if differs:
        return _refused("rounds_differ", "%s: A's and B's rounds are not the same measurement: %s; run both from "
                        "the same upgrade_slo settings" % (VAR, differs), fa, fb)
    da, db = fa["digest"], fb["digest"]
    if not da or not db:
        return _refused("no_prompt_digest", "%s: %s's round has no prompt digest, so the two rounds cannot be shown "
                        "to have sent the same prompts; run the round with this collection's client (benchmark_round)"
                        % (VAR, "A" if not da else "B"), fa, fb)
    if (da.get("sha256"), da.get("prompts")) != (db.get("sha256"), db.get("prompts")):
        return _refused("prompts_differ", "%s: A and B got different prompts (token-ID digest %s..., %s prompts, "
                        "vs %s..., %s prompts): the comparison would not be of the same requests; %s"
                        % (VAR, str(da.get("sha256"))[:12], da.get("prompts"), str(db.get("sha256"))[:12],
                           db.get("prompts"), _bench_stats.PROMPTS_DIFFER_FIX), fa, fb)
    if fa["failed"] > settings["max_failed_requests"] or not fa["completed"]:
        return _refused("baseline_failed", "%s: A failed %d of %d requests of its round%s (max_failed_requests %d), "
                        "so it is no baseline for B; find why A fails (its engine log), or lower upgrade_slo.rate"
                        % (VAR, fa["failed"], fa["requests"],
                           " (first error: %s)" % fa["first_error"] if fa["first_error"] else "",
                           settings["max_failed_requests"]), fa, fb)
    limits = [_failed_limit(fb, settings)] + _latency_limits(fa, fb, settings)
    if settings["goodput"]:
        limits.append(_goodput_limit(fa, fb, settings))
    breached = [x["key"] for x in limits if not x["passed"]]
    line = _line(fa, fb, limits, settings, breached)
    if breached:
        msg = "; ".join(x["msg"] for x in limits if not x["passed"])
        return {"verdict": "breach", "passed": False, "reason": "slo_breach", "msg": msg, "line": line,
                "limits": limits, "breached": breached, "a": fa, "b": fb}
    return {"verdict": "pass", "passed": True, "reason": None, "msg": "%s: B met every limit: %s" % (VAR, line),
            "line": line, "limits": limits, "breached": [], "a": fa, "b": fb}


def _line(fa, fb, limits, settings, breached):
    """The comparison in one line."""
    by = dict((x["key"], x) for x in limits)
    parts = []
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        x = by["%s_p95_ratio" % metric]
        part = "p95 %s A %s, B %s = %s (limit %s" % (
            label, _ms(x["a"]), _ms(x["b"]), _x(x["measured"]), _x(x["limit"]))
        absolute = by.get("%s_p95_ms" % metric)
        parts.append(part + (", at most %s)" % _ms(absolute["limit"]) if absolute else ")"))
    if "goodput_min_ratio" in by:
        x = by["goodput_min_ratio"]
        parts.append("goodput A %s, B %s = %s (at least %s)" % (_rate(x["a"]), _rate(x["b"]), _x(x["measured"]),
                                                                _x(x["limit"])))
    else:
        parts.append("goodput not judged (no %s.goodput)" % VAR)
    parts.append("failed A %d, B %d of %d (at most %d)" % (
        fa["failed"], fb["failed"], fb["requests"], settings["max_failed_requests"]))
    return "SLO round, %s, same prompts (%s...): %s: %s" % (
        _bench_slo.round_line(settings), str((fa["digest"] or {}).get("sha256"))[:12], "; ".join(parts),
        "breach of %s" % ", ".join(breached) if breached else "pass")
