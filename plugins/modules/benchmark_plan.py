#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_plan
short_description: Check a serving benchmark's inputs and targets, and write its ordered plan of rounds
version_added: "0.1.0"
description:
  - Validates the protocol (targets, concurrency ladder, seeds, length pairs, requests per round, warm-up rounds,
    repetitions); each refusal names the role variable (C(benchmark_*)) and the fix.
  - With O(check_targets) (the default), before any load, for every target C(GET /v1/models) must answer and
    list the target's C(model), O(tokenizer) must be a directory holding a tokenizer, and one probe request per
    target and length pair must complete. The probe times give a lower bound of what the ladder needs (every
    round's requests in waves of C at the time one request took alone); above O(time_budget) the module fails.
  - Moves the files of a previous run in O(out_dir) under C(previous/<UTC time>/) (never deletes them) and writes
    C(plan.json) with the targets, the protocol and the ordered rounds. Per length pair and concurrency the warm-up
    rounds of every target come first, then the measured rounds rep by rep and seed by seed; with two targets and
    O(interleave) they alternate A, B, A, B so that a noisy period hits both.
options:
  targets:
    description:
      - >-
        One or two targets (two make an A/B run). Each is C({name, url, model}) plus optional C(headers) (for
        example C({model: glm}) for the AIBrix gateway, C({routing-strategy: pd})), C(metrics_url) (the engine's
        C(/metrics) behind a gateway or router; default C(<url>/metrics), read around every round for the phases),
        C(decode_metrics_url) and C(prefill_metrics_url) (a P/D target's engines' C(/metrics), for the transport
        evidence and the phases) and C(transport) (C(any), C(rdma) or C(tcp): what the evidence verdict checks).
    type: list
    elements: dict
    required: true
  concurrency:
    description: Client concurrencies (C(--max-concurrency)), run in the order given; may be empty when
      O(request_rates) is set (then only the fixed-rate ladder runs).
    type: list
    elements: int
    required: true
  seeds:
    description: Prompt seeds; one measured round per seed (per repetition).
    type: list
    elements: int
    required: true
  lengths:
    description: C([input, output]) token pairs of the random dataset.
    type: list
    elements: list
    required: true
  requests_per_round:
    description: Requests of one measured round.
    type: int
    required: true
  requests_per_concurrency:
    description: With a value above 0 a measured round sends max(O(requests_per_round), this x C) requests.
    type: int
    default: 0
  warmup_rounds:
    description: Discarded rounds per concurrency and target (C requests each, seeds no measured round uses).
    type: int
    default: 1
  repetitions:
    description: How often each seed is measured.
    type: int
    default: 1
  interleave:
    description: Alternate the two targets' rounds (ABAB) instead of all of A, then all of B.
    type: bool
    default: true
  time_budget:
    description: Seconds the ladder may take; 0 for no limit. Checked against the probe's lower bound before any
      load, and before every round.
    type: float
    default: 0
  tokenizer:
    description: Directory of the served model's tokenizer, on the host that runs the client.
    type: path
  out_dir:
    description: Absolute directory for the plan, the rounds and the report.
    type: path
    required: true
  check_targets:
    description: Check the targets, the tokenizer and the budget now (false when the client runs in the cluster
      and the targets are not reachable from here).
    type: bool
    default: true
  probe_timeout:
    description: Seconds one probe request may take.
    type: float
    default: 600
  ready_timeout:
    description: Seconds the client waits for its first test request before a round counts as failed.
    type: int
    default: 30
  client:
    description: Where the client runs, recorded in the report (for example C(control node), C(gpu-node-3),
      C(kubernetes job)).
    type: str
    default: control node
  request_rates:
    description: Offered requests per second of the open-loop ladder (C(--request-rate R)), run after the
      concurrency ladder of each length pair, in the order given; empty for none. Each cell records C(request_rate)
      and C(achieved_rate) and is C(saturated) when the achieved rate falls short of what the offered rate allows.
    type: list
    elements: float
    default: []
  burstiness:
    description: Arrival burstiness of the fixed-rate rounds (C(--burstiness)); 1 sends Poisson arrivals.
    type: float
    default: 1.0
  goodput:
    description: SLO pairs of the client's C(--goodput) (C(ttft:500), C(tpot:50), C(e2el:2000), in ms); each cell
      then reports the client's goodput.
    type: list
    elements: str
    default: []
  rate_max_concurrency:
    description: Requests in flight a fixed-rate round allows at most (its C(--max-concurrency)).
    type: int
    default: 256
  saturation_tolerance:
    description: A fixed-rate cell is saturated when its achieved rate is below (1 - this) x the rate the offered
      rate allows (the Poisson spread of the round's arrivals widens it for short rounds).
    type: float
    default: 0.1
  transport_warmup_requests:
    description: For every target with C(decode_metrics_url), single requests sent one after the other before its
      first round, each between two reads of the decode engine's NIXL counters, so that the NIXL/UCX connections
      are open before anything is measured and the report gives the first transfers (connection set-up) and those
      after apart; 0 for none. Give at least one per prefill x decode rank pair.
    type: int
    default: 8
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: partial
    details: Validates and checks the targets (one probe request each) but writes nothing.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Plan an A/B of a colocated engine and a P/D router
  llmops.serving.benchmark_plan:
    targets:
      - {name: colocated, url: "http://10.0.0.5:8000", model: glm-5.2-fp8}
      - name: pd
        url: http://10.0.0.9:8000
        model: glm-5.2-fp8
        decode_metrics_url: http://10.0.0.12:8000/metrics
        transport: rdma
    concurrency: [1, 4, 8]
    seeds: [1, 2, 3]
    lengths: [[128, 64], [4096, 256]]
    requests_per_round: 64
    warmup_rounds: 1
    time_budget: 7200
    tokenizer: /mnt/nvme/models/glm-5.2-fp8/rev1
    out_dir: /var/tmp/llmops/bench
  register: plan
"""

RETURN = r"""
rounds:
  description: Number of rounds in the plan (warm-up and measured).
  returned: always
  type: int
indices:
  description: The round numbers 1..n, to loop over.
  returned: always
  type: list
  elements: int
measured_rounds:
  description: Number of measured rounds.
  returned: always
  type: int
estimate_s:
  description: Lower bound of the ladder's seconds from the probes (null without O(check_targets)).
  returned: always
  type: float
probes:
  description: One C({target, input_len, output_len, seconds}) per target and length pair.
  returned: always
  type: list
  elements: dict
plan_file:
  description: The plan written (C(<out_dir>/plan.json)).
  returned: always
  type: str
moved_previous:
  description: Where the previous run's files went, or null.
  returned: always
  type: str
msg:
  description: The plan in one line; its rounds (measured and warm-up), its targets and, with O(check_targets), the
    least time the probes allow it.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_evidence, _bench_inputs, _bench_outdir, _bench_plan
from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _http, _units


def main():
    module = AnsibleModule(
        argument_spec=dict(
            targets=dict(type="list", elements="dict", required=True),
            concurrency=dict(type="list", elements="int", required=True),
            seeds=dict(type="list", elements="int", required=True),
            lengths=dict(type="list", elements="list", required=True),
            requests_per_round=dict(type="int", required=True),
            requests_per_concurrency=dict(type="int", default=0),
            warmup_rounds=dict(type="int", default=1),
            repetitions=dict(type="int", default=1),
            interleave=dict(type="bool", default=True),
            time_budget=dict(type="float", default=0),
            tokenizer=dict(type="path", no_log=False),  # a directory path, not a token
            out_dir=dict(type="path", required=True),
            check_targets=dict(type="bool", default=True),
            probe_timeout=dict(type="float", default=600),
            ready_timeout=dict(type="int", default=30),
            client=dict(type="str", default="control node"),
            request_rates=dict(type="list", elements="float", default=[]),
            burstiness=dict(type="float", default=1.0),
            goodput=dict(type="list", elements="str", default=[]),
            rate_max_concurrency=dict(type="int", default=256),
            saturation_tolerance=dict(type="float", default=0.1),
            transport_warmup_requests=dict(type="int", default=8),
        ),
        supports_check_mode=True,
    )
    _http.refuse_url_credentials(module, {
        "targets[].url": "send them as an Authorization header in the target's headers (never shown)",
        "targets[].metrics_url": "expose the engine's /metrics without them",
        "targets[].decode_metrics_url": "expose the engine's /metrics without them",
        "targets[].prefill_metrics_url": "expose the engine's /metrics without them"})
    p = module.params
    try:
        proto = _bench_inputs.check_inputs(dict(p, time_budget_s=p["time_budget"]))
        # credential headers (Authorization, x-api-key) are never shown
        module.no_log_values.update(_bench_inputs.secret_header_values(proto["targets"]))
        plan = _bench_plan.make_plan(proto)
        probes, estimate = [], None
        if p["check_targets"]:
            _bench_inputs.check_tokenizer(p["tokenizer"])
            for i, t in enumerate(proto["targets"]):
                _bench_inputs.check_target(t, i)
            seconds = {}
            for i, t in enumerate(proto["targets"]):
                for input_len, output_len in proto["lengths"]:
                    s, kv = _bench_evidence.probe_transport(t, i, input_len, output_len, timeout=p["probe_timeout"])
                    seconds[(t["name"], input_len, output_len)] = s
                    probes.append({"target": t["name"], "input_len": input_len, "output_len": output_len,
                                   "seconds": round(s, 4), "kv_transfer": kv})
            estimate = _bench_plan.check_budget(plan, seconds, proto["time_budget_s"])
        moved = None
        plan_file = "%s/plan.json" % p["out_dir"].rstrip("/")
        if not module.check_mode:
            moved = _bench_outdir.prepare_out_dir(p["out_dir"])
            _bench_outdir.write_plan(p["out_dir"], {
                "schema": _bench_outdir.PLAN_SCHEMA, "started_at": time.time(), "started_host": _clock.host_instant(),
                "targets": proto["targets"],
                "protocol": dict((k, v) for k, v in proto.items() if k != "targets"), "rounds": plan,
                "tokenizer": p["tokenizer"], "probes": probes, "estimate_s": estimate,
                "ready_timeout_s": p["ready_timeout"], "time_budget_s": proto["time_budget_s"],
                "client": p["client"]})
    except _bench_inputs.BenchError as e:
        module.fail_json(**_bench_inputs.failure(e))
    measured = sum(1 for r in plan if r["kind"] == "measure")
    msg = "%d rounds (%d measured, %d warm-up) over %d target(s)" % (len(plan), measured, len(plan) - measured,
                                                                     len(proto["targets"]))
    if estimate is not None:
        msg += "; at least %s by the probes" % _units.human_seconds(estimate)
        if proto["time_budget_s"]:
            msg += " (budget %s)" % _units.human_seconds(proto["time_budget_s"])
    module.exit_json(changed=not module.check_mode, rounds=len(plan), indices=[r["index"] for r in plan],
                     measured_rounds=measured, estimate_s=estimate, probes=probes, plan_file=plan_file,
                     moved_previous=moved, msg=msg)


if __name__ == "__main__":
    main()
