#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_upgrade_plan
short_description: Plan a Kubernetes revision upgrade with a canary, waves by spare GPUs and a recorded rollback
version_added: "0.1.0"
description:
  - Takes A's objects as the API returned them (O(live)), B's rendered objects (O(rendered)), the nodes and pods,
    and the nodes that staged B, and returns the plan; it reads and changes nothing.
  - The plan records A's objects without the fields the API server and controllers set (C(resourceVersion),
    C(uid), C(generation), C(managedFields), C(status) ...); a rollback deletes what B added and re-applies them.
  - The canary is one replica (Deployment), one group (LeaderWorkerSet) or one prefill, decode and front of B's
    generation (a P/D pair of Deployments). It runs beside A where a node that staged B has free GPUs for one more
    pod, else in the place of one of A's replicas; the waves are as wide as that spare room, else one at a time.
  - Refuses with RV(reason=outage) a change that would stop the only serving pod (one replica, no room beside it)
    unless O(allow_outage), with RV(reason=pd_generations_mix) a P/D step where a front could reach two
    generations, and with RV(reason=pd_stormservice) a StormService pair.
options:
  live:
    description: A's objects as read from the API (the workload, its Service, route, grant, PDB; a P/D pair's all).
    type: list
    elements: dict
    required: true
  rendered:
    description:
      - B's objects as C(engine_manifests) or C(pd_manifests) rendered them.
      - Without it the module returns only RV(serving) (which of O(live) serves O(served_model_name), and the
        revision it loads, to pin before B is staged).
    type: list
    elements: dict
  served_model_name:
    description: The served model name whose workload O(live) holds (without O(rendered)).
    type: str
  pd_model_name:
    description:
      - Without O(rendered), the model name of a P/D pair (C(pd_disagg_model_name)) looked for in O(live) when no
        engine workload serves O(served_model_name) - its prefill, decode and front Deployments (C(form) V(P/D)), or
        its StormService (C(form) V(StormService)), which is refused there with RV(reason=pd_stormservice).
    type: str
  nodes:
    description: The Nodes as listed (C(status.allocatable), C(spec.unschedulable), taints). Required with O(rendered).
    type: list
    elements: dict
  pods:
    description:
      - The pods as listed; the GPUs of those bound to a node and not ended count as allocated there, and A's own
        pods on nodes that staged B count as B's room once A gives them back.
      - Without it, O(nodes) give C(allocated) GPUs themselves and A's replicas are taken to run on nodes that staged B.
    type: list
    elements: dict
  staged_nodes:
    description: The nodes that staged B; for a P/D pair a dict with C(prefill) and C(decode) lists. Required with O(rendered).
    type: raw
  allow_outage:
    description: Accept that nothing serves while B starts when A has one replica and no room beside it.
    type: bool
    default: false
  gpu_resource:
    description: The GPU extended resource.
    type: str
    default: nvidia.com/gpu
  namespace:
    description: The namespace of B's objects (default, their own).
    type: str
  pinned:
    description: The revisions kept on disk until the upgrade ends (listed in the plan).
    type: list
    elements: str
    default: []
  kernel_cache:
    description:
      - B's kernel cache as each node that staged B found it, stated in the plan before any pod changes - C(reports)
        (per node, the kernel_cache role's facts - C(node), C(status), C(fingerprint), C(dir), C(capturing)),
        C(enabled) (false - B compiles at its start everywhere, for C(off_reason)) and C(compile_minutes) (the cold
        start a miss adds).
      - Unset, the plan says nothing of the kernel cache.
    type: dict
  a_ref:
    description: A as C(model@revision), for the plan's text.
    type: str
  b_ref:
    description: B as C(model@revision), for the plan's text.
    type: str
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: The module reads and changes nothing; check mode returns the same plan.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Plan the upgrade
  llmops.serving.k8s_upgrade_plan:
    live: "{{ upgrade_k8s_live.resources }}"
    rendered: "{{ engine_k8s.objects }}"
    nodes: "{{ upgrade_k8s_nodes.resources }}"
    pods: "{{ upgrade_k8s_pods.resources }}"
    staged_nodes: "{{ engine_staged_nodes }}"
    allow_outage: "{{ engine_allow_outage }}"
  register: upgrade_k8s_plan
"""

RETURN = r"""
plan:
  description: >-
    C(form) (Deployment, LeaderWorkerSet, P/D), C(unit), C(units), C(room) (pods that fit per node that staged B),
    C(surge), C(waves) (units per wave), C(outage), C(canary), C(generations) (P/D), C(steps) (each C(name),
    C(apply) objects, C(delete) C({kind, name}), C(wait) C({kind, name, replicas, selector})), C(order),
    C(record) (A's objects to re-apply), C(rollback) (C(delete), C(apply), C(wait) - A's workloads to wait for),
    C(retire), C(pinned), C(kernel_cache) (per node that staged B - C(node), C(state) V(hit), V(miss), V(unknown) or
    V(off), C(fingerprint), C(dir), C(line)). A wait may name its C(container) and C(service) (a P/D role's own).
  returned: with O(rendered)
  type: dict
serving:
  description: Without O(rendered), the workload of O(live) that serves O(served_model_name) or the P/D pair of
    O(pd_model_name) (C(kind), C(name), C(form) - V(Deployment), V(LeaderWorkerSet), V(P/D) or V(StormService) -,
    C(model_path), C(model), C(revision); a P/D pair also C(prefill), C(decode), C(front)); null when none does.
  returned: when O(rendered) is not given
  type: dict
lines:
  description: The plan as text lines (check mode shows them).
  returned: with O(rendered)
  type: list
  elements: str
reason:
  description: Why the upgrade is refused (V(outage), V(pd_generations_mix), V(pd_stormservice), V(no_a), V(no_workload), V(shape), V(same)).
  returned: on failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_upgrade


def main():
    module = AnsibleModule(
        argument_spec=dict(
            live=dict(type="list", elements="dict", required=True),
            rendered=dict(type="list", elements="dict"),
            served_model_name=dict(type="str"),
            pd_model_name=dict(type="str"),
            nodes=dict(type="list", elements="dict"),
            pods=dict(type="list", elements="dict"),
            staged_nodes=dict(type="raw"),
            allow_outage=dict(type="bool", default=False),
            gpu_resource=dict(type="str", default="nvidia.com/gpu"),
            namespace=dict(type="str"),
            pinned=dict(type="list", elements="str", default=[]),
            kernel_cache=dict(type="dict"),
            a_ref=dict(type="str"),
            b_ref=dict(type="str"),
        ),
        required_one_of=[("rendered", "served_model_name")],
        required_by={"rendered": ("nodes", "staged_nodes")},
        supports_check_mode=True,
    )
    p = module.params
    if p["rendered"] is None:
        found = _k8s_upgrade.serving(p["live"], p["served_model_name"], p["pd_model_name"])
        if found and found["form"] == "StormService":
            module.fail_json(msg=str(_k8s_upgrade.storm_service_refusal()), reason="pd_stormservice", serving=found)
        module.exit_json(changed=False, serving=found)
    if not isinstance(p["staged_nodes"], (list, dict)):
        module.fail_json(msg="staged_nodes: a list of node names, or {prefill: [...], decode: [...]} for a P/D pair",
                         reason="staged_nodes")
    try:
        plan = _k8s_upgrade.plan(p["live"], p["rendered"], p["nodes"], p["staged_nodes"], allow_outage=p["allow_outage"],
                                 gpu_resource=p["gpu_resource"], pods=p["pods"], namespace=p["namespace"],
                                 pinned=p["pinned"], a_ref=p["a_ref"], b_ref=p["b_ref"], kernel_cache=p["kernel_cache"])
    except _k8s_upgrade.UpgradeError as e:
        module.fail_json(msg=str(e), reason=e.reason)
    module.exit_json(changed=False, plan=plan, lines=_k8s_upgrade.summary(plan))


if __name__ == "__main__":
    main()
