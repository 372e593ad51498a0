"""The one AIBrix routing rule: labels on pods only, our own ``<model>-router`` to the DNS-1035 Service.

Upstream rules restated here (read at tag v0.7.0 of vllm-project/aibrix):

* ``pkg/controller/modelrouter/modelrouter_controller.go``: informers on Deployment, ModelAdapter,
  RayClusterFleet and (when its CRD exists) ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet; for an object
  whose *own* labels carry ``model.aibrix.ai/name`` it creates ``<model>-router`` in ``aibrix-system`` with
  ``backendRefs[0].name = <model>`` and ``timeouts.request = AIBRIX_GATEWAY_TIMEOUT_SECONDS`` (120 s), and
  matches ``modelPaths`` (the list below, with ``/v1/responses``).
* Gateway API v1.4.1 ``HTTPRouteTimeouts.request``: "Setting a timeout to the zero duration (e.g. "0s")
  MUST disable the timeout"; duration pattern ``^([0-9]{1,5}(h|m|s|ms)){1,4}$`` (GEP-2257).
"""
from __future__ import annotations

import functools
import os

import jsonschema
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route as route
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMAS = os.path.join(HERE, "..", "..", "fixtures", "schemas", "gateway-api-v1.4.1")

# modelPaths in pkg/controller/modelrouter/modelrouter_controller.go at v0.7.0
AIBRIX_V070_MODEL_PATHS = [
    "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings",
    "/v1/rerank", "/v1/classify", "/generate", "/generatevideo", "/v1/audio/transcriptions",
    "/v1/audio/translations",
]


@functools.lru_cache(maxsize=None)
def _schema(filename, version):
    with open(os.path.join(SCHEMAS, filename)) as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return [v for v in crd["spec"]["versions"] if v["name"] == version][0]["schema"]["openAPIV3Schema"]


def controller_route_for(obj):
    """What AIBrix v0.7.0's model-router controller creates for one object, or None (its rule, restated)."""
    if (obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else "", obj["kind"]) not in {
            ("apps", "Deployment"), ("orchestration.aibrix.ai", "RayClusterFleet"),
            ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")}:
        return None
    labels = obj["metadata"].get("labels") or {}
    if "model.aibrix.ai/name" not in labels:
        return None
    model = labels["model.aibrix.ai/name"]
    return {"name": model + "-router", "backend": model, "namespace": obj["metadata"]["namespace"]}


def test_paths_are_aibrix_v070s_list_with_responses():
    assert list(route.ROUTE_PATHS) == AIBRIX_V070_MODEL_PATHS


def test_dotted_model_routes_to_the_dns1035_service_across_namespaces():
    model = "glm-5.2-fp8"
    svc = names.service_name(model)
    out = route.route_objects(model, svc, "llm-serving", 8000, labels={"app.kubernetes.io/managed-by": "llmops.serving"})
    grant, http = out["objects"]
    assert (grant["kind"], http["kind"]) == ("ReferenceGrant", "HTTPRoute")
    jsonschema.validate(http, _schema("httproutes.yaml", "v1"))
    jsonschema.validate(grant, _schema("referencegrants.yaml", "v1beta1"))
    # the gateway plugin looks up exactly <model>-router in the gateway namespace
    assert http["metadata"]["name"] == "glm-5.2-fp8-router" == out["route_name"]
    assert http["metadata"]["namespace"] == "aibrix-system"
    backend = http["spec"]["rules"][0]["backendRefs"]
    assert backend == [{"group": "", "kind": "Service", "name": "glm-5-2-fp8-320dd373", "namespace": "llm-serving", "port": 8000}]
    # the grant sits beside the Service and admits routes from the gateway namespace to that Service only
    assert grant["metadata"]["namespace"] == "llm-serving"
    assert grant["spec"]["from"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "aibrix-system"}]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": "glm-5-2-fp8-320dd373"}]
    # every path is matched together with the model header (AIBrix's match)
    matches = http["spec"]["rules"][0]["matches"]
    assert [m["path"]["value"] for m in matches] == AIBRIX_V070_MODEL_PATHS
    assert all(m["headers"] == [{"type": "Exact", "name": "model", "value": model}] for m in matches)


def test_same_namespace_needs_no_grant():
    out = route.route_objects("qwen3-8b", "qwen3-8b", "aibrix-system", 8000)
    assert [o["kind"] for o in out["objects"]] == ["HTTPRoute"] and out["reference_grant_name"] is None


def test_default_request_timeout_is_none_at_all():
    http = route.route_objects("glm-5.2-fp8", "glm-5-2-fp8", "llm", 8000)["objects"][-1]
    assert http["spec"]["rules"][0]["timeouts"] == {"request": "0s"}
    assert route.parse_duration("0s") == 0


@pytest.mark.parametrize("value, seconds", [("0s", 0), ("1800s", 1800), ("30m", 1800), ("1h30m", 5400), ("500ms", 0.5)])
def test_durations_parse_as_gateway_api_defines_them(value, seconds):
    assert route.parse_duration(value) == seconds
    out = route.route_objects("m1", "m1", "llm", 8000, request_timeout=value)
    jsonschema.validate(out["objects"][-1], _schema("httproutes.yaml", "v1"))


def test_short_timeout_warns_with_the_tokens_it_holds():
    # 120 s is the AIBrix controller's default; at 65 tok/s it holds 7800 tokens
    out = route.route_objects("m1", "m1", "llm", 8000, request_timeout="120s")
    assert len(out["warnings"]) == 1 and "about 7800 tokens" in out["warnings"][0] and "0s" in out["warnings"][0]
    assert route.route_objects("m1", "m1", "llm", 8000, request_timeout="30m")["warnings"] == []


@pytest.mark.parametrize("value", ["120", "2 min", "-1s", "1d", ""])
def test_bad_duration_is_refused_with_the_field(value):
    with pytest.raises(route.RouteError, match=r"^route_request_timeout: .* is not a Gateway API duration"):
        route.route_objects("m1", "m1", "llm", 8000, request_timeout=value)
    # the refusal is right: the CRD rejects it too
    with pytest.raises(jsonschema.ValidationError):
        obj = route.route_objects("m1", "m1", "llm", 8000)["objects"][-1]
        obj["spec"]["rules"][0]["timeouts"]["request"] = value
        jsonschema.validate(obj, _schema("httproutes.yaml", "v1"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(model="Qwen3-8B"), "served_model_name"),
    (dict(service="glm-5.2-fp8"), "DNS-1035"),
    (dict(namespace="LLM"), "namespace"),
    (dict(port=0), "port"),
    (dict(paths=["v1/chat"]), r"route_paths\[0\]"),
])
def test_unroutable_inputs_are_refused(kwargs, match):
    base = dict(model="glm-5.2-fp8", service="glm-5-2-fp8", namespace="llm", port=8000)
    positional = [kwargs.get(k, base[k]) for k in ("model", "service", "namespace", "port")]
    extra = {k: v for k, v in kwargs.items() if k not in base}
    with pytest.raises(route.RouteError, match=match):
        route.route_objects(*positional, **extra)


def test_pod_labels_and_workload_labels():
    labels = route.pod_labels("glm-5.2-fp8", 8000, "sglang")
    assert labels == {"model.aibrix.ai/name": "glm-5.2-fp8", "model.aibrix.ai/port": "8000", "model.aibrix.ai/engine": "sglang"}
    assert "model.aibrix.ai/name" not in route.workload_labels(dict(labels, app="x"))


@pytest.mark.parametrize("api, kind, watched", [
    ("apps/v1", "Deployment", True),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", True),
    ("orchestration.aibrix.ai/v1alpha1", "RayClusterFleet", True),
    ("orchestration.aibrix.ai/v1alpha1", "StormService", False),  # no HTTPRoute for StormService (AIBrix #1321)
])
def test_workload_problems_agree_with_the_controller(api, kind, watched):
    labelled = {"apiVersion": api, "kind": kind,
                "metadata": {"name": "w", "namespace": "llm", "labels": route.pod_labels("glm-5.2-fp8", 8000, "vllm")}}
    clean = {"apiVersion": api, "kind": kind, "metadata": {"name": "w", "namespace": "llm", "labels": {"app": "w"}}}
    expected = controller_route_for(labelled)
    assert bool(route.workload_problems([labelled])) is (expected is not None) is watched
    if watched:
        # the route the controller would make points at a Service that cannot exist
        assert not names.is_dns1035_label(expected["backend"])
        assert "glm-5.2-fp8-router" in route.workload_problems([labelled])[0]
    assert route.workload_problems([clean]) == [] and controller_route_for(clean) is None


# ---- the whole rendered set routes: the gateway plugin's lookup and the controller's rule, restated ---- #

def _matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _pod_templates(obj):
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    if obj["kind"] == "LeaderWorkerSet":
        tpl = obj["spec"]["leaderWorkerTemplate"]
        return [tpl["workerTemplate"]] + ([tpl["leaderTemplate"]] if "leaderTemplate" in tpl else [])
    return []


def route_problems(objects, model, gateway_namespace="aibrix-system"):
    """Why a request with header ``model: <model>`` would not reach a serving pod (empty when it would).

    * The gateway plugin (pkg/plugins/gateway/gateway.go, v0.7.0) looks up ``<model>-router`` in the gateway
      namespace; the route must match the model header.
    * Its backendRef Service must exist (else ResolvedRefs=False/BackendNotFound, 503) and, in another
      namespace, a ReferenceGrant there must admit HTTPRoutes from the gateway namespace (else RefNotPermitted).
    * The Service must select the pods that carry the model label (what the pod informer and /v1/models see).
    * No workload may carry the model label itself: the controller would create its own ``<model>-router``
      pointing at a Service named exactly the model.
    """
    problems = []
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    routes = [r for r in by_kind.get("HTTPRoute", []) if r["metadata"]["name"] == model + "-router"
              and r["metadata"]["namespace"] == gateway_namespace]
    if not routes:
        return ["no HTTPRoute %s/%s-router" % (gateway_namespace, model)]
    rule = routes[0]["spec"]["rules"][0]
    if not all({"type": "Exact", "name": "model", "value": model} in m["headers"] for m in rule["matches"]):
        problems.append("a match does not require the model header")
    ref = rule["backendRefs"][0]
    services = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == ref["name"]
                and s["metadata"]["namespace"] == ref["namespace"]]
    if not services:
        return problems + ["BackendNotFound: no Service %s/%s" % (ref["namespace"], ref["name"])]
    svc = services[0]
    if ref["port"] not in [p["port"] for p in svc["spec"]["ports"]]:
        problems.append("the route's port %s is not a Service port" % ref["port"])
    if ref["namespace"] != gateway_namespace and not any(
            g["metadata"]["namespace"] == ref["namespace"]
            and {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": gateway_namespace} in g["spec"]["from"]
            and any(t["kind"] == "Service" and t.get("name") in (None, ref["name"]) for t in g["spec"]["to"])
            for g in by_kind.get("ReferenceGrant", [])):
        problems.append("RefNotPermitted: no ReferenceGrant in %s for Service %s" % (ref["namespace"], ref["name"]))
    labelled = [t for o in objects for t in _pod_templates(o) if t["metadata"]["labels"].get("model.aibrix.ai/name") == model]
    if not labelled:
        problems.append("no pod carries model.aibrix.ai/name=%s" % model)
    if not all(_matches(svc["spec"]["selector"], t["metadata"]["labels"]) for t in labelled):
        problems.append("the Service does not select every pod the gateway routes to")
    for o in objects:
        meant = controller_route_for(o)
        if meant is not None:
            problems.append("%s %s wakes the route controller (%s -> Service %r)" % (o["kind"], o["metadata"]["name"],
                                                                                     meant["name"], meant["backend"]))
    return problems


LONG = "glm-5.2-fp8-" + "x" * 45 + ".v1.2"     # 62 characters with dots


@pytest.mark.parametrize("params", [
    dict(engine="vllm", served_model_name="glm-5.2-fp8"),
    dict(engine="sglang", served_model_name="glm-5.2-fp8"),
    dict(engine="vllm", served_model_name=LONG),
    dict(engine="sglang", served_model_name=LONG, namespace="aibrix-system"),
    dict(engine="vllm", served_model_name="glm-5.2-fp8", pp_size=2, nodes=2),
    dict(engine="sglang", served_model_name=LONG, pp_size=2, nodes=2, replicas=2),
], ids=["vllm", "sglang", "vllm-62", "sglang-62-same-ns", "vllm-lws", "sglang-lws-62"])
def test_every_rendered_engine_set_routes(params):
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s

    image = {"vllm": "vllm/vllm-openai:v0.26.0", "sglang": "lmsysorg/sglang:v0.5.16"}[params["engine"]]
    built = k8s.build(dict(dict(namespace="llm-serving", model_path="/mnt/nvme/m", image=image + "@sha256:" + "f" * 64), **params))
    assert route_problems(built["objects"], params["served_model_name"]) == []


def test_the_route_oracle_catches_what_aibrix_would_break():
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s

    base = dict(engine="vllm", served_model_name="glm-5.2-fp8", namespace="llm-serving", model_path="/m",
                image="vllm/vllm-openai:v0.26.0@sha256:" + "f" * 64)
    # the controller's own route for a labelled Deployment (manage_route=false) points at Service "glm-5.2-fp8"
    unmanaged = k8s.build(dict(base, manage_route=False))["objects"]
    assert route_problems(unmanaged, "glm-5.2-fp8") == ["no HTTPRoute aibrix-system/glm-5.2-fp8-router"]
    objs = k8s.build(base)["objects"]
    no_grant = [o for o in objs if o["kind"] != "ReferenceGrant"]
    assert any("RefNotPermitted" in p for p in route_problems(no_grant, "glm-5.2-fp8"))
    labelled = yaml.safe_load(yaml.safe_dump(objs))
    labelled[-1]["metadata"]["labels"]["model.aibrix.ai/name"] = "glm-5.2-fp8"
    assert any("wakes the route controller" in p for p in route_problems(labelled, "glm-5.2-fp8"))


# ---- original_route: the timeout every routing-strategy request gets --------------------------------------- #

def _epp(timeout="120s", name="aibrix-epp", idle=None):
    """The EnvoyPatchPolicy of AIBrix v0.7.0's config/gateway/gateway.yaml (kustomize prefix aibrix-), trimmed to
    the original_route patch; Helm dist/chart/templates/gateway-instance/gateway.yaml renders the same route from
    gateway.envoyPatchPolicy.route.timeout (120s in dist/chart/values.yaml) and adds ``idle_timeout`` from
    gateway.envoyPatchPolicy.route.idleTimeout (300s)."""
    route_action = {"cluster": "original_destination_cluster"}
    if timeout is not None:
        route_action["timeout"] = timeout
    if idle is not None:
        route_action["idle_timeout"] = idle
    return {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
            "metadata": {"name": name, "namespace": "aibrix-system"},
            "spec": {"type": "JSONPatch", "targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                                        "name": "aibrix-eg"},
                     "jsonPatches": [{"type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                                      "name": "aibrix-system/aibrix-eg/http",
                                      "operation": {"op": "add", "path": "/virtual_hosts/0/routes/0", "value": {
                                          "name": "original_route",
                                          "match": {"prefix": "/", "headers": [{"name": "routing-strategy",
                                                                                "string_match": {"safe_regex": {"regex": ".*"}}}]},
                                          "route": route_action}}}]}}


def test_original_route_timeout_is_read_from_the_clusters_policy():
    assert route.original_route_timeout([_epp()]) == (120, "EnvoyPatchPolicy aibrix-system/aibrix-epp")
    assert route.original_route_timeout([{"kind": "ConfigMap"}, _epp("1h", "aibrix-epp")])[0] == 3600
    assert route.original_route_timeout([_epp("0s")])[0] == 0
    # Envoy's RouteAction.timeout defaults to 15 s when the patch sets none
    assert route.original_route_timeout([_epp(None)])[0] == 15
    assert route.original_route_timeout([]) == (None, None)
    with pytest.raises(route.RouteError) as e:
        route.original_route_timeout([_epp("two minutes")])
    assert "aibrix-system/aibrix-epp" in str(e.value) and "not an Envoy duration" in str(e.value)


def test_the_longest_answer_is_the_request_timeout_else_the_context_at_the_measured_rate():
    assert route.longest_answer(131072) == (131072 / 65.0, "an answer of 131072 tokens at 65 tok/s")
    assert route.longest_answer(131072, "30m")[0] == 1800
    assert route.answer_tokens({"max-model-len": "131072"}) == 131072
    assert route.answer_tokens({"context-length": 32768}) == 32768
    assert route.answer_tokens({}) is None


def test_original_route_findings_fail_in_apply_mode_and_warn_in_render_mode():
    flags = {"max-model-len": 131072}
    error, note = route.original_route_findings(flags, "0s", [_epp()])
    assert note is None and error.startswith("EnvoyPatchPolicy aibrix-system/aibrix-epp: original_route")
    assert "times out after 120s" in error and "streams for 2016s" in error
    assert "gateway.envoyPatchPolicy.route.timeout=2017s" in error
    assert route.original_route_findings(flags, "0s", [_epp("0s", idle="0s")]) == (None, None)
    assert route.original_route_findings(flags, "0s", [_epp("3600s", idle="1h")]) == (None, None)
    # the operator's own request timeout is the bound when set: 100 s fits in 120 s
    assert route.original_route_findings(flags, "100s", [_epp()]) == (None, None)
    error, dummy = route.original_route_findings(flags, "30m", [_epp()])
    assert "within the request timeout 30m streams for 1800s" in error
    # render mode: the same comparison against v0.7.0's 120 s, as a warning
    error, note = route.original_route_findings(flags, "0s", None)
    assert error is None and "Rendered only" in note and "gateway.envoyPatchPolicy.route.timeout=2017s" in note
    assert route.original_route_findings({"max-model-len": 4096}, "0s", None) == (None, None)
    # no policy defines original_route: a warning that routing-strategy requests have no route
    assert "no EnvoyPatchPolicy" in route.original_route_findings(flags, "0s", [])[1]


def test_the_stormservice_render_checks_original_route():
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_manifests as pd

    params = dict(engine="vllm", workload="stormservice", transport="tcp", model_name="glm-5.2-fp8",
                  namespace="llm-lab", image="vllm/vllm-openai:v0.11.0@sha256:" + "a" * 64, model_path="/models/glm",
                  model_host_path="/mnt/nvme/models/glm/3f2a9c1", engine_args={"max-model-len": 131072})
    r = pd.render(dict(params))
    assert any("original_route" in w and "Rendered only" in w for w in r["warnings"])
    with pytest.raises(_k8s_checks.SpecError) as e:
        pd.render(dict(params, gateway_policies=[_epp()]))
    assert str(e.value).startswith("gateway_policies: EnvoyPatchPolicy aibrix-system/aibrix-epp: original_route")
    r = pd.render(dict(params, gateway_policies=[_epp("0s", idle="0s")]))
    assert not any("original_route" in w for w in r["warnings"])


def _eep(message_timeout="60s"):
    """AIBrix v0.7.0 config/gateway/gateway-plugin/gateway-plugin.yaml EnvoyExtensionPolicy
    gateway-plugins-extension-policy (Helm dist/chart/templates/gateway-plugin/envoy_extension_policy.yaml,
    gatewayPlugin.messageTimeout "60s"), trimmed."""
    return {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyExtensionPolicy",
            "metadata": {"name": "aibrix-gateway-plugins-extension-policy", "namespace": "aibrix-system"},
            "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                   "name": "aibrix-reserved-router"},
                     "extProc": [{"backendRefs": [{"name": "aibrix-gateway-plugins", "port": 50052}],
                                  "processingMode": {"request": {"body": "Buffered"}, "response": {"body": "Streamed"}},
                                  "messageTimeout": message_timeout}]}}


def test_a_raised_route_timeout_still_meets_the_idle_timeout_and_every_message_names_the_three_limits():
    """m3: the Helm install also sets the same route's idle_timeout 300s (a non-streamed answer is idle until it is
    whole), and the gateway plugin's ext_proc messageTimeout 60s bounds a vLLM prefill (it runs inside the plugin's
    request-body call: pkg/plugins/gateway/algorithms/pd_disaggregation.go doPrefillRequest). Before, an operator who
    raised the route timeout as told passed the check and got resets at 300 s."""
    flags = {"max-model-len": 131072}  # 2016 s at 65 tok/s
    error, note = route.original_route_findings(flags, "0s", [_epp("0s", idle="300s"), _eep()])
    assert error and "idle for 300s" in error and "gateway.envoyPatchPolicy.route.idleTimeout=2017s" in error
    for knob in ("gateway.envoyPatchPolicy.route.timeout", "gateway.envoyPatchPolicy.route.idleTimeout",
                 "gatewayPlugin.messageTimeout", "AIBRIX_PREFILL_REQUEST_TIMEOUT"):
        assert knob in error, knob
    # the kustomize patch sets no idle_timeout: Envoy's stream idle timeout (5 min) applies
    assert route.original_route_limits([_epp("0s")])["idle_timeout"][0] == 300
    assert route.original_route_findings(flags, "0s", [_epp("0s", idle="0s"), _eep()]) == (None, None)
    # a messageTimeout under the prefill timeout decides for vLLM's synchronous prefill
    assert route.original_route_limits([_eep("30s")])["message_timeout"] == (
        30, "EnvoyExtensionPolicy aibrix-system/aibrix-gateway-plugins-extension-policy")
    error, note = route.original_route_findings(flags, "0s", [_epp("0s", idle="0s"), _eep("30s")], engine="vllm")
    assert error is None and "messageTimeout is 30s" in note and "gatewayPlugin.messageTimeout" in note
    assert route.original_route_findings(flags, "0s", [_epp("0s", idle="0s"), _eep("30s")], engine="sglang") == (None, None)


def test_a_gateway_namespace_other_than_aibrix_system_warns_that_the_route_is_never_found():
    """m6: AIBrix v0.7.0 pkg/plugins/gateway/gateway.go: defaultAIBrixNamespace = "aibrix-system", and
    validateHTTPRouteStatus reads HTTPRoutes(defaultAIBrixNamespace).Get("<model>-router"): a route elsewhere is never
    found, every request without a routing strategy gets a 503. Before, any namespace was accepted in silence."""
    out = route.route_objects("glm-5.2-fp8", "glm-5-2-fp8-320dd373", "llm", 8000, gateway_namespace="gateway-system")
    (warning,) = [w for w in out["warnings"] if w.startswith("gateway_namespace:")]
    assert "'gateway-system'" in warning and "aibrix-system only" in warning and "503" in warning
    assert out["objects"][-1]["metadata"]["namespace"] == "gateway-system"  # rendered as asked, with the warning
    assert not [w for w in route.route_objects("glm-5.2-fp8", "glm-5-2-fp8-320dd373", "llm", 8000)["warnings"]
                if w.startswith("gateway_namespace:")]
