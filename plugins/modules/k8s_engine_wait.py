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
  - With O(workload_name) the CURRENT revision is waited for, not assumed - a Deployment's C(generation) observed,
    C(updatedReplicas) and C(availableReplicas) equal to its replicas and no old replicas left, only pods of the
    current ReplicaSet's C(pod-template-hash) counted (a LeaderWorkerSet's and a StormService's status the same
    way). Right after a re-apply the old pod is still Ready; that is C(rolling), not ready.
  - With O(models_url) the rollout is ready only once C(/v1/models) there lists the current revision's model path
    as C(root) (vLLM and SGLang report the path they loaded), so the answer is proven to come from the new pods.
  - Through an AIBrix gateway, whose C(/v1/models) names no C(root), the proof comes from what is live
    (RV(revision_proof)) - with O(gateway_url), one short completion is sent through the gateway; when its answer names
    the pod that served it (C(target-pod), C(target-pod-ip), set by AIBrix only when a routing strategy picked a pod),
    that pod must be a Ready pod of the current revision. Otherwise the Service the route points at (O(service_name),
    else the HTTPRoute's backend) must have no ready endpoint outside the current revision (its EndpointSlices), so
    no old pod can still answer. A failure names the old pod and its revision.
  - Fails within a few polls, not at O(timeout), on what never clears - an image the registry does not have, a
    volume that keeps failing to mount, no feasible node even with preemption, a pod evicted under node pressure
    - with the diagnosis of M(llmops.serving.engine_diagnose) (a liveness kill of a serving engine is
    C(engine_hung), an eviction C(evicted)).
  - With O(workload_name), fails within about a minute when the workload's controller cannot create its pods (Pod
    Security, a ResourceQuota, an admission webhook) - C(ReplicaFailure) on the Deployment, its ReplicaSet or a
    StormService's RoleSet, C(FailedCreate) Events on them or on a LeaderWorkerSet's StatefulSets - quoting the API
    server's refusal. Reading those needs list on C(statefulsets) or C(rolesets.orchestration.aibrix.ai) and on
    C(events); without them the wait still runs, and times out instead.
  - Every age it judges (pending, failing, held) is one API time against another - the C(Date) of the API server's
    answers, the objects' own times - or what this module measured on its monotonic clock; the controller's
    wall clock is never compared with the cluster's.
  - O(objects) judges recorded objects instead of reading the cluster (once, no polling), by the same code, so a
    wait can be replayed offline.
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
  gateway_name:
    description: Only this Gateway's parent status is considered (others are ignored when present).
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
  workload_kind:
    description: Kind of the engine workload (RV(llmops.serving.engine_manifests#module:workload)).
    type: str
    choices: [Deployment, LeaderWorkerSet, StormService]
    default: Deployment
  workload_name:
    description:
      - Name of the engine workload. Set, the wait judges its current revision (see the description). Unset, every
        pod the selector matches counts, whichever revision it runs.
    type: str
  models_url:
    description:
      - Base URL (the Service or the gateway) whose C(GET /v1/models) must list the current revision's model path
        as C(root) before the rollout is ready. Needs O(workload_name). No credentials in the URL; give them in
        O(models_headers).
    type: str
  models_headers:
    description: Headers of the C(/v1/models) request (for example the C(model) header or an Authorization).
    type: dict
    default: {}
  objects:
    description:
      - Recorded objects to judge instead of reading the cluster - what the API returned, for example
        C(kubectl get pods,replicasets,deployments,statefulsets,events,httproutes -A -o json) (a C(List); with a
        StormService also its C(rolesets)) or a list of objects
        and Lists. Judged once; no credentials are needed. The result is what a poll of those objects would say at
        the moment they were recorded (their newest timestamp), so an old recording does not read as time waited.
      - Fields of the wrong type count as absent; a document nested too deeply or with numbers out of range is
        refused.
    type: raw
  models:
    description: With O(objects), a recorded C(/v1/models) answer to judge in place of O(models_url).
    type: dict
  service_name:
    description:
      - The Service that serves the engine (RV(llmops.serving.engine_manifests#module:service_name)), in O(namespace).
        With O(workload_name) its EndpointSlices (label C(kubernetes.io/service-name)) must have a ready endpoint and
        none outside the current revision before the rollout is ready.
      - Unset, the Service the HTTPRoute O(route_name) points at (its first C(Service) backend) is used; with neither,
        endpoints are not read.
    type: str
  gateway_url:
    description:
      - Base URL of the AIBrix gateway. With O(workload_name), once the rollout is otherwise ready one completion
        (C(max_tokens) 1, no C(model) header, so the gateway plugin routes it) is sent for O(served_model_name); when the
        answer names the pod that served it (C(target-pod)/C(target-pod-ip)), that pod must be a Ready pod of the
        current revision. An answer that names no pod (no routing strategy in force) or no answer at all leaves the
        proof to the Service's endpoints.
      - No credentials in the URL; give them in O(gateway_headers).
    type: str
  gateway_headers:
    description: Headers of that request (for example C(routing-strategy) or an Authorization).
    type: dict
    default: {}
  served_model_name:
    description: The model of that request. Unset - the current revision's first C(--served-model-name).
    type: str
  answer_headers:
    description:
      - With O(objects), the response headers of a recorded answer through the gateway (C(target-pod),
        C(target-pod-ip)) to judge in place of O(gateway_url).
      - Each value is a string, as a header's value is; another type is refused (C(reason=answer_headers_type)).
    type: dict
extends_documentation_fragment:
  - llmops.serving.attributes.k8s_group
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - kubernetes.core.k8s_auth_options
  - llmops.serving.gateway
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
rollout:
  description:
    - The workload's rollout - C(kind), C(name), C(state) (C(done), C(rolling), C(failed)), C(message),
      C(generation), C(observed_generation), C(replicas), C(updated), C(ready), C(available), C(revision_label),
      C(revision) (the current C(pod-template-hash) or revision) and C(current_pods).
  returned: when O(workload_name) is set
  type: dict
revision:
  description:
    - What the current revision serves and the proof it answers - C(image), C(model_path) (the C(root) its engine
      lists), C(served_names), C(revision), C(pods), C(pod_addresses) (the current revision's pods, C(name) and
      C(ip)), C(generation), and with O(models_url) C(proven) (the answer lists C(model_path)) and C(answered_roots).
  returned: when O(workload_name) is set
  type: dict
revision_proof:
  description:
    - Which live evidence proved that the answer comes from the current revision, and whether it held - C(by)
      (C(root) - the C(/v1/models) answer lists the model path; C(target-pod-ip) or C(target-pod) - the pod the
      gateway's answer names, with C(pod), C(ip), its C(revision) and C(current_revision); C(endpoints) - the
      Service's ready endpoints, with C(service) and C(ready_endpoints) (C(pod), C(ip), C(revision))) and C(held).
    - Null while the rollout is not otherwise ready, or when nothing live could be read (no O(models_url),
      O(gateway_url) or Service).
  returned: when O(workload_name) is set
  type: dict
  sample: {by: endpoints, held: true, service: llm-lab/glm-5-2-fp8-vllm, current_revision: 5d8f7c9b6,
           ready_endpoints: [{pod: glm-5-2-fp8-vllm-5d8f7c9b6-x2x4q, ip: 10.244.1.7, revision: 5d8f7c9b6}]}
timelines:
  description: Per pod cold-start stages known from the API (created, scheduled, container started, Ready).
  returned: always
  type: list
  elements: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route, _k8s_client, _k8s_revision, _k8s_shape, _k8s_wait
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, check_value, loads_json

try:
    from kubernetes import client as k8s_client
    from kubernetes.client.rest import ApiException
    HAS_K8S = True
    K8S_IMPORT_ERROR = None
except ImportError:
    HAS_K8S = False
    K8S_IMPORT_ERROR = traceback.format_exc()


_WORKLOAD_API = {"LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
                 "StormService": ("orchestration.aibrix.ai", "v1alpha1", "stormservices")}
MAX_API_BYTES = 64 * 1024 * 1024
#: the kinds whose FailedCreate Events say that the workload's pods cannot be created (_k8s_revision.create_failure)
_CREATORS = {"Deployment": ("Deployment", "ReplicaSet"), "LeaderWorkerSet": ("LeaderWorkerSet", "StatefulSet"),
             "StormService": ("StormService", "RoleSet")}


def _matches(selector, obj):
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def service_of(params, route):
    """``(namespace, name)`` of the Service whose endpoints prove the revision: O(service_name), else the route's first
    Service backend (Gateway API v1.4.1 BackendRef: group ``""``, kind ``Service`` and the route's namespace by
    default); None without either."""
    if params.get("service_name"):
        return params["namespace"], params["service_name"]
    for rule in ((route or {}).get("spec") or {}).get("rules") or []:
        for ref in rule.get("backendRefs") or []:
            if (ref.get("group") or "") == "" and (ref.get("kind") or "Service") == "Service" and ref.get("name"):
                return ref.get("namespace") or (route.get("metadata") or {}).get("namespace") or params["namespace"], ref["name"]
    return None


def select(params, objects, selected=False, slices_read=False):
    """``{pods, route, workload, replicasets, events, endpointslices, service}`` of the engine among shaped ``objects``
    (``selected``: the Pods were listed by the selector already; ``slices_read``: the Service's EndpointSlices were
    listed, so none among ``objects`` means it has none). Recorded objects without any EndpointSlice did not record
    them: ``endpointslices`` is None."""
    ns, selector = params["namespace"], params["selector"]

    def of(kind, namespace=ns):
        return [o for o in objects if o["kind"] == kind and (o.get("metadata") or {}).get("namespace", namespace) == namespace]

    def named(kind, namespace, name):
        return next((o for o in of(kind, namespace) if (o.get("metadata") or {}).get("name") == name), None)

    workload = named(params["workload_kind"], ns, params["workload_name"]) if params["workload_name"] else None
    route = named("HTTPRoute", params["gateway_namespace"], params["route_name"]) if params["route_name"] else None
    svc = service_of(params, route)
    slices = None
    if svc is not None and (slices_read or any(o["kind"] == "EndpointSlice" for o in objects)):
        slices = [o for o in of("EndpointSlice", svc[0]) if _matches({_k8s_revision.SERVICE_NAME_LABEL: svc[1]}, o)]
    return dict(pods=[p for p in of("Pod") if selected or _matches(selector, p)], route=route,
                workload=workload, replicasets=of("ReplicaSet") if workload is not None else None, events=of("Event"),
                controllers=of("StatefulSet") + of("RoleSet") if workload is not None else None,
                endpointslices=slices, service="%s/%s" % svc if svc else None)


def make_fetch(params):
    """Return ``fetch() -> {pods, route, workload, replicasets, events}`` reading the live cluster (the client from
    the auth options and K8S_AUTH_*)."""
    api = _k8s_client.api_client(params)
    core = k8s_client.CoreV1Api(api)
    custom = k8s_client.CustomObjectsApi(api)
    apps = k8s_client.AppsV1Api(api)
    discovery = k8s_client.DiscoveryV1Api(api)
    selector = ",".join("%s=%s" % kv for kv in sorted(params["selector"].items()))
    ns = params["namespace"]

    dates = []

    # Raw JSON (no client models): the objects exactly as the API server sends them, as recorded in tests, read as
    # untrusted input and shaped. The Date header of each answer is the API server's clock (_k8s_clock): the time
    # the read is judged at.
    def raw(call, *args, **kwargs):
        resp = call(*args, _preload_content=False, **kwargs)
        dates.append((getattr(resp, "headers", None) or {}).get("Date"))
        return loads_json(resp.data, "the API server's answer", max_bytes=MAX_API_BYTES)

    def listed(kind, call, *args, **kwargs):
        return _k8s_shape.shape_objects([dict(raw(call, *args, **kwargs), kind=kind + "List")])

    def optional(kind, call, *args, **kwargs):
        try:
            return listed(kind, call, *args, **kwargs)
        except ApiException as e:
            if e.status not in (403, 404):
                raise
            return []  # not installed, or not readable with these credentials: judged without it

    def one(kind, call, *args):
        try:
            return _k8s_shape.shape_objects([dict(raw(call, *args), kind=kind)])
        except ApiException as e:
            if e.status != 404:
                raise
            return []

    def fetch():
        del dates[:]
        objects = listed("Pod", core.list_namespaced_pod, ns, label_selector=selector)
        if params["route_name"]:
            objects += one("HTTPRoute", custom.get_namespaced_custom_object, "gateway.networking.k8s.io", "v1",
                           params["gateway_namespace"], "httproutes", params["route_name"])
        if params["workload_name"]:
            kind = params["workload_kind"]
            if kind == "Deployment":
                objects += one(kind, apps.read_namespaced_deployment, params["workload_name"], ns)
                objects += listed("ReplicaSet", apps.list_namespaced_replica_set, ns, label_selector=selector)
            else:
                group, version, plural = _WORKLOAD_API[kind]
                objects += one(kind, custom.get_namespaced_custom_object, group, version, ns, plural,
                               params["workload_name"])
            # the controllers that create the pods: what they fail to create shows on them, not on a pod
            if kind == "LeaderWorkerSet":
                objects += optional("StatefulSet", apps.list_namespaced_stateful_set, ns, label_selector="%s=%s" % (
                    _k8s_revision.LWS_NAME_LABEL, params["workload_name"]))
            elif kind == "StormService":
                objects += optional("RoleSet", custom.list_namespaced_custom_object, "orchestration.aibrix.ai",
                                    "v1alpha1", ns, "rolesets", label_selector="%s=%s" % (
                                        _k8s_revision.STORM_NAME_LABEL, params["workload_name"]))
            for involved in ("Pod",) + _CREATORS[kind]:
                objects += listed("Event", core.list_namespaced_event, ns, field_selector="involvedObject.kind=" + involved)
        svc = service_of(params, next((o for o in objects if o["kind"] == "HTTPRoute"), None)) \
            if params["workload_name"] else None
        if svc is not None:
            objects += listed("EndpointSlice", discovery.list_namespaced_endpoint_slice, svc[0],
                              label_selector="%s=%s" % (_k8s_revision.SERVICE_NAME_LABEL, svc[1]))
        return dict(select(params, objects, selected=True, slices_read=svc is not None), dates=list(dates))

    def read_log(pod, container, previous):
        if not params["log_tail_lines"]:
            return None
        try:
            resp = core.read_namespaced_pod_log(pod, ns, container=container, previous=previous,
                                                tail_lines=params["log_tail_lines"], _preload_content=False)
        except ApiException:
            return None  # e.g. 400 "previous terminated container not found": the kubelet kept no log
        return resp.data.decode("utf-8", "replace")

    fetch.read_log = read_log
    return fetch


def make_answer(params):
    """``answer() -> /v1/models body or None`` for O(models_url) (None when unset or when it does not answer)."""
    if not params["models_url"]:
        return None

    def answer():
        try:
            return _http.get_json(params["models_url"].rstrip("/") + "/v1/models", headers=params["models_headers"],
                                  timeout=10)
        except (_http.HttpError, UntrustedInput, ValueError):
            return None
    return answer


def make_served(params):
    """``served(revision) -> response headers or None`` for O(gateway_url): one completion through the gateway
    (None when unset, when no model is known, or when no answer came)."""
    if not params["gateway_url"]:
        return None

    def served(revision):
        model = params["served_model_name"] or ((revision or {}).get("served_names") or [None])[0]
        if not model:
            return None
        payload = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
        try:
            resp = _http.request("POST", params["gateway_url"].rstrip("/") + "/v1/completions", payload=payload,
                                 headers=params["gateway_headers"], timeout=30)
            return dict(resp.headers)
        except _http.HttpError as e:
            # an error answer still names the pod a routing strategy picked (the plugin sets the headers on any status)
            return dict(e.headers) if e.status is not None else None
    return served


def run(module, fetch, answer=None, served=None):
    p = module.params
    check_route = bool(p["route_name"])
    read_log = getattr(fetch, "read_log", None)
    kw = dict(replicas=p["replicas"], gateway_name=p["gateway_name"], check_route=check_route,
              container=p["container"], max_restarts=p["max_restarts"])
    if p["objects"] is not None or module.check_mode:
        if p["objects"] is not None and p["models"] is not None:
            def answer():
                return p["models"]  # the recorded answer
        if p["objects"] is not None and p["answer_headers"] is not None:
            def served(revision):
                return dict((str(k).lower(), v) for k, v in p["answer_headers"].items())  # the recorded answer
        # one read, judged at its own API time (the newest time it carries): a recording replayed a week later, or
        # a controller whose clock is off, reads no extra waiting
        verdict = _k8s_wait.judge(fetch, read_log=read_log, answer=answer, served=served,
                                  schedule_timeout=p["schedule_timeout"], **kw)
        verdict.update(elapsed=0.0)
    else:
        verdict = _k8s_wait.wait_rollout(
            fetch, timeout=p["timeout"], route_condition_timeout=p["route_condition_timeout"],
            schedule_timeout=p["schedule_timeout"], poll_interval=p["poll_interval"], read_log=read_log,
            answer=answer, served=served, **kw)
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
    if p["workload_name"]:
        result.update(rollout=verdict.get("rollout"), revision=verdict.get("revision"),
                      revision_proof=verdict.get("revision_proof"))
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
        timeout=dict(type="int", default=4500),
        route_condition_timeout=dict(type="int", default=300, aliases=["route_timeout"],
                                     deprecated_aliases=[dict(name="route_timeout", version="1.0.0",
                                                              collection_name="llmops.serving")]),
        schedule_timeout=dict(type="int", default=900),
        max_restarts=dict(type="int", default=0),
        log_tail_lines=dict(type="int", default=3000),
        poll_interval=dict(type="int", default=10),
        workload_kind=dict(type="str", default="Deployment", choices=["Deployment", "LeaderWorkerSet", "StormService"]),
        workload_name=dict(type="str"),
        models_url=dict(type="str"),
        models_headers=dict(type="dict", default={}, no_log=True),
        objects=dict(type="raw"),
        models=dict(type="dict"),
        service_name=dict(type="str"),
        gateway_url=dict(type="str"),
        gateway_headers=dict(type="dict", default={}, no_log=True),
        served_model_name=dict(type="str"),
        answer_headers=dict(type="dict"),
    )
    argument_spec.update(_aibrix_route.gateway_argument_spec())
    argument_spec.update(_k8s_client.argument_spec())
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    _http.refuse_url_credentials(module, dict(_k8s_client.URL_OPTIONS,
                                              models_url="give them in models_headers (for example Authorization)",
                                              gateway_url="give them in gateway_headers (for example Authorization)"))
    if not module.params["selector"]:
        module.fail_json(msg="selector: must name at least one label, e.g. the pod_selector engine_manifests returns")
    for opt in ("max_restarts", "log_tail_lines"):
        if module.params[opt] < 0:
            module.fail_json(msg="%s: must be 0 or more (got %d)" % (opt, module.params[opt]))
    p = module.params
    if p["models_url"] and not p["workload_name"]:
        module.fail_json(msg="models_url: needs workload_name (the revision whose model path /v1/models must list)")
    if p["gateway_url"] and not p["workload_name"]:
        module.fail_json(msg="gateway_url: needs workload_name (the revision whose pods must answer through the gateway)")
    if p["objects"] is not None:
        if not isinstance(p["objects"], (list, dict)):
            module.fail_json(msg="objects: must be a list of Kubernetes objects or a List (kubectl get -o json), "
                                 "not a %s" % type(p["objects"]).__name__, reason="objects_type")
        try:
            check_value(p["objects"], "objects")
            check_value(p["models"], "models")
            check_value(p["answer_headers"], "answer_headers")
        except UntrustedInput as e:
            module.fail_json(msg=str(e), reason=e.limit)
        for name, value in sorted((p["answer_headers"] or {}).items(), key=lambda kv: str(kv[0])):
            if value is not None and not isinstance(value, str):
                module.fail_json(msg="answer_headers.%s: must be a string, as a response header's value is (got a %s); "
                                     "quote it, as the gateway sent it" % (name, type(value).__name__),
                                 reason="answer_headers_type")
        recorded = select(p, _k8s_shape.shape_objects(p["objects"]))
        run(module, lambda: recorded)
    if not HAS_K8S:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=K8S_IMPORT_ERROR)
    try:
        fetch = make_fetch(p)
    except _k8s_client.K8sClientError as e:
        module.fail_json(msg=str(e))
    run(module, fetch, make_answer(p), make_served(p))


if __name__ == "__main__":
    main()
