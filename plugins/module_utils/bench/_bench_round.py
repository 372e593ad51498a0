# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: one round of the serving benchmark.

* :func:`run_round` - round k of the plan with the real client (``_bench_client``, run by :func:`run_client`, or
  the output of a Job that ran it): ``rounds/NNN.json`` with its samples, the client's summary, the engines' phases
  and, for a P/D target, the transport evidence (``_bench_evidence``); ``stopped.json`` when the run must end there
  (the target died, the client failed, the time budget ran out).
* :func:`run_transport_warmup` - a P/D target's transport warm-up round.
* :func:`describe_round` - a saved round in one line for the play output.
"""
from __future__ import annotations

import os
import time

from ansible_collections.llmops.serving.plugins.module_utils.bench import (
    _bench_client, _bench_evidence, _bench_inputs, _bench_outdir, _bench_phases, _bench_plan,
)
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_outdir import MAX_ROUND_BYTES, ROUND_SCHEMA
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _units
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json


def _tail(path, lines=20):
    """The last ``lines`` of the client's log (a regular file only: a FIFO put in its place is not waited on)."""
    data = _fsutil.read_part(path, 16384, from_end=True)
    return [] if data is None else data.decode("utf-8", "replace").splitlines()[-lines:]


def run_client(argv, log_path, timeout, env=None, child_cls=None):
    """Run the client to completion (or ``timeout`` seconds): ``(returncode or None, seconds)``."""
    if child_cls is None:
        from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run  # pylint: disable=import-outside-toplevel
        child_cls = _process_run.Child
    t0 = time.monotonic()
    child = child_cls(argv, log_path, env=env)
    try:
        rc = child.wait(timeout if timeout else None)
    finally:
        if child.returncode is None:
            child.stop(grace=10)
            rc = None
    return rc, time.monotonic() - t0


def run_round(out_dir, plan_doc, index, python, env=None, client_timeout=0, evidence_args=None, opener=None,
              runner=run_client, now=time.time, client_output=None, proc_root="/proc", clock=time.monotonic):
    """Run round ``index`` of the plan; returns ``(record, stopped)``.

    ``record`` is what ``rounds/NNN.json`` holds (``{schema, index, kind, target, concurrency, input_len,
    output_len, seed, rep, samples, failed, duration_s, evidence, client, started_at}``), None when the round
    could not be measured. ``stopped`` is None, or ``{index, target, reason, message}`` when the run must end here
    (the target died, the client failed, the time budget ran out); it is then also written to ``stopped.json``.

    The time budget is spent when :func:`_bench_plan.elapsed` (this host's monotonic clock since the plan; ``proc_root``
    and ``clock`` for tests) exceeds it; ``now`` only stamps the record and ``stopped.json`` for people.
    """
    rounds = plan_doc["rounds"]
    if not 1 <= index <= len(rounds):
        raise BenchError("index: %d is not a round of the plan (1..%d)" % (index, len(rounds)), field="index")
    rnd = rounds[index - 1]
    target = next(t for t in plan_doc["targets"] if t["name"] == rnd["target"])
    started = now()  # when the round started, for people; the budget is measured on the monotonic clock
    budget = plan_doc.get("time_budget_s") or 0
    if budget:
        done = dict((i, r) for i, r in _bench_outdir.done_rounds(out_dir, plan_doc).items() if i != index)
        spent, exact = _bench_plan.elapsed(plan_doc, done, proc_root, clock)
        if spent > budget:
            return None, _stop(out_dir, rnd, "over_budget",
                               "benchmark_time_budget (%s) ran out before round %d of %d; raise it or shorten the "
                               "ladder (%s)" % (_units.human_seconds(budget), index, len(rounds),
                                                _bench_plan.describe_elapsed(spent, exact)), now)
    # a Job's client reaches cluster addresses this host may not: only a local client's target is checked here
    dead = _bench_inputs.target_alive(target, opener=opener) if client_output is None else None
    if dead:
        return None, _stop(out_dir, rnd, "target_down",
                           "target %s stopped answering before round %d of %d: %s"
                           % (target["name"], index, len(rounds), dead), now)
    if rnd.get("transport_warmup") and client_output is None and target.get("decode_metrics_url"):
        return run_transport_warmup(out_dir, plan_doc, rnd, target, opener=opener, now=now), None
    ev_before, ph_before = None, None
    fetch = _bench_evidence.metrics_reader(opener)
    if evidence_args is not None and target.get("decode_metrics_url"):
        ev_before = _bench_evidence.evidence_snapshot(target, opener=opener, fetch=fetch, **evidence_args)
    if client_output is None:
        # the engines' request histograms before the load (a Job's round is read after it ran: no before)
        ph_before = _bench_phases.snapshot(target, fetch=fetch)
    result_name = "%03d.json" % index
    raw_dir = os.path.join(out_dir, "raw")
    raw_path = os.path.join(raw_dir, result_name)
    if os.path.exists(raw_path):
        os.unlink(raw_path)
    log_path = os.path.join(out_dir, "logs", "%03d.log" % index)
    if client_output is not None:
        # the client ran elsewhere (a Kubernetes Job): its log holds the result
        _fsutil.atomic_write_text(log_path, client_output)
        doc = _bench_client.result_from_output(client_output)
        if doc is not None:
            _fsutil.atomic_write_json(raw_path, doc, sort_keys=True, newline=True)
        took = (doc or {}).get("duration")
        took = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) and took >= 0 else 0.0
        rc, seconds = (0 if doc is not None else 1), took
    else:
        argv = _bench_client.client_argv(python, target, rnd, plan_doc["tokenizer"], raw_dir, result_name,
                                         ready_timeout=plan_doc.get("ready_timeout_s", 30),
                                         **_bench_client.load_args(plan_doc))
        # the target's headers go in the client's environment, never on its command line
        rc, seconds = runner(argv, log_path, client_timeout,
                             _bench_client.client_env(target, os.environ if env is None else env))
    doc, refused = None, None
    if rc == 0 and os.path.lexists(raw_path):
        try:
            doc = load_json(raw_path, "the client's result", max_bytes=MAX_ROUND_BYTES)
        except (OSError, UntrustedInput) as e:
            doc, refused = None, str(e)
        if doc is not None and not isinstance(doc, dict):
            doc, refused = None, "the client's result: %s is not a JSON object" % raw_path
    if doc is None:
        dead = _bench_inputs.target_alive(target, opener=opener) if client_output is None and not refused else None
        why = ("target %s stopped answering during round %d of %d: %s" % (target["name"], index, len(rounds), dead)
               if dead else
               "%s (round %d of %d); see %s" % (refused, index, len(rounds), log_path) if refused else
               "the client (vllm bench serve) %s in round %d of %d; see %s: %s"
               % ("ran past %ss" % client_timeout if rc is None else "exited %s" % rc, index, len(rounds), log_path,
                  " | ".join(_tail(log_path, 6))))
        return None, _stop(out_dir, rnd, "target_down" if dead else "client_failed", why, now, log=log_path)
    duration = doc.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
        duration = None
    samples = _bench_client.samples_from_result(doc, rnd["seed"])
    record = dict(rnd)
    record.update({"schema": ROUND_SCHEMA, "started_at": started, "samples": samples,
                   "failed": sum(1 for s in samples if not s["ok"]),
                   "duration_s": float(duration or seconds), "wall_s": round(seconds, 3),
                   "client": _bench_client.client_summary(doc), "raw": os.path.relpath(raw_path, out_dir),
                   "log": os.path.relpath(log_path, out_dir), "evidence": None, "phases": None,
                   "prompt_digest": _bench_client.prompt_digest(doc)})
    fetch = _bench_evidence.metrics_reader(opener)
    if ph_before is not None:
        record["phases"] = _bench_phases.round_phases(ph_before, _bench_phases.snapshot(target, fetch=fetch))
    if ev_before is not None:
        after = _bench_evidence.evidence_snapshot(target, opener=opener, fetch=fetch, **evidence_args)
        record["evidence"] = _bench_evidence.evidence(ev_before, after, target.get("transport") or "any",
                                                      direction=evidence_args.get("direction", "both"))
    _fsutil.atomic_write_json(_bench_outdir.round_path(out_dir, index), record, sort_keys=True, newline=True)
    stopped = None
    if record["failed"] == len(samples) and client_output is None:
        dead = _bench_inputs.target_alive(target, opener=opener)
        if dead:
            stopped = _stop(out_dir, rnd, "target_down", "target %s stopped answering during round %d of %d "
                            "(every request failed): %s" % (target["name"], index, len(rounds), dead), now)
    return record, stopped


def run_transport_warmup(out_dir, plan_doc, rnd, target, opener=None, now=time.time):
    """Round ``rnd`` (a P/D target's transport warm-up) as ``_bench_evidence.transport_warmup`` runs it; its record has no
    client samples and ``transport_requests`` with the requests. (A Job runs that round as the client at C=1: its
    record is a client round, without ``transport_requests``.)"""
    started = now()
    t0 = time.monotonic()
    reqs = _bench_evidence.transport_warmup(target, rnd, opener=opener)
    seconds = time.monotonic() - t0
    record = dict(rnd)
    record.update({"schema": ROUND_SCHEMA, "started_at": started, "samples": [], "transport_requests": reqs,
                   "failed": sum(1 for r in reqs if not r["ok"]), "duration_s": float(seconds),
                   "wall_s": round(seconds, 3), "client": None, "evidence": None, "phases": None,
                   "prompt_digest": None})
    _fsutil.atomic_write_json(_bench_outdir.round_path(out_dir, rnd["index"]), record, sort_keys=True, newline=True)
    return record


def _stop(out_dir, rnd, reason, message, now, log=None):
    doc = {"index": rnd["index"], "target": rnd["target"], "kind": rnd["kind"], "concurrency": rnd["concurrency"],
           "input_len": rnd["input_len"], "output_len": rnd["output_len"], "seed": rnd["seed"], "rep": rnd["rep"],
           "reason": reason, "message": message, "at": now()}
    if log:
        doc["log"] = os.path.relpath(log, out_dir)
    _fsutil.atomic_write_json(os.path.join(out_dir, "stopped.json"), doc, indent=2, sort_keys=True, newline=True)
    return doc


def describe_round(rec):
    if isinstance(rec.get("transport_requests"), list):
        reqs = rec["transport_requests"]
        per = [r.get("per_transfer_ms") for r in reqs if isinstance(r, dict) and r.get("per_transfer_ms") is not None]
        return ("transport warm-up %s: %d single requests, %d failed; NIXL time per transfer %s"
                % (rec["target"], len(reqs), rec["failed"],
                   "first %.1f ms, then median %.1f ms" % (per[0], _bench_evidence.median(per[1:])) if len(per) > 1 else
                   "%.1f ms" % per[0] if per else "not counted"))
    c = rec.get("client") or {}
    ok = [s for s in rec["samples"] if s["ok"]]

    def p95(key):
        v = c.get("p95_%s_ms" % key)
        return "%.1f" % v if isinstance(v, (int, float)) else "n/a"
    # a fixed-rate round's concurrency is only its cap (benchmark_rate_max_concurrency): name the offered rate
    load = ("R=%g/s (achieved %.2f)" % (rec["request_rate"], float(c.get("request_throughput") or 0.0))
            if rec.get("request_rate") else "C=%d" % rec["concurrency"])
    return ("%s %s %s %d/%d seed %d rep %d: %d requests, %d failed, %.1f out tok/s, p95 TTFT %s ms, TPOT %s ms, "
            "E2EL %s ms" % (rec["kind"], rec["target"], load, rec["input_len"], rec["output_len"],
                            rec["seed"], rec["rep"], len(rec["samples"]), rec["failed"],
                            float(c.get("output_throughput") or 0.0), p95("ttft"), p95("tpot"), p95("e2el"))
            + ("" if len(ok) == len(rec["samples"]) else " (failed requests are kept in the report)"))
