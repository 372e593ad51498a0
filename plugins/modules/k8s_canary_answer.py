#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_canary_answer
short_description: Prove that a correct answer through the AIBrix gateway came from a canary pod
version_added: "0.1.0"
description:
  - Sends one answer check (the first C(chat) or C(completion) of O(checks), as M(llmops.serving.engine_probe) runs
    it, without the C(model) header) through the AIBrix gateway at O(base_url) with a C(routing-strategy) header, so
    that the gateway picks a pod and names it in the answer (C(target-pod), under C(pd) also C(prefill-target-pod);
    AIBrix v0.7.0 C(gateway_rsp_headers.go) sets them only when a routing strategy picked the pod).
  - An answer counts when every pod it names is a pod of the canary - the pods of O(pods) that one of
    O(canary_selectors) selects. Answers from other pods are tallied and the request is sent again, at most
    O(attempts) times; the failure names the pods that answered.
  - A wrong answer from a canary pod fails at once (RV(reason=canary_wrong)); no answer from a canary pod in
    O(attempts) is RV(reason=canary_not_reached); an answer that names no pod is RV(reason=no_pod_named).
  - Returns the address of the canary pod that answered and of one Ready pod of the model outside the canary (A's),
    for a comparison of the two alone (the upgrade's SLO gate).
options:
  base_url:
    description:
      - The AIBrix gateway's base URL. Credentials in the URL are refused; send them in O(headers).
    type: str
    required: true
  model:
    description: The served model name (the request's C(model), the pods' C(model.aibrix.ai/name)).
    type: str
    required: true
  headers:
    description: Request headers (an Authorization header); a C(routing-strategy) here replaces O(routing_strategy).
    type: dict
    default: {}
  routing_strategy:
    description: The strategy that picks the pod (AIBrix's C(random) picks uniformly among the model's Ready pods).
    type: str
    default: random
  checks:
    description: Checks as M(llmops.serving.engine_probe) takes them; the first C(chat) or C(completion) one is sent.
    type: list
    elements: dict
    required: true
  pods:
    description: The pods as listed (C(kubernetes.core.k8s_info) of kind Pod in the namespace).
    type: list
    elements: dict
    required: true
  canary_selectors:
    description: The label selectors of the canary's workloads (the plan's canary step's waits).
    type: list
    elements: dict
    required: true
  attempts:
    description:
      - Answers to ask at most. V(0) - enough that uniform picks miss every canary pod with a chance below 1 in 1000
        (at most 200).
    type: int
    default: 0
  deadline:
    description: Seconds each attempt may retry transient failures (HTTP 502/503/504, a refused connection).
    type: int
    default: 600
  timeout:
    description: Seconds one request's whole answer may take.
    type: float
    default: 60
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: The module only sends read-only requests; check mode sends them too.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: The canary's correct answer, from a canary pod
  llmops.serving.k8s_canary_answer:
    base_url: http://aibrix-gateway.example
    model: tiny
    checks: "{{ engine_k8s_probe_checks }}"
    pods: "{{ upgrade_k8s_pods.resources }}"
    canary_selectors: "{{ upgrade_k8s_step.wait | map(attribute='selector') | list }}"
"""

RETURN = r"""
pod:
  description: The canary pod whose answer was correct.
  returned: success
  type: str
canary:
  description: The canary's pods, by name; C(others) - the other pods of the model the gateway may pick.
  returned: always
  type: list
  elements: str
others:
  description: The pods of the model outside the canary.
  returned: always
  type: list
  elements: str
answers:
  description: Each attempt - C(attempt), C(ok), C(pods) (the pods its answer named), C(canary), C(error).
  returned: always
  type: list
  elements: dict
canary_address:
  description: C(name), C(ip) and C(url) (C(http://<podIP>:<model.aibrix.ai/port>)) of the pod that answered.
  returned: success
  type: dict
a_address:
  description: The same of the first Ready pod of the model outside the canary; null when none.
  returned: success
  type: dict
reason:
  description: V(canary_wrong), V(canary_not_reached), V(no_pod_named), V(no_canary_pod), V(probe) or V(checks).
  returned: on failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_canary


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            headers=dict(type="dict", default={}, no_log=True),
            routing_strategy=dict(type="str", default="random"),
            checks=dict(type="list", elements="dict", required=True),
            pods=dict(type="list", elements="dict", required=True),
            canary_selectors=dict(type="list", elements="dict", required=True),
            attempts=dict(type="int", default=0),
            deadline=dict(type="int", default=600),
            timeout=dict(type="float", default=60.0),
        ),
        supports_check_mode=True,
    )
    _http.refuse_url_credentials(module, {"base_url": "send them as an Authorization header in headers (no_log)"})
    p = module.params
    if p["attempts"] < 0:
        module.fail_json(msg="attempts: must be >= 0 (0: from the number of pods)", reason="attempts")
    try:
        _probe.validate_checks(p["checks"], "aibrix_gateway")
    except ValueError as e:
        module.fail_json(msg="checks: %s" % e, reason="checks")
    canary, others = _k8s_canary.canary_pods(p["pods"], p["canary_selectors"], p["model"])
    picked = len(_k8s_canary.routable(p["pods"], canary, p["model"]))
    attempts = p["attempts"] or _k8s_canary.attempts_for(picked, picked + len(others))
    try:
        pod, answers = _k8s_canary.prove(_probe.run, p["base_url"], p["model"], p["checks"], canary, others, headers=p["headers"],
                                         strategy=p["routing_strategy"], attempts=attempts,
                                         deadline=p["deadline"], timeout=p["timeout"])
    except _k8s_canary.CanaryError as e:
        module.fail_json(msg=str(e), reason=e.reason, answers=e.answers, canary=canary, others=others)
    module.exit_json(changed=False, pod=pod, answers=answers, canary=canary, others=others,
                     canary_address=_k8s_canary.addresses(p["pods"], [pod])[pod],
                     a_address=_k8s_canary.one_ready(p["pods"], others),
                     msg="the canary's pod %s answered correctly (%d attempt(s))" % (pod, len(answers)))


if __name__ == "__main__":
    main()
