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
  - A snapshot records the host (C(sys/kernel/random/boot_id) and C(sys/kernel/hostname) under O(proc_root)), the O(devices) and
    O(ports) it was taken with, and per port the HCA's C(node_guid) and the port's GID 0.
  - The comparison refuses, with RV(verdict) C(status=error) and a message naming what differs and the fix
    (take a new baseline), a baseline of another host or of an earlier boot of this one, one taken with other
    O(devices)/O(ports), a port that disappeared or appeared since the baseline (a new port is never counted
    from zero), a port whose C(node_guid) or GID 0 changed (the HCA was replaced), and a port counter that
    went backwards (counter reset, driver reload). None of them yields a delta, let alone a pass.
  - A counter stuck at its 32-bit maximum is reported as saturated and C(N/A (no PMA)) as unavailable; neither
    yields a made-up or negative delta. C(hw_counters) that went down are only a warning (some are 32-bit and
    wrap).
  - A baseline (O(baseline) or O(baseline_file)) is validated field by field before anything is read; a
    malformed one fails naming the file and the field, never quoting it.
  - On mlx5 RoCE ports these counters count RDMA traffic only, so kernel TCP on the same NIC does not
    move them. C(/sys/class/infiniband) is not namespaced, so a pod sees every port of its node.
  - With O(nixl_metrics) it also reads the decode engine's KV-transfer metrics (vLLM
    C(vllm:nixl_*) and C(vllm:prompt_tokens_by_source), SGLang C(sglang:kv_transfer_*)) and
    cross-checks them against the RDMA bytes.
  - The module fails when the verdict fails or is an error; the result still carries RV(deltas), RV(kv) and
    RV(verdict).
options:
  baseline:
    description:
      - The RV(snapshot) of an earlier run of this module on the same host, with the same O(devices) and
        O(ports). When set, the module compares against it and returns RV(deltas) and RV(verdict).
      - Mutually exclusive with O(baseline_file).
    type: dict
  baseline_file:
    description:
      - A JSON file holding the RV(snapshot) of an earlier run on this host (written for example with
        C(content="{{ before.snapshot | to_json }}")), for a baseline kept across plays or runs.
      - Mutually exclusive with O(baseline).
    type: path
  expect:
    description:
      - V(rdma) fails unless the chosen O(direction) moved at least O(min_bytes) on RDMA ports.
      - V(tcp) fails when RDMA ports moved more than O(tolerance_bytes) (the control run must not
        secretly use RDMA) or when a port could not be measured. A host with no RDMA device passes,
        and the reason says so. Expired or failed KV transfers in the engine metrics warn.
      - V(any) only reports.
    type: str
    choices: [any, rdma, tcp]
    default: any
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
      - Failed transfers fail O(expect=rdma) and O(expect=tcp); expired KV requests
        (C(vllm:nixl_num_kv_expired_reqs)) and failed notifications warn, and under O(expect=tcp) the warning
        says the control load may not have moved the KV at all.
      - A URL with credentials (C(user:password@)) is refused here and in O(prefill_metrics), since results and
        logs show the URL.
      - A URL's whole answer must come within 10 seconds and hold at most 16 MiB (here and in O(prefill_metrics));
        an answer that trickles or does not end fails naming the option, never waits or fills memory.
      - A counter or histogram figure that cannot be (C(NaN), C(+Inf), negative) fails naming the option and the
        sample.
    type: str
  prefill_metrics:
    description:
      - Prometheus text of the prefill engine's C(/metrics), or its C(http(s)://) URL, sampled like
        O(nixl_metrics). vLLM counts expired KV requests (C(vllm:nixl_num_kv_expired_reqs)) on the prefill
        instance, so without this option they are not seen.
      - Its failed transfers count like the decode engine's; its expired requests and failed notifications
        warn. Its bytes are not used (the decode engine records the transfers of a NIXL pull).
    type: str
  min_nixl_ratio:
    description: Share of the engine's KV bytes that RDMA counters must account for under O(expect=rdma).
    type: float
    default: 0.9
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.node.sysfs_root
  - llmops.serving.node.proc_root
  - llmops.serving.rdma
attributes:
  check_mode:
    details: Only reads sysfs, procfs, O(baseline_file) and the metrics endpoints; runs the same in check mode.
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
    nixl_metrics: http://10.0.0.12:8000/metrics
    prefill_metrics: http://10.0.0.11:8000/metrics

- name: Keep the baseline in a file for a later run on this host
  ansible.builtin.copy:
    dest: /var/tmp/llmops/rdma-baseline.json
    content: "{{ before.snapshot | to_json }}"
    mode: "0600"

- name: Compare against the file
  llmops.serving.rdma_counters:
    baseline_file: /var/tmp/llmops/rdma-baseline.json
    expect: rdma
"""

RETURN = r"""
snapshot:
  description: Counters read now; pass it as O(baseline) later. Raw sysfs values plus C(tx_bytes)/C(rx_bytes).
  returned: always
  type: dict
  sample:
    schema: 2
    taken_at: 1767225600.25
    host: {boot_id: f8b03bce-ed06-4c61-826b-7ea3da125e3e, hostname: gpu-node-a}
    selection: {devices: [], ports: []}
    present: true
    reason: ""
    ports:
      mlx5_0/1: {device: mlx5_0, port: 1, link_layer: Ethernet, transport: RoCE, state: "4: ACTIVE",
                 rate: "200 Gb/sec (4X HDR)", counters: {port_xmit_data: 1000}, tx_bytes: 4000,
                 identity: {node_guid: "b83f:d203:00a1:0f3c", gid0: "fe80:0000:0000:0000:ba3f:d2ff:fea1:0f3c"}}
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
      C(elapsed_s), C(missing_ports), C(new_ports), C(untrusted) counters (saturated, reset, unavailable)
      and C(mismatch) (see RV(mismatch)); C(totals) is null when the baseline is of another host or selection.
  returned: when a baseline is given and valid
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
  returned: when O(nixl_metrics) and a baseline are set
  type: dict
  sample: {engine: vllm, bytes: 65536.0, xfer_time_s: 0.004, rate_bytes_per_s: 16384000.0, failures: 0.0,
           prompt_tokens_by_source: {external_kv_transfer: 34.0, local_compute: 0.0}}
kv_prefill:
  description: The same as RV(kv) for the prefill engine (O(prefill_metrics)).
  returned: when O(prefill_metrics) and a baseline are set
  type: dict
verdict:
  description:
    - C(passed), C(status) (C(pass), C(fail), or C(error) when the baseline does not describe what was read now),
      C(rdma_bytes) (null on error), C(kv_bytes), C(kv_failures), C(kv_expired_reqs), C(link_layers),
      C(mismatch), C(reasons), C(warnings), C(summary).
  returned: when a baseline is given and valid
  type: dict
  sample: {expect: tcp, passed: true, status: pass, rdma_bytes: 0, mismatch: [],
           reasons: ["no RDMA devices - /sys/class/infiniband does not exist - no RDMA port could carry the transfer"]}
mismatch:
  description:
    - Why the baseline cannot be compared with what was read now, one entry per problem, with C(kind)
      (C(host_changed), C(host_rebooted), C(host_unknown), C(selection_changed), C(port_disappeared),
      C(port_appeared), C(port_replaced), C(counter_reset)), C(port) and C(message). Empty when comparable.
  returned: when a baseline is given and valid
  type: list
  elements: dict
  sample:
    - {kind: host_rebooted, port: null,
       message: "host gpu-node-a rebooted since the baseline (...): every counter restarted from zero; take a new baseline"}
file:
  description: The baseline file read (O(baseline_file)); on failure, the file the error is about.
  returned: when O(baseline_file) is set
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.common import _http, _option_specs
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom, _rdma


def _metrics_url(value):
    """Whether a metrics option holds a URL (one word) rather than Prometheus text."""
    return isinstance(value, str) and (_prom.is_url(value) or len(value.split()) == 1)


def _kv_sample(module, source, option="nixl_metrics", role="decode"):
    try:
        return _prom.kv_sample(_prom.load(source))
    except _prom.PromValueError as e:
        module.fail_json(msg="%s: the %s engine's metrics hold a figure that cannot be (%s); its KV counters are "
                             "unknown: check the engine's /metrics" % (option, role, e))
    except _prom.PromParseError as e:
        module.fail_json(msg="%s: not Prometheus text (%s); pass the %s engine's /metrics body or "
                             "its http(s):// URL" % (option, e, role))
    except _http.HttpError as e:  # no credentials or query string of the URL in e.url / e.reason
        module.fail_json(msg="%s: cannot read %s: %s; check the %s engine's metrics URL"
                             % (option, e.url, e.reason, role))


def _load_baseline(module, p):
    try:
        if p["baseline_file"] is not None:
            return _rdma.load_snapshot_file(p["baseline_file"])
        if p["baseline"] is not None:
            _rdma.validate_snapshot(p["baseline"], "baseline")
            return p["baseline"]
    except _rdma.RdmaError as e:
        extra = {"file": e.file} if e.file else {}
        module.fail_json(msg=str(e), **extra)
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **_option_specs.node("sysfs_root", "proc_root"),
            **_rdma.snapshot_argument_spec(),
            baseline=dict(type="dict"),
            baseline_file=dict(type="path"),
            expect=dict(type="str", choices=["any", "rdma", "tcp"], default="any"),
            min_bytes=dict(type="int", default=1048576),
            tolerance_bytes=dict(type="int", default=1048576),
            nixl_metrics=dict(type="str"),
            prefill_metrics=dict(type="str"),
            min_nixl_ratio=dict(type="float", default=0.9),
        ),
        mutually_exclusive=[("baseline", "baseline_file")],
        supports_check_mode=True,
    )
    _http.refuse_url_credentials(module, dict.fromkeys(("nixl_metrics", "prefill_metrics"), (
        "expose the engine's /metrics without them, or read it on the host and pass its text", _metrics_url)))
    p = module.params
    for opt in ("min_bytes", "tolerance_bytes"):
        if p[opt] < 0:
            module.fail_json(msg="%s: must be >= 0 (got %d)" % (opt, p[opt]))
    if not 0 < p["min_nixl_ratio"] <= 1.5:
        module.fail_json(msg="min_nixl_ratio: must be in (0, 1.5] (got %s); 0.9 allows 10%% slack"
                             % p["min_nixl_ratio"])
    base = _load_baseline(module, p)
    try:
        snap = _rdma.snapshot(p["sysfs_root"], devices=p["devices"], ports=p["ports"], proc_root=p["proc_root"])
    except _rdma.RdmaError as e:
        module.fail_json(msg=str(e))
    if p["nixl_metrics"]:
        snap["kv"] = _kv_sample(module, p["nixl_metrics"])
    if p["prefill_metrics"]:
        snap["kv_prefill"] = _kv_sample(module, p["prefill_metrics"], "prefill_metrics", "prefill")
    result = dict(changed=False, snapshot=snap, present=snap["present"], reason=snap["reason"])
    if base is None:
        module.exit_json(**result)

    deltas = _rdma.compare(base, snap, proc_hint="%s/sys/kernel/random/boot_id" % p["proc_root"].rstrip("/"))
    kv = kv_prefill = None
    for option, field, role in (("nixl_metrics", "kv", "decode"), ("prefill_metrics", "kv_prefill", "prefill")):
        if not p[option]:
            continue
        d = _prom.kv_delta(base.get(field), snap[field])
        result[field] = d
        if not d["baseline"]:
            module.warn("baseline has no %s engine metrics sample; its KV counters are totals since the engine "
                        "started (take the baseline with %s set)" % (role, option))
        if field == "kv":
            kv = d
        else:
            kv_prefill = d
    result["deltas"] = deltas
    result["mismatch"] = deltas["mismatch"]
    verdict = _rdma.verdict(deltas, snap, p["expect"], direction=p["direction"], min_bytes=p["min_bytes"],
                            tolerance_bytes=p["tolerance_bytes"], kv=kv, min_nixl_ratio=p["min_nixl_ratio"],
                            kv_prefill=kv_prefill)
    result["verdict"] = verdict
    if p["baseline_file"]:
        result["file"] = p["baseline_file"]
    if not verdict["passed"]:
        module.fail_json(msg=verdict["summary"], **result)
    module.exit_json(msg=verdict["summary"], **result)


if __name__ == "__main__":
    main()
