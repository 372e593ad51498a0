# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: which transport carried a P/D target's KV cache, round by round.

* :func:`evidence_snapshot` / :func:`evidence` - the decode engine's NIXL counters and the RDMA port counters
  before and after a round: KV bytes moved, RDMA bytes, bytes the RDMA ports did not carry (``tcp_bytes``) and the
  transport verdict; :func:`metrics_reader` reads each /metrics URL once per moment.
* :func:`probe_transport` / :func:`transport_warmup` - the NIXL transfers of the probe and of the single requests
  that open the transport before the first round; :func:`transport_warmup_problem` checks them as saved.
* :func:`transport_summary` - per P/D target, for the report: the first transfers, the warmed ones and the
  measured rounds'.
"""
from __future__ import annotations

import math
import time

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import shown
from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import figure_or_none
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom, _rdma


def metrics_reader(opener=None):
    """A ``fetch(url)`` that GETs each /metrics URL once (the evidence and the phases of one moment read the same
    text); a failed fetch raises the same ``_http.HttpError`` again."""
    cache = {}

    def fetch(url):
        if url not in cache:
            try:
                cache[url] = (_prom.fetch_text(url, opener=opener), None)
            except _http.HttpError as e:
                cache[url] = (None, e)
        text, err = cache[url]
        if err is not None:
            raise err
        return text
    return fetch


def evidence_snapshot(target, sysfs_root="/sys", proc_root="/proc", devices=None, ports=None, direction="both",
                      opener=None, fetch=None):
    """The decode engine's KV counters (and the prefill engine's, when given) with an RDMA port snapshot."""
    del direction
    fetch = fetch or metrics_reader(opener)
    snap = {"rdma": _rdma.snapshot(sysfs_root, devices=devices or [], ports=ports or [], proc_root=proc_root),
            "kv": None, "kv_prefill": None, "errors": []}
    for key, field in (("kv", "decode_metrics_url"), ("kv_prefill", "prefill_metrics_url")):
        url = target.get(field)
        if not url:
            continue
        try:
            snap[key] = _prom.kv_sample(fetch(url))
        except (_http.HttpError, _prom.PromParseError) as e:
            snap["errors"].append("%s: %s" % (field, e))
    return snap


def evidence(before, after, expect="any", direction="both", min_bytes=1048576, tolerance_bytes=1048576):
    """``{kv_bytes, rdma_bytes, tcp_bytes, verdict, ...}`` of one round.

    ``tcp_bytes``: the KV bytes the engine reports beyond what the RDMA ports moved (all of them on a host
    without RDMA ports), i.e. what another transport, in practice TCP, must have carried.
    """
    deltas = _rdma.compare(before["rdma"], after["rdma"])
    kv = _prom.kv_delta(before.get("kv"), after["kv"]) if after.get("kv") else None
    kv_p = _prom.kv_delta(before.get("kv_prefill"), after["kv_prefill"]) if after.get("kv_prefill") else None
    v = _rdma.verdict(deltas, after["rdma"], expect, direction=direction, min_bytes=min_bytes,
                      tolerance_bytes=tolerance_bytes, kv=kv, kv_prefill=kv_p)
    kv_bytes = kv.get("bytes") if kv else None
    rdma_bytes = v.get("rdma_bytes")
    tcp_bytes = None
    if kv_bytes is not None and rdma_bytes is not None:
        tcp_bytes = max(0.0, kv_bytes - rdma_bytes)
    ratio = figure_or_none(float(rdma_bytes) / kv_bytes) if kv_bytes and rdma_bytes is not None else None
    return {"kv_bytes": kv_bytes, "rdma_bytes": rdma_bytes, "tcp_bytes": tcp_bytes, "rdma_to_kv_ratio": ratio,
            "kv_rate_bytes_per_s": kv.get("rate_bytes_per_s") if kv else None,
            "kv_xfer_s": kv.get("xfer_time_s") if kv else None,
            "kv_transfers": kv.get("transfers") if kv else None,
            "kv_failures": v.get("kv_failures"), "prompt_tokens_by_source": kv.get("prompt_tokens_by_source") if kv
            else None, "rdma_present": bool(after["rdma"].get("present")), "link_layers": v.get("link_layers"),
            "elapsed_s": deltas.get("elapsed_s"), "verdict": {"expect": expect, "status": v["status"],
                                                              "passed": v["passed"], "summary": v["summary"],
                                                              "warnings": v.get("warnings") or []},
            "errors": list(before.get("errors") or []) + list(after.get("errors") or [])}


def _kv_now(target, opener):
    try:
        return _prom.kv_sample(_prom.fetch_text(target["decode_metrics_url"], opener=opener)), None
    except (_http.HttpError, _prom.PromParseError) as e:
        return None, "decode_metrics_url: %s" % e


def _kv_entry(before, after):
    """``{kv_bytes, kv_transfers, kv_xfer_s, per_transfer_ms, rate_bytes_per_s}`` between two NIXL samples."""
    d = _prom.kv_delta(before, after)
    per = (figure_or_none(round(d["xfer_time_s"] / d["xfer_count"] * 1000.0, 4)) if d["xfer_time_s"] and d["xfer_count"]
           else None)
    return {"kv_bytes": d["bytes"], "kv_transfers": d["transfers"], "kv_xfer_s": d["xfer_time_s"],
            "per_transfer_ms": per, "rate_bytes_per_s": d["rate_bytes_per_s"]}


def probe_transport(target, index, input_len, output_len, opener=None, timeout=600):
    """``_bench_inputs.probe``, and for a P/D target the NIXL transfers it caused (``None`` without
    decode_metrics_url or when the counters cannot be read): the plan's probes are the pair's first requests, so the
    connection set-up is in theirs."""
    before = _kv_now(target, opener)[0] if target.get("decode_metrics_url") else None
    seconds = _bench_inputs.probe(target, index, input_len, output_len, opener=opener, timeout=timeout)
    after = _kv_now(target, opener)[0] if before is not None else None
    return seconds, (_kv_entry(before, after) if after is not None else None)


def transport_warmup(target, rnd, opener=None, clock=time.monotonic, timeout=600):
    """``num_prompts`` single requests, one after the other, each between two reads of the decode engine's NIXL
    counters: ``[{i, ok, error, seconds, kv_bytes, kv_transfers, kv_xfer_s, per_transfer_ms, rate_bytes_per_s}]``.

    The first requests of a fresh pair open the NIXL/UCX connections (the handshake is in their transfer time);
    the later ones show the transport warmed. Each prompt starts with its own token, so no prefix cache serves
    it and every request moves its KV."""
    out = []
    before, err = _kv_now(target, opener)
    for i in range(rnd["num_prompts"]):
        prompt = [10 + ((i * 37 + j) % 90) for j in range(rnd["input_len"])]
        body = {"model": target["model"], "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
                "stream": False}
        entry = {"i": i + 1, "ok": True, "error": "", "seconds": None, "kv_bytes": None, "kv_transfers": None,
                 "kv_xfer_s": None, "per_transfer_ms": None, "rate_bytes_per_s": None}
        t0 = clock()
        try:
            _http.post_json(target["url"] + "/v1/completions", body, headers=target["headers"], timeout=timeout,
                            opener=opener)
        except _http.HttpError as e:
            entry.update(ok=False, error=str(e)[:300])
        entry["seconds"] = round(clock() - t0, 6)
        after, err2 = _kv_now(target, opener)
        if before is not None and after is not None:
            entry.update(_kv_entry(before, after))
        elif err or err2:
            entry["error"] = entry["error"] or (err or err2)
        before, err = after, err2
        out.append(entry)
    return out


#: Numbers of a transport warm-up request (None or a finite number >= 0).
TRANSPORT_NUMBERS = ("seconds", "kv_bytes", "kv_transfers", "kv_xfer_s", "per_transfer_ms", "rate_bytes_per_s")


def transport_warmup_problem(reqs, where="round.transport_requests"):
    """Why a saved round's ``transport_requests`` cannot be used (naming the entry and field), or None."""
    if not isinstance(reqs, list):
        return "%s: expected a list of requests, got %s" % (where, shown(reqs))
    for i, r in enumerate(reqs):
        if not isinstance(r, dict):
            return "%s[%d]: expected a mapping, got %s" % (where, i, shown(r))
        for k in TRANSPORT_NUMBERS:
            v = r.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                return "%s[%d].%s: expected a non-negative number or null, got %s" % (where, i, k, shown(v))
        if not isinstance(r.get("ok"), bool):
            return "%s[%d].ok: expected true or false, got %s" % (where, i, shown(r.get("ok")))
    return None


def median(xs):
    """The median of the values that are not None; None without any."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0


def transport_summary(plan_doc, done):
    """Per P/D target: ``first`` (the first request that moved KV: the plan's probe, else the transport warm-up's
    first), ``after_warmup`` (median per-transfer latency and rate of the warm-up's requests after that one) and
    ``measured`` (the measured rounds' NIXL transfer time per transfer and rate, from their evidence). Only
    targets with a transport warm-up or evidence."""
    out = {}
    for t in plan_doc["targets"]:
        name = t["name"]
        mine = [rec for rec in done.values() if rec["target"] == name]
        warm = [rec for rec in mine if isinstance(rec.get("transport_requests"), list)]
        measured = [rec["evidence"] for rec in mine if rec["kind"] == "measure" and isinstance(rec.get("evidence"), dict)]
        if not warm and not measured:
            continue
        entry = {"first": None, "after_warmup": None, "measured": None}
        probes = []
        for p in plan_doc.get("probes") or []:
            kv = p.get("kv_transfer") if isinstance(p, dict) and p.get("target") == name else None
            if isinstance(kv, dict) and transport_warmup_problem([dict(kv, ok=True)]) is None:
                probes.append(dict(kv, i="probe %s/%s" % (p.get("input_len"), p.get("output_len"))))
        reqs = [r for r in (warm[0]["transport_requests"] if warm else []) if isinstance(r, dict)]
        moved = [r for r in probes + reqs if r.get("kv_transfers")]
        if moved:
            first = moved[0]
            entry["first"] = {"request": first.get("i"), "per_transfer_ms": first.get("per_transfer_ms"),
                              "rate_bytes_per_s": first.get("rate_bytes_per_s"), "kv_bytes": first.get("kv_bytes"),
                              "transfers": first.get("kv_transfers"), "seconds": first.get("seconds")}
        if len(moved) > 1:
            later = moved[1:]
            entry["after_warmup"] = {"requests": len(later),
                                     "per_transfer_ms_median": median([r.get("per_transfer_ms") for r in later]),
                                     "rate_bytes_per_s_median": median([r.get("rate_bytes_per_s") for r in later])}
        if reqs and not moved:
            entry["note"] = ("the warm-up's requests moved no KV the decode engine counted (check "
                             "decode_metrics_url and that the target is the P/D router)")
        xfer = sum(e.get("kv_xfer_s") or 0.0 for e in measured)
        n = sum(e.get("kv_transfers") or 0.0 for e in measured)
        kv = sum(e.get("kv_bytes") or 0.0 for e in measured)
        if xfer > 0 and n > 0:
            entry["measured"] = {"rounds": len(measured), "transfers": n, "per_transfer_ms": round(xfer / n * 1000.0, 4),
                                 "rate_bytes_per_s": kv / xfer}
        out[name] = entry
    return out
