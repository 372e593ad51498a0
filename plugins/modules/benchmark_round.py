#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_round
short_description: Run one round of a serving benchmark plan with vllm bench serve
version_added: "0.1.0"
description:
  - Runs round O(index) of the plan that M(llmops.serving.benchmark_plan) wrote into O(out_dir), with the real
    client, C(vllm bench serve) (its parser and C(main) from C(vllm.benchmarks.serve), run by O(python) as a child
    process, so a wheel whose C(vllm) console script is broken still works) with the random dataset at exact
    lengths, temperature 0, C(--ignore-eos), unlimited arrival rate, C(--max-concurrency) C and
    C(--save-result --save-detailed).
  - Writes C(<out_dir>/rounds/NNN.json) with one sample per request (TTFT, TPOT, ITLs, E2EL, tokens, seed, ok,
    error; failed requests are kept), the client's raw result under C(raw/) and its output under C(logs/).
  - For a target with C(decode_metrics_url), snapshots the decode engine's NIXL counters and the RDMA port
    counters (as M(llmops.serving.rdma_counters) does) before and after the round and records the C(evidence) of RV(record)
    with the KV bytes, RDMA bytes, the KV bytes the RDMA ports did not carry (C(tcp_bytes)) and the verdict for the target's
    C(transport).
  - When the target stops answering, the client fails, or the plan's time budget has run out, the round is not
    recorded and RV(stopped) (also written to C(<out_dir>/stopped.json)) says where and why; the module does not
    fail, so the play can still write the report of the rounds so far.
options:
  out_dir:
    description: The directory holding C(plan.json).
    type: path
    required: true
  index:
    description: The round to run (1..n).
    type: int
    required: true
  python:
    description: Interpreter that has C(vllm) installed (the engine's environment).
    type: str
    required: true
  env:
    description:
      - Extra environment for the client (for example C(HF_HUB_OFFLINE=1)), on top of the module's own.
      - Values are C(no_log) (the environment may carry C(HF_TOKEN)); they reach the client's process environment
        only, never a result or a round record.
    type: dict
    default: {}
  client_timeout:
    description: Seconds the client may run; 0 for no limit.
    type: float
    default: 0
  client_output:
    description:
      - The log of a client that ran elsewhere (a Kubernetes Job from M(llmops.serving.benchmark_job)); its
        C(LLMOPS_BENCH_RESULT) line is the round's result and no client is started here.
    type: str
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.node.sysfs_root
  - llmops.serving.node.proc_root
  - llmops.serving.rdma.evidence
attributes:
  check_mode:
    support: none
    details: Sending the load is the point; the task does nothing in check mode.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Run round 3 of the plan
  llmops.serving.benchmark_round:
    out_dir: /var/tmp/llmops/bench
    index: 3
    python: /opt/vllm/bin/python
  register: round
"""

RETURN = r"""
record:
  description:
    - The round as saved (C(rounds/NNN.json)) without its per-request samples, null when RV(stopped).
    - C(index), C(kind) (C(warmup) or C(measure)), C(target), C(concurrency), C(input_len), C(output_len), C(seed),
      C(rep), C(num_prompts), C(failed), C(duration_s), C(client) (the client's own summary), C(evidence).
  returned: always
  type: dict
stopped:
  description: Null, or C({index, target, reason, message}) when the run must end at this round (C(reason)
    C(target_down), C(client_failed) or C(over_budget)).
  returned: always
  type: dict
progress:
  description: C({k, n, elapsed_s, eta_s, line}) after this round.
  returned: always
  type: dict
msg:
  description: The round's result in one line, with round k of n and the ETA.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs, _bench_outdir, _bench_plan, _bench_round
from ansible_collections.llmops.serving.plugins.module_utils.common import _option_specs
from ansible_collections.llmops.serving.plugins.module_utils.transport import _rdma


def main():
    module = AnsibleModule(
        argument_spec=dict(
            out_dir=dict(type="path", required=True),
            index=dict(type="int", required=True),
            python=dict(type="str", required=True),
            env=dict(type="dict", default={}, no_log=True),  # the client environment may carry HF_TOKEN and the like
            client_timeout=dict(type="float", default=0),
            **_option_specs.node("sysfs_root", "proc_root"),
            **_rdma.snapshot_argument_spec("rdma_"),
            client_output=dict(type="str"),
        ),
        supports_check_mode=False,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: no load sent", record=None, stopped=None,
                         progress=None)
    try:
        plan = _bench_outdir.read_plan(p["out_dir"])
        module.no_log_values.update(_bench_inputs.secret_header_values(plan["targets"]))
        env = dict(os.environ)
        env.update(dict((str(k), str(v)) for k, v in p["env"].items()))
        evidence_args = {"sysfs_root": p["sysfs_root"], "proc_root": p["proc_root"], "devices": p["rdma_devices"],
                         "ports": p["rdma_ports"], "direction": p["direction"]}
        record, stopped = _bench_round.run_round(p["out_dir"], plan, p["index"], p["python"], env=env,
                                                 client_timeout=p["client_timeout"], evidence_args=evidence_args,
                                                 client_output=p["client_output"])
        prog = _bench_plan.progress(plan, _bench_outdir.done_rounds(p["out_dir"]), p["index"])
    except _bench_inputs.BenchError as e:
        module.fail_json(msg=str(e), reason=e.reason)
    except OSError as e:
        module.fail_json(msg="python: cannot start the client with %s: %s; set benchmark_client_python to the "
                             "interpreter that has vllm installed" % (p["python"], e), reason="client_failed")
    if record is not None:
        msg = "round %d of %d: %s; %s" % (p["index"], prog["n"], _bench_round.describe_round(record), prog["line"])
        shown = dict((k, v) for k, v in record.items() if k != "samples")
    else:
        msg = "round %d of %d not measured: %s" % (p["index"], prog["n"], stopped["message"])
        shown = None
    module.exit_json(changed=True, record=shown, stopped=stopped, progress=prog, msg=msg)


if __name__ == "__main__":
    main()
