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

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names

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


def gateway_argument_spec(name=True):
    """The spec of the options that say where the gateway is (doc fragment ``llmops.serving.gateway``):
    ``gateway_namespace`` and, with ``name``, ``gateway_name``, to ``update()`` a module's argument spec with."""
    spec = {"gateway_namespace": {"type": "str", "default": DEFAULT_GATEWAY_NAMESPACE}}
    if name:
        spec["gateway_name"] = {"type": "str", "default": DEFAULT_GATEWAY_NAME}
    return spec


def gateway_namespace_warnings(gateway_namespace):
    """AIBrix v0.7.0's gateway plugin looks ``<model>-router`` up in ``aibrix-system`` whatever namespace it runs in
    (pkg/plugins/gateway/gateway.go ``defaultAIBrixNamespace``, validateHTTPRouteStatus): a route anywhere else is
    never found, and every request without a routing strategy gets a 503. A warning, not a refusal: a later AIBrix
    may read the namespace it is installed in."""
    if gateway_namespace == DEFAULT_GATEWAY_NAMESPACE:
        return []
    return ["gateway_namespace: %r - AIBrix up to v0.7.0 looks the route <model>-router up in %s only "
            "(pkg/plugins/gateway/gateway.go defaultAIBrixNamespace), whatever namespace it was installed in: a route "
            "in %s is never found and every request without a routing strategy gets a 503. Keep %s unless this "
            "AIBrix reads its own namespace"
            % (gateway_namespace, DEFAULT_GATEWAY_NAMESPACE, gateway_namespace, DEFAULT_GATEWAY_NAMESPACE)]


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
    warnings = check_request_timeout(request_timeout, timeout_field) + gateway_namespace_warnings(gateway_namespace)
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


# ---- original_route: where every routing-strategy request goes ----------------------------------------- #
#
# AIBrix v0.7.0 ``config/gateway/gateway.yaml``: the EnvoyPatchPolicy ``epp`` (deployed as ``aibrix-epp``;
# Helm ``dist/chart/templates/gateway-instance/gateway.yaml``: ``<release>-epp``) inserts the Envoy route
# ``original_route`` first in the gateway's virtual host: any request with a ``routing-strategy`` header, which
# the gateway plugin sets whenever a strategy picks the pod (the request's header, the pods'
# ``model.aibrix.ai/config`` profile, the plugins' ``ROUTING_ALGORITHM``; ``gateway_req_body.go``), goes to the
# picked pod with ``timeout: 120s`` (Helm ``gateway.envoyPatchPolicy.route.timeout``). A StormService has no
# HTTPRoute, so all its requests take that route, and an HTTPRoute's ``timeouts.request`` never applies there.

ORIGINAL_ROUTE = "original_route"
ORIGINAL_ROUTE_TIMEOUT_S = 120
#: The same route's ``idle_timeout`` (Helm ``gateway.envoyPatchPolicy.route.idleTimeout: 300s``,
#: dist/chart/templates/gateway-instance/gateway.yaml); the kustomize patch sets none, and then Envoy's
#: HttpConnectionManager ``stream_idle_timeout`` applies, 5 minutes by default
#: (envoy.extensions.filters.network.http_connection_manager.v3, RouteAction.idle_timeout). A non-streamed answer
#: sends no byte until it is whole: one that takes longer is reset.
ORIGINAL_ROUTE_IDLE_TIMEOUT_S = 300
#: The gateway plugin's ext_proc ``messageTimeout`` (EnvoyExtensionPolicy ``gateway-plugins-extension-policy``,
#: config/gateway/gateway-plugin/gateway-plugin.yaml; Helm ``gatewayPlugin.messageTimeout: "60s"``,
#: dist/chart/templates/gateway-plugin/envoy_extension_policy.yaml). vLLM's prefill runs inside the plugin's
#: request-body call (pkg/plugins/gateway/algorithms/pd_disaggregation.go Route -> doPrefillRequest; pd_readme.md
#: "vLLM -> sync"), so a prefill longer than this fails whatever AIBRIX_PREFILL_REQUEST_TIMEOUT says.
EXT_PROC_MESSAGE_TIMEOUT_S = 60
#: Envoy's route timeout when a route sets none (``envoy.config.route.v3.RouteAction.timeout``).
ENVOY_DEFAULT_ROUTE_TIMEOUT_S = 15
#: The v0.7.0 install (``config/gateway/gateway-plugin/gateway-plugin.yaml``, Helm ``dist/chart/values.yaml``)
#: sets ``AIBRIX_PREFILL_REQUEST_TIMEOUT=60`` on the gateway plugins; the code's default is 30
#: (``pkg/plugins/gateway/algorithms/pd_disaggregation.go``).
PREFILL_REQUEST_TIMEOUT_S = 60
EPP_GROUP = "gateway.envoyproxy.io"

_ENVOY_DURATION = re.compile(r"^\s*((?:[0-9]+(?:\.[0-9]+)?(?:h|ms|m|s))+)\s*$")
_ENVOY_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s)")


def envoy_duration(text):
    """Seconds of an Envoy/Helm duration (``120s``, ``1.5s``, ``2m``, ``0s``); ``ValueError`` otherwise."""
    m = _ENVOY_DURATION.match(str(text))
    if not m:
        raise ValueError(text)
    return sum(float(n) * _UNIT_S[u] for n, u in _ENVOY_PART.findall(m.group(1)))


def original_route_timeout(objects):
    """``(seconds, where)`` of ``original_route`` in the EnvoyPatchPolicy objects read from the cluster (``0`` is
    no timeout), or ``(None, None)`` when none defines it. ``where`` names the policy for messages."""
    for obj in objects or []:
        if not isinstance(obj, dict) or obj.get("kind") != "EnvoyPatchPolicy":
            continue
        meta = obj.get("metadata") or {}
        where = "EnvoyPatchPolicy %s/%s" % (meta.get("namespace"), meta.get("name"))
        patches = (obj.get("spec") or {}).get("jsonPatches") or []
        for patch in patches if isinstance(patches, list) else []:
            value = ((patch or {}).get("operation") or {}).get("value") if isinstance(patch, dict) else None
            if not isinstance(value, dict) or value.get("name") != ORIGINAL_ROUTE:
                continue
            route = value.get("route") if isinstance(value.get("route"), dict) else {}
            if "timeout" not in route:
                return float(ENVOY_DEFAULT_ROUTE_TIMEOUT_S), where
            try:
                return envoy_duration(route["timeout"]), where
            except ValueError:
                raise RouteError("%s: original_route timeout %r is not an Envoy duration" % (where, route["timeout"]))
    return None, None


def original_route_limits(objects):
    """The three limits AIBrix's gateway puts on a routing-strategy request, from the policies read from the cluster:
    ``{"timeout": (s, where), "idle_timeout": (s, where), "message_timeout": (s, where)}`` (``(None, None)`` when no
    policy defines it; ``0`` is no limit). The route's ``idle_timeout`` defaults to Envoy's stream idle timeout
    (:data:`ORIGINAL_ROUTE_IDLE_TIMEOUT_S`) when its patch sets none."""
    timeout, where = original_route_timeout(objects)
    idle = (None, None)
    if where is not None:
        idle = (float(ORIGINAL_ROUTE_IDLE_TIMEOUT_S), "%s (no idle_timeout: Envoy's stream_idle_timeout)" % where)
        for obj in objects or []:
            meta = (obj or {}).get("metadata") or {} if isinstance(obj, dict) else {}
            if not isinstance(obj, dict) or obj.get("kind") != "EnvoyPatchPolicy" or \
                    "EnvoyPatchPolicy %s/%s" % (meta.get("namespace"), meta.get("name")) != where:
                continue
            for patch in (obj.get("spec") or {}).get("jsonPatches") or []:
                value = ((patch or {}).get("operation") or {}).get("value") if isinstance(patch, dict) else None
                route = value.get("route") if isinstance(value, dict) and value.get("name") == ORIGINAL_ROUTE else None
                if isinstance(route, dict) and "idle_timeout" in route:
                    try:
                        idle = (envoy_duration(route["idle_timeout"]), where)
                    except ValueError:
                        raise RouteError("%s: original_route idle_timeout %r is not an Envoy duration"
                                         % (where, route["idle_timeout"]))
    message = (None, None)
    for obj in objects or []:
        if not isinstance(obj, dict) or obj.get("kind") != "EnvoyExtensionPolicy":
            continue
        meta = obj.get("metadata") or {}
        for proc in (obj.get("spec") or {}).get("extProc") or []:
            if isinstance(proc, dict) and proc.get("messageTimeout") is not None:
                pwhere = "EnvoyExtensionPolicy %s/%s" % (meta.get("namespace"), meta.get("name"))
                try:
                    message = (envoy_duration(proc["messageTimeout"]), pwhere)
                except ValueError:
                    raise RouteError("%s: messageTimeout %r is not a duration" % (pwhere, proc["messageTimeout"]))
    return {"timeout": (timeout, where), "idle_timeout": idle, "message_timeout": message}


#: What raises each limit, for the messages.
_KNOBS = ("the route timeout (Helm gateway.envoyPatchPolicy.route.timeout; the timeout of the original_route patch in "
          "the EnvoyPatchPolicy aibrix-epp), its idle_timeout (Helm gateway.envoyPatchPolicy.route.idleTimeout, 300s; "
          "the patch's idle_timeout) and the gateway plugin's messageTimeout (Helm gatewayPlugin.messageTimeout, 60s; "
          "the EnvoyExtensionPolicy gateway-plugins-extension-policy), which bounds a vLLM prefill together with "
          "AIBRIX_PREFILL_REQUEST_TIMEOUT")


def longest_answer(max_tokens, request_timeout=DEFAULT_REQUEST_TIMEOUT, tokens_per_s=SINGLE_STREAM_TOKENS_PER_S):
    """``(seconds, why)`` the longest answer of the profile may stream, by the documented rule: the configured
    request timeout when it is set (non-zero: the operator's own bound on one request), else ``max_tokens``
    (the profile's context length, the most one answer can hold) at ``tokens_per_s`` (65: one GLM-5.2 FP8
    stream on 8 x H20, the field report)."""
    seconds = parse_duration(request_timeout) if request_timeout else 0
    if seconds > 0:
        return seconds, "an answer within the request timeout %s" % request_timeout
    return float(max_tokens) / tokens_per_s, "an answer of %d tokens at %d tok/s" % (max_tokens, tokens_per_s)


def _fix(need):
    return ("Raise it to at least %ds (or 0s for none): helm upgrade ... --set gateway.envoyPatchPolicy.route.timeout=%ds "
            "(Helm install), or set the timeout of the original_route patch in the EnvoyPatchPolicy aibrix-epp "
            "(aibrix-system, kustomize install)" % (int(need) + 1, int(need) + 1))


def check_original_route(timeout_s, where, need_s, why, idle=(None, None)):
    """The error for an ``original_route`` timeout or idle timeout that would cut the longest answer (None when
    neither does); it names all three limits of that path (:data:`_KNOBS`)."""
    cut = []
    if timeout_s is not None and timeout_s != 0 and timeout_s < need_s:
        cut.append("%s: original_route (every routing-strategy request, the StormService path) times out after %gs, "
                   "but %s streams for %ds; the gateway would cut it with a 504. %s"
                   % (where, timeout_s, why, need_s, _fix(need_s)))
    idle_s, idle_where = idle
    if idle_s is not None and idle_s != 0 and idle_s < need_s:
        cut.append("%s: original_route resets a stream idle for %gs, and a non-streamed answer is idle until it is "
                   "whole: %s takes %ds. Raise it to at least %ds: helm upgrade ... --set "
                   "gateway.envoyPatchPolicy.route.idleTimeout=%ds, or the patch's idle_timeout"
                   % (idle_where, float(idle_s), why, need_s, int(need_s) + 1, int(need_s) + 1))
    if not cut:
        return None
    return "%s. That path has three limits: %s" % ("; ".join(cut), _KNOBS)


def original_route_note(need_s, why):
    """What a render-mode run says next to the objects: the cluster's ``original_route`` limits are not read."""
    if need_s <= ORIGINAL_ROUTE_TIMEOUT_S:
        return None
    return ("AIBrix sends every routing-strategy request (the StormService path) through its original_route, whose "
            "timeout is %ds in the v0.7.0 install (config/gateway/gateway.yaml; Helm gateway.envoyPatchPolicy.route."
            "timeout), and an HTTPRoute's request timeout does not apply there; %s streams for %ds. Rendered only, so "
            "the cluster's EnvoyPatchPolicy was not read. %s. That path has three limits: %s"
            % (ORIGINAL_ROUTE_TIMEOUT_S, why, need_s, _fix(need_s), _KNOBS))


def prefill_note(limits):
    """A warning when the plugin's ext_proc ``messageTimeout`` read from the cluster is shorter than the prefill
    timeout of the v0.7.0 install: a vLLM prefill runs inside that call (:data:`EXT_PROC_MESSAGE_TIMEOUT_S`), so
    the shorter one decides; None otherwise."""
    seconds, where = limits.get("message_timeout") or (None, None)
    if seconds is None or seconds == 0 or seconds >= PREFILL_REQUEST_TIMEOUT_S:
        return None
    return ("%s: the gateway plugin's messageTimeout is %gs, shorter than AIBRIX_PREFILL_REQUEST_TIMEOUT (%ds in the "
            "v0.7.0 install); AIBrix runs a vLLM prefill inside that call (pd_disaggregation.go doPrefillRequest), so "
            "a prompt that takes longer to prefill fails whatever the prefill timeout says. That path has three "
            "limits: %s" % (where, seconds, PREFILL_REQUEST_TIMEOUT_S, _KNOBS))


def answer_tokens(flags):
    """The longest answer the engine allows, in tokens: its context length (vLLM ``max-model-len``, SGLang
    ``context-length`` in the final flags); None when the flags leave it to the model's config."""
    for name in ("max-model-len", "context-length"):
        value = (flags or {}).get(name)
        try:
            if value is not None and int(value) > 0:
                return int(value)
        except (TypeError, ValueError):
            continue
    return None


def original_route_findings(flags, request_timeout=DEFAULT_REQUEST_TIMEOUT, policies=None, engine=None):
    """``(error, warning)`` about ``original_route`` for a model whose requests a routing strategy routes.

    ``policies``: the EnvoyPatchPolicy and EnvoyExtensionPolicy objects read from the cluster (apply mode), or None
    (render mode, where only a warning can be given). The need is :func:`longest_answer` of the engine's context
    length (:func:`answer_tokens`) or of ``request_timeout`` when that is set; the route's ``timeout`` and
    ``idle_timeout`` must cover it (:func:`original_route_limits`). With ``engine`` ``vllm`` a plugin
    ``messageTimeout`` under the prefill timeout is a warning (:func:`prefill_note`).
    """
    error, note = _original_route_findings(flags, request_timeout, policies)
    if engine == "vllm" and policies is not None:
        note = "; ".join(n for n in (note, prefill_note(original_route_limits(policies))) if n) or None
    return error, note


def _original_route_findings(flags, request_timeout, policies):
    tokens = answer_tokens(flags)
    if parse_duration(request_timeout or "0s") == 0 and tokens is None:
        return None, ("AIBrix sends every routing-strategy request (the StormService path) through its original_route, "
                      "which times out after %ds in the v0.7.0 install: about %d tokens at %d tok/s. The profile sets "
                      "no context length (max-model-len / context-length) to check it against; set one, or raise "
                      "Helm gateway.envoyPatchPolicy.route.timeout for longer answers"
                      % (ORIGINAL_ROUTE_TIMEOUT_S, ORIGINAL_ROUTE_TIMEOUT_S * SINGLE_STREAM_TOKENS_PER_S,
                         SINGLE_STREAM_TOKENS_PER_S))
    need, why = longest_answer(tokens or 0, request_timeout)
    if policies is None:
        return None, original_route_note(need, why)
    limits = original_route_limits(policies)
    timeout, where = limits["timeout"]
    if where is None:
        return None, ("no EnvoyPatchPolicy in the cluster defines original_route, which AIBrix's routing-strategy "
                      "requests (the StormService path) need; install AIBrix's gateway configuration "
                      "(config/gateway/gateway.yaml, or the Helm chart's gateway-instance)")
    return check_original_route(timeout, where, need, why, limits["idle_timeout"]), None
