# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the one place recorded or fetched Kubernetes objects are made safe to judge.

Every field the collection reads is kept only with the type the API defines (a string, an integer, a list, a map),
anything else counts as absent. ``engine_diagnose`` and ``k8s_engine_wait`` judge only shaped objects, so a field
of the wrong type is never a traceback.

* :func:`shape` / :func:`shape_objects` / :func:`shape_logs` - objects (and Lists of them) and logs, shaped.
* :func:`parse_time`, :func:`condition`, :func:`integer` - a time, a condition and a count read from them.
* :func:`recorded_at` - when recorded objects were read, the moment a replay judges them at.

No I/O here.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline

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
                       status={"replicas": I, "readyReplicas": I, "availableReplicas": I, "observedGeneration": I,
                               "conditions": [_COND]}),
    # the StatefulSets a LeaderWorkerSet runs its groups with (kubernetes-sigs/lws pkg/controllers
    # leaderworkerset_controller.go: the leader StatefulSet <lws>, one worker StatefulSet per group)
    "StatefulSet": dict(_HEAD, spec={"replicas": I, "selector": _SELECTOR},
                        status={"replicas": I, "readyReplicas": I, "currentRevision": S, "updateRevision": S,
                                "observedGeneration": I, "conditions": [_COND]}),
    # AIBrix v0.7.0 api/orchestration/v1alpha1/roleset_types.go: the RoleSets of a StormService
    "RoleSet": dict(_HEAD, status={"conditions": [_COND]}),
    "LeaderWorkerSet": dict(_HEAD, spec={
        "replicas": I, "startupPolicy": S,
        "leaderWorkerTemplate": {"size": I, "restartPolicy": S, "leaderTemplate": _TEMPLATE, "workerTemplate": _TEMPLATE}},
        status={"replicas": I, "readyReplicas": I, "updatedReplicas": I, "hpaPodSelector": S, "conditions": [_COND],
                "observedGeneration": I}),
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
# Reading shaped objects
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


def integer(value, default=0):
    """``value`` when it is an integer (a bool is not one), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# --------------------------------------------------------------------------------------------- #
# Recorded objects
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
