#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_diagnose
short_description: Name why an inference engine is not serving, from the evidence it left
version_added: "0.1.0"
description:
  - Reads what the engine, Kubernetes and the gateway already recorded and returns one RV(verdict), the
    RV(findings) behind it (each with its evidence and a fix) and a one-line RV(summary).
  - O(platform=kubernetes) reads the workload O(name) (a Deployment, an AIBrix StormService or a LeaderWorkerSet)
    in O(namespace), its pods, the Events of the scheduler and the kubelet, Services, EndpointSlices,
    ReferenceGrants, the AIBrix HTTPRoute C(<served_model_name>-router) in O(gateway_namespace), and each
    container's log (current and previous). With O(objects) nothing is fetched - offline post-mortems and tests.
  - O(platform=local) reads the state file and the log of the latest start of an engine that
    M(llmops.serving.engine_process) supervises (O(run_dir)/O(name)), the engine's processes in C(/proc) and
    one C(GET /health) on the port its command names.
  - A container that ended with exit 0 (C(Completed)) is a crash whose status was masked (V(crash_exit_zero)); the
    exception line of the log is the evidence. A kill by the startup probe (V(startup_probe_killed)) reports the
    window the probe allowed (C(initialDelaySeconds + failureThreshold x periodSeconds)) and how far the log shows
    the weights had loaded. The codes and their fixes are listed in C(docs/diagnose.md).
  - A pod that is not Ready is never V(healthy), whatever its status lacks (init containers running, an eviction
    before any container status was recorded, no statuses at all) - it is V(not_ready) when no rule names more.
    Recorded objects are read as untrusted - a field of the wrong type counts as absent, never a traceback.
    Recorded objects are judged at the newest time they hold (when they were read), not at the clock of the run.
  - Only pods of the workload's current revision are judged (the current ReplicaSet's C(pod-template-hash), a
    LeaderWorkerSet's or StormService's revision); while the rollout is under way the verdict is at most
    V(rolling), and a Deployment past its progress deadline is V(rollout_stalled).
  - Only reads; nothing on the cluster or the host changes.
requirements:
  - kubernetes (Python client), only for O(platform=kubernetes) without O(objects)
options:
  platform:
    description: Where the engine runs.
    type: str
    choices: [kubernetes, local]
    default: kubernetes
  namespace:
    description: Namespace of the engine workload. Required for O(platform=kubernetes).
    type: str
  name:
    description:
      - For O(platform=kubernetes), the engine workload (Deployment, StormService or LeaderWorkerSet).
      - For O(platform=local), the M(llmops.serving.engine_process) name (directory under O(run_dir)).
    type: str
    required: true
  served_model_name:
    description:
      - The model name clients request. It must equal the pods' C(model.aibrix.ai/name) label, the engine's
        C(--served-model-name) and the HTTPRoute's C(model) header match; the route looked up is
        C(<served_model_name>-router) (AIBrix up to v0.7.0).
      - Unset - the first engine pod's C(model.aibrix.ai/name) label.
    type: str
  gateway_namespace:
    description: Namespace of the AIBrix gateway and its HTTPRoutes.
  objects:
    description:
      - Kubernetes objects to judge instead of reading the cluster (as C(kubectl get -o json) writes them, or
        C(List) objects). Pods, Events, the workload, Services, EndpointSlices, HTTPRoutes, ReferenceGrants.
      - A kind is taken as listed whole when at least one object of it is given, so an object of that kind that is
        not there counts as absent (a route's backend Service, for example); leave a kind out entirely to not judge
        it.
    type: list
    elements: dict
  logs:
    description:
      - Container logs for O(objects), keyed C(POD/CONTAINER) (or C(POD) for a pod with one container); each value
        is the log text of the running container, or a dict with C(current) and C(previous)
        (C(kubectl logs --previous)).
    type: dict
    default: {}
  log_tail_lines:
    description: Lines of each container log read from the cluster (when O(objects) is not given).
    type: int
    default: 3000
  run_dir:
    description: For O(platform=local), the O(llmops.serving.engine_process#module:run_dir) of the engine.
    type: path
  health_timeout:
    description: For O(platform=local), seconds one C(GET /health) may take before a running engine counts as hung.
    type: float
    default: 5.0
extends_documentation_fragment:
  - llmops.serving.attributes.k8s_group
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.node.proc_root
  - llmops.serving.gateway.namespace
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    details: Only reads (the cluster, the engine's files, one GET /health); runs the same in check mode.
notes:
  - The kubernetes.core authentication options are used only when O(platform=kubernetes) and O(objects) is not
    given.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Why is the GLM engine not serving?
  llmops.serving.engine_diagnose:
    namespace: llm-serving
    name: glm-5-2-fp8-vllm
    served_model_name: glm-5.2-fp8-vllm
  register: diagnosis

- name: Print the verdict first
  ansible.builtin.debug:
    msg: "{{ [diagnosis.summary] + diagnosis.findings | map(attribute='code') | list }}"

- name: Post-mortem on saved objects (kubectl get pods,events,svc,endpointslices -o json) and logs
  llmops.serving.engine_diagnose:
    namespace: llm-prod
    name: qwen35-397b-sglang
    objects: "{{ (lookup('ansible.builtin.file', 'incident/objects.json') | from_json)['items'] }}"
    logs:
      qwen35-397b-sglang-6b7f8c9d5-zt2lr/engine:
        previous: "{{ lookup('ansible.builtin.file', 'incident/engine.previous.log') }}"

- name: The local engine started by llmops.serving.engine_process
  llmops.serving.engine_diagnose:
    platform: local
    run_dir: /var/tmp/llmops/run
    name: engine
"""

RETURN = r"""
verdict:
  description: The code of the most severe finding (root causes before their consequences), or V(healthy).
  returned: always
  type: str
  sample: startup_probe_killed
findings:
  description:
    - What was found, most severe first. C(code) (see C(docs/diagnose.md)), C(severity) (V(error), V(warning),
      V(info)), C(object) (the pod, container, route or engine it concerns), C(evidence) (facts read from events,
      statuses and logs; the first is the headline) and C(hint) (what fixes it).
  returned: always
  type: list
  elements: dict
  sample:
    - code: crash_exit_zero
      severity: error
      object: pod llm-prod/qwen35-397b-sglang-6b7f8c9d5-zt2lr container engine
      evidence:
        - container engine (restarted 5 times) exited with status 0 (Completed); an inference server never exits 0 on its own
        - "log (kubectl logs --previous): TypeError: 'NoneType' object cannot be interpreted as an integer"
      hint: A crash whose exit status was masked ...
summary:
  description: One line a person reads first - the verdict, what it concerns and its headline evidence.
  returned: always
  type: str
"""

import importlib

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmops.serving.plugins.module_utils.common import _http, _option_specs
from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose_local, _process_state
from ansible_collections.llmops.serving.plugins.module_utils.kube import (
    _aibrix_route, _diagnose_k8s, _k8s_client, _k8s_clock,
)
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, check_value


def _api_client(module):
    """A kubernetes ApiClient from the kubernetes.core auth options and K8S_AUTH_* (imported only when needed)."""
    try:
        importlib.import_module("kubernetes")
        return _k8s_client.api_client(module.params)
    except ImportError as e:
        module.fail_json(msg=missing_required_lib("kubernetes", reason="to read the cluster (or give objects to "
                                                  "judge recorded objects)"), exception=str(e))
    except _k8s_client.K8sClientError as e:
        module.fail_json(msg=str(e))


def main():
    argument_spec = dict(
        platform=dict(type="str", choices=["kubernetes", "local"], default="kubernetes"),
        namespace=dict(type="str"),
        name=dict(type="str", required=True),
        served_model_name=dict(type="str"),
        objects=dict(type="list", elements="dict"),
        logs=dict(type="dict", default={}),
        log_tail_lines=dict(type="int", default=3000),
        run_dir=dict(type="path"),
        health_timeout=dict(type="float", default=5.0),
    )
    argument_spec.update(_aibrix_route.gateway_argument_spec(name=False))
    argument_spec.update(_option_specs.node("proc_root"))
    argument_spec.update(_k8s_client.argument_spec())
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_if=[("platform", "kubernetes", ["namespace"]), ("platform", "local", ["run_dir"])],
        supports_check_mode=True,
    )
    _http.refuse_url_credentials(module, _k8s_client.URL_OPTIONS)
    p = module.params
    if p["platform"] == "local":
        if p["health_timeout"] <= 0:
            module.fail_json(msg="health_timeout: must be more than 0 seconds (a running engine must answer GET /health "
                                 "within it); the default is 5")
        try:
            facts = _diagnose_local.local_facts(p["run_dir"], p["name"], proc_root=p["proc_root"],
                                                health_timeout=p["health_timeout"])
        except _process_state.ProcessError as e:
            module.fail_json(msg=str(e), **e.details)
        module.exit_json(changed=False, **_diagnose_local.diagnose_local(facts))
    if p["log_tail_lines"] < 1:
        module.fail_json(msg="log_tail_lines: must be at least 1 (the exception line is near the end of a log)")
    bad = [k for k, v in (p["logs"] or {}).items()
           if not (isinstance(v, str) or (isinstance(v, dict) and set(v) <= {"current", "previous"}))]
    if bad:
        module.fail_json(msg="logs: the value of %s must be the log text or a dict with current and/or previous"
                             % ", ".join(sorted(map(str, bad))[:5]))
    if p["objects"] is not None:
        try:
            objects, logs, listed = check_value(p["objects"], "objects"), check_value(p["logs"], "logs"), None
        except UntrustedInput as e:
            module.fail_json(msg=str(e), reason=e.limit)
        # judged when they were read (their newest time), not at this run's clock: a recording from last week
        # must not read as a week of waiting
        now = _k8s_clock.read_time(objects)
    else:
        api = _api_client(module)
        try:
            objects, logs, listed, now = _diagnose_k8s.fetch_kubernetes(
                api, p["namespace"], p["name"], p["gateway_namespace"], p["log_tail_lines"])
        except UntrustedInput as e:
            module.fail_json(msg="reading namespace %s from the cluster: %s" % (p["namespace"], e), reason=e.limit)
        except Exception as e:  # pylint: disable=broad-except  # ApiException, urllib3 and socket errors
            status = getattr(e, "status", None)
            why = ("the API server answered %s %s" % (status, getattr(e, "reason", "") or "") if status
                   else type(e).__name__)
            module.fail_json(msg="reading namespace %s from the cluster failed: %s; check the credentials' RBAC "
                                 "(list pods, events, services, endpointslices, httproutes, referencegrants; read "
                                 "pods/log)" % (p["namespace"], why.strip()))
    module.exit_json(changed=False, **_diagnose_k8s.diagnose_kubernetes(
        objects, logs, namespace=p["namespace"], name=p["name"], served_model_name=p["served_model_name"],
        gateway_namespace=p["gateway_namespace"], listed_kinds=listed, now=now))


if __name__ == "__main__":
    main()
