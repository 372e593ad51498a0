# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark report assembled from a run directory.

* :func:`build_report` - the report document (``_bench_report.build``) from ``<out_dir>``'s plan, saved rounds
  and stopped marker: the measured rounds grouped into cells (:func:`group_cells`, ``_bench_stats.cell``), the A/B
  comparisons, the run's metadata (the client host, :func:`machine`, :func:`same_host`; the targets without
  header values, :func:`report_targets`), the transport summary and the cold starts.
"""
from __future__ import annotations

import os
import re
import time

from ansible_collections.llmops.serving.plugins.module_utils.bench import (
    _bench_client, _bench_evidence, _bench_outdir, _bench_report, _bench_stats,
)
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError
from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline


def machine():
    """The client host as the report names it: host name, CPUs, memory, kernel."""
    info = {"hostname": None, "cpus": os.cpu_count(), "mem_bytes": None, "kernel": None}
    try:
        u = os.uname()
        info["hostname"], info["kernel"] = u.nodename, u.release
    except AttributeError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_bytes"] = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return info


def report_targets(plan_doc):
    """The targets as the report shows them: header names only (a value may be a credential)."""
    return [{"name": t["name"], "url": t["url"], "model": t["model"], "headers": sorted(t.get("headers") or {}),
             "pd": bool(t.get("decode_metrics_url")), "transport": t.get("transport") or "any"}
            for t in plan_doc["targets"]]


def group_cells(plan_doc, done):
    """``[(target, concurrency, input_len, output_len, request_rate, [rounds])]`` of the measured rounds saved, in
    plan order (``request_rate`` None: a concurrency cell)."""
    order, groups = [], {}
    for r in plan_doc["rounds"]:
        if r["kind"] != "measure":
            continue
        key = (r["target"], r["concurrency"], r["input_len"], r["output_len"], r.get("request_rate"))
        if key not in groups:
            groups[key] = []
            order.append(key)
        rec = done.get(r["index"])
        if rec is not None:
            groups[key].append(rec)
    return [key + (groups[key],) for key in order if groups[key]]


def _probe_ms(plan_doc, target, input_len, output_len):
    """The plan's probe of ``target`` at these lengths (one request on the idle target), in ms; None without one."""
    for p in plan_doc.get("probes") or []:
        if (isinstance(p, dict) and (p.get("target"), p.get("input_len"), p.get("output_len")) == (
                target, input_len, output_len) and isinstance(p.get("seconds"), (int, float))
                and not isinstance(p.get("seconds"), bool) and p["seconds"] > 0):
            return p["seconds"] * 1000.0
    return None


def build_report(out_dir, meta=None, unstable_threshold=0.2, n_boot=2000, rng_seed=0, coldstart_file=None):
    """The report dict (``_bench_report.build``) from ``out_dir``'s plan, saved rounds and stopped marker."""
    meta = dict(meta or {})
    coldstart = _bench_outdir.read_json(coldstart_file, "coldstart_file") if coldstart_file else None
    plan_path = os.path.join(out_dir, "plan.json")
    if not os.path.exists(plan_path):
        if coldstart is None:
            raise BenchError("benchmark_out_dir: %s has no plan.json; run playbooks/benchmark.yml (it plans, runs "
                             "and reports)" % out_dir, reason="missing_file", file=plan_path)
        meta.setdefault("machine", machine())
        targets = meta.pop("targets", None) or [{"name": "engine", "url": "", "model": ""}]
        return _bench_report.build(targets, [], meta, coldstart=coldstart)
    plan_doc = _bench_outdir.read_plan(out_dir)
    done, unreadable = _bench_outdir.read_rounds(out_dir, plan_doc)
    cells = []
    proto = plan_doc["protocol"]
    for target, c, input_len, output_len, rate, rounds in group_cells(plan_doc, done):
        cells.append(_bench_stats.cell(target, c, input_len, output_len, rounds,
                                       unstable_threshold=unstable_threshold, n_boot=n_boot, rng_seed=rng_seed,
                                       request_rate=rate, burstiness=_bench_client.load_args(plan_doc)["burstiness"],
                                       saturation_tolerance=proto.get("saturation_tolerance", 0.1),
                                       # vllm bench serve sends one test request before the load when its
                                       # ready check is on
                                       ready_checks_per_round=(1 if (plan_doc.get("ready_timeout_s", 30) or 0) > 0
                                                               else 0),
                                       unloaded_e2el_ms=_probe_ms(plan_doc, target, input_len, output_len)))
    comparisons = None
    names = [t["name"] for t in plan_doc["targets"]]
    if len(names) == 2:
        comparisons = []
        by_key = dict(((x["target"], x["concurrency"], x["input_len"], x["output_len"], x.get("request_rate")), x)
                      for x in cells)
        for x in cells:
            if x["target"] != names[0]:
                continue
            other = by_key.get((names[1], x["concurrency"], x["input_len"], x["output_len"], x.get("request_rate")))
            if other is None:
                continue
            for m in _bench_stats.METRICS:
                comparisons.append(_bench_stats.compare(x, other, m, n_boot=n_boot, rng_seed=rng_seed))
    warmups = sum(1 for r in plan_doc["rounds"] if r["kind"] == "warmup")
    meta.setdefault("machine", machine())
    client = plan_doc.get("client") or "control node"
    meta.update({
        "client": client, "client_host": meta["machine"].get("hostname") if client == "control node" else client,
        "client_same_host": client == "control node" and any(same_host(t["url"]) for t in plan_doc["targets"]),
        "tokenizer": plan_doc.get("tokenizer"),
        "started": _timeline.iso(round(plan_doc["started_at"], 3)), "ended": _timeline.iso(round(time.time(), 3)),
        "protocol": dict(proto, warmup_rounds_run=sum(1 for i, r in done.items() if r.get("kind") == "warmup"),
                         warmup_rounds_planned=warmups),
        "rounds_planned": len(plan_doc["rounds"]), "rounds_done": len(done),
        "probes": plan_doc.get("probes"), "estimate_s": plan_doc.get("estimate_s"),
        "load_generator": "vllm bench serve (random dataset, exact lengths, temperature 0, --ignore-eos, "
                          "--request-rate inf, --max-concurrency C%s)" % (
                              "; fixed-rate rounds: --request-rate R --burstiness %g, at most %s in flight"
                              % (_bench_client.load_args(plan_doc)["burstiness"],
                                 proto.get("rate_max_concurrency", 256))
                              if proto.get("request_rates") else ""),
    })
    if proto.get("repetitions", 1) > 1:
        meta.setdefault("notes", []).append(
            "repetitions of one seed send the same prompts: an engine with prefix caching may serve later "
            "repetitions from its cache")
    try:
        stopped = _bench_outdir.read_stopped(out_dir)
    except BenchError as e:
        stopped = None
        unreadable.append({"file": "stopped.json", "reason": str(e)})
    # named in the report (meta and a caveat), never dropped silently
    meta["files_not_used"] = unreadable
    transport = _bench_evidence.transport_summary(plan_doc, done)
    if transport:
        meta["transport_warmup"] = transport
    if stopped is not None:
        stopped = {"reason": stopped["message"], "code": stopped["reason"], "at_round": stopped["index"],
                   "after_round": stopped["index"] - 1, "of_rounds": len(plan_doc["rounds"]),
                   "target": stopped["target"], "concurrency": stopped["concurrency"],
                   "input_len": stopped["input_len"], "output_len": stopped["output_len"]}
    return _bench_report.build(report_targets(plan_doc), cells, meta, comparisons=comparisons, coldstart=coldstart,
                               stopped=stopped)


def same_host(url):
    """Whether ``url`` points at this host (loopback, or this host's name)."""
    m = re.match(r"^https?://(\[[^\]]+\]|[^/:]+)", url or "")
    host = (m.group(1).strip("[]").lower() if m else "")
    try:
        names = {os.uname().nodename.lower()}
    except AttributeError:
        names = set()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.") or host in names
