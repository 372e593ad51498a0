#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_engine_wait
short_description: Wait until engine pods are Ready and their AIBrix HTTPRoute is Accepted and ResolvedRefs
version_added: "0.1.0"
description:
  - Polls the engine pods (by label selector) and the HTTPRoute until all O(replicas) pods are Ready and
    every parent of the route reports C(Accepted)/C(Accepted) and C(ResolvedRefs)/C(ResolvedRefs), which is
    what the AIBrix gateway checks before it routes.
  - Fails at once when an engine container restarted (more than O(max_restarts) times, even when it is
    Ready again) or exited, cannot be created, or a pod stays unschedulable longer than
    O(schedule_timeout); the message carries the exit code or the scheduler's reason.
  - A restart or exit is judged from the pod's C(restartCount) and C(lastState.terminated) (reason, exit
    code, signal) and the log of the run that ended (C(kubectl logs --previous)), by the rules of
    M(llmops.serving.engine_diagnose) - exit 0 / C(Completed) is a crash whose status was masked (the
    message names the command that hides it and the fix), C(OOMKilled) is the kernel's OOM killer, and
    the log's root exception is named.
  - Fails when a route condition stays False for O(route_condition_timeout), naming the reason
    (C(NotAllowedByListeners), C(BackendNotFound), C(RefNotPermitted), ...) and its usual fix.
  - Returns each pod's cold-start timestamps (created, scheduled, container started, Ready).
  - Connects with kubernetes.core's authentication options and their C(K8S_AUTH_*) environment variables, so
    the credential a job applies with through M(kubernetes.core.k8s) (for AWX, the C(OpenShift or Kubernetes
    API Bearer Token) credential) is the one it waits with. Without O(host) and O(api_key) or O(kubeconfig), the
    in-cluster service account is used, then the default kubeconfig.
requirements:
  - kubernetes (Python client)
options:
  namespace:
    description: Namespace of the engine pods.
    type: str
    required: true
  selector:
    description: Labels selecting the engine pods (RV(llmops.serving.engine_manifests#module:pod_selector)).
    type: dict
    required: true
  replicas:
    description: Number of pods that must be Ready.
    type: int
    default: 1
  container:
    description: Name of the engine container in the pod.
    type: str
    default: engine
  route_name:
    description: HTTPRoute to check. Unset - only the pods are checked.
    type: str
  gateway_namespace:
    description: Namespace of the HTTPRoute.
    type: str
    default: aibrix-system
  gateway_name:
    description: Only this Gateway's parent status is considered (others are ignored when present).
    type: str
    default: aibrix-eg
  timeout:
    description: Seconds to wait in total; cover image pull plus the engine's startup window.
    type: int
    default: 4500
  route_condition_timeout:
    description:
      - Seconds a False route condition may persist before the wait fails.
      - C(route_timeout) is a deprecated alias, removed in 1.0.0. It is not the HTTPRoute's request timeout,
        which is O(llmops.serving.engine_manifests#module:route_request_timeout) (a duration).
    type: int
    default: 300
    aliases: [route_timeout]
  max_restarts:
    description:
      - Restarts of the engine container tolerated before the wait fails. A restart means the engine ended
        (a crash, an OOM kill, a probe kill), so the default is V(0).
    type: int
    default: 0
  log_tail_lines:
    description: Lines of the ended run's log read to name the exception it died of; V(0) reads none.
    type: int
    default: 3000
  schedule_timeout:
    description: Seconds a pod may stay unschedulable before the wait fails.
    type: int
    default: 900
  poll_interval:
    description: Seconds between polls.
    type: int
    default: 10
extends_documentation_fragment:
  - llmops.serving.attributes.k8s_group
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    details: Only reads the API. In check mode the state is read once and reported without waiting.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Wait for the engine and its route
  llmops.serving.k8s_engine_wait:
    namespace: llm-serving
    selector: "{{ engine_objects.pod_selector }}"
    route_name: "{{ engine_objects.route_name }}"
    timeout: 4500
  register: engine_rollout

- name: Apply and wait with one credential (AWX injects K8S_AUTH_HOST, K8S_AUTH_API_KEY ... for both)
  module_defaults:
    group/llmops.serving.k8s:
      host: https://api.gpu-lab.example.com:6443
      api_key: "{{ cluster_token }}"
      ca_cert: /etc/pki/gpu-lab-ca.pem
  block:
    - name: Apply the engine objects
      kubernetes.core.k8s:
        definition: "{{ engine_objects.objects }}"
        apply: true
    - name: Wait until they serve
      llmops.serving.k8s_engine_wait:
        namespace: llm-serving
        selector: "{{ engine_objects.pod_selector }}"
        route_name: "{{ engine_objects.route_name }}"
"""

RETURN = r"""
state:
  description: C(ready), or (with a failure) C(failed) / C(timeout).
  returned: always
  type: str
message:
  description: What is ready, or what is wrong and why.
  returned: always
  type: str
elapsed:
  description: Seconds waited.
  returned: always
  type: float
pods:
  description:
    - Per pod - name, node, state, restarts, last_exit (exit_code, reason, signal, finished, message), and epoch
      timestamps created/scheduled/started/ready.
    - C(diagnosis) - for a container that ended, C(code) (as M(llmops.serving.engine_diagnose) names it, e.g.
      C(crash_exit_zero), C(oom_killed), C(crashed)), C(evidence) and C(hint); null otherwise.
  returned: always
  type: list
  elements: dict
route:
  description: Route verdict - state, accepted, resolved_refs, reason, message, per-parent conditions.
  returned: when O(route_name) is set
  type: dict
timelines:
  description: Per pod cold-start stages known from the API (created, scheduled, container started, Ready).
  returned: always
  type: list
  elements: dict
"""

import json
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmops.serving.plugins.module_utils import _http, _k8s_client, _k8s_wait

try:
    from kubernetes import client as k8s_client
    from kubernetes.client.rest import ApiException
    HAS_K8S = True
    K8S_IMPORT_ERROR = None
except ImportError:
    HAS_K8S = False
    K8S_IMPORT_ERROR = traceback.format_exc()


def make_fetch(params):
    """Return ``fetch() -> (pods, route)`` reading the live cluster (the client from the auth options and K8S_AUTH_*)."""
    api = _k8s_client.api_client(params)
    core = k8s_client.CoreV1Api(api)
    custom = k8s_client.CustomObjectsApi(api)
    selector = ",".join("%s=%s" % kv for kv in sorted(params["selector"].items()))

    # Raw JSON (no client models): the objects exactly as the API server sends them, as recorded in tests.
    def fetch():
        resp = core.list_namespaced_pod(params["namespace"], label_selector=selector, _preload_content=False)
        pods = json.loads(resp.data).get("items", [])
        route = None
        if params["route_name"]:
            try:
                resp = custom.get_namespaced_custom_object(
                    "gateway.networking.k8s.io", "v1", params["gateway_namespace"], "httproutes", params["route_name"],
                    _preload_content=False)
                route = json.loads(resp.data)
            except ApiException as e:
                if e.status != 404:
                    raise
        return pods, route

    def read_log(pod, container, previous):
        if not params["log_tail_lines"]:
            return None
        try:
            resp = core.read_namespaced_pod_log(pod, params["namespace"], container=container, previous=previous,
                                                tail_lines=params["log_tail_lines"], _preload_content=False)
        except ApiException:
            return None  # e.g. 400 "previous terminated container not found": the kubelet kept no log
        return resp.data.decode("utf-8", "replace")

    fetch.read_log = read_log
    return fetch


def run(module, fetch):
    p = module.params
    check_route = bool(p["route_name"])
    read_log = getattr(fetch, "read_log", None)
    if module.check_mode:
        pods, route = fetch()
        verdict = _k8s_wait.evaluate(pods, route, replicas=p["replicas"], gateway_name=p["gateway_name"],
                                     check_route=check_route, container=p["container"], max_restarts=p["max_restarts"])
        if verdict["state"] == "failed" and read_log is not None:
            logs = _k8s_wait.read_logs(pods, read_log, p["container"], [ps["name"] for ps in verdict["pods"] if ps.get("diagnosis")])
            verdict = _k8s_wait.evaluate(pods, route, replicas=p["replicas"], gateway_name=p["gateway_name"],
                                         check_route=check_route, container=p["container"], logs=logs,
                                         max_restarts=p["max_restarts"])
        verdict.update(elapsed=0.0)
    else:
        verdict = _k8s_wait.wait_rollout(
            fetch, timeout=p["timeout"], route_condition_timeout=p["route_condition_timeout"],
            schedule_timeout=p["schedule_timeout"], poll_interval=p["poll_interval"], replicas=p["replicas"], gateway_name=p["gateway_name"],
            check_route=check_route, container=p["container"], read_log=read_log, max_restarts=p["max_restarts"])
    result = dict(
        changed=False,
        state=verdict["state"],
        message=verdict["message"],
        elapsed=verdict["elapsed"],
        pods=verdict["pods"],
        timelines=[dict(pod=ps["name"], **_k8s_wait.cold_start_timeline(marks=_k8s_wait.pod_marks(ps))) for ps in verdict["pods"]],
    )
    if check_route:
        result["route"] = verdict["route"]
    if verdict["state"] == "ready" or (module.check_mode and verdict["state"] == "waiting"):
        module.exit_json(**result)
    module.fail_json(msg=verdict["message"], **result)


def main():
    argument_spec = dict(
        namespace=dict(type="str", required=True),
        selector=dict(type="dict", required=True),
        replicas=dict(type="int", default=1),
        container=dict(type="str", default="engine"),
        route_name=dict(type="str"),
        gateway_namespace=dict(type="str", default="aibrix-system"),
        gateway_name=dict(type="str", default="aibrix-eg"),
        timeout=dict(type="int", default=4500),
        route_condition_timeout=dict(type="int", default=300, aliases=["route_timeout"],
                                     deprecated_aliases=[dict(name="route_timeout", version="1.0.0",
                                                              collection_name="llmops.serving")]),
        schedule_timeout=dict(type="int", default=900),
        max_restarts=dict(type="int", default=0),
        log_tail_lines=dict(type="int", default=3000),
        poll_interval=dict(type="int", default=10),
    )
    argument_spec.update(_k8s_client.argument_spec())
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    _http.refuse_url_credentials(module, _k8s_client.URL_OPTIONS)
    if not module.params["selector"]:
        module.fail_json(msg="selector: must name at least one label, e.g. the pod_selector engine_manifests returns")
    for opt in ("max_restarts", "log_tail_lines"):
        if module.params[opt] < 0:
            module.fail_json(msg="%s: must be 0 or more (got %d)" % (opt, module.params[opt]))
    if not HAS_K8S:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=K8S_IMPORT_ERROR)
    try:
        fetch = make_fetch(module.params)
    except _k8s_client.K8sClientError as e:
        module.fail_json(msg=str(e))
    run(module, fetch)


if __name__ == "__main__":
    main()
