# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the one place that decides how a model is routed by AIBrix.

AIBrix v0.7.0 (``pkg/controller/modelrouter/modelrouter_controller.go``) watches Deployments,
RayClusterFleets, ModelAdapters and LeaderWorkerSets. When one of them carries the label
``model.aibrix.ai/name`` *in its own metadata*, the controller creates the HTTPRoute ``<model>-router`` in
``aibrix-system`` with a backendRef to a Service named exactly the model. A model name with a dot
(``glm-5.2-fp8``) can never be a Service name (DNS-1035), so that route stays ``ResolvedRefs=False /
BackendNotFound`` and the gateway answers 503. The rule here:

* the AIBrix labels go on **pods only** (:func:`pod_labels`); the gateway's pod informer and the
  metadata service's ``/v1/models`` read them from the pods, and the route controller never sees them;
* the route ``<model>-router`` (the name the gateway plugin looks up) is rendered here, with its backendRef
  on the DNS-1035 Service, and a ReferenceGrant for exactly that Service when the gateway lives in
  another namespace (:func:`route_objects`);
* :func:`workload_problems` says which rendered workload would still wake the controller.

Request timeout: the controller writes ``AIBRIX_GATEWAY_TIMEOUT_SECONDS`` (default 120 s). The field report
measured 65-82 tok/s for one GLM-5.2 FP8 stream on 8 x H20, so 120 s cuts every answer beyond roughly
8,000 tokens with a 504, and reasoning answers are often longer. The default here is ``0s``, which the
Gateway API defines as "no timeout" (GEP-2257, ``HTTPRouteTimeouts``); a value below
:data:`MIN_REQUEST_TIMEOUT_S` is accepted with a warning that says how many tokens fit in it.
"""
from __future__ import annotations

import re

from ansible_collections.llmops.serving.plugins.module_utils import _k8s_names as names

AIBRIX_NAME = "model.aibrix.ai/name"
AIBRIX_PORT = "model.aibrix.ai/port"
AIBRIX_ENGINE = "model.aibrix.ai/engine"
GATEWAY_GROUP = "gateway.networking.k8s.io"
SERVED_NAME_ANNOTATION = "llmops.serving/served-model-name"

DEFAULT_GATEWAY_NAME = "aibrix-eg"
DEFAULT_GATEWAY_NAMESPACE = "aibrix-system"

# The paths AIBrix v0.7.0's model-router controller matches (``modelPaths`` in modelrouter_controller.go);
# every match also requires the request header ``model`` to equal the model name.
ROUTE_PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/classify",
    "/generate",
    "/generatevideo",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
)

# Kinds whose own metadata the v0.7.0 controller reads the model label from (its informers).
ROUTED_WORKLOAD_KINDS = {
    ("apps", "Deployment"),
    ("orchestration.aibrix.ai", "RayClusterFleet"),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
    ("model.aibrix.ai", "ModelAdapter"),  # its informer reads the labels on the ModelAdapter itself
}

DEFAULT_REQUEST_TIMEOUT = "0s"
# Half an hour: a 131072-token context answered at the field report's 65 tok/s single stream still needs
# 33 min for 128K tokens, and 1800 s holds about 117,000 tokens at that rate.
MIN_REQUEST_TIMEOUT_S = 1800
SINGLE_STREAM_TOKENS_PER_S = 65

# Gateway API Duration (GEP-2257), the HTTPRoute CRD's own pattern.
_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
_DURATION_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


class RouteError(ValueError):
    """An input no working route can be built from; ``str()`` names the field and the fix."""


def pod_labels(model, port, engine):
    """The AIBrix labels of a serving pod (never of its Deployment/StormService/LeaderWorkerSet)."""
    return {AIBRIX_NAME: model, AIBRIX_PORT: str(port), AIBRIX_ENGINE: engine}


def workload_labels(labels):
    """``labels`` without the model label, for a workload's own metadata."""
    return dict((k, v) for k, v in (labels or {}).items() if k != AIBRIX_NAME)


def _group_kind(obj):
    api = obj.get("apiVersion") or ""
    group = api.split("/", 1)[0] if "/" in api else ""
    return group, obj.get("kind")


def workload_problems(objects):
    """Objects the AIBrix route controller would create its own ``<model>-router`` for (empty when none)."""
    problems = []
    for obj in objects:
        if _group_kind(obj) not in ROUTED_WORKLOAD_KINDS:
            continue
        meta = obj.get("metadata") or {}
        model = (meta.get("labels") or {}).get(AIBRIX_NAME)
        if model is not None:
            problems.append(
                "%s %s/%s carries %s=%s in its own metadata: AIBrix's route controller would create %s-router "
                "pointing at a Service named exactly %r; put the label on the pod template only"
                % (obj.get("kind"), meta.get("namespace"), meta.get("name"), AIBRIX_NAME, model, model, model))
    return problems


def parse_duration(text):
    """Seconds of a Gateway API duration (``0s``, ``90m``, ``1h30m``); ``ValueError`` when it is not one."""
    if not isinstance(text, str) or not _DURATION.match(text):
        raise ValueError(text)
    return sum(int(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))


def check_request_timeout(value, field="route_request_timeout"):
    """Validate an HTTPRoute request timeout; return the warnings it deserves (a list, maybe empty)."""
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise RouteError(
            "%s: %r is not a Gateway API duration (digits and h/m/s/ms, e.g. 0s, 1800s, 1h); use 0s for no "
            "timeout" % (field, value))
    if 0 < seconds < MIN_REQUEST_TIMEOUT_S:
        return [
            "%s=%s cuts every answer that streams longer than %d s with a 504: at %d tok/s (one GLM-5.2 FP8 "
            "stream on 8 GPUs) that is about %d tokens. Use 0s (no timeout) or at least %ds."
            % (field, value, seconds, SINGLE_STREAM_TOKENS_PER_S, int(seconds * SINGLE_STREAM_TOKENS_PER_S),
               MIN_REQUEST_TIMEOUT_S)]
    return []


def check_paths(paths, field="route_paths"):
    if not isinstance(paths, (list, tuple)) or not paths:
        raise RouteError("%s: must be a non-empty list of path prefixes such as /v1/chat/completions" % field)
    for i, path in enumerate(paths):
        if not isinstance(path, str) or not path.startswith("/"):
            raise RouteError("%s[%d]: %r is not an absolute path prefix (it must start with '/')" % (field, i, path))


def route_objects(model, service, namespace, port, gateway_name=DEFAULT_GATEWAY_NAME,
                  gateway_namespace=DEFAULT_GATEWAY_NAMESPACE, request_timeout=DEFAULT_REQUEST_TIMEOUT,
                  paths=ROUTE_PATHS, labels=None, timeout_field="route_request_timeout", paths_field="route_paths"):
    """The ReferenceGrant (when the namespaces differ) and the HTTPRoute ``<model>-router`` for ``service``.

    Returns ``dict(objects=[...], route_name=..., reference_grant_name=... or None, warnings=[...])``, the
    objects in apply order (the grant before the route, so the route resolves on its first reconcile).
    """
    problems = names.check_model_name(model)
    if problems:
        raise RouteError("; ".join(problems))
    if not names.is_dns1035_label(service):
        raise RouteError("service: %r is not a DNS-1035 label; derive it with _k8s_names.service_name" % (service,))
    for field, value in (("namespace", namespace), ("gateway_namespace", gateway_namespace)):
        if not names.is_dns1123_label(value):
            raise RouteError("%s: %r is not a valid namespace name (DNS-1123 label)" % (field, value))
    if not names.is_dns1123_subdomain(gateway_name):
        raise RouteError("gateway_name: %r is not a valid Gateway name" % (gateway_name,))
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise RouteError("port: %r is not a TCP port" % (port,))
    check_paths(list(paths), paths_field)
    warnings = check_request_timeout(request_timeout, timeout_field)
    route = names.route_name(model)
    labels = dict(labels or {})
    objects = []
    grant_name = None
    if namespace != gateway_namespace:
        grant_name = names.reference_grant_name(service, gateway_namespace)
        objects.append({
            "apiVersion": GATEWAY_GROUP + "/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": {"name": grant_name, "namespace": namespace, "labels": dict(labels)},
            "spec": {
                "from": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "namespace": gateway_namespace}],
                "to": [{"group": "", "kind": "Service", "name": service}],
            },
        })
    header = {"type": "Exact", "name": "model", "value": model}
    objects.append({
        "apiVersion": GATEWAY_GROUP + "/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": route, "namespace": gateway_namespace, "labels": dict(labels),
                     "annotations": {SERVED_NAME_ANNOTATION: model}},
        "spec": {
            "parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway_name,
                            "namespace": gateway_namespace}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": path}, "headers": [dict(header)]}
                            for path in paths],
                "backendRefs": [{"group": "", "kind": "Service", "name": service, "namespace": namespace,
                                 "port": port}],
                "timeouts": {"request": request_timeout},
            }],
        },
    })
    return dict(objects=objects, route_name=route, reference_grant_name=grant_name, warnings=warnings)
