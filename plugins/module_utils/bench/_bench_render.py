# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark report rendered: Markdown, PNG plots, the files written.

* :func:`markdown` - tables per target (concurrency x length pair), transport evidence, the A/B table,
  cold-start phases and the "What this does not prove" section.
* :func:`plots` - PNGs (matplotlib, Agg backend, imported only here, :func:`pyplot`): p95 latency vs concurrency
  with the 95 % intervals, output throughput vs concurrency, the A/B deltas with their intervals, cold-start phases.
* :func:`write` - ``report.json``, ``report.md`` and the PNGs into a directory, each written atomically
  (``_fsutil``); everything is rendered before the first file is written.
"""
from __future__ import annotations

import io
import json
import os

from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_report import (
    LABELS, METRICS, caveats, cell_name, validate, verdict_status,
)
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _units


# --------------------------------------------------------------------------------------------------
# Markdown


def _load(c):
    """What a cell's load column shows: its fixed rate (``R=2/s``) or its concurrency (the cap a fixed-rate round
    also passes to the client is not the load)."""
    return "R=%g/s" % c["request_rate"] if c.get("request_rate") else "%s" % c.get("concurrency")


def _md(v):
    """A value as Markdown table text: a ``|`` would end the cell, a line break the row."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def _f(v, fmt="%.1f"):
    return "n/a" if v is None else fmt % v


def _ci(v):
    return "n/a" if not v else "[%.1f, %.1f]" % (v[0], v[1])


def _latency(c, m):
    return "%s / %s (%s) %s" % (_f(c.get("p50_%s_ms_pooled" % m)), _f(c.get("p95_%s_ms_pooled" % m)),
                                _f(c.get("p95_%s_ms_mean_of_seeds" % m)), _ci(c.get("p95_%s_ms_ci95" % m)))


def _sorted_cells(cells, target=None, rates=None):
    """Cells of ``target`` (all when None) by lengths, concurrency and rate; ``rates`` True: only fixed-rate cells,
    False: only concurrency cells."""
    return sorted((c for c in cells if (target is None or c["target"] == target)
                   and (rates is None or bool(c.get("request_rate")) == rates)),
                  key=lambda c: (c["input_len"], c["output_len"], c["concurrency"], c.get("request_rate") or 0))


def _bytes(v):
    return "n/a" if v is None else _units.human_bytes(v)


def _rate(v):
    return "n/a" if v is None else "%s/s" % _units.human_bytes(v)


def _transport_pairs(report):
    """Cells of the first and second target at the same C and lengths, both with a NIXL rate."""
    names = [t["name"] for t in report["targets"]]
    if len(names) != 2:
        return []
    by = {}
    for c in report["cells"]:
        es = c.get("evidence_summary") or {}
        if es.get("kv_rate_bytes_s") and not c.get("request_rate"):
            by[(c["target"], c["concurrency"], c["input_len"], c["output_len"])] = es["kv_rate_bytes_s"]
    out = []
    for (t, conc, i, o), ra in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][1])):
        if t == names[0] and (names[1], conc, i, o) in by:
            rb = by[(names[1], conc, i, o)]
            out.append((conc, i, o, ra, rb, rb / ra))
    return out


def markdown(report):
    """The report as Markdown: protocol, per-target tables, transport evidence, A/B, cold start, caveats."""
    lines = ["# Serving benchmark", ""]
    meta = report.get("meta") or {}
    stopped = report.get("stopped")
    if stopped:
        lines += ["**The run stopped after round %d of %d: %s.** The tables hold the rounds measured until then."
                  % (stopped["after_round"], stopped["of_rounds"], stopped["reason"]), ""]
    lines += ["| | |", "|---|---|"]
    for k in ("started", "ended", "client", "client_host", "client_same_host", "load_generator", "tokenizer"):
        if meta.get(k) is not None:
            lines.append("| %s | %s |" % (k.replace("_", " "), _md(meta[k])))
    for k, v in sorted((meta.get("protocol") or {}).items()):
        lines.append("| %s | %s |" % (_md(k).replace("_", " "), _md(v)))
    notes = meta.get("notes") if isinstance(meta.get("notes"), list) else []
    if notes:
        lines += ["", "Notes:", ""] + ["- %s" % n for n in notes]
    lines += ["", "Targets:", ""]
    for t in report["targets"]:
        lines.append("- **%s**: %s%s" % (t["name"], t.get("url") or "", (" (model %s)" % t["model"]) if t.get("model") else ""))
    lines.append("")
    cells = report["cells"]
    if cells:
        lines += ["Latency columns, in ms: p50 / p95 of all requests pooled (mean of the per-round p95s) "
                  "[95 % bootstrap interval of the pooled p95].", ""]
    for t in report["targets"]:
        tc = _sorted_cells(cells, t["name"], rates=False)
        if not tc:
            continue
        lines += ["## %s" % t["name"], "",
                  "| C | in/out | rounds | requests | failed | TTFT | TPOT | E2EL | out tok/s (min..max) | unstable |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        notes = []
        for c in tc:
            lines.append("| %d | %d/%d | %d | %d | %d | %s | %s | %s | %s (%s..%s) | %s |" % (
                c["concurrency"], c["input_len"], c["output_len"], len(c.get("rounds") or []), c["requests"],
                c["failed"], _latency(c, "ttft"), _latency(c, "tpot"), _latency(c, "e2el"),
                _f(c.get("output_tok_s_mean")), _f(c.get("output_tok_s_min")), _f(c.get("output_tok_s_max")),
                "**yes**" if c["unstable"] else "no"))
            for r in c.get("unstable_reasons") or []:
                notes.append("- C=%d %d/%d unstable: %s" % (c["concurrency"], c["input_len"], c["output_len"], r))
        lines += [""] + notes + ([""] if notes else [])
    rows = [(c, r) for c in _sorted_cells(cells) for r in c.get("rounds") or []]
    if rows:
        lines += ["## Rounds", "", "Each measured round (warm-up rounds are not in the report); p95 in ms.", "",
                  "| target | C | in/out | seed | rep | requests | failed | p95 TTFT | p95 TPOT | p95 E2EL | out tok/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c, r in rows:
            lines.append("| %s | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                _md(c["target"]), _load(c), c["input_len"], c["output_len"], r.get("seed"), r.get("rep"),
                r.get("requests"), r.get("failed"), _f(r.get("p95_ttft_ms")), _f(r.get("p95_tpot_ms")),
                _f(r.get("p95_e2el_ms")), _f(r.get("output_tok_s"))))
        lines.append("")
    ev = [c for c in _sorted_cells(cells) if c.get("evidence_summary")]
    if ev:
        lines += ["## Transport evidence", "",
                  "KV bytes: the decode engine's NIXL counters; RDMA/TCP bytes: port counters over the same rounds; "
                  "RDMA / KV near 1 or more means the KV went over RDMA, near 0 that it did not.", "",
                  "| target | C | in/out | KV bytes moved | RDMA bytes | TCP bytes | RDMA / KV | NIXL rate | verdicts |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in ev:
            es = c["evidence_summary"]
            lines.append("| %s | %s | %d/%d | %s | %s | %s | %s | %s | %s |" % (
                _md(c["target"]), _load(c), c["input_len"], c["output_len"], _bytes(es.get("kv_bytes")),
                _bytes(es.get("rdma_bytes")), _bytes(es.get("tcp_bytes")), _f(es.get("rdma_to_kv"), "%.2f×"),
                _rate(es.get("kv_rate_bytes_s")), _md(", ".join(str(v) for v in es.get("verdicts") or []) or "n/a")))
        notes = []
        for c in ev:
            for e in c.get("evidence") or []:
                v = e.get("verdict")
                if verdict_status(v) in ("fail", "error"):
                    summary = v.get("summary") if isinstance(v, dict) else None
                    what = summary or verdict_status(v)
                    notes.append("- %s, seed %s rep %s: %s" % (cell_name(c), e.get("seed"), e.get("rep"), what))
        if notes:
            lines += [""] + notes
        pairs = _transport_pairs(report)
        if pairs:
            a, b = _md(report["targets"][0]["name"]), _md(report["targets"][1]["name"])
            lines += ["", "| C | in/out | NIXL rate %s | NIXL rate %s | %s / %s |" % (a, b, b, a), "|---|---|---|---|---|"]
            for conc, i, o, ra, rb, ratio in pairs:
                lines.append("| %d | %d/%d | %s | %s | %.1f× |" % (conc, i, o, _rate(ra), _rate(rb), ratio))
        lines.append("")
    lines += _transport_warmup_markdown(meta.get("transport_warmup"))
    lines += _ramp_markdown(cells)
    lines += _phases_markdown(cells)
    comps = report.get("comparisons") or []
    if comps:
        lines += ["## A/B", "", "Pooled p95, ms; B − A with its 95 % bootstrap interval; \"differs\" only when the "
                  "interval excludes 0.", "",
                  "| metric | C | in/out | A | p95 A | B | p95 B | B − A [95 %] | B / A | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for cp in sorted(comps, key=lambda x: (x.get("input_len") or 0, x.get("output_len") or 0,
                                               x.get("concurrency") or 0, METRICS.index(x["metric"]))):
            lines.append("| %s | %s | %s/%s | %s | %s | %s | %s | %s %s | %s | **%s** |" % (
                LABELS[cp["metric"]], "R=%g/s" % cp["request_rate"] if cp.get("request_rate") else cp.get("concurrency"),
                cp.get("input_len"), cp.get("output_len"),
                _md(cp.get("target_a")), _f(cp["a"]), _md(cp.get("target_b")), _f(cp["b"]), _f(cp["delta_ms"], "%+.1f"),
                _ci(cp["delta_ci95"]), _f(cp.get("ratio"), "%.2f"), cp["verdict"]))
        lines.append("")
    cs = report.get("coldstart")
    if cs and cs.get("states"):
        phases = _phase_names(cs)
        lines += ["## Cold start", "", "Seconds per phase of each start.", "",
                  "| state | rep | %s | total |" % " | ".join(_md(p) for p in phases), "|---|---|%s---|" % ("---|" * len(phases))]
        for st in cs["states"]:
            for j, rep in enumerate(st.get("reps") or []):
                lines.append("| %s | %d | %s | %s |" % (_md(st["state"]), j + 1, " | ".join(
                    _f(rep["phases"].get(p)) for p in phases), _f(rep.get("total_s"))))
        lines += ["", "| state | starts | total s, mean (min..max) |", "|---|---|---|"]
        for st in cs["states"]:
            totals = [rep["total_s"] for rep in st.get("reps") or [] if rep.get("total_s") is not None]
            lines.append("| %s | %d | %s |" % (_md(st["state"]), len(st.get("reps") or []), "%.1f (%.1f..%.1f)" % (
                sum(totals) / len(totals), min(totals), max(totals)) if totals else "n/a"))
        lines.append("")
    cav = report.get("caveats")
    if cav is None:
        cav = caveats(report)
    lines += ["## What this does not prove", ""] + ["- " + c["text"] for c in cav] + [""]
    return "\n".join(lines)


#: Phases of a request in the order it goes through them (``phases_ms`` of a cell).
REQUEST_PHASES = ("queue", "prefill", "kv_transfer", "decode")


def _transport_warmup_markdown(tw):
    """First KV transfers (connection set-up) against the warmed ones, per P/D target."""
    if not isinstance(tw, dict) or not tw:
        return []
    lines = ["## KV transfer: first transfers and warmed", "",
             "Before a P/D target's first round, single requests one after the other, each between two reads of the "
             "decode engine's NIXL counters: the first transfers carry the NIXL/UCX connection set-up, the later "
             "ones show the transport warmed. Measured: NIXL time per transfer over the measured rounds.", "",
             "| target | first: ms per transfer | first: rate | after warm-up: ms per transfer (median) | "
             "after warm-up: rate (median) | measured rounds: ms per transfer | measured rounds: rate |",
             "|---|---|---|---|---|---|---|"]
    notes = []
    for name in sorted(tw):
        e = tw[name] if isinstance(tw[name], dict) else {}
        first, later, meas = e.get("first") or {}, e.get("after_warmup") or {}, e.get("measured") or {}
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            _md(name), _f(first.get("per_transfer_ms"), "%.2f"), _rate(first.get("rate_bytes_per_s")),
            _f(later.get("per_transfer_ms_median"), "%.2f"), _rate(later.get("rate_bytes_per_s_median")),
            _f(meas.get("per_transfer_ms"), "%.2f"), _rate(meas.get("rate_bytes_per_s"))))
        if e.get("note"):
            notes.append("- %s: %s" % (_md(name), _md(e["note"])))
    return lines + [""] + notes + ([""] if notes else [])


def _ramp_markdown(cells):
    """The fixed-rate ladder: offered, achieved and expected rate, saturation, goodput and latency per cell."""
    rows = _sorted_cells(cells, rates=True)
    if not rows:
        return []
    lines = ["## Fixed-rate ramp", "",
             "Open loop (vllm bench serve --request-rate R). Achieved: completed requests / the rounds' duration; "
             "expected: what R allows when nothing queues (the arrivals' span plus one request's latency). "
             "**Saturated**: achieved below expected by more than the allowance (the larger of the tolerance and "
             "two standard deviations of the arrivals' spread). p95 latencies in ms, pooled.", "",
             "| target | in/out | offered req/s | achieved | expected | allowance | saturated | goodput req/s | "
             "p95 TTFT | p95 E2EL | failed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in rows:
        lines.append("| %s | %d/%d | %g | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            _md(c["target"]), c["input_len"], c["output_len"], c["request_rate"], _f(c.get("achieved_rate"), "%.2f"),
            _f(c.get("expected_rate"), "%.2f"), _f(c.get("saturation_allowance"), "%.2f"),
            "**yes**" if c.get("saturated") else "no" if c.get("saturated") is False else "n/a",
            _f(c.get("goodput_rate"), "%.2f"), _f(c.get("p95_ttft_ms_pooled")), _f(c.get("p95_e2el_ms_pooled")),
            c["failed"]))
    return lines + [""]


def _phase_mean(c, key):
    v = ((c.get("phases_ms") or {}).get(key) or {})
    return v.get("mean_ms") if isinstance(v, dict) else None


def _phases_markdown(cells):
    """"Where the time goes": per cell, the engines' phase means (p95 from the buckets) and the share of the
    client's mean end-to-end latency they explain."""
    rows = [c for c in _sorted_cells(cells) if c.get("phases")]
    if not rows:
        return []
    lines = ["## Where the time goes", "",
             "Means per request from the engines' histograms over the cell's rounds (sum / count; p95 interpolated in "
             "its bucket where the bucket is bounded). P/D: queue is the prefill engine's plus the decode engine's, "
             "KV transfer the decode engine's NIXL time per request. Explained: the phases' sum over the client's "
             "mean E2EL; the rest is HTTP, tokenization, a proxy or gateway, streaming.", "",
             "| target | C | in/out | queue | prefill | KV transfer | decode | phases sum | client E2EL mean | "
             "explained |", "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for c in rows:
        ph = c["phases"]
        cols = []
        for key in REQUEST_PHASES:
            v = (ph.get("phases_ms") or {}).get(key)
            if key == "kv_transfer" and not ph.get("pd"):
                cols.append("–")
            elif not isinstance(v, dict) or v.get("mean_ms") is None:
                cols.append("n/a")
            else:
                bucket = v.get("p95_bucket_ms")
                p95 = (" (p95 %s)" % _f(v["p95_ms"]) if v.get("p95_ms") is not None else
                       " (p95 ≤ %s)" % _f(bucket[1]) if isinstance(bucket, list) and len(bucket) == 2 else "")
                cols.append(_f(v["mean_ms"]) + p95)
        frac = ph.get("explained_fraction")
        lines.append("| %s | %s | %d/%d | %s | %s | %s | %s |" % (
            _md(c["target"]), _load(c), c["input_len"], c["output_len"], " | ".join(cols),
            _f(ph.get("phases_total_ms")), _f(ph.get("client_e2el_ms_mean")),
            "%.0f %%" % (frac * 100) if frac is not None else "n/a"))
        for w in list(ph.get("warnings") or []) + list(ph.get("errors") or []):
            notes.append("- %s: %s" % (cell_name(c), _md(w)))
    return lines + [""] + notes + ([""] if notes else [])


def _phase_names(cs):
    names = []
    for st in cs.get("states") or []:
        for rep in st.get("reps") or []:
            for p in rep.get("phases") or {}:
                if p not in names:
                    names.append(p)
    return names


# --------------------------------------------------------------------------------------------------
# Plots


def _series(cells):
    """``{(target, input_len, output_len): [cell, ...] sorted by concurrency}``."""
    out = {}
    for c in cells:
        out.setdefault((c["target"], c["input_len"], c["output_len"]), []).append(c)
    for v in out.values():
        v.sort(key=lambda c: c["concurrency"])
    return dict(sorted(out.items()))


def _dodge(xs, k, n):
    """Series ``k`` of ``n`` shifted a little sideways so that their error bars do not hide each other."""
    f = 2.0 ** (0.04 * (k - (n - 1) / 2.0))
    return [x * f for x in xs]


def _concurrency_axis(ax, cells):
    concs = sorted({c["concurrency"] for c in cells})
    if concs and concs[-1] >= 4 * concs[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(concs)
    ax.set_xticklabels([str(c) for c in concs])
    ax.minorticks_off()
    ax.set_xlabel("client concurrency C (max requests in flight)")


#: The caveat a report carries when matplotlib is not installed where it was built.
NO_PLOTS = ("no_plots", "The plots were not drawn: the Python library matplotlib is not installed where the report "
            "was built (pip install matplotlib there: the collection's meta/host-requirements.txt); "
            "the tables above hold every number the plots would show.")


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend, or None when matplotlib cannot be imported."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return plt


def _figures(report, plt):
    """``[(file name, matplotlib figure)]`` drawn with ``plt`` (:func:`pyplot`)."""
    figs = []
    series = _series([c for c in report["cells"] if not c.get("request_rate")])
    if series:
        fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4.2))
        for ax, m in zip(axes, METRICS):
            for k, ((t, i, o), cs) in enumerate(series.items()):
                xs, ys, lo, hi = [], [], [], []
                for c in cs:
                    y = c.get("p95_%s_ms_pooled" % m)
                    if y is None:
                        continue
                    ci = c.get("p95_%s_ms_ci95" % m) or [y, y]
                    xs.append(c["concurrency"])
                    ys.append(y)
                    lo.append(max(0.0, y - ci[0]))
                    hi.append(max(0.0, ci[1] - y))
                if not xs:
                    continue
                line = ax.errorbar(_dodge(xs, k, len(series)), ys, yerr=[lo, hi], marker="o", capsize=4,
                                   label="%s %d/%d" % (t, i, o))
                mos = [(c["concurrency"], c.get("p95_%s_ms_mean_of_seeds" % m)) for c in cs
                       if c.get("p95_%s_ms_mean_of_seeds" % m) is not None]
                if mos:
                    ax.plot(_dodge([x for x, _y in mos], k, len(series)), [y for _x, y in mos], linestyle="none", marker="x",
                            color=line[0].get_color())
            _concurrency_axis(ax, report["cells"])
            ax.set_ylabel("p95 %s (ms)" % LABELS[m])
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle("p95 latency, pooled requests (bars: 95 % bootstrap interval; x: mean of per-round p95)")
        fig.tight_layout()
        figs.append(("latency_p95.png", fig))

        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for k, ((t, i, o), cs) in enumerate(series.items()):
            pts = [c for c in cs if c.get("output_tok_s_mean") is not None]
            if not pts:
                continue
            ys = [c["output_tok_s_mean"] for c in pts]
            lo = [c["output_tok_s_mean"] - c["output_tok_s_min"] for c in pts]
            hi = [c["output_tok_s_max"] - c["output_tok_s_mean"] for c in pts]
            ax.errorbar(_dodge([c["concurrency"] for c in pts], k, len(series)), ys, yerr=[lo, hi], marker="o", capsize=4,
                        label="%s %d/%d" % (t, i, o))
        _concurrency_axis(ax, report["cells"])
        ax.set_ylabel("output tok/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("output throughput, mean of rounds (bars: min..max)")
        fig.tight_layout()
        figs.append(("throughput.png", fig))

    comps = [cp for cp in report.get("comparisons") or [] if cp.get("delta_ms") is not None]
    if comps:
        metrics = [m for m in METRICS if any(cp["metric"] == m for cp in comps)]
        rows = sorted({(cp.get("input_len") or 0, cp.get("output_len") or 0, cp.get("concurrency") or 0,
                        cp.get("request_rate") or 0, cp.get("target_a"), cp.get("target_b")) for cp in comps})
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics) + 1.5, 1.2 + 0.4 * len(rows)),
                                 sharey=True, squeeze=False)
        for ax, m in zip(axes[0], metrics):
            for cp in comps:
                if cp["metric"] != m:
                    continue
                y = rows.index((cp.get("input_len") or 0, cp.get("output_len") or 0, cp.get("concurrency") or 0,
                                cp.get("request_rate") or 0, cp.get("target_a"), cp.get("target_b")))
                ci = cp["delta_ci95"] or [cp["delta_ms"], cp["delta_ms"]]
                color = "tab:red" if cp["verdict"] == "differs" else "tab:gray"
                ax.errorbar([cp["delta_ms"]], [y], xerr=[[cp["delta_ms"] - ci[0]], [ci[1] - cp["delta_ms"]]],
                            marker="o", capsize=4, color=color)
            ax.axvline(0, color="black", linewidth=0.8)
            ax.set_xlabel("p95 %s, B − A (ms)" % LABELS[m])
            ax.grid(True, axis="x", alpha=0.3)
        axes[0][0].set_yticks(range(len(rows)))
        axes[0][0].set_yticklabels(["%s − %s %s %d/%d" % (b, a, ("R=%g/s" % r) if r else "C=%d" % conc, i, o)
                                    for i, o, conc, r, a, b in rows], fontsize=8)
        axes[0][0].invert_yaxis()
        fig.suptitle("A/B: difference of pooled p95 with 95 % interval (red: differs, gray: cannot tell)", fontsize=10)
        fig.tight_layout()
        figs.append(("ab_delta.png", fig))
    rcells = _sorted_cells(report["cells"], rates=True)
    if rcells:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        groups = {}
        for c in rcells:
            groups.setdefault((c["target"], c["input_len"], c["output_len"]), []).append(c)
        top = max(c["request_rate"] for c in rcells)
        axes[0].plot([0, top], [0, top], color="gray", linestyle=":", label="achieved = offered")
        for (t, i, o), cs in sorted(groups.items()):
            cs.sort(key=lambda c: c["request_rate"])
            xs = [c["request_rate"] for c in cs]
            line = axes[0].plot(xs, [c.get("achieved_rate") or 0.0 for c in cs], marker="o", label="%s %d/%d" % (t, i, o))
            sat = [c for c in cs if c.get("saturated")]
            if sat:
                axes[0].plot([c["request_rate"] for c in sat], [c.get("achieved_rate") or 0.0 for c in sat],
                             linestyle="none", marker="x", markersize=12, color="tab:red")
            ys = [c.get("p95_e2el_ms_pooled") for c in cs]
            axes[1].plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], marker="o",
                         color=line[0].get_color(), label="%s %d/%d" % (t, i, o))
        axes[0].set_xlabel("offered requests/s")
        axes[0].set_ylabel("achieved requests/s")
        axes[0].set_title("fixed-rate ramp (red x: saturated)")
        axes[1].set_xlabel("offered requests/s")
        axes[1].set_ylabel("p95 E2EL (ms)")
        for ax in axes:
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        figs.append(("rate_ramp.png", fig))
    pcells = [c for c in _sorted_cells(report["cells"]) if any(_phase_mean(c, k) is not None for k in REQUEST_PHASES)]
    if pcells:
        series = [(k, key.replace("_", " "), [_phase_mean(c, key) or 0.0 for c in pcells])
                  for k, key in enumerate(REQUEST_PHASES)]
        client = [(x, c["phases"].get("client_e2el_ms_mean")) for x, c in enumerate(pcells)
                  if c["phases"].get("client_e2el_ms_mean") is not None]
        figs.append(("phases.png", _stacked_bars(
            plt, [cell_name(c) for c in pcells], [s_ for s_ in series if any(s_[2])], client, "client E2EL mean",
            "ms per request (mean)", "where the time goes: engine phases per cell", width=(0.7, 2.5))))
    cs = report.get("coldstart")
    if cs and any(st.get("reps") for st in cs.get("states") or []):
        phases = _phase_names(cs)
        reps = [(st["state"], j, rep) for st in cs["states"] for j, rep in enumerate(st.get("reps") or [])]
        series = [(k, p, [rep["phases"].get(p) or 0.0 for _s, _j, rep in reps]) for k, p in enumerate(phases)]
        totals = [(x, rep.get("total_s")) for x, (_s, _j, rep) in enumerate(reps) if rep.get("total_s") is not None]
        figs.append(("coldstart.png", _stacked_bars(
            plt, ["%s #%d" % (st, j + 1) for st, j, _rep in reps], series, totals, "total (measured)", "seconds",
            "engine cold start, phases per state and repetition", width=(0.8, 2))))
    return figs


def _render_pngs(report):
    """``[(file name, PNG bytes)]``; None when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return None
    figs = _figures(report, plt)
    out = []
    try:
        for name, fig in figs:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=110)
            out.append((name, buf.getvalue()))
    finally:
        for _name, fig in figs:
            plt.close(fig)
    return out


def plots(report, out_dir):
    """Write the report's PNGs into ``out_dir`` (created if missing; atomically, one by one); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, data in _render_pngs(report) or []:
        paths.append(_fsutil.atomic_write_bytes(os.path.join(out_dir, name), data))
    return paths


def write(report, out_dir):
    """Validate, render everything, then write ``report.json``, ``report.md`` and the PNGs into ``out_dir``
    (created if missing), each atomically; returns the paths written, ``report.json`` first.

    Without matplotlib there are no PNGs: the report (JSON and Markdown) gets the ``no_plots`` caveat instead."""
    validate(report)
    pngs = _render_pngs(report)
    if pngs is None:
        pngs = []
        cav = report.setdefault("caveats", caveats(report))
        if not any(c.get("code") == NO_PLOTS[0] for c in cav):
            cav.append({"code": NO_PLOTS[0], "text": NO_PLOTS[1]})
    md = markdown(report)
    text = json.dumps(report, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, data in pngs:
        paths.append(_fsutil.atomic_write_bytes(os.path.join(out_dir, name), data))
    md_path = _fsutil.atomic_write_text(os.path.join(out_dir, "report.md"), md)
    json_path = _fsutil.atomic_write_text(os.path.join(out_dir, "report.json"), text)
    return [json_path, md_path] + paths


def _stacked_bars(plt, labels, series, totals, total_label, ylabel, title, width):
    """One stacked bar per label: ``series`` is ``[(color index, name, values)]`` bottom to top, ``totals``
    ``[(x, y)]`` a measured whole drawn as a black tick over its bar; ``width`` (per bar, margin) in inches."""
    fig, ax = plt.subplots(figsize=(max(6, width[0] * len(labels) + width[1]), 4.5))
    bottom = [0.0] * len(labels)
    cmap = plt.get_cmap("tab10")
    for k, name, vals in series:
        ax.bar(range(len(labels)), vals, bottom=bottom, label=name, color=cmap(k % 10))
        bottom = [b0 + v for b0, v in zip(bottom, vals)]
    if totals:
        ax.plot([x for x, _y in totals], [y for _x, y in totals], linestyle="none", marker="_", markersize=28,
                color="black", label=total_label)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
