#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_counters
short_description: Snapshot RDMA port counters and prove which transport carried the KV cache
version_added: "0.1.0"
description:
  - Reads, for every RDMA port under C(<sysfs_root>/class/infiniband), the data and packet counters
    (C(port_xmit_data) and C(port_rcv_data) are in units of 4 octets; bytes = value x 4), all
    C(hw_counters), C(link_layer) (C(InfiniBand), or C(Ethernet) = RoCE), C(state) and C(rate).
  - Without O(baseline) it returns a RV(snapshot). With O(baseline) (an earlier RV(snapshot)) it returns
    per-port and total deltas and a RV(verdict) on O(expect).
  - A counter that went down is reported as a reset, one stuck at its 32-bit maximum as saturated, and
    C(N/A (no PMA)) as unavailable; none of them yields a made-up or negative delta.
  - On mlx5 RoCE ports these counters count RDMA traffic only, so kernel TCP on the same NIC does not
    move them. C(/sys/class/infiniband) is not namespaced, so a pod sees every port of its node.
  - With O(nixl_metrics) it also reads the decode engine's KV-transfer metrics (vLLM
    C(vllm:nixl_*) and C(vllm:prompt_tokens_by_source), SGLang C(sglang:kv_transfer_*)) and
    cross-checks them against the RDMA bytes.
  - The module fails when the verdict fails; the result still carries RV(deltas), RV(kv) and RV(verdict).
options:
  sysfs_root:
    description: Root of sysfs; tests point this at a fixture tree.
    type: path
    default: /sys
  devices:
    description:
      - RDMA device names to read (for example V(mlx5_0)). Empty reads every device under
        C(class/infiniband).
      - A name that does not exist fails the module with the list of devices present.
    type: list
    elements: str
    default: []
  ports:
    description: Port numbers to read on each device. Empty reads every port.
    type: list
    elements: int
    default: []
  baseline:
    description:
      - The RV(snapshot) of an earlier run of this module on the same host. When set, the module
        compares against it and returns RV(deltas) and RV(verdict).
    type: dict
  expect:
    description:
      - V(rdma) fails unless the chosen O(direction) moved at least O(min_bytes) on RDMA ports.
      - V(tcp) fails when RDMA ports moved more than O(tolerance_bytes) (the control run must not
        secretly use RDMA) or when a port could not be measured. A host with no RDMA device passes,
        and the reason says so.
      - V(any) only reports.
    type: str
    choices: [any, rdma, tcp]
    default: any
  direction:
    description:
      - Which counters count toward the verdict. With a NIXL pull (READ) the prefill host transmits
        (V(tx)) and the decode host receives (V(rx)). V(both) adds the two.
    type: str
    choices: [tx, rx, both]
    default: both
  min_bytes:
    description: Bytes the chosen direction must move for O(expect=rdma) to pass.
    type: int
    default: 1048576
  tolerance_bytes:
    description:
      - Bytes RDMA ports may move during an O(expect=tcp) control run (fabric management and other
        tenants of a shared HCA).
    type: int
    default: 1048576
  nixl_metrics:
    description:
      - Prometheus text of the decode engine's C(/metrics), or its C(http(s)://) URL, for the
        KV-transfer cross-check. Sampled with the snapshot and again at comparison time.
      - With O(expect=rdma), RDMA bytes must be at least the engine's KV bytes x O(min_nixl_ratio) and
        the engine must report zero failed transfers.
    type: str
  min_nixl_ratio:
    description: Share of the engine's KV bytes that RDMA counters must account for under O(expect=rdma).
    type: float
    default: 0.9
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: Only reads sysfs and the metrics endpoint; runs the same in check mode.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
notes:
  - C(hw_counters) are cached by the kernel for C(lifespan) milliseconds (default 10); reads closer
    together than that return the same values.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Snapshot RDMA ports before the load
  llmops.serving.rdma_counters:
    nixl_metrics: http://10.0.0.12:8000/metrics
  register: before

- name: Send the load through the P/D router
  ansible.builtin.uri:
    url: http://router:8000/v1/completions
    method: POST
    body_format: json
    body: {model: glm, prompt: "hello", max_tokens: 16}

- name: The KV must have crossed on RDMA (decode host receives)
  llmops.serving.rdma_counters:
    baseline: "{{ before.snapshot }}"
    expect: rdma
    direction: rx
    min_bytes: 1073741824
    nixl_metrics: http://10.0.0.12:8000/metrics

- name: TCP control run - RDMA ports must not move
  llmops.serving.rdma_counters:
    baseline: "{{ before.snapshot }}"
    expect: tcp
    tolerance_bytes: 1048576
"""

RETURN = r"""
snapshot:
  description: Counters read now; pass it as O(baseline) later. Raw sysfs values plus C(tx_bytes)/C(rx_bytes).
  returned: always
  type: dict
  sample:
    schema: 1
    taken_at: 1767225600.25
    present: true
    reason: ""
    ports:
      mlx5_0/1: {device: mlx5_0, port: 1, link_layer: Ethernet, transport: RoCE, state: "4: ACTIVE",
                 rate: "200 Gb/sec (4X HDR)", counters: {port_xmit_data: 1000}, tx_bytes: 4000}
present:
  description: Whether any RDMA port was found.
  returned: always
  type: bool
reason:
  description: Why no port was found (for example C(no RDMA devices - /sys/class/infiniband does not exist)).
  returned: always
  type: str
deltas:
  description:
    - Per-port and total byte and packet deltas (bytes already x 4), per-port hw_counter deltas,
      C(elapsed_s), C(missing_ports), C(new_ports) and C(untrusted) counters (saturated, reset, unavailable).
  returned: when O(baseline) is set
  type: dict
  sample:
    elapsed_s: 42.1
    totals: {tx_bytes: 38180000000, rx_bytes: 1200, tx_packets: 9300000, rx_packets: 12}
    ports:
      mlx5_0/1: {tx_bytes: 4772500000, status: {port_xmit_data: ok}, hw_counters: {rx_read_requests: 120}}
kv:
  description:
    - KV-transfer counters of the engine across the load (deltas when the baseline carried a sample),
      C(rate_bytes_per_s) = bytes / sum(xfer_time), C(failures), and C(prompt_tokens_by_source).
  returned: when O(nixl_metrics) and O(baseline) are set
  type: dict
  sample: {engine: vllm, bytes: 65536.0, xfer_time_s: 0.004, rate_bytes_per_s: 16384000.0, failures: 0.0,
           prompt_tokens_by_source: {external_kv_transfer: 34.0, local_compute: 0.0}}
verdict:
  description: C(passed), C(status), C(rdma_bytes), C(kv_bytes), C(link_layers), C(reasons), C(warnings), C(summary).
  returned: when O(baseline) is set
  type: dict
  sample: {expect: tcp, passed: true, status: pass, rdma_bytes: 0,
           reasons: ["no RDMA devices - /sys/class/infiniband does not exist - no RDMA port could carry the transfer"]}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils import _prom, _rdma


def _kv_sample(module, source):
    try:
        return _prom.kv_sample(_prom.load(source))
    except _prom.PromParseError as e:
        module.fail_json(msg="nixl_metrics: not Prometheus text (%s); pass the engine's /metrics body or "
                             "its http(s):// URL" % e)
    except Exception as e:  # open_url raises several types (URLError, HTTPError, socket errors)
        module.fail_json(msg="nixl_metrics: cannot read %s: %s; check the decode engine's metrics URL"
                             % (source, e))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            devices=dict(type="list", elements="str", default=[]),
            ports=dict(type="list", elements="int", default=[]),
            baseline=dict(type="dict"),
            expect=dict(type="str", choices=["any", "rdma", "tcp"], default="any"),
            direction=dict(type="str", choices=["tx", "rx", "both"], default="both"),
            min_bytes=dict(type="int", default=1048576),
            tolerance_bytes=dict(type="int", default=1048576),
            nixl_metrics=dict(type="str"),
            min_nixl_ratio=dict(type="float", default=0.9),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for opt in ("min_bytes", "tolerance_bytes"):
        if p[opt] < 0:
            module.fail_json(msg="%s: must be >= 0 (got %d)" % (opt, p[opt]))
    if not 0 < p["min_nixl_ratio"] <= 1.5:
        module.fail_json(msg="min_nixl_ratio: must be in (0, 1.5] (got %s); 0.9 allows 10%% slack"
                             % p["min_nixl_ratio"])
    if p["baseline"] is not None:
        try:
            _rdma.validate_baseline(p["baseline"])
        except _rdma.RdmaError as e:
            module.fail_json(msg=str(e))
    try:
        snap = _rdma.snapshot(p["sysfs_root"], devices=p["devices"], ports=p["ports"])
    except _rdma.RdmaError as e:
        module.fail_json(msg=str(e))
    if p["nixl_metrics"]:
        snap["kv"] = _kv_sample(module, p["nixl_metrics"])
    result = dict(changed=False, snapshot=snap, present=snap["present"], reason=snap["reason"])
    if p["baseline"] is None:
        module.exit_json(**result)

    base = p["baseline"]
    deltas = _rdma.compare(base, snap)
    kv = None
    if p["nixl_metrics"]:
        kv = _prom.kv_delta(base.get("kv"), snap["kv"])
        result["kv"] = kv
        if not kv["baseline"]:
            module.warn("baseline has no engine metrics sample; KV counters are totals since the engine "
                        "started (take the baseline with nixl_metrics set)")
    result["deltas"] = deltas
    verdict = _rdma.verdict(deltas, snap, p["expect"], direction=p["direction"], min_bytes=p["min_bytes"],
                            tolerance_bytes=p["tolerance_bytes"], kv=kv, min_nixl_ratio=p["min_nixl_ratio"])
    result["verdict"] = verdict
    if not verdict["passed"]:
        module.fail_json(msg=verdict["summary"], **result)
    module.exit_json(msg=verdict["summary"], **result)


if __name__ == "__main__":
    main()
