# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: why a Kubernetes-served model does not answer, over its whole workload.

* :func:`diagnose_kubernetes` - pure: Kubernetes objects (dicts as the API returns them) and log texts in,
  findings and the verdict out: the workload and its pods (``_diagnose_pods``), the served model names, the
  AIBrix route (Gateway API conditions, ReferenceGrants) and the Service's endpoints.
* :func:`fetch_kubernetes` - reads those objects and logs with a ``kubernetes`` ApiClient (raw JSON, through the
  shared reader).
"""
from __future__ import annotations

import json

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_clock, _k8s_names, _k8s_revision, _k8s_shape, _k8s_wait
from ansible_collections.llmops.serving.plugins.module_utils.engine._diagnose import command_facts, finding, result
from ansible_collections.llmops.serving.plugins.module_utils.kube._diagnose_pods import (
    KubeContext, container_argv, event_text, map_selects, obj_meta, obj_name, obj_ns, pod_findings, pod_ready, ref,
    rule_not_ready, selector_matches,
)
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import loads_json

#: The gateway looks the model up through this route name (AIBrix v0.3.0-v0.7.0, pkg/plugins/gateway/gateway.go).
AIBRIX_NAME_LABEL = "model.aibrix.ai/name"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # EndpointSlice -> Service (discovery.k8s.io/v1)
# Pods of the workload kinds, by the label their controller sets.
STORM_LABEL = "storm-service-name"  # AIBrix pkg/controller/constants/stormservice.go
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"  # kubernetes-sigs/lws api/leaderworkerset/v1/labels


WORKLOAD_KINDS = ("Deployment", "StormService", "LeaderWorkerSet")


def _templates(workload):
    """Pod templates of a workload (Deployment; AIBrix StormService roles; LeaderWorkerSet leader/worker)."""
    spec = workload.get("spec") or {}
    kind = workload.get("kind")
    if kind == "Deployment":
        return [spec.get("template") or {}]
    if kind == "StormService":
        return [r.get("template") or {} for r in ((spec.get("template") or {}).get("spec") or {}).get("roles") or []]
    if kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    return []


def _workload_pods(ctx, workload):
    pods = ctx.o.of("Pod", ctx.namespace)
    if workload is not None:
        kind = workload.get("kind")
        if kind == "Deployment":
            sel = (workload.get("spec") or {}).get("selector")
            return [p for p in pods if selector_matches(sel, obj_meta(p).get("labels"))]
        label = STORM_LABEL if kind == "StormService" else LWS_LABEL
        return [p for p in pods if (obj_meta(p).get("labels") or {}).get(label) == ctx.name]
    for label in ("app.kubernetes.io/name", STORM_LABEL, LWS_LABEL, "app"):
        found = [p for p in pods if (obj_meta(p).get("labels") or {}).get(label) == ctx.name]
        if found:
            return found
    return [p for p in pods if obj_name(p).startswith(ctx.name + "-")]


# ---- names, routes, endpoints ------------------------------------------------------------------

def _header_models(route):
    """Values of the ``model`` header matches (AIBrix modelrouter_controller.go: header ``model`` Exact)."""
    out = []
    for rule in (route.get("spec") or {}).get("rules") or []:
        for m in rule.get("matches") or []:
            for h in m.get("headers") or []:
                if (h.get("name") or "").lower() == "model" and h.get("value") not in out:
                    out.append(h.get("value"))
    return out


def rule_served_names(ctx, pods, templates):
    """The AIBrix label, the engine's --served-model-name and the requested name must be byte-identical
    (AIBrix samples/disaggregation/vllm/README.md; the gateway answers 400 "model ... does not exist" otherwise)."""
    labels, engine_names = {}, {}
    sources = [("pod %s/%s" % (obj_ns(p), obj_name(p)), obj_meta(p).get("labels") or {}, (p.get("spec") or {}).get("containers") or [])
               for p in pods]
    if not sources:
        sources = [("pod template", (t.get("metadata") or {}).get("labels") or {}, (t.get("spec") or {}).get("containers") or [])
                   for t in templates]
    for where, lab, containers in sources:
        if AIBRIX_NAME_LABEL in lab:
            labels.setdefault(lab[AIBRIX_NAME_LABEL], where)
        for c in containers:
            cmd = command_facts(container_argv(c))
            if cmd["engine"] and cmd["served_names"]:
                engine_names.setdefault(tuple(cmd["served_names"]), (where, c.get("name"), cmd["served_names_given"]))
    ev = []
    label_values = sorted(labels)
    if len(label_values) > 1:
        ev.append("pods carry different %s labels: %s" % (AIBRIX_NAME_LABEL, ", ".join(repr(v) for v in label_values)))
    label = label_values[0] if label_values else None
    for names, (where, cname, given) in engine_names.items():
        if label is not None and label not in names:
            ev.append("%s container %s serves %s%s but is labelled %s=%r" % (
                where, cname, " ".join(repr(n) for n in names), "" if given else " (no --served-model-name: the "
                "model path is the name)", AIBRIX_NAME_LABEL, label))
    wanted = ctx.served_model_name
    if wanted and label is not None and wanted != label:
        ev.append("the requested model %r differs from the label %s=%r" % (wanted, AIBRIX_NAME_LABEL, label))
    if wanted and label is None and engine_names and not any(wanted in n for n in engine_names):
        names = sorted({n for ns in engine_names for n in ns})
        ev.append("the requested model %r is not served (the engine serves %s)" % (wanted, ", ".join(map(repr, names))))
    route = _aibrix_route(ctx, wanted or label)
    if route is not None:
        expect = wanted or label
        other = [h for h in _header_models(route) if h != expect]
        if other:
            ev.append("%s matches header model=%s, not %r" % (ref(route), ",".join(repr(h) for h in other), expect))
    if not ev:
        return None
    return finding("served_name_mismatch", "model %s" % (wanted or label or "?"), ev,
                   "Use one name in all places: the request's model, the pod label %s, the engine's "
                   "--served-model-name and the route's header match (dots are fine in a label and a route name, "
                   "not in a Service name)." % AIBRIX_NAME_LABEL)


def _model_name(ctx, pods):
    """The requested model, else the AIBrix label of the first engine pod."""
    if ctx.served_model_name:
        return ctx.served_model_name
    for p in pods:
        labels = obj_meta(p).get("labels") or {}
        if AIBRIX_NAME_LABEL in labels:
            return labels[AIBRIX_NAME_LABEL]
    return None


def _aibrix_route(ctx, model):
    if not model:
        return None
    return ctx.o.get("HTTPRoute", ctx.gateway_namespace, "%s-router" % model)


def _grant_permits(grants, route_ns, svc_ns, svc_name):
    """gateway-api apis/v1beta1/referencegrant_types.go: a grant in the target's namespace, from HTTPRoute in
    ``route_ns`` (group gateway.networking.k8s.io), to core Services (group "", name empty or equal)."""
    for g in grants:
        if obj_ns(g) != svc_ns:
            continue
        spec = g.get("spec") or {}
        frm = any(f.get("group") == "gateway.networking.k8s.io" and f.get("kind") == "HTTPRoute"
                  and f.get("namespace") == route_ns for f in spec.get("from") or [])
        to = any((t.get("group") or "") == "" and t.get("kind") == "Service" and (not t.get("name") or t.get("name") == svc_name)
                 for t in spec.get("to") or [])
        if frm and to:
            return g
    return None


def rule_routes(ctx, pods):
    """The AIBrix route ``<model>-router`` in the gateway namespace: present, Accepted, its backends resolvable.

    Conditions and reasons from gateway-api apis/v1/shared_types.go (Accepted: NotAllowedByListeners,
    NoMatchingParent, ...; ResolvedRefs: BackendNotFound, RefNotPermitted, InvalidKind); AIBrix routes only when
    Accepted/Accepted and ResolvedRefs/ResolvedRefs (pkg/plugins/gateway, 503 otherwise).
    """
    model = _model_name(ctx, pods)
    if not model:
        return []
    rname = "%s-router" % model
    rref = "HTTPRoute %s/%s" % (ctx.gateway_namespace, rname)
    route = _aibrix_route(ctx, model)
    out = []
    if route is None:
        if "HTTPRoute" not in ctx.o.listed:
            return []
        others = [r for r in ctx.o.of("HTTPRoute") if model in _header_models(r)]
        ev = ["there is no %s; the AIBrix gateway looks model %r up by exactly that name" % (rref, model)]
        ev += ["%s matches header model=%r but the gateway never reads it" % (ref(r), model) for r in others[:3]]
        try:
            _k8s_names.route_name(model)
        except ValueError as e:
            ev.append(str(e))
        return [finding("route_missing", rref, ev,
                        "Create the HTTPRoute %s in %s (llmops.serving.engine_manifests renders it), or let the AIBrix "
                        "controller create it from the workload's model label; do not rename it." % (rname, ctx.gateway_namespace))]
    # backends
    missing_ev, existing = [], []
    for rule in (route.get("spec") or {}).get("rules") or []:
        for b in rule.get("backendRefs") or []:
            if (b.get("kind") or "Service") != "Service" or (b.get("group") or "") != "":
                continue
            svc_ns = b.get("namespace") or obj_ns(route)
            svc_name = b.get("name") or ""
            svc = ctx.o.get("Service", svc_ns, svc_name)
            if svc is None and "Service" in ctx.o.listed:
                line = "backendRef Service %s/%s does not exist" % (svc_ns, svc_name)
                if not _k8s_names.is_dns1035_label(svc_name):
                    line += (" and never can: a Service name is a DNS-1035 label (lowercase letters, digits and '-', "
                             "starting with a letter; no dots)")
                # the name engine_manifests derives now, or the one earlier versions derived
                derived = (_k8s_names.service_name(svc_name), _k8s_names.legacy_service_name(svc_name))
                safe = [s for s in ctx.o.of("Service", svc_ns) if obj_name(s) in derived]
                if safe:
                    line += "; Service %s/%s exists" % (svc_ns, obj_name(safe[0]))
                    existing.append(obj_name(safe[0]))
                missing_ev.append(line)
            elif svc_ns != obj_ns(route) and "ReferenceGrant" in ctx.o.listed and \
                    not _grant_permits(ctx.o.of("ReferenceGrant"), obj_ns(route), svc_ns, svc_name):
                missing_ev.append("no ReferenceGrant in %s lets HTTPRoutes from %s reach Service %s"
                                  % (svc_ns, obj_ns(route), svc_name))
    accepted_ev = []
    parents = (route.get("status") or {}).get("parents") or []
    for parent in parents:
        gw = (parent.get("parentRef") or {}).get("name", "?")
        for ctype, good in (("Accepted", "Accepted"), ("ResolvedRefs", "ResolvedRefs")):
            cond = _k8s_shape.condition(parent.get("conditions"), ctype)
            if cond is None or (cond.get("status") == "True" and cond.get("reason") == good):
                continue
            line = "gateway %s: %s=%s reason %s: %s" % (gw, ctype, cond.get("status"), cond.get("reason"), cond.get("message", ""))
            explain = _k8s_wait.ROUTE_REASONS.get(cond.get("reason"))
            if ctype == "ResolvedRefs" and cond.get("status") == "False":
                missing_ev.append(line)
            else:
                accepted_ev.append(line + ("" if not explain else " (%s)" % explain))
    if not parents:
        accepted_ev.append("no gateway controller has reported on the route (status.parents is empty): its parentRef "
                           "names no Gateway that a controller serves")
    if missing_ev:
        out.append(finding("route_backend_not_found", rref, missing_ev,
                           "Point backendRefs at the engine's DNS-safe Service (%s for model %s, the name "
                           "llmops.serving.engine_manifests gives it), create that Service in the engine namespace, and "
                           "a ReferenceGrant there from HTTPRoutes in %s; the gateway answers 503 until ResolvedRefs is "
                           "True." % ((existing or [_k8s_names.service_name(model)])[0], model, ctx.gateway_namespace)))
    if accepted_ev:
        out.append(finding("route_not_accepted", rref, ["the route is not accepted: %s" % accepted_ev[0]] + accepted_ev[1:],
                           "The Gateway must accept the route: parentRef names the AIBrix Gateway (aibrix-eg in "
                           "aibrix-system) and its listener's allowedRoutes admits the route's namespace."))
    return out


def _named_port(pod, name):
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == name:
                return True
    return False


def rule_endpoints(ctx, pods, route):
    """Services of the engine with no ready endpoint although an engine pod is Ready (selector or targetPort
    mismatch). EndpointSlice endpoints[].conditions.ready: nil means ready (discovery.k8s.io/v1 types.go)."""
    names = set()
    for s in ctx.o.of("Service", ctx.namespace):
        if any(map_selects((s.get("spec") or {}).get("selector"), obj_meta(p).get("labels")) for p in pods):
            names.add((obj_ns(s), obj_name(s)))
    if route is not None:
        for rule in (route.get("spec") or {}).get("rules") or []:
            for b in rule.get("backendRefs") or []:
                if (b.get("kind") or "Service") == "Service":
                    names.add((b.get("namespace") or obj_ns(route), b.get("name")))
    ready_pods = [p for p in pods if (_k8s_shape.condition((p.get("status") or {}).get("conditions"), "Ready") or {}).get("status") == "True"]
    out = []
    for svc_ns, svc_name in sorted(names):
        svc = ctx.o.get("Service", svc_ns, svc_name)
        if svc is None:
            continue
        sref = "Service %s/%s" % (svc_ns, svc_name)
        sel = (svc.get("spec") or {}).get("selector") or {}
        selected = [p for p in pods if map_selects(sel, obj_meta(p).get("labels"))]
        if pods and not selected:
            labels = obj_meta(pods[0]).get("labels") or {}
            out.append(finding("service_no_endpoints", sref,
                               ["%s selects none of the engine's pods: selector %s, pod labels %s" % (
                                   sref, json.dumps(sel, sort_keys=True), json.dumps(labels, sort_keys=True))],
                               "Make the Service selector a subset of the engine pods' labels."))
            continue
        if "EndpointSlice" not in ctx.o.listed or not ready_pods:
            continue  # nothing to compare, or the pods explain it
        slices = [e for e in ctx.o.of("EndpointSlice", svc_ns) if (obj_meta(e).get("labels") or {}).get(SERVICE_NAME_LABEL) == svc_name]
        ready = sum(1 for sl in slices for ep in sl.get("endpoints") or []
                    if ((ep.get("conditions") or {}).get("ready")) is not False)
        if ready:
            continue
        ev = ["%s has no ready endpoint although %d engine pod(s) are Ready" % (sref, len(ready_pods))]
        ev.append("%d EndpointSlice(s) labelled %s=%s" % (len(slices), SERVICE_NAME_LABEL, svc_name))
        for port in (svc.get("spec") or {}).get("ports") or []:
            tp = port.get("targetPort")
            if isinstance(tp, str) and not _named_port(ready_pods[0], tp):
                ev.append("targetPort %r names no container port of the pods" % tp)
        out.append(finding("service_no_endpoints", sref, ev,
                           "Check the Service's targetPort against the container's named port and that the "
                           "EndpointSlice controller runs; the gateway has nowhere to send requests."))
    return out


def diagnose_kubernetes(objects, logs=None, namespace=None, name=None, served_model_name=None,
                        gateway_namespace="aibrix-system", now=None, listed_kinds=None):
    """Findings for the engine workload ``name`` in ``namespace`` from recorded or fetched objects.

    ``listed_kinds``: the kinds listed whole (an object of such a kind that is not there does not exist); by
    default every kind present in ``objects``.
    """
    ctx = KubeContext(objects, logs, namespace, name, served_model_name, gateway_namespace, now, listed_kinds)
    findings = []
    workload = None
    for kind in WORKLOAD_KINDS:
        workload = ctx.o.get(kind, namespace, name)
        if workload is not None:
            break
    pods = [p for p in _workload_pods(ctx, workload) if not obj_meta(p).get("deletionTimestamp")]
    wref = ref(workload) if workload else "workload %s/%s" % (namespace, name)
    if workload is None and not pods and any(k in ctx.o.listed for k in WORKLOAD_KINDS):
        findings.append(finding("workload_not_found", wref,
                                ["no Deployment, StormService or LeaderWorkerSet %s/%s and no pods of it" % (namespace, name)],
                                "Check name and namespace (the engine role names the Deployment after the DNS-safe "
                                "service name, e.g. glm-5-2-fp8-vllm)."))
    elif workload is not None and not pods:
        evs = []
        for e in ctx.events:
            if e["reason"] in ("FailedCreate", "FailedCreatePodSandBox", "ProgressDeadlineExceeded") or (
                    e["kind"] in WORKLOAD_KINDS + ("ReplicaSet",) and e["type"] == "Warning"):
                evs.append(event_text(e))
        replicas = (workload.get("spec") or {}).get("replicas")
        findings.append(finding("no_pods", wref, ["the workload has no pods (spec.replicas %s)" % replicas] + evs[-3:],
                                "The controller did not create pods: read its events (quota, admission webhooks, "
                                "an unknown serviceAccount) or scale it up."))
    rollout = None
    if workload is not None:
        rollout = _k8s_revision.rollout_status(workload, ctx.o.of("ReplicaSet", namespace), pods, list(
            _k8s_revision.owned_controllers(workload, ctx.o.of("RoleSet", namespace))))
    judged = pods
    if rollout is not None and rollout["current_pods"] is not None:
        judged = [p for p in pods if obj_name(p) in rollout["current_pods"]]
    old = [p for p in pods if p not in judged]
    for pod in judged:
        findings.extend(pod_findings(ctx, pod))
    if rollout is not None and rollout["state"] == "failed":
        findings.append(finding("rollout_stalled", wref, [rollout["message"]] + [
            event_text(e) for e in ctx.events_for(workload.get("kind"), name) if e["type"] == "Warning"][-2:],
            "The controller gave up waiting for the new pods: the pod findings say why they are not available; fix "
            "that, or raise progressDeadlineSeconds above the cold start (the engine role sizes it from "
            "engine_startup_timeout)."))
    elif rollout is not None and rollout["state"] != "done":
        ev = [rollout["message"]]
        if old:
            ev.append("%d pod(s) of an earlier revision do not count: %s" % (len(old), ", ".join(obj_name(p) for p in old[:4])))
        findings.append(finding("rolling", wref, ev, "Not an error: the new revision is being rolled out; it serves "
                                                     "once its pods are Ready and the old ones are gone."))
    templates = _templates(workload) if workload else []
    f = rule_served_names(ctx, judged, templates)
    if f:
        findings.append(f)
    findings.extend(rule_routes(ctx, judged))
    findings.extend(rule_endpoints(ctx, judged, _aibrix_route(ctx, _model_name(ctx, judged))))
    ready = [p for p in judged if pod_ready(p)]
    for pod in judged:
        if not pod_ready(pod) and not any(f["object"] == "pod %s/%s" % (obj_ns(pod), obj_name(pod))
                                          or f["object"].startswith("pod %s/%s " % (obj_ns(pod), obj_name(pod)))
                                          for f in findings):
            findings.append(rule_not_ready(ctx, pod))
    if not findings and ready and len(ready) == len(judged):
        ev = ["%d/%d pod(s) of %s Ready" % (len(ready), len(judged), wref)]
        if rollout is not None:
            ev.append(rollout["message"])
        route = _aibrix_route(ctx, served_model_name)
        if route is not None:
            ev.append("%s Accepted and ResolvedRefs" % ref(route))
        findings.append(finding("healthy", wref, ev, "Nothing to fix."))
    if not findings:
        findings.append(finding("no_pods", wref, ["none of the %d pod(s) given belongs to %s" % (
            len(ctx.o.of("Pod")), wref)], "Give the workload's pods (kubectl get pods -o json) or check name and "
                                          "namespace: without a pod there is no evidence that it serves."))
    return result(findings)


# --------------------------------------------------------------------------------------------- #
# Kubernetes: reading the objects (raw JSON through a kubernetes ApiClient)
# --------------------------------------------------------------------------------------------- #

# (kind, group, version, plural, namespaced-in) read for one diagnosis.
_WORKLOAD_APIS = (
    ("Deployment", "apps", "v1", "deployments"),
    ("StormService", "orchestration.aibrix.ai", "v1alpha1", "stormservices"),
    ("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)
LOG_TAIL_LINES = 3000
#: Largest list answer read from the API server (a namespace's Events can be large; a bigger one is refused).
MAX_API_BYTES = 64 * 1024 * 1024


def fetch_kubernetes(api_client, namespace, name, gateway_namespace="aibrix-system", log_tail_lines=LOG_TAIL_LINES):
    """``(objects, logs, listed_kinds, read_at)`` for :func:`diagnose_kubernetes`, read with ``api_client``;
    ``read_at`` is the API server's time of the read (``_k8s_clock.read_time``: its answers' ``Date`` headers and the
    objects' own times), the ``now`` to judge them at.

    Lists Pods, Events, Services, EndpointSlices and ReferenceGrants in ``namespace``, HTTPRoutes in both
    namespaces, the workload by name, and each engine pod's container logs (current and previous). A kind whose
    API is not installed (no LeaderWorkerSet CRD) is skipped and not counted as listed.
    """
    from kubernetes import client as k8s_client  # pylint: disable=import-outside-toplevel
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel

    core = k8s_client.CoreV1Api(api_client)
    custom = k8s_client.CustomObjectsApi(api_client)
    apps = k8s_client.AppsV1Api(api_client)
    disc = k8s_client.DiscoveryV1Api(api_client)

    dates = []

    def raw(call, *args, **kwargs):
        resp = call(*args, _preload_content=False, **kwargs)
        dates.append((getattr(resp, "headers", None) or {}).get("Date"))  # the API server's clock (_k8s_clock)
        # the answer is untrusted input: size, nesting and numbers are checked before anything reads it
        return loads_json(resp.data, "the API server's answer (%s)" % getattr(call, "__name__", "list"),
                          max_bytes=MAX_API_BYTES)

    def listed(kind, call, *args, **kwargs):
        try:
            data = raw(call, *args, **kwargs)
        except ApiException as e:
            if e.status in (403, 404):
                return None
            raise
        items = data.get("items") if isinstance(data, dict) and isinstance(data.get("items"), list) else []
        return [x for x in (_k8s_shape.shape(item, kind) for item in items) if x is not None]

    objects, kinds = [], set()
    plan = [
        ("Pod", core.list_namespaced_pod, (namespace,)),
        ("Event", core.list_namespaced_event, (namespace,)),
        ("Service", core.list_namespaced_service, (namespace,)),
        ("EndpointSlice", disc.list_namespaced_endpoint_slice, (namespace,)),
        ("ReferenceGrant", custom.list_namespaced_custom_object, ("gateway.networking.k8s.io", "v1beta1", namespace,
                                                                  "referencegrants")),
    ]
    for ns in sorted({gateway_namespace, namespace}):
        plan.append(("HTTPRoute", custom.list_namespaced_custom_object, ("gateway.networking.k8s.io", "v1", ns, "httproutes")))
    for kind, group, version, plural in _WORKLOAD_APIS:
        if kind == "Deployment":
            plan.append((kind, apps.list_namespaced_deployment, (namespace,)))
            plan.append(("ReplicaSet", apps.list_namespaced_replica_set, (namespace,)))
        else:
            plan.append((kind, custom.list_namespaced_custom_object, (group, version, namespace, plural)))
    # a StormService's RoleSets tell which pods are of its current revision (_k8s_revision.rollout_status)
    plan.append(("RoleSet", custom.list_namespaced_custom_object, ("orchestration.aibrix.ai", "v1alpha1", namespace,
                                                                   "rolesets")))
    for kind, call, args in plan:
        items = listed(kind, call, *args)
        if items is not None:
            kinds.add(kind)
            objects.extend(items)
    ctx = KubeContext(objects, {}, namespace, name, None, gateway_namespace, None, kinds)
    workload = None
    for kind in WORKLOAD_KINDS:
        workload = ctx.o.get(kind, namespace, name)
        if workload is not None:
            break
    logs = {}
    for pod in _workload_pods(ctx, workload):
        statuses = ((pod.get("status") or {}).get("containerStatuses") or []) + \
            ((pod.get("status") or {}).get("initContainerStatuses") or [])
        for cs in statuses:
            entry = {}
            for which, previous in (("current", False), ("previous", True)):
                if previous and not (cs.get("lastState") or {}).get("terminated"):
                    continue
                try:
                    resp = core.read_namespaced_pod_log(obj_name(pod), namespace, container=cs.get("name"), previous=previous,
                                                        tail_lines=log_tail_lines, _preload_content=False)
                    entry[which] = resp.data.decode("utf-8", "replace")
                except ApiException:
                    continue  # no such container instance (yet, or any more)
            if entry:
                logs["%s/%s" % (obj_name(pod), cs.get("name"))] = entry
    return objects, logs, sorted(kinds), _k8s_clock.read_time(objects, dates)
