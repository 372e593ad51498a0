"""Every rendered set routes, by the route-controller oracle (tests/lib/aibrix_oracle.py).

The oracle restates AIBrix v0.7.0's model-router controller (pkg/controller/modelrouter/modelrouter_controller.go
createHTTPRoute / createReferenceGrant / deleteHTTPRoute), its gateway plugin (gateway_req_body.go
validateModelAvailability, gateway.go validateHTTPRouteStatus, pd_disaggregation.go, pd/engine/sglang.go),
Gateway API v1.4.1 backendRef resolution (ReferenceGrant, BackendNotFound / RefNotPermitted) and the two P/D
fronts (pd_proxy.py's kv_transfer_params, sglang_router's service discovery). The first tests show the oracle
catches each failure the field report and the AIBrix issues describe; then every combination the collection
renders (colocated engine, P/D StormService, P/D Deployments; vLLM and SGLang; RDMA and TCP; a dotted name and a
62-character dotted name) is validated against kubernetes-validate and the vendored CRD schemas and must route.
"""
from __future__ import annotations

import copy
import os

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_manifests as pd
from ansible_collections.llmops.serving.tests.lib import aibrix_oracle as oracle

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")
ROOT = os.path.join(HERE, "..", "..")
K8S_VERSION = "1.33.0"
DOTTED = "glm-5.2-fp8"
# 62 characters, dots included: the longest label value AIBrix can match that leaves room for nothing else.
LONG = "org.lab.glm-5.2-fp8-instruct.2026-08.rev-3f2a9c1.tp8-h20.pd-x1"
assert len(LONG) == 62
with open(os.path.join(ROOT, "roles", "pd_disagg", "files", "pd_proxy.py")) as _f:
    PROXY_SRC = _f.read()


def _crd(path, version):
    with open(path) as f:
        crd = yaml.safe_load(f)
    return [v for v in crd["spec"]["versions"] if v["name"] == version][0]["schema"]["openAPIV3Schema"]


SCHEMAS = {
    ("orchestration.aibrix.ai", "StormService"): _crd(
        os.path.join(FIX, "pd", "aibrix-v0.7.0", "orchestration.aibrix.ai_stormservices.yaml"), "v1alpha1"),
    ("gateway.networking.k8s.io", "HTTPRoute"): _crd(
        os.path.join(FIX, "schemas", "gateway-api-v1.4.1", "httproutes.yaml"), "v1"),
    ("gateway.networking.k8s.io", "ReferenceGrant"): _crd(
        os.path.join(FIX, "schemas", "gateway-api-v1.4.1", "referencegrants.yaml"), "v1beta1"),
}


def validate_all(objects):
    for obj in objects:
        gk = oracle.group_kind(obj)
        if gk in SCHEMAS:
            jsonschema.validate(obj, SCHEMAS[gk])
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def engine_set(engine, model, transport=None):
    """The colocated engine role's objects (transport does not apply to it)."""
    params = dict(engine=engine, served_model_name=model, namespace="llm-lab",
                  model_path="/mnt/nvme/models/glm/3f2a9c1",
                  image=("lmsysorg/sglang:v0.5.16" if engine == "sglang" else "vllm/vllm-openai:v0.11.0")
                  + "@sha256:" + "a" * 64)
    return k8s.build(params)["objects"]


def pd_set(engine, model, workload, transport="rdma", **extra):
    params = dict(engine=engine, workload=workload, transport=transport, model_name=model, namespace="llm-lab",
                  image=("lmsysorg/sglang:v0.5.16" if engine == "sglang" else "vllm/vllm-openai:v0.11.0"),
                  model_path="/models/glm", model_host_path="/mnt/nvme/models/glm/3f2a9c1",
                  ucx_net_devices={"rdma": "mlx5_0:1,mlx5_1:1", "tcp": "eth0"}, proxy_source=PROXY_SRC,
                  proxy_image="registry.example/python:3.11-slim@sha256:" + "b" * 64)
    params.update(extra)
    return pd.build(params)


# --------------------------------------------------------------------------------------------- #
# The oracle catches what breaks on a real cluster
# --------------------------------------------------------------------------------------------- #


def _old_style_deployments(model):
    """The P/D Deployments set as rendered before: the proxy Deployment labelled, no route of our own."""
    objs = [o for o in pd_set("vllm", model, "deployments") if o["kind"] not in ("HTTPRoute", "ReferenceGrant")]
    for o in objs:
        if o["kind"] == "Deployment" and o["spec"]["template"]["metadata"]["labels"].get(oracle.NAME):
            o["metadata"]["labels"].update({k: v for k, v in o["spec"]["template"]["metadata"]["labels"].items()
                                            if k.startswith("model.aibrix.ai/")})
    return objs


def test_a_labelled_deployment_makes_the_controller_route_to_a_service_named_the_model():
    """modelrouter_controller.go: backendRef Name = modelName; glm-5.2-fp8 is no Service name -> 503."""
    objs = _old_style_deployments(DOTTED)
    v = oracle.route(objs, DOTTED)
    assert v.status == 503 and "BackendNotFound" in v.reason, v
    made = {o["kind"]: o for o in oracle.Cluster(objs).controller_made}
    assert made["HTTPRoute"]["metadata"]["name"] == "glm-5.2-fp8-router"
    assert made["HTTPRoute"]["spec"]["rules"][0]["backendRefs"][0]["name"] == "glm-5.2-fp8"
    assert made["ReferenceGrant"]["metadata"]["name"] == "aibrix-system-reserved-referencegrant-in-llm-lab"
    assert oracle.hazards(objs)
    # the same shape routes when the model name happens to be a Service name: the rule is the name
    assert oracle.route(_old_style_deployments("qwen3-8b"), "qwen3-8b").ok


def test_the_controller_keeps_a_route_that_already_exists_but_deletes_it_with_the_workload():
    objs = pd_set("vllm", DOTTED, "deployments")
    labelled = copy.deepcopy(objs)
    front = [o for o in labelled if o["kind"] == "Deployment" and oracle.NAME in o["spec"]["template"]["metadata"]["labels"]][0]
    front["metadata"]["labels"][oracle.NAME] = DOTTED
    cluster = oracle.Cluster(labelled)
    # the labelled Deployment comes first: the controller creates its route and grant (Create; AlreadyExists
    # would be ignored), our route replaces it when applied, and deleting the workload deletes <model>-router
    # by name, ours included
    assert [o["kind"] for o in cluster.controller_made] == ["HTTPRoute", "ReferenceGrant"]
    ours = cluster.get("gateway.networking.k8s.io", "HTTPRoute", "aibrix-system", "glm-5.2-fp8-router")
    assert ours["spec"]["rules"][0]["backendRefs"][0]["name"] == "glm-5-2-fp8-320dd373"
    assert oracle.route(labelled, DOTTED).ok
    assert oracle.hazards(labelled) == ["Deployment glm-5-2-fp8-320dd373-pd-proxy: AIBrix's route controller creates/deletes "
                                        "glm-5.2-fp8-router for it"]
    assert oracle.hazards(objs) == []


def test_a_cross_namespace_backend_needs_a_grant_for_that_service():
    """Gateway API: a backendRef into another namespace needs a ReferenceGrant there, else RefNotPermitted."""
    objs = pd_set("vllm", DOTTED, "deployments")
    no_grant = [o for o in objs if o["kind"] != "ReferenceGrant"]
    assert "RefNotPermitted" in oracle.route(no_grant, DOTTED).reason
    other = copy.deepcopy(objs)
    grant = [o for o in other if o["kind"] == "ReferenceGrant"][0]
    grant["spec"]["to"][0]["name"] = "some-other-service"
    assert "RefNotPermitted" in oracle.route(other, DOTTED).reason
    del grant["spec"]["to"][0]["name"]  # a grant without a name covers every Service of the namespace
    assert oracle.route(other, DOTTED).ok
    no_service = [o for o in objs if not (o["kind"] == "Service" and o["metadata"]["name"] == "glm-5-2-fp8-320dd373")]
    assert "BackendNotFound" in oracle.route(no_service, DOTTED).reason


def test_the_gateway_needs_pods_labelled_with_the_model():
    objs = pd_set("vllm", DOTTED, "deployments")
    for o in objs:
        if o["kind"] == "Deployment":
            o["spec"]["template"]["metadata"]["labels"].pop(oracle.NAME, None)
    v = oracle.route(objs, DOTTED)
    assert v.status == 400 and "does not exist" in v.reason


def test_stormservice_routes_only_with_the_pd_strategy():
    objs = pd_set("vllm", DOTTED, "stormservice")
    bare = copy.deepcopy(objs)
    for role in bare[0]["spec"]["template"]["spec"]["roles"]:
        del role["template"]["metadata"]["annotations"][oracle.CONFIG]
    # no strategy: the gateway looks for <model>-router, which nothing creates for a StormService
    assert "httproute aibrix-system/glm-5.2-fp8-router not found" in oracle.route(bare, DOTTED).reason
    v = oracle.route(bare, DOTTED, strategy="pd")  # the routing-strategy header
    assert v.ok and v.disaggregated
    v = oracle.route(objs, DOTTED)  # the pod profile
    assert v.ok and v.disaggregated, v


def test_the_vllm_proxy_in_front_of_sglang_engines_does_not_serve():
    """pd_proxy.py speaks kv_transfer_params; SGLang's P/D engines need bootstrap_host/port/room."""
    vllm = pd_set("vllm", DOTTED, "deployments")
    sglang = pd_set("sglang", DOTTED, "deployments")
    engines = [o for o in sglang if o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in _pd_checks.ROLES]
    mixed = [o for o in vllm if not (o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in _pd_checks.ROLES)]
    v = oracle.route(mixed + engines, DOTTED)
    assert v.status == 502 and "not a vllm kv_both engine" in v.reason, v


def test_the_sglang_router_needs_rbac_and_the_bootstrap_annotation():
    objs = pd_set("sglang", DOTTED, "deployments")
    assert oracle.route(objs, DOTTED).ok
    no_rbac = [o for o in objs if o["kind"] != "RoleBinding"]
    assert "may not get/list/watch pods" in oracle.route(no_rbac, DOTTED).reason
    wrong = copy.deepcopy(objs)
    prefill = [o for o in wrong if o["metadata"]["labels"].get(pd.ROLE_LABEL) == "prefill"][0]
    prefill["spec"]["template"]["metadata"]["annotations"]["sglang.ai/bootstrap-port"] = "9000"
    assert oracle.route(wrong, DOTTED).status == 504


def test_sglang_stormservice_bootstrap_annotation_must_match_the_engine():
    """pd/engine/sglang.go sends the annotation's port (8998 when missing) as bootstrap_port."""
    objs = pd_set("sglang", DOTTED, "stormservice", sglang_bootstrap_port=9100)
    assert oracle.route(objs, DOTTED).ok
    for role in objs[0]["spec"]["template"]["spec"]["roles"]:
        role["template"]["metadata"]["annotations"].pop(oracle.SGLANG_BOOTSTRAP_ANNOTATION, None)
    v = oracle.route(objs, DOTTED)
    assert v.status == 504 and "listens on 9100" in v.reason


def test_disaggregated_sglang_engines_reached_directly_do_not_answer():
    objs = pd_set("sglang", DOTTED, "stormservice")
    v = oracle.route(objs, DOTTED, strategy="random")
    assert v.status == 504 and "bootstrap" in v.reason


# --------------------------------------------------------------------------------------------- #
# Every rendered set
# --------------------------------------------------------------------------------------------- #

SETS = [(kind, engine, transport, model)
        for kind in ("engine", "stormservice", "deployments")
        for engine in ("vllm", "sglang")
        for transport in ("rdma", "tcp")
        for model in (DOTTED, LONG)
        if not (kind == "engine" and transport == "tcp")]


def _render(kind, engine, transport, model):
    if kind == "engine":
        return engine_set(engine, model)
    return pd_set(engine, model, kind, transport)


@pytest.mark.parametrize("kind,engine,transport,model", SETS)
def test_every_rendered_set_validates_and_routes(kind, engine, transport, model):
    objs = _render(kind, engine, transport, model)
    validate_all(objs)
    assert oracle.hazards(objs) == []
    assert oracle.models_listed(objs) == [model]
    for path in ("/v1/chat/completions", "/v1/completions"):
        v = oracle.route(objs, model, path=path)
        assert v.ok, "%s %s %s %s: %s" % (kind, engine, transport, model, v)
        assert v.disaggregated == (kind != "engine"), v
    if kind != "stormservice":
        # a gateway with a default strategy (ROUTING_ALGORITHM=random) sends requests to labelled pods directly:
        # those must be the engine or the P/D front, never a bare prefill or decode engine
        v = oracle.route(objs, model, gateway_default="random")
        assert v.ok and v.disaggregated == (kind != "engine"), v


# --------------------------------------------------------------------------------------------- #
# The gateway's route table and the readiness checks that pass through it (AIBrix v0.7.0)
# --------------------------------------------------------------------------------------------- #

with open(os.path.join(ROOT, "roles", "engine", "defaults", "main", "kubernetes.yml")) as _f:
    ENGINE_K8S_DEFAULTS = yaml.safe_load(_f)
# The defaults before they followed the route table: /health through the gateway, target-pod without a strategy.
OLD_DEFAULT_CHECKS = [{"type": "health"}, {"type": "models"},
                      {"type": "chat", "prompt": "Reply with exactly FP8_OK and nothing else.", "expect": "FP8_OK",
                       "max_tokens": 512}, {"type": "route", "header": "target-pod"}]


def test_the_route_table_is_aibrix_v070s():
    """config/gateway/gateway-plugin/gateway-plugin.yaml (reserved-router, reserved-router-metadata-endpoint),
    config/gateway/gateway.yaml (EnvoyPatchPolicy original_route, timeout: 120s), gateway_req_body.go,
    gateway_rsp_headers.go, pd_disaggregation.go, python/aibrix/aibrix/metadata/api/v1/models.py (v0.7.0)."""
    objs = engine_set("vllm", DOTTED)
    # no /health route at all: Envoy answers 404 to an unmatched path; /v1/responses is no reserved-router path
    assert oracle.gateway(objs, "GET", "/health").status == 404
    assert oracle.gateway(objs, "POST", "/v1/responses", model=DOTTED).status == 404
    # ... but it is one of <model>-router's paths, so with the model header it routes
    assert oracle.gateway(objs, "POST", "/v1/responses", {"model": DOTTED}, model=DOTTED).route == "glm-5.2-fp8-router"
    # /v1/models: the metadata service, no plugin, no root field
    a = oracle.gateway(objs, "GET", "/v1/models")
    assert a.route == "reserved-router-metadata-endpoint" and a.headers == {}
    assert a.body["data"] == [{"id": DOTTED, "object": "model", "created": 0, "owned_by": "aibrix"}]
    # the model header matches <model>-router directly (more header matches): the plugin never sees the request
    a = oracle.gateway(objs, "POST", "/v1/chat/completions", {"model": DOTTED}, model=DOTTED)
    assert a.ok and a.route == "glm-5.2-fp8-router" and a.headers == {} and a.timeout_s == 0
    # without it: reserved-router -> plugin -> (no strategy) model header set -> <model>-router, its own timeout
    a = oracle.gateway(objs, "POST", "/v1/chat/completions", model=DOTTED)
    assert a.ok and a.route == "glm-5.2-fp8-router" and set(a.headers) == {"request-id", "x-went-into-req-headers"}
    # a routing strategy (header, profile or ROUTING_ALGORITHM) lands on original_route: 120 s, pod headers
    for a in (oracle.gateway(objs, "POST", "/v1/completions", {"routing-strategy": "least-request"}, model=DOTTED),
              oracle.gateway(objs, "POST", "/v1/completions", model=DOTTED, gateway_default="least-request")):
        assert a.ok and a.route == "original_route" and a.timeout_s == 120
        assert set(a.headers) == {"request-id", "x-went-into-req-headers", "routing-strategy", "target-pod",
                                  "target-pod-ip"} and a.headers["target-pod"] == "glm-5-2-fp8-320dd373-0"
    # a StormService always goes that way (its pods' profile says pd); the prefill pod is named too
    a = oracle.gateway(pd_set("vllm", DOTTED, "stormservice"), "POST", "/v1/chat/completions", model=DOTTED)
    assert a.ok and a.route == "original_route" and a.timeout_s == 120 and a.verdict.disaggregated
    assert a.headers["prefill-target-pod"].endswith("-prefill-0") and a.headers["target-pod"].endswith("-decode-0")
    # the timeout is whatever the cluster's EnvoyPatchPolicy says (Helm gateway.envoyPatchPolicy.route.timeout)
    epp = {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
           "metadata": {"name": "aibrix-epp", "namespace": "aibrix-system"},
           "spec": {"jsonPatches": [{"operation": {"op": "add", "path": "/virtual_hosts/0/routes/0", "value": {
               "name": "original_route", "route": {"cluster": "original_destination_cluster", "timeout": "1h"}}}}]}}
    a = oracle.gateway(objs + [epp], "POST", "/v1/completions", {"routing-strategy": "random"}, model=DOTTED)
    assert a.route == "original_route" and a.timeout_s == 3600
    # an unknown model: the plugin's 400
    assert oracle.gateway(objs, "POST", "/v1/completions", model="nope").status == 400


def _gateway_server(objs, gateway_default=None, seen=None):
    """An HTTP server answering as the gateway in front of ``objs`` would, the engines answering FP8_OK."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import json
    import threading

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self, method):
            body = {}
            if method == "POST":
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer = oracle.gateway(objs, method, self.path, dict(self.headers.items()), model=body.get("model"),
                                    gateway_default=gateway_default)
            if seen is not None:
                seen.append((method, self.path, answer.route, answer.status))
            if not answer.ok:
                doc = {"error": {"message": answer.verdict.reason}}
            elif answer.body is not None:
                doc = answer.body
            elif self.path.startswith("/v1/chat/completions"):
                doc = {"choices": [{"message": {"role": "assistant", "content": "FP8_OK"}, "finish_reason": "stop"}]}
            else:
                doc = {"choices": [{"text": "FP8_OK", "finish_reason": "length"}]}
            data = json.dumps(doc).encode()
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in answer.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer("GET")

        def do_POST(self):
            self._answer("POST")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, "http://127.0.0.1:%d" % srv.server_address[1]


@pytest.mark.parametrize("kind,gateway_default", [("engine", None), ("engine", "least-request"),
                                                  ("stormservice", None), ("deployments", None)])
def test_the_default_readiness_checks_pass_through_the_gateway(kind, gateway_default):
    from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe

    checks = ENGINE_K8S_DEFAULTS["engine_k8s_probe_checks"]
    assert ENGINE_K8S_DEFAULTS["engine_k8s_probe_target"] == "aibrix_gateway"
    _probe.validate_checks(checks, "aibrix_gateway")
    objs = _render(kind, "vllm", "rdma", DOTTED)
    seen = []
    srv, url = _gateway_server(objs, gateway_default, seen)
    try:
        ok, results, dummy, dummy2, msg = _probe.run(url, DOTTED, checks, deadline=5, interval=0.1, timeout=5,
                                                     target="aibrix_gateway")
    finally:
        srv.shutdown()
    assert ok, (msg, seen)
    assert [r["type"] for r in results] == ["models", "chat", "route"]
    assert results[1]["text"] == "FP8_OK"
    routed = dict(((m, p), r) for m, p, r, dummy in seen)
    assert routed[("GET", "/v1/models")] == "reserved-router-metadata-endpoint"
    # the chat answer: sent with the model header, so on <model>-router wherever one exists (a StormService has
    # none and its pods' profile says pd: original_route)
    assert routed[("POST", "/v1/chat/completions")] == ("original_route" if kind == "stormservice" else "glm-5.2-fp8-router")
    # the route check asked only for what AIBrix sets: target-pod appears only when a strategy picked a pod
    picked = kind == "stormservice" or gateway_default is not None
    assert ("target-pod" in results[2]["headers"]) == picked
    assert ("prefill-target-pod" in results[2]["headers"]) == (kind == "stormservice")


def test_the_old_default_checks_fail_through_the_gateway():
    from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe

    with pytest.raises(ValueError) as e:
        _probe.validate_checks(OLD_DEFAULT_CHECKS, "aibrix_gateway")
    assert str(e.value).startswith("checks[0]: a health check GETs /health") and "Service or pod" in str(e.value)
    srv, url = _gateway_server(engine_set("vllm", DOTTED))
    try:
        # as the engine role sent them: /health is a 404 retried to the deadline
        ok, results, dummy, dummy2, msg = _probe.run(url, DOTTED, OLD_DEFAULT_CHECKS, deadline=1.5, interval=0.1)
        assert not ok and results[0]["type"] == "health" and "HTTP 404" in msg
        # without /health, target-pod is demanded of a request no strategy routed
        ok, results, dummy, dummy2, msg = _probe.run(url, DOTTED, OLD_DEFAULT_CHECKS[1:], deadline=5, interval=0.1,
                                                     target="aibrix_gateway")
        assert not ok and results[-1]["type"] == "route" and "lacks target-pod" in msg
        # a strategy declared by the caller but not in force is caught too
        ok, results, dummy, dummy2, msg = _probe.run(url, DOTTED, [{"type": "route", "routing_strategy": "pd"}],
                                                     deadline=5, interval=0.1, target="aibrix_gateway")
        assert not ok and "lacks routing-strategy, target-pod" in msg
    finally:
        srv.shutdown()


def test_a_stormservice_answer_longer_than_original_route_is_caught_before_apply():
    """The renderer and the route table agree: every StormService request rides original_route (config/gateway/
    gateway.yaml, timeout: 120s), so the profile's longest answer (131072 tokens at 65 tok/s) would be cut; the
    render warns, a cluster policy that keeps 120 s fails the render with the fix, one without a timeout passes."""
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route as aroute

    objs = pd_set("vllm", DOTTED, "stormservice", engine_args={"max-model-len": 131072})
    a = oracle.gateway(objs, "POST", "/v1/chat/completions", model=DOTTED)
    need, dummy = aroute.longest_answer(131072)
    assert a.route == "original_route" and 0 < a.timeout_s < need
    params = dict(engine="vllm", workload="stormservice", transport="rdma", model_name=DOTTED, namespace="llm-lab",
                  image="vllm/vllm-openai:v0.11.0", model_path="/models/glm", model_host_path="/mnt/nvme/models/glm/3f2a9c1",
                  ucx_net_devices={"rdma": "mlx5_0:1,mlx5_1:1", "tcp": "eth0"}, engine_args={"max-model-len": 131072})
    assert any("original_route" in w for w in pd.render(dict(params))["warnings"])

    def epp(timeout, idle=None):
        # Helm dist/chart/templates/gateway-instance/gateway.yaml also sets idle_timeout (route.idleTimeout, 300s);
        # without one Envoy's 5-minute stream idle timeout applies: a non-streamed answer is idle until it is whole
        route = {"cluster": "original_destination_cluster", "timeout": timeout}
        if idle is not None:
            route["idle_timeout"] = idle
        return {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
                "metadata": {"name": "aibrix-epp", "namespace": "aibrix-system"},
                "spec": {"jsonPatches": [{"operation": {"op": "add", "path": "/virtual_hosts/0/routes/0", "value": {
                    "name": "original_route", "route": route}}}]}}

    with pytest.raises(_k8s_checks.SpecError) as e:
        pd.render(dict(params, gateway_policies=[epp("120s")]))
    assert "gateway.envoyPatchPolicy.route.timeout" in str(e.value)
    assert oracle.gateway(objs + [epp("0s")], "POST", "/v1/chat/completions", model=DOTTED).timeout_s == 0
    with pytest.raises(_k8s_checks.SpecError) as e:  # the timeout raised as told, the idle timeout still cuts it
        pd.render(dict(params, gateway_policies=[epp("0s")]))
    assert "gateway.envoyPatchPolicy.route.idleTimeout" in str(e.value)
    assert not any("original_route" in w for w in pd.render(dict(params, gateway_policies=[epp("0s", "0s")]))["warnings"])
