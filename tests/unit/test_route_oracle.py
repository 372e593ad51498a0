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

from ansible_collections.llmops.serving.plugins.module_utils import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils import _pd_manifests as pd
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
                  ucx_net_devices={"rdma": "mlx5_0:1,mlx5_1:1", "tcp": "eth0"}, proxy_source=PROXY_SRC)
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
    assert ours["spec"]["rules"][0]["backendRefs"][0]["name"] == "glm-5-2-fp8"
    assert oracle.route(labelled, DOTTED).ok
    assert oracle.hazards(labelled) == ["Deployment glm-5-2-fp8-pd-proxy: AIBrix's route controller creates/deletes "
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
    no_service = [o for o in objs if not (o["kind"] == "Service" and o["metadata"]["name"] == "glm-5-2-fp8")]
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
    engines = [o for o in sglang if o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in pd.ROLES]
    mixed = [o for o in vllm if not (o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in pd.ROLES)]
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
