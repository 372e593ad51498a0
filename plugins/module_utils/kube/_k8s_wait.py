# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: pure functions over Kubernetes API objects (plain dicts as the API returns them).

* :func:`shape` / :func:`shape_objects` - the one place recorded or fetched objects are made safe to judge: every
  field the collection reads is kept only with the type the API defines (a string, an integer, a list, a map),
  anything else counts as absent. ``engine_diagnose`` and ``k8s_engine_wait`` judge only shaped objects, so a
  field of the wrong type is never a traceback.
* :func:`route_status` - an HTTPRoute's parent conditions. Healthy means what the AIBrix gateway checks
  before routing: ``Accepted`` with reason ``Accepted`` and ``ResolvedRefs`` with reason ``ResolvedRefs``.
* :func:`rollout_status` - whether the workload's CURRENT revision is rolled out (Deployment generation,
  ``observedGeneration``, ``updatedReplicas``, ``availableReplicas``, old replicas; LeaderWorkerSet and
  StormService status the same way) and which pods belong to that revision (``pod-template-hash`` of the
  current ReplicaSet; pods of an old ReplicaSet do not count).
* :func:`pod_status` - where an engine pod is: unscheduled, starting, ready, or failed. A failure is named by
  ``_diagnose_pods``'s rules over the pod, its Events and the log of the run that ended (one code for the wait and
  the diagnosis). A container that restarted and is Ready again is still failed (beyond ``max_restarts``):
  the restart hid the crash, it did not fix it. What never clears by waiting (a missing image, a mount that
  keeps failing, no feasible node, an eviction) fails at once.
* :func:`revision_proof` - that the answer comes from the current revision, from what is live: the ``root`` a
  ``/v1/models`` answer lists, else the pod AIBrix's gateway names in ``target-pod``/``target-pod-ip``, else the
  ready endpoints of the Service the route points at (no old pod left that could answer).
* :func:`evaluate` - one verdict for a rollout from the objects and the route, given the clock.
* :func:`cold_start_timeline` - a pod's timestamps and probe marks as ``_timeline.staged``: pod created ->
  scheduled -> container started -> port open -> /health 200 -> model listed -> first correct response;
  the SLO figure is the first to the last.

No I/O here; the polling module feeds these the objects it reads, and tests feed recorded ones.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose
from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_pods

# Why each Gateway API reason happens, and what fixes it (gateway-api apis/v1/shared_types.go).
ROUTE_REASONS = {
    "NotAllowedByListeners": "the Gateway's listeners do not admit routes from this namespace or of this kind; "
    "check the listener's allowedRoutes on the Gateway",
    "NoMatchingListenerHostname": "no listener hostname matches the route's hostnames",
    "NoMatchingParent": "the parentRef names no existing Gateway/listener (check gateway_name, namespace, sectionName)",
    "UnsupportedValue": "the route uses a value the gateway implementation does not support",
    "Pending": "the gateway controller has not processed the route yet",
    "BackendNotFound": "the backend Service does not exist; it must be created in the engine namespace under the "
    "DNS-safe name the route points at (AIBrix <= v0.7 would look for a Service named exactly the model, "
    "which is impossible for names with dots)",
    "RefNotPermitted": "the route references a Service in another namespace and no ReferenceGrant there allows "
    "HTTPRoutes from the gateway namespace to reach it",
    "InvalidKind": "the backendRef kind/group is not a Service",
    "UnsupportedProtocol": "the backend Service's port protocol is not supported by the gateway",
}

FATAL_WAITING = {
    "CrashLoopBackOff": "the engine keeps exiting",
    "CreateContainerConfigError": "the container spec references something missing (a Secret or ConfigMap key?)",
    "CreateContainerError": "the runtime could not create the container",
    "InvalidImageName": "the image reference is malformed",
}
PULL_WAITING = {"ErrImagePull", "ImagePullBackOff"}

# --------------------------------------------------------------------------------------------- #
# Shapes: every field read, with the type the API defines (k8s.io/api core/v1, apps/v1, events/v1,
# discovery/v1 types.go; Gateway API v1.4.1 and AIBrix v0.7.0 CRDs; kubernetes-sigs/lws api/leaderworkerset/v1)
# --------------------------------------------------------------------------------------------- #

S, I, B = str, int, bool
_DROP = object()
_STRMAP = {"*": S}
_META = {"name": S, "namespace": S, "uid": S, "generation": I, "labels": _STRMAP, "annotations": _STRMAP,
         "creationTimestamp": S, "deletionTimestamp": S, "resourceVersion": S,
         "ownerReferences": [{"apiVersion": S, "kind": S, "name": S, "uid": S, "controller": B}]}
_COND = {"type": S, "status": S, "reason": S, "message": S, "lastTransitionTime": S, "lastUpdateTime": S,
         "lastProbeTime": S, "observedGeneration": I}
_PROBE = {"initialDelaySeconds": I, "periodSeconds": I, "failureThreshold": I, "successThreshold": I,
          "timeoutSeconds": I, "terminationGracePeriodSeconds": I,
          "httpGet": {"path": S, "port": (I, S), "scheme": S}, "tcpSocket": {"port": (I, S)}, "exec": {"command": [S]}}
_CONTAINER = {"name": S, "image": S, "command": [S], "args": [S],
              "ports": [{"name": S, "containerPort": I, "protocol": S}],
              "resources": {"limits": {"*": (S, I)}, "requests": {"*": (S, I)}},
              "startupProbe": _PROBE, "livenessProbe": _PROBE, "readinessProbe": _PROBE,
              "env": [{"name": S, "value": S}],
              "volumeMounts": [{"name": S, "mountPath": S, "subPath": S, "readOnly": B}]}
_POD_SPEC = {"nodeName": S, "containers": [_CONTAINER], "initContainers": [_CONTAINER], "nodeSelector": _STRMAP,
             "volumes": [{"name": S, "hostPath": {"path": S, "type": S},
                          "persistentVolumeClaim": {"claimName": S, "readOnly": B}}],
             "shareProcessNamespace": B, "hostNetwork": B, "restartPolicy": S, "terminationGracePeriodSeconds": I}
_STATE = {"waiting": {"reason": S, "message": S}, "running": {"startedAt": S},
          "terminated": {"exitCode": I, "signal": I, "reason": S, "message": S, "startedAt": S, "finishedAt": S}}
_CSTATUS = {"name": S, "ready": B, "started": B, "restartCount": I, "state": _STATE, "lastState": _STATE,
            "image": S, "imageID": S, "containerID": S}
_TEMPLATE = {"metadata": {"labels": _STRMAP, "annotations": _STRMAP}, "spec": _POD_SPEC}
_SELECTOR = {"matchLabels": _STRMAP, "matchExpressions": [{"key": S, "operator": S, "values": [S]}]}
_HEAD = {"apiVersion": S, "kind": S, "metadata": _META}
_REF = {"kind": S, "name": S, "namespace": S, "uid": S, "fieldPath": S}
_PARENT_REF = {"group": S, "kind": S, "name": S, "namespace": S, "sectionName": S}

SHAPES = {
    "Pod": dict(_HEAD, spec=_POD_SPEC, status={
        "phase": S, "reason": S, "message": S, "startTime": S, "podIP": S, "hostIP": S, "nominatedNodeName": S,
        "conditions": [_COND], "containerStatuses": [_CSTATUS], "initContainerStatuses": [_CSTATUS]}),
    "Event": dict(_HEAD, involvedObject=_REF, regarding=_REF, reason=S, message=S, note=S, type=S, count=I,
                  deprecatedCount=I, series={"count": I, "lastObservedTime": S}, firstTimestamp=S,
                  lastTimestamp=S, eventTime=S, deprecatedFirstTimestamp=S, deprecatedLastTimestamp=S,
                  source={"component": S, "host": S}, reportingComponent=S),
    "Deployment": dict(_HEAD, spec={
        "replicas": I, "selector": _SELECTOR, "template": _TEMPLATE, "paused": B, "progressDeadlineSeconds": I,
        "strategy": {"type": S, "rollingUpdate": {"maxSurge": (I, S), "maxUnavailable": (I, S)}}},
        status={"observedGeneration": I, "replicas": I, "updatedReplicas": I, "readyReplicas": I,
                "availableReplicas": I, "unavailableReplicas": I, "collisionCount": I, "conditions": [_COND]}),
    "ReplicaSet": dict(_HEAD, spec={"replicas": I, "selector": _SELECTOR, "template": _TEMPLATE},
                       status={"replicas": I, "readyReplicas": I, "availableReplicas": I, "observedGeneration": I}),
    "LeaderWorkerSet": dict(_HEAD, spec={
        "replicas": I, "startupPolicy": S,
        "leaderWorkerTemplate": {"size": I, "restartPolicy": S, "leaderTemplate": _TEMPLATE, "workerTemplate": _TEMPLATE}},
        status={"replicas": I, "readyReplicas": I, "updatedReplicas": I, "hpaPodSelector": S, "conditions": [_COND]}),
    "StormService": dict(_HEAD, spec={
        "replicas": I, "selector": _SELECTOR,
        "template": {"metadata": {"labels": _STRMAP}, "spec": {"roles": [{"name": S, "replicas": I, "template": _TEMPLATE}]}}},
        status={"observedGeneration": I, "replicas": I, "readyReplicas": I, "notReadyReplicas": I,
                "currentReplicas": I, "updatedReplicas": I, "updatedReadyReplicas": I, "currentRevision": S,
                "updateRevision": S, "conditions": [_COND]}),
    "Service": dict(_HEAD, spec={"type": S, "selector": _STRMAP,
                                 "ports": [{"name": S, "port": I, "targetPort": (I, S), "protocol": S}]}),
    "EndpointSlice": dict(_HEAD, endpoints=[{"addresses": [S], "conditions": {"ready": B, "serving": B, "terminating": B},
                                             "targetRef": _REF}]),
    "HTTPRoute": dict(_HEAD, spec={
        "parentRefs": [_PARENT_REF], "hostnames": [S],
        "rules": [{"matches": [{"path": {"type": S, "value": S}, "headers": [{"type": S, "name": S, "value": S}]}],
                   "backendRefs": [{"group": S, "kind": S, "name": S, "namespace": S, "port": I, "weight": I}],
                   "timeouts": {"request": S, "backendRequest": S}}]},
        status={"parents": [{"parentRef": _PARENT_REF, "controllerName": S, "conditions": [_COND]}]}),
    "ReferenceGrant": dict(_HEAD, spec={"from": [{"group": S, "kind": S, "namespace": S}],
                                        "to": [{"group": S, "kind": S, "name": S}]}),
}
#: The largest magnitude an integer field may have (the API's int64); beyond it the field counts as absent.
MAX_INT = 2 ** 63


def _shape(value, schema):
    """``value`` reduced to ``schema`` (a type, a tuple of alternatives, ``[item]``, ``{field: schema}`` or
    ``{"*": schema}``), or ``_DROP``. Recursion follows the schema, never the input, so it is bounded."""
    if schema is S:
        return value if isinstance(value, str) else _DROP
    if schema is I:
        return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_INT else _DROP
    if schema is B:
        return value if isinstance(value, bool) else _DROP
    if isinstance(schema, tuple):
        for alt in schema:
            out = _shape(value, alt)
            if out is not _DROP:
                return out
        return _DROP
    if isinstance(schema, list):
        if not isinstance(value, list):
            return _DROP
        items = (_shape(v, schema[0]) for v in value)
        return [v for v in items if v is not _DROP]
    if not isinstance(value, dict):
        return _DROP
    if "*" in schema:
        items = ((k, _shape(v, schema["*"])) for k, v in value.items() if isinstance(k, str))
        return dict((k, v) for k, v in items if v is not _DROP)
    out = {}
    for key, sub in schema.items():
        if key in value:
            v = _shape(value[key], sub)
            if v is not _DROP:
                out[key] = v
    return out


def shape(obj, kind=None):
    """``obj`` with only the fields the collection reads, each of its API type (others absent); ``kind`` is the
    default for an object without one (the items of a ``PodList``). None for what is not an object of a
    known kind."""
    if not isinstance(obj, dict):
        return None
    k = obj.get("kind") if isinstance(obj.get("kind"), str) else kind
    if k not in SHAPES:
        return None
    out = _shape(obj, SHAPES[k])
    out["kind"] = k
    out.setdefault("metadata", {})
    return out


def shape_objects(objects):
    """Shaped objects from a list of objects and/or Lists (``kubectl get -o json``: ``{"kind": "List", "items":
    [...]}``, an API ``PodList`` whose items carry no kind) or one such List. Unknown kinds are left out."""
    if isinstance(objects, dict):
        objects = [objects]
    out = []
    for obj in objects if isinstance(objects, list) else []:
        if not isinstance(obj, dict):
            continue
        items = obj.get("items")
        if isinstance(items, list):
            lkind = obj.get("kind") if isinstance(obj.get("kind"), str) else ""
            default = lkind[:-4] if lkind.endswith("List") and lkind != "List" else None
            out.extend(x for x in (shape(item, default) for item in items) if x is not None)
            continue
        shaped = shape(obj)
        if shaped is not None:
            out.append(shaped)
    return out


def shape_logs(logs):
    """``{"POD/CONTAINER" or "POD": text or {"current": text, "previous": text}}`` with text values only."""
    out = {}
    for key, value in (logs.items() if isinstance(logs, dict) else []):
        if isinstance(value, str):
            out[str(key)] = value
        elif isinstance(value, dict):
            entry = dict((w, value[w]) for w in ("current", "previous") if isinstance(value.get(w), str))
            if entry:
                out[str(key)] = entry
    return out


# --------------------------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------------------------- #


def parse_time(value):
    """``_timeline.parse_time`` that answers None for a time that cannot be one (a recorded object may hold
    anything)."""
    try:
        return _timeline.parse_time(value)
    except (TypeError, ValueError, OverflowError):
        return None


def condition(conditions, ctype):
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond
    return None


def _name(obj):
    meta = obj.get("metadata", {})
    return "%s/%s" % (meta.get("namespace", ""), meta.get("name", ""))


def _labels(obj):
    return (obj.get("metadata") or {}).get("labels") or {}


# --------------------------------------------------------------------------------------------- #
# HTTPRoute
# --------------------------------------------------------------------------------------------- #


def route_status(route, gateway_name=None):
    """Summarise an HTTPRoute's ``status.parents``.

    Returns ``dict(state=ready|pending|failed, accepted, resolved_refs, reason, message, parents)``.
    ``failed`` means a condition is False with a known reason; the caller decides how long to let the
    controller converge before treating that as final.
    """
    route = shape(route, "HTTPRoute") if route is not None else None
    if route is None:
        return dict(state="pending", accepted=None, resolved_refs=None, reason="NotFound",
                    message="the HTTPRoute does not exist (yet)", parents=[])
    generation = route.get("metadata", {}).get("generation")
    parents = route.get("status", {}).get("parents") or []
    if gateway_name:
        parents = [p for p in parents if (p.get("parentRef") or {}).get("name") == gateway_name] or parents
    if not parents:
        return dict(state="pending", accepted=None, resolved_refs=None, reason="NoStatus",
                    message="no gateway controller has reported on %s yet; check that its parentRef names an "
                    "existing Gateway and that the gateway controller runs" % _name(route), parents=[])
    summaries = []
    verdict = None
    for parent in parents:
        conds = parent.get("conditions") or []
        acc = condition(conds, "Accepted")
        res = condition(conds, "ResolvedRefs")
        gw = (parent.get("parentRef") or {}).get("name", "?")
        summary = dict(gateway=gw, controller=parent.get("controllerName"),
                       accepted=_cond_view(acc), resolved_refs=_cond_view(res))
        summaries.append(summary)
        stale = any(c.get("observedGeneration") is not None and generation is not None
                    and c["observedGeneration"] < generation for c in (acc, res) if c)
        for ctype, cond, good in (("Accepted", acc, "Accepted"), ("ResolvedRefs", res, "ResolvedRefs")):
            if cond is None or stale:
                verdict = verdict or ("pending", "Pending", "%s on %s: %s not reported for the current generation yet"
                                      % (_name(route), gw, ctype))
            elif cond.get("status") != "True" or cond.get("reason") != good:
                reason = cond.get("reason") or "Unknown"
                explain = ROUTE_REASONS.get(reason, "see the condition message")
                state = "pending" if cond.get("status") == "Unknown" or reason == "Pending" else "failed"
                msg = "%s on gateway %s: %s=%s reason %s: %s (%s)" % (
                    _name(route), gw, ctype, cond.get("status"), reason, cond.get("message", ""), explain)
                if verdict is None or verdict[0] != "failed":
                    verdict = (state, reason, msg)
    accepted = all(s["accepted"] and s["accepted"]["status"] == "True" for s in summaries)
    resolved = all(s["resolved_refs"] and s["resolved_refs"]["status"] == "True" for s in summaries)
    if verdict is None:
        return dict(state="ready", accepted=True, resolved_refs=True, reason="Accepted",
                    message="%s: Accepted and ResolvedRefs are True" % _name(route), parents=summaries)
    return dict(state=verdict[0], accepted=accepted, resolved_refs=resolved, reason=verdict[1],
                message=verdict[2], parents=summaries)


def _cond_view(cond):
    if not cond:
        return None
    return dict(status=cond.get("status"), reason=cond.get("reason"), message=cond.get("message"),
                last_transition=cond.get("lastTransitionTime"))


# --------------------------------------------------------------------------------------------- #
# Rollout: which revision is current, and is it rolled out
# --------------------------------------------------------------------------------------------- #

#: kubernetes/kubernetes pkg/apis/apps types.go DefaultDeploymentUniqueLabelKey: the controller labels the pods of
#: each ReplicaSet with the hash of its template (pkg/controller/deployment/sync.go getNewReplicaSet).
HASH_LABEL = "pod-template-hash"
#: pkg/controller/deployment/util/deployment_util.go RevisionAnnotation, on the Deployment and each ReplicaSet.
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
#: kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go RevisionKey (every pod of a group).
LWS_REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
#: vllm-project/aibrix v0.7.0 pkg/controller/constants/stormservice.go StormServiceRevisionLabelKey.
STORM_REVISION_LABEL = "storm-service-revision"


def _int(value, default=0):
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _template_without_hash(template):
    t = dict(template or {})
    meta = dict(t.get("metadata") or {})
    meta["labels"] = dict((k, v) for k, v in (meta.get("labels") or {}).items() if k != HASH_LABEL)
    t["metadata"] = meta
    return t


def current_replicaset(deployment, replicasets):
    """The Deployment's new ReplicaSet: the oldest one it owns whose template equals the Deployment's ignoring
    ``pod-template-hash`` (pkg/controller/deployment/util/deployment_util.go FindNewReplicaSet, EqualIgnoreHash);
    else the one with the Deployment's revision annotation. None when it is not among ``replicasets``."""
    meta = deployment.get("metadata") or {}
    uid = meta.get("uid")
    owned = []
    for rs in replicasets or []:
        refs = (rs.get("metadata") or {}).get("ownerReferences") or []
        if uid and any(r.get("uid") == uid for r in refs) or not uid and any(
                r.get("kind") == "Deployment" and r.get("name") == meta.get("name") for r in refs):
            owned.append(rs)
    owned.sort(key=lambda rs: parse_time((rs.get("metadata") or {}).get("creationTimestamp")) or 0)
    want = _template_without_hash((deployment.get("spec") or {}).get("template"))
    for rs in owned:
        if _template_without_hash((rs.get("spec") or {}).get("template")) == want:
            return rs
    rev = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    for rs in owned:
        if rev and ((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION) == rev:
            return rs
    return None


def _engine_template(workload):
    spec = workload.get("spec") or {}
    kind = workload.get("kind")
    if kind == "Deployment":
        return spec.get("template") or {}
    if kind == "LeaderWorkerSet":
        return (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    roles = ((spec.get("template") or {}).get("spec") or {}).get("roles") or []
    return (roles[0].get("template") or {}) if roles else {}


def revision_facts(workload, container="engine"):
    """What the workload's current template serves: the engine image, the model path (the ``root`` the engine
    lists in ``/v1/models``) and the served names, read from the engine container's command."""
    spec = _engine_template(workload).get("spec") or {}
    containers = spec.get("containers") or []
    engine = next((c for c in containers if c.get("name") == container), containers[0] if containers else {})
    cmd = _diagnose.command_facts(list(engine.get("command") or []) + list(engine.get("args") or []))
    return dict(image=engine.get("image"), model_path=cmd.get("model"), served_names=cmd.get("served_names") or [])


def rollout_status(workload, replicasets=None, pods=None):
    """Whether the workload's current revision is rolled out, and which pods are of it.

    Returns ``dict(kind, name, state=done|rolling|failed, message, generation, observed_generation, replicas,
    updated, ready, available, revision_label, revision, current_pods)``; ``current_pods`` is None when the
    current revision cannot be told apart (then every pod counts, and only a rolled-out status proves there are
    no old ones).

    * Deployment (kubectl pkg/polymorphichelpers/rollout_status.go DeploymentStatusViewer, the rule
      ``kubectl rollout status`` and kubernetes.core's waiter apply): the controller has observed the current
      generation; no ``Progressing`` condition with reason ``ProgressDeadlineExceeded``; ``updatedReplicas`` ==
      ``spec.replicas``; no old replicas (``status.replicas`` == ``updatedReplicas``); ``availableReplicas`` >=
      ``updatedReplicas``. Current pods carry the new ReplicaSet's ``pod-template-hash``.
    * LeaderWorkerSet (kubernetes-sigs/lws leaderworkerset_types.go): no ``UpdateInProgress``/``Progressing``
      condition True, ``Available`` True, ``updatedReplicas`` and ``readyReplicas`` == ``spec.replicas``;
      current pods carry the newest ``template-revision-hash`` while it rolls.
    * StormService (AIBrix v0.7.0 CRD status): ``observedGeneration`` >= generation, ``currentRevision`` ==
      ``updateRevision``, ``updatedReplicas`` and ``updatedReadyReplicas`` == ``spec.replicas``; current pods
      carry ``storm-service-revision`` = ``updateRevision``.
    """
    kind = workload.get("kind")
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    want = _int(spec.get("replicas"), 1)
    gen = _int(meta.get("generation"), None)
    observed = _int(status.get("observedGeneration"), None)
    out = dict(kind=kind, name=meta.get("name"), generation=gen, observed_generation=observed, replicas=want,
               updated=_int(status.get("updatedReplicas")), ready=_int(status.get("readyReplicas")),
               available=_int(status.get("availableReplicas")), revision_label=None, revision=None, current_pods=None)
    pods = pods or []
    label, value = None, None
    if kind == "Deployment":
        label = HASH_LABEL
        rs = current_replicaset(workload, replicasets)
        if rs is not None:
            value = ((rs.get("metadata") or {}).get("labels") or {}).get(HASH_LABEL)
    elif kind == "LeaderWorkerSet":
        label = LWS_REVISION_LABEL
        # the newest pod's hash: the controller recreates groups with the new template, never the old one
        hashes = [(parse_time((p.get("metadata") or {}).get("creationTimestamp")) or 0, _labels(p).get(label))
                  for p in pods if _labels(p).get(label)]
        value = max(hashes)[1] if hashes else None
    elif kind == "StormService":
        label = STORM_REVISION_LABEL
        value = status.get("updateRevision") if any(label in _labels(p) for p in pods) else None
    if value:
        out.update(revision_label=label, revision=value,
                   current_pods=[(p.get("metadata") or {}).get("name") for p in pods if _labels(p).get(label) == value])
    name = "%s %s" % (kind, meta.get("name"))
    waiting = None
    if kind == "Deployment":
        progressing = condition(status.get("conditions"), "Progressing") or {}
        if gen is not None and (observed is None or observed < gen):
            waiting = "%s: waiting for the controller to observe generation %s (observedGeneration %s)" % (name, gen, observed)
        elif progressing.get("reason") == "ProgressDeadlineExceeded":
            out.update(state="failed", message="%s exceeded its progress deadline (progressDeadlineSeconds %s): %s" % (
                name, spec.get("progressDeadlineSeconds", 600), progressing.get("message", "")))
            return out
        elif out["updated"] < want:
            waiting = "%s: %d of %d new replicas have been updated" % (name, out["updated"], want)
        elif _int(status.get("replicas")) > out["updated"]:
            waiting = "%s: %d old replica(s) pending termination" % (name, _int(status.get("replicas")) - out["updated"])
        elif out["available"] < out["updated"]:
            waiting = "%s: %d of %d updated replicas are available" % (name, out["available"], out["updated"])
    elif kind == "LeaderWorkerSet":
        conds = status.get("conditions")
        stale = [c for c in conds or [] if gen is not None and _int(c.get("observedGeneration"), gen) < gen]
        busy = [c["type"] for c in conds or [] if c.get("type") in ("UpdateInProgress", "Progressing")
                and c.get("status") == "True"]
        if stale:
            waiting = "%s: its conditions are of generation %s, not %s yet" % (name, stale[0].get("observedGeneration"), gen)
        elif busy:
            waiting = "%s: %s (%d of %d groups updated, %d ready)" % (name, " and ".join(busy), out["updated"], want,
                                                                      out["ready"])
        elif out["updated"] < want or out["ready"] < want:
            waiting = "%s: %d of %d groups updated, %d ready" % (name, out["updated"], want, out["ready"])
        elif (condition(conds, "Available") or {}).get("status") != "True":
            waiting = "%s: not Available yet" % name
    elif kind == "StormService":
        cur, upd = status.get("currentRevision"), status.get("updateRevision")
        upd_ready = _int(status.get("updatedReadyReplicas"), out["ready"])
        if gen is not None and (observed is None or observed < gen):
            waiting = "%s: waiting for the controller to observe generation %s (observedGeneration %s)" % (name, gen, observed)
        elif cur and upd and cur != upd:
            waiting = "%s: rolling from revision %s to %s (%d of %d updated)" % (name, cur, upd, out["updated"], want)
        elif out["updated"] < want or upd_ready < want:
            waiting = "%s: %d of %d replicas updated, %d of them ready" % (name, out["updated"], want, upd_ready)
    if waiting:
        out.update(state="rolling", message=waiting)
    else:
        out.update(state="done", message="%s: revision %s rolled out" % (name, value or gen))
    return out


# --------------------------------------------------------------------------------------------- #
# Pods
# --------------------------------------------------------------------------------------------- #


def _container(pod, container):
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == container:
            return cs
    return statuses[0] if statuses else None


def ended_run(pod, container="engine"):
    """``(terminated, which)`` of the run to judge: the current state when the container has ended now
    (``which`` = ``current``), else ``lastState.terminated`` of a container that restarted (``previous``, the
    log ``kubectl logs --previous`` shows); ``(None, None)`` when the container never ended."""
    pod = shape(pod, "Pod") or {}
    cs = _container(pod, container) or {}
    now = (cs.get("state") or {}).get("terminated")
    if now:
        return now, "current"
    last = (cs.get("lastState") or {}).get("terminated")
    if last and _int(cs.get("restartCount")) > 0:
        return last, "previous"
    return None, None


def _context(pod, events, log, container, now):
    """A ``_diagnose_pods.KubeContext`` over one pod, the Events and the log of its ended run."""
    name = (pod.get("metadata") or {}).get("name") or ""
    _term, which = ended_run(pod, container)
    logs = {"%s/%s" % (name, container): {which or "current": log}} if isinstance(log, str) else {}
    return _diagnose_pods.KubeContext([pod] + list(events or []), logs,
                                      (pod.get("metadata") or {}).get("namespace") or "", None, None, None, now, None)


def pod_status(pod, container="engine", log=None, max_restarts=0, events=None, now=None):
    """Where one engine pod stands, with its timestamps (epoch seconds).

    ``log`` is the text of the run that ended (see :func:`ended_run`), when it could be read; ``events`` the
    namespace's Events (shaped or not). A pod that restarted more than ``max_restarts`` times is ``failed`` even
    when it is Ready again; what never clears by waiting (``_diagnose_pods.pod_blocked``) is ``failed`` at once.
    """
    pod = shape(pod, "Pod") or {"metadata": {}}
    events = [e for e in (shape(ev, "Event") for ev in events or []) if e is not None]
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    conds = status.get("conditions") or []
    sched = condition(conds, "PodScheduled")
    ready = condition(conds, "Ready")
    cs = _container(pod, container) or {}
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    out = dict(
        name=meta.get("name"),
        phase=status.get("phase"),
        node=pod.get("spec", {}).get("nodeName"),
        created=parse_time(meta.get("creationTimestamp")),
        scheduled=parse_time(sched.get("lastTransitionTime")) if sched and sched.get("status") == "True" else None,
        started=parse_time((state.get("running") or {}).get("startedAt")),
        ready=parse_time(ready.get("lastTransitionTime")) if ready and ready.get("status") == "True" else None,
        restarts=_int(cs.get("restartCount")),
        waiting_reason=(state.get("waiting") or {}).get("reason"),
        last_exit=None,
        diagnosis=None,
        unschedulable=None,
        deleting=bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
    )
    is_ready = bool(ready and ready.get("status") == "True")  # a Ready pod whose time was not recorded is Ready
    term = state.get("terminated") or last
    if term:
        out["last_exit"] = dict(exit_code=term.get("exitCode"), reason=term.get("reason"), signal=term.get("signal"),
                                finished=term.get("finishedAt"), message=term.get("message"))
    if sched and sched.get("status") == "False":
        out["unschedulable"] = "%s: %s" % (sched.get("reason", "Unschedulable"), sched.get("message", ""))
    ctx = _context(pod, events, log, container, now)
    if status.get("phase") in ("Succeeded", "Failed") or state.get("terminated"):
        _judge_exit(out, ctx, pod, container, "exited", log)
    elif out["restarts"] > max_restarts:
        _judge_exit(out, ctx, pod, container, "restarted %d time(s)%s" % (
            out["restarts"], " and is Ready again" if is_ready else ""), log)
    elif is_ready:
        out["state"], out["message"] = "ready", "%s is Ready" % out["name"]
    elif out["waiting_reason"] in FATAL_WAITING:
        out["state"] = "failed"
        out["message"] = "%s: container %s is %s: %s. %s" % (
            out["name"], container, out["waiting_reason"], (state.get("waiting") or {}).get("message", ""),
            FATAL_WAITING[out["waiting_reason"]])
    else:
        blocked = _diagnose_pods.pod_blocked(ctx, pod)
        if blocked is not None:
            out["diagnosis"] = dict(code=blocked["code"], evidence=blocked["evidence"], hint=blocked["hint"])
            out["state"] = "failed"
            out["message"] = "%s: %s: %s. Fix: %s" % (out["name"], blocked["code"], "; ".join(blocked["evidence"]),
                                                      blocked["hint"])
        elif out["unschedulable"]:
            out["state"], out["message"] = "unscheduled", "%s is not scheduled: %s" % (out["name"], out["unschedulable"])
        elif out["waiting_reason"] in PULL_WAITING:
            out["state"] = "starting"
            out["message"] = "%s: %s: %s" % (out["name"], out["waiting_reason"], (state.get("waiting") or {}).get("message", ""))
        else:
            out["state"] = "starting"
            doing = "loading (started, not Ready)" if out["started"] else status.get("phase") or "pending"
            out["message"] = "%s: %s" % (out["name"], out["waiting_reason"] or doing)
    return out


def _judge_exit(out, ctx, pod, container, what, log):
    """``failed`` with the diagnosis of the run that ended, by ``_diagnose``'s rules (the pod's eviction, else the
    engine container's status, its Events - a probe kill - and its log)."""
    ex = out["last_exit"] or {}
    code, sig = ex.get("exit_code"), ex.get("signal")
    pod_ref = "pod %s" % out["name"]
    f = _diagnose_pods.rule_evicted(ctx, pod, pod_ref)
    if f is None:
        cs = _container(pod, container)
        f = _diagnose_pods.rule_container(ctx, pod, pod_ref, cs) if cs else None
        if f is None or f["severity"] != "error":
            restarts = " (restarted %d time%s)" % (out["restarts"], "" if out["restarts"] == 1 else "s") \
                if out["restarts"] else ""
            f = _diagnose.classify_exit("container %s%s" % (container, restarts), pod_ref, code, sig,
                                        _diagnose.analyse_log(log or ""), "log", oom=ex.get("reason") == "OOMKilled")
        if log is None and ex:
            f["evidence"].append("the log of that run could not be read; read it with kubectl logs%s"
                                 % (" --previous" if what.startswith("restarted") else ""))
    out["diagnosis"] = dict(code=f["code"], evidence=f["evidence"], hint=f["hint"])
    head = "%s: engine container %s; last exit code %s (reason %s%s%s)" % (
        out["name"], what, code, ex.get("reason"), ", signal %s" % sig if sig else "",
        ", finished %s" % ex.get("finished") if ex.get("finished") else "")
    if f["code"] == "evicted":
        head = "%s: pod %s (phase %s)" % (out["name"], what, out["phase"])
    out["state"] = "failed"
    out["message"] = "%s: %s: %s. Fix: %s" % (head, f["code"], "; ".join(f["evidence"]), f["hint"])


# --------------------------------------------------------------------------------------------- #
# Rollout verdict
# --------------------------------------------------------------------------------------------- #


def answered_by(models, model_path):
    """``(proven, roots)``: whether a ``/v1/models`` answer (vLLM and SGLang list the served model with
    ``root`` = the path it was loaded from) comes from an engine of ``model_path``; ``roots`` is what it lists
    (empty when the answer names none, as a gateway's own model list)."""
    data = models.get("data") if isinstance(models, dict) else None
    roots = [m.get("root") for m in data if isinstance(m, dict) and isinstance(m.get("root"), str)] \
        if isinstance(data, list) else []
    norm = (model_path or "").rstrip("/")
    return bool(norm) and any(r.rstrip("/") == norm for r in roots), roots


#: Response headers AIBrix v0.7.0's gateway plugin sets when a routing strategy picked a pod
#: (vllm-project/aibrix pkg/plugins/gateway/gateway_rsp_headers.go, ``routerCtx.HasRouted()``): the pod's name, and
#: ``RoutingContext.TargetAddress()`` = ``<podIP>:<port>`` (pkg/types/router_context.go).
TARGET_POD, TARGET_POD_IP = "target-pod", "target-pod-ip"
#: discovery.k8s.io/v1 ``LabelServiceName``: the label the EndpointSlice controller puts on every slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_FIX_OLD = ("Fix: wait for the rollout to finish (an old pod leaves the Service's endpoints and AIBrix's pod cache "
            "once it terminates); a pod that belongs to no current workload (a renamed or leftover Deployment, a pod "
            "started by hand) keeps answering until it is deleted or relabelled")


def _address(value):
    """The IP of an ``<ip>:<port>`` / ``[<ipv6>]:<port>`` / bare IP header value."""
    v = (value or "").strip()
    if v.startswith("["):
        return v[1:v.index("]")] if "]" in v else v[1:]
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


def ready_endpoints(endpointslices):
    """``[dict(pod, addresses)]`` of every endpoint a Service would send traffic to, over its EndpointSlices.

    k8s.io/api discovery/v1 types.go ``EndpointConditions.ready``: "A nil value indicates an unknown state. In most
    cases consumers should interpret this unknown state as ready"; the EndpointSlice controller sets it false for a
    pod that is not Ready or is terminating (kubernetes/kubernetes v1.33.0 staging/src/k8s.io/endpointslice/utils.go
    ``podToEndpoint``: ``ready = publishNotReadyAddresses || (serving && !terminating)``)."""
    out = []
    for sl in endpointslices or []:
        for ep in (sl.get("endpoints") or []):
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            ref = ep.get("targetRef") or {}
            out.append(dict(pod=ref.get("name") if ref.get("kind", "Pod") == "Pod" else None,
                            addresses=list(ep.get("addresses") or [])))
    return out


def _pod_revision(pod, label):
    return _labels(pod).get(label) if (pod is not None and label) else None


def _describe(name, ip, pod, label):
    where = "pod %s" % name if name else "address %s" % ip
    if name and ip:
        where += " (%s)" % ip
    if pod is None:
        return "%s, which is no pod the selector matches" % where
    rev = _pod_revision(pod, label)
    return "%s of revision %s" % (where, rev) if rev else "%s of an earlier revision" % where


def revision_proof(revision, rollout, pods, models=None, served=None, endpointslices=None, service=None):
    """``(proof, waiting)``: whether what is live proves the answer comes from the current revision.

    ``pods``: the shaped live pods the selector matches (every revision); ``revision["pods"]``: the current
    revision's. Tried in this order, the first the evidence allows:

    * ``root``: ``models`` (a ``/v1/models`` answer; False: none came) lists the current model path as ``root``
      (vLLM and SGLang report the path they loaded; a gateway's own list names none);
    * ``target-pod-ip`` / ``target-pod``: ``served`` (the response headers of an answer through AIBrix's gateway;
      False: none came) names the pod a routing strategy picked; it must be a Ready pod of the current revision;
    * ``endpoints``: ``endpointslices`` (the Service's EndpointSlices, ``service`` its ``namespace/name``) have a
      ready endpoint and every one is a pod of the current revision, so no old pod can still answer.

    ``proof`` is None when none could be read; ``waiting`` says what still answers and the fix, or is None.
    """
    label = (rollout or {}).get("revision_label")
    current = set(revision.get("pods") or [])
    ready = set(revision.get("ready_pods") or [])
    by_name = dict(((p.get("metadata") or {}).get("name"), p) for p in pods)
    by_ip = dict(((p.get("status") or {}).get("podIP"), p) for p in pods if (p.get("status") or {}).get("podIP"))
    if models is not None:
        proven, roots = answered_by(models, revision.get("model_path"))
        if not isinstance(models, dict):
            return None, "the serving URL gave no /v1/models answer yet"
        if roots:
            proof = dict(by="root", held=proven, model_path=revision.get("model_path"), answered_roots=roots)
            if not proven:
                return proof, ("rolling: the serving URL answers from %s, not from the current revision's %s (an old "
                               "engine still answers)" % (", ".join(roots), revision.get("model_path")))
            return proof, None
    heard = served if isinstance(served, dict) else {}
    named, ip = heard.get(TARGET_POD) or None, _address(heard.get(TARGET_POD_IP)) or None
    if named or ip:
        pod = by_name.get(named) if named else None
        pod = pod if pod is not None else by_ip.get(ip)
        name = (pod.get("metadata") or {}).get("name") if pod is not None else named
        pod_ip = (pod.get("status") or {}).get("podIP") if pod is not None else None
        held = pod is not None and name in ready and (ip is None or pod_ip is None or pod_ip == ip)
        proof = dict(by=TARGET_POD_IP if ip else TARGET_POD, held=held, pod=name, ip=ip,
                     revision=_pod_revision(pod, label), current_revision=revision.get("revision"))
        if held:
            return proof, None
        if pod is not None and name in current:
            why = "a pod of the current revision that is not Ready"
        else:
            why = _describe(name, ip, pod, label)
        return proof, ("rolling: the gateway's answer came from %s, not from a Ready pod of the current revision %s: "
                       "an old pod still answers. %s" % (why, revision.get("revision") or "", _FIX_OLD))
    if endpointslices is None:
        return None, None
    eps = ready_endpoints(endpointslices)
    current_ips = set((by_name[n].get("status") or {}).get("podIP") for n in current if n in by_name)
    outside = [e for e in eps if not (e["pod"] in current if e["pod"] else set(e["addresses"]) & current_ips)]
    view = [dict(pod=e["pod"], ip=(e["addresses"] or [None])[0],
                 revision=_pod_revision(by_name.get(e["pod"]), label)) for e in eps]
    proof = dict(by="endpoints", held=bool(eps) and not outside, service=service, ready_endpoints=view,
                 current_revision=revision.get("revision"))
    if not eps:
        return proof, "Service %s has no ready endpoint yet" % (service or "")
    if outside:
        who = "; ".join(_describe(e["pod"], (e["addresses"] or [None])[0], by_name.get(e["pod"]), label) for e in outside)
        return proof, ("rolling: Service %s still has %d ready endpoint(s) outside the current revision %s: %s; it can "
                       "still answer. %s" % (service or "", len(outside), revision.get("revision") or "", who, _FIX_OLD))
    return proof, None


def _proof_text(proof):
    if not proof or not proof.get("held"):
        return ""
    if proof["by"] == "root":
        return "; the answer comes from %s" % proof["model_path"]
    if proof["by"] in (TARGET_POD, TARGET_POD_IP):
        return "; the gateway's answer came from %s, a pod of the current revision" % proof["pod"]
    return "; every ready endpoint of Service %s is a pod of the current revision" % proof["service"]


def evaluate(pods, route=None, now=None, replicas=1, schedule_timeout=900, gateway_name=None, check_route=True,
             container="engine", logs=None, max_restarts=0, workload=None, replicasets=None, events=None,
             models=None, served=None, endpointslices=None, service=None):
    """One verdict: ``dict(state=ready|waiting|failed, message, pods, route, rollout, revision, revision_proof)``.

    ``failed`` is final (an engine restarted more than ``max_restarts`` times or exited, a container can
    never be created, what never clears by waiting, a pod stayed unschedulable longer than ``schedule_timeout``
    seconds, a Deployment past its progress deadline). ``logs`` maps a pod name to the log text of its run that
    ended (:func:`ended_run`). Route conditions that are False are left to the caller's route deadline, because
    a controller may still converge.

    With ``workload`` (its ``replicasets`` for a Deployment) only pods of the current revision count, and the
    rollout must be done (:func:`rollout_status`): right after an update the old pod is Ready, and that is
    "waiting", not "ready". Then what is live must prove the answer comes from the current revision
    (:func:`revision_proof` over ``models``, ``served``, ``endpointslices`` of ``service``).
    """
    logs = logs or {}
    events = [e for e in (shape(ev, "Event") for ev in events or []) if e is not None]
    shaped = [x for x in (shape(p, "Pod") for p in pods or []) if x is not None]
    live = [p for p in shaped if not (p.get("metadata") or {}).get("deletionTimestamp")]
    route = shape(route, "HTTPRoute") if route is not None else None
    ro = revision = None
    judged = live
    if workload is not None:
        workload = shape(workload) or shape(workload, "Deployment")
        rsets = [x for x in (shape(r, "ReplicaSet") for r in replicasets or []) if x is not None]
        ro = rollout_status(workload, rsets, live)
        if ro["current_pods"] is not None:
            judged = [p for p in live if (p.get("metadata") or {}).get("name") in ro["current_pods"]]
        revision = dict(revision_facts(workload, container), kind=ro["kind"], name=ro["name"],
                        generation=ro["generation"], observed_generation=ro["observed_generation"],
                        revision=ro["revision"], pods=ro["current_pods"], proven=None, answered_roots=None,
                        pod_addresses=[dict(name=(p.get("metadata") or {}).get("name"),
                                            ip=(p.get("status") or {}).get("podIP")) for p in judged])
    statuses = [pod_status(p, container, log=logs.get((p.get("metadata") or {}).get("name")), max_restarts=max_restarts,
                           events=events, now=now) for p in judged]
    old = len(live) - len(judged)
    rstate = route_status(route, gateway_name) if check_route else None
    verdict = dict(pods=statuses, route=rstate, rollout=ro, revision=revision, revision_proof=None)
    failed = [p for p in statuses if p["state"] == "failed"]
    if failed:
        return dict(verdict, state="failed", message="; ".join(p["message"] for p in failed))
    if ro is not None and ro["state"] == "failed":
        return dict(verdict, state="failed", message=ro["message"])
    if now is not None:
        stuck = [p for p in statuses if p["state"] == "unscheduled" and p["created"] is not None
                 and now - p["created"] > schedule_timeout]
        if stuck:
            return dict(verdict, state="failed", message="; ".join(
                "%s (for %ds, limit %ds)" % (p["message"], now - p["created"], schedule_timeout) for p in stuck))
    ready = [p for p in statuses if p["state"] == "ready"]
    waiting = []
    if ro is not None and ro["state"] != "done":
        waiting.append("rolling: %s%s" % (ro["message"], "; %d pod(s) of an old revision do not count" % old if old else ""))
    if len(ready) < replicas:
        others = [p["message"] for p in statuses if p["state"] != "ready"]
        waiting.append("%d/%d engine pod(s)%s Ready%s" % (len(ready), replicas, " of the current revision" if ro else "",
                                                          (": " + "; ".join(others)) if others else ""))
    if rstate is not None and rstate["state"] != "ready":
        waiting.append(rstate["message"])
    if not waiting and revision is not None:
        if revision["pods"] is None:
            revision["pods"] = [p["name"] for p in statuses]
        proof, why = revision_proof(dict(revision, ready_pods=[p["name"] for p in ready]), ro, shaped,
                                    models=models, served=served, endpointslices=endpointslices, service=service)
        if models is not None:
            proven, roots = answered_by(models, revision["model_path"])
            # an answer that names no root (a gateway's own model list) has nothing to compare
            revision.update(proven=proven if roots or not isinstance(models, dict) else None, answered_roots=roots)
        verdict["revision_proof"] = proof
        if why:
            waiting.append(why)
    if waiting:
        return dict(verdict, state="waiting", message="; ".join(waiting))
    return dict(verdict, state="ready", message="%d/%d pod(s) Ready%s%s%s" % (
        len(ready), replicas, "; %s" % ro["message"] if ro else "", _proof_text(verdict["revision_proof"]),
        "; " + rstate["message"] if rstate else ""))


# --------------------------------------------------------------------------------------------- #
# Cold-start timeline
# --------------------------------------------------------------------------------------------- #


def pod_marks(summary):
    """Timeline marks of one :func:`pod_status` summary (``created``, ``scheduled``, ``started``, ``ready``)."""
    return dict(pod_created=summary.get("created"), scheduled=summary.get("scheduled"),
                container_started=summary.get("started"), pod_ready=summary.get("ready"))


def cold_start_timeline(pod=None, marks=None):
    """Merge a pod's own timestamps with probe marks into the cold-start timeline (``_timeline.staged``).

    ``marks`` maps ``port_open``, ``health_ok``, ``model_listed``, ``first_correct_response`` (and
    optionally any pod stage, e.g. ``pod_created`` for a local process start) to RFC 3339 or epoch
    times. Returns ``dict(stages=[{stage, label, at, t_s, step_s}], slo_seconds, missing)``; ``t_s``
    counts from pod creation, ``step_s`` from the previous recorded stage. ``slo_seconds`` is pod created
    -> first correct response (None while either is unknown).
    """
    merged = pod_marks(pod_status(pod)) if pod is not None else {}
    for key, value in (marks or {}).items():
        _timeline.check_stage(key)
        if value is not None or key not in merged:
            merged[key] = value
    return _timeline.staged(merged)


# --------------------------------------------------------------------------------------------- #
# Polling loop (I/O injected)
# --------------------------------------------------------------------------------------------- #


_TIMES = ("creationTimestamp", "lastTransitionTime", "lastTimestamp", "eventTime", "firstTimestamp", "startTime",
          "startedAt", "finishedAt", "lastUpdateTime", "lastProbeTime")


def recorded_at(objects):
    """The newest time in recorded objects (epoch seconds; None without any): when they were read, at the earliest.
    A replay judges the objects at that moment, not at the clock of the replay, so a recording an hour old does not
    read as an hour more of waiting."""
    newest = [None]

    def walk(value, depth=0):
        if depth > 12:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                if k in _TIMES and isinstance(v, str):
                    t = parse_time(v)
                    if t is not None and (newest[0] is None or t > newest[0]):
                        newest[0] = t
                else:
                    walk(v, depth + 1)
        elif isinstance(value, list):
            for v in value:
                walk(v, depth + 1)
    walk(objects)
    return newest[0]


def read_logs(pods, read_log, container, names):
    """``{pod name: log text}`` of the ended run (:func:`ended_run`) of the pods named, through ``read_log``."""
    out = {}
    for pod in pods:
        name = ((shape(pod, "Pod") or {}).get("metadata") or {}).get("name")
        if name not in names:
            continue
        _term, which = ended_run(pod, container)
        text = read_log(name, container, which == "previous") if which else None
        if isinstance(text, str):
            out[name] = text
    return out


def _read(fetch):
    """``fetch()`` answers ``(pods, route)`` or a dict with ``pods``, ``route``, ``workload``, ``replicasets``,
    ``events``, ``endpointslices`` (None: not read) and ``service`` (``namespace/name``)."""
    got = fetch()
    if isinstance(got, dict):
        return dict(pods=got.get("pods") or [], route=got.get("route"), workload=got.get("workload"),
                    replicasets=got.get("replicasets"), events=got.get("events"),
                    endpointslices=got.get("endpointslices"), service=got.get("service"))
    pods, route = got
    return dict(pods=pods, route=route, workload=None, replicasets=None, events=None, endpointslices=None, service=None)


def judge(fetch, now, read_log=None, answer=None, served=None, **kw):
    """One poll: read, judge (:func:`evaluate`); a failure is judged again with the logs of the runs that ended,
    and a rollout that is otherwise ready asks ``answer()`` (the ``/v1/models`` answer, or None) and
    ``served(revision)`` (the response headers of an answer through the gateway, or None) for its proof."""
    seen = _read(fetch)
    slices = seen["endpointslices"]
    args = dict(kw, workload=seen["workload"], replicasets=seen["replicasets"], events=seen["events"],
                endpointslices=[x for x in (shape(e, "EndpointSlice") for e in slices) if x is not None]
                if isinstance(slices, list) else None, service=seen["service"])
    verdict = evaluate(seen["pods"], seen["route"], now=now, **args)
    if verdict["state"] == "failed" and read_log is not None:
        logs = read_logs(seen["pods"], read_log, kw.get("container", "engine"),
                         [p["name"] for p in verdict["pods"] if p.get("diagnosis")])
        if logs:
            verdict = evaluate(seen["pods"], seen["route"], now=now, logs=logs, **args)
    if verdict["state"] == "ready" and verdict.get("revision") is not None and (answer is not None or served is not None):
        models = answer() if answer is not None else None
        heard = served(verdict["revision"]) if served is not None else None
        verdict = evaluate(seen["pods"], seen["route"], now=now,
                           models=None if answer is None else (models if models is not None else False),
                           served=None if served is None else (heard if heard is not None else False), **args)
    return verdict


def wait_rollout(fetch, timeout, route_condition_timeout=300, schedule_timeout=900, poll_interval=10, replicas=1,
                 gateway_name=None, check_route=True, container="engine", clock=None, sleep=None, now=None,
                 read_log=None, max_restarts=0, answer=None, served=None):
    """Poll ``fetch()`` (see :func:`_read`) until the rollout is ready, failed, or ``timeout`` seconds pass.

    When pods failed because their engine ended, ``read_log(pod_name, container, previous) -> text or None``
    (``previous``: the run before the restart) is asked once per such pod and the verdict is judged again with
    those logs, so the message names the exception the engine died of. ``answer() -> /v1/models body or None``
    and ``served(revision) -> gateway response headers or None`` prove that the current revision answers
    (:func:`revision_proof`).

    A route condition that stays False for ``route_condition_timeout`` seconds fails the wait with its reason.
    Returns the last :func:`evaluate` verdict with ``elapsed`` and ``polls`` added; ``state`` is
    ``ready``, ``failed`` or ``timeout``.
    """
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    now = now or time.time
    start = clock()
    route_bad_since = None
    polls = 0
    while True:
        polls += 1
        verdict = judge(fetch, now(), read_log=read_log, answer=answer, served=served, replicas=replicas,
                        schedule_timeout=schedule_timeout, gateway_name=gateway_name, check_route=check_route,
                        container=container, max_restarts=max_restarts)
        elapsed = clock() - start
        verdict.update(elapsed=round(elapsed, 1), polls=polls)
        if verdict["state"] in ("ready", "failed"):
            return verdict
        rstate = verdict["route"]
        if rstate is not None and rstate["state"] == "failed":
            route_bad_since = elapsed if route_bad_since is None else route_bad_since
            if elapsed - route_bad_since >= route_condition_timeout:
                verdict.update(state="failed", message="route not usable for %ds: %s" % (route_condition_timeout,
                                                                                         rstate["message"]))
                return verdict
        else:
            route_bad_since = None
        if elapsed >= timeout:
            verdict.update(state="timeout", message="not ready after %ds: %s" % (timeout, verdict["message"]))
            return verdict
        sleep(min(poll_interval, max(0.0, timeout - elapsed)) or poll_interval)
