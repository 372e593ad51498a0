"""P/D manifests for both engines, both modes and both transports, validated against the real schemas."""
from __future__ import annotations

import json
import os

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_manifests as pd

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(HERE, "..", "..", "fixtures")
STORM_CRD = os.path.join(FIX, "pd", "aibrix-v0.7.0", "orchestration.aibrix.ai_stormservices.yaml")
GATEWAY_CRDS = {"HTTPRoute": (os.path.join(FIX, "schemas", "gateway-api-v1.4.1", "httproutes.yaml"), "v1"),
                "ReferenceGrant": (os.path.join(FIX, "schemas", "gateway-api-v1.4.1", "referencegrants.yaml"), "v1beta1")}
PROXY_SRC = os.path.join(HERE, "..", "..", "..", "..", "roles", "pd_disagg", "files", "pd_proxy.py")
K8S_VERSION = "1.33.0"

BASE = dict(model_name="glm-5.2-fp8", image="registry.example/vllm-openai:v0.10.1-nixl",
            model_path="/models/glm-5.2-fp8", model_host_path="/mnt/nvme/models/glm-5.2-fp8/3f2a9c1",
            namespace="llm-lab", ucx_net_devices="mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
            proxy_image="registry.example/python:3.11-slim@sha256:" + "a" * 64,
            prefill_node_selector={"llmops/pd": "prefill"}, decode_node_selector={"llmops/pd": "decode"},
            # gated models need the Hugging Face token: only ever a Secret reference
            env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                 {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}])
with open(PROXY_SRC) as _f:
    BASE["proxy_source"] = _f.read()


def _crd_schema(path, version):
    with open(path) as f:
        crd = yaml.safe_load(f)
    return [v for v in crd["spec"]["versions"] if v["name"] == version][0]["schema"]["openAPIV3Schema"]


def _storm_schema():
    return _crd_schema(STORM_CRD, "v1alpha1")


def _pods(objs):
    """(role, pod spec, pod labels, pod annotations) of every engine pod."""
    out = []
    for o in objs:
        if o["kind"] == "StormService":
            for r in o["spec"]["template"]["spec"]["roles"]:
                t = r["template"]
                out.append((r["name"], t["spec"], t["metadata"]["labels"], t["metadata"].get("annotations", {})))
        elif o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in _pd_checks.ROLES:
            t = o["spec"]["template"]
            out.append((o["metadata"]["labels"][pd.ROLE_LABEL], t["spec"], t["metadata"]["labels"], {}))
    return out


def _env(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


CASES = [(engine, mode) for engine in ("vllm", "sglang") for mode in ("stormservice", "deployments")]


@pytest.mark.parametrize("engine,mode", CASES)
def test_objects_validate_against_kubernetes_and_aibrix_schemas(engine, mode):
    objs = pd.build(dict(BASE, engine=engine, workload=mode))
    for o in objs:
        if o["kind"] == "StormService":
            jsonschema.validate(o, _storm_schema())
        elif o["kind"] in GATEWAY_CRDS:
            jsonschema.validate(o, _crd_schema(*GATEWAY_CRDS[o["kind"]]))
        else:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    assert len(_pods(objs)) == 2
    for _role, spec, _labels, _ann in _pods(objs):
        env = _env(spec["containers"][0])
        assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
        assert env["VLLM_LOGGING_LEVEL"] == "INFO" and "UCX_TLS" in env


def test_storm_schema_rejects_a_bad_update_strategy():
    obj = pd.build(dict(BASE))[0]
    obj["spec"]["updateStrategy"]["type"] = "Recreate"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, _storm_schema())


@pytest.mark.parametrize("engine,mode", CASES)
def test_rdma_and_tcp_renderings_differ_only_in_ucx_tls_and_net_devices(engine, mode):
    rdma = pd.build(dict(BASE, engine=engine, workload=mode, transport="rdma"))
    tcp = pd.build(dict(BASE, engine=engine, workload=mode, transport="tcp"))
    diffs = []

    def walk(a, b, path):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), path + [str(k)])
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, path + [str(i)])
        elif a != b:
            diffs.append((path, a, b))

    walk(rdma, tcp, [])
    assert len(diffs) == 4  # UCX_TLS and UCX_NET_DEVICES of each engine pod, nothing else
    for path, a, b in diffs:
        assert path[-1] == "value" and path[-3] == "env"
        assert (a, b) in (("rc,ud,sm,self,cuda_copy,cuda_ipc", "tcp,sm,self,cuda_copy,cuda_ipc"),
                          ("mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "eth0"))
    for _role, spec, _l, _a in _pods(rdma):
        assert _env(spec["containers"][0])["UCX_TLS"].startswith("rc,")


def test_vllm_pods_have_nixl_config_side_channel_from_pod_ip_rdma_ipc_lock_and_shm():
    for role, spec, labels, ann in _pods(pd.build(dict(BASE))):
        c = spec["containers"][0]
        argv = c["command"] + c["args"]
        kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cuda"}
        assert argv[argv.index("--served-model-name") + 1] == labels["model.aibrix.ai/name"] == "glm-5.2-fp8"
        assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
        env = _env(c)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        shm = [v for v in spec["volumes"] if v["name"] == "dshm"][0]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert spec["nodeSelector"] == {"llmops/pd": role}
        anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == "kubernetes.io/hostname"
        assert anti["labelSelector"]["matchLabels"][pd.ROLE_LABEL] == ("decode" if role == "prefill" else "prefill")
        assert json.loads(ann["model.aibrix.ai/config"]) == {"defaultProfile": "default",
                                                             "profiles": {"default": {"routingStrategy": "pd"}}}


def test_storm_service_roles_are_prefill_and_decode():
    ss = pd.build(dict(BASE))[0]
    assert ss["apiVersion"] == "orchestration.aibrix.ai/v1alpha1"
    assert [r["name"] for r in ss["spec"]["template"]["spec"]["roles"]] == ["prefill", "decode"]


def test_sglang_pods_use_disaggregation_mode_backend_and_ib_device():
    objs = pd.build(dict(BASE, engine="sglang", image="lmsysorg/sglang:v0.5.4", sglang_ib_device="mlx5_0,mlx5_1"))
    for role, spec, labels, _ann in _pods(objs):
        c = spec["containers"][0]
        argv = c["command"] + c["args"]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
        assert argv[argv.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"
        assert argv[argv.index("--tp-size") + 1] == "8"
        assert _env(c)["SGLANG_DISAGGREGATION_NIXL_BACKEND"] == "UCX"
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in _env(c)
        assert labels["model.aibrix.ai/engine"] == "sglang"


def test_deployments_route_through_the_proxy_named_after_the_model():
    objs = pd.build(dict(BASE, workload="deployments"))
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert ("Service", "glm-5-2-fp8-320dd373") in kinds  # DNS-1035 form of the model name
    assert ("HTTPRoute", "glm-5.2-fp8-router") in kinds  # our own route, the name the gateway looks up
    proxy = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) == "front"][0]
    # Only the proxy's pods carry the AIBrix labels: the gateway never sends traffic to a bare engine, and no
    # Deployment carries model.aibrix.ai/name in its own metadata (AIBrix's route controller reads it there).
    assert proxy["spec"]["template"]["metadata"]["labels"]["model.aibrix.ai/name"] == "glm-5.2-fp8"
    for o in objs:
        assert "model.aibrix.ai/name" not in o["metadata"]["labels"], o["kind"]
    for _role, _spec, labels, _ann in _pods(objs):
        assert "model.aibrix.ai/name" not in labels
    args = proxy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prefill") + 1] == "http://glm-5-2-fp8-320dd373-prefill.llm-lab.svc:8000"
    assert args[args.index("--decode") + 1] == "http://glm-5-2-fp8-320dd373-decode.llm-lab.svc:8000"
    cm = [o for o in objs if o["kind"] == "ConfigMap"][0]
    assert "def prefill_body" in cm["data"]["pd_proxy.py"]


def test_sglang_deployments_run_sglangs_router_with_service_discovery():
    """sglang_router.launch_router --pd-disaggregation (router_args.py): the router discovers the role pods,
    reads the prefill bootstrap port from their sglang.ai/bootstrap-port annotation and sends
    bootstrap_host/port/room to both, which pd_proxy (kv_transfer_params only) cannot."""
    objs = pd.build(dict(BASE, engine="sglang", workload="deployments", image="lmsysorg/sglang:v0.5.16"))
    assert "ConfigMap" not in [o["kind"] for o in objs]
    router = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) == "front"][0]
    c = router["spec"]["template"]["spec"]["containers"][0]
    argv = c["command"] + c["args"]
    assert argv[:4] == ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    assert c["image"] == "lmsysorg/sglang:v0.5.16"
    i = argv.index("--prefill-selector")
    assert argv[i + 1:i + 3] == ["llmops.serving/pd-model=glm-5.2-fp8", "llmops.serving/pd-role=prefill"]
    assert argv[argv.index("--service-discovery-namespace") + 1] == "llm-lab"
    assert argv[argv.index("--service-discovery-port") + 1] == "8000"
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == "glm-5-2-fp8-320dd373-sglang-router"
    role = [o for o in objs if o["kind"] == "Role"][0]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    prefill = [o for o in objs if o["metadata"]["labels"].get(pd.ROLE_LABEL) == "prefill"][0]
    assert prefill["spec"]["template"]["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == "8998"


@pytest.mark.parametrize("change,field", [
    (dict(model_name="Bad/Name"), "model_name:"),
    (dict(ucx_tls={"rdma": "rc"}, transport="tcp"), "ucx_tls: no entry for transport 'tcp'"),
    (dict(gpus=4), "gpus: 4 GPUs cannot hold tensor parallel size 8"),
    (dict(side_channel_port=8000), "side_channel_port: 8000 collides"),
    (dict(workload="deployments", proxy_source=""), "proxy_source:"),
    (dict(workload="deployments", routing_strategy="pd"), "routing_strategy: pd pairs StormService pods"),
    (dict(engine="sglang", image="lmsysorg/sglang:v0.5.16", workload="deployments", router_policy="fastest"),
     "router_policy: 'fastest' is not one of SGLang's router policies"),
    (dict(engine="sglang", image="lmsys/sglang:v0.5.4"), "image: 'lmsys/sglang:v0.5.4' is not SGLang's image"),
    (dict(namespace="LLM"), "namespace:"),
])
def test_bad_input_names_the_field(change, field):
    with pytest.raises(_k8s_checks.SpecError) as e:
        pd.build(dict(BASE, **change))
    assert str(e.value).startswith(field)


@pytest.mark.parametrize("field,value,check", [
    ("shm_size", "lots", _k8s_checks.check_shm_size),
    ("hf_token_secret", {"key": "token"}, _k8s_checks.check_hf_token_secret),
    ("image_pull_secret", "Not_A_Secret", _k8s_checks.check_image_pull_secret),
])
def test_the_pair_refuses_a_pod_input_as_the_engine_does(field, value, check):
    with pytest.raises(_k8s_checks.SpecError) as engine:
        check(value)
    with pytest.raises(_k8s_checks.SpecError) as pair:
        pd.build(dict(BASE, env=[], **{field: value}))
    assert str(pair.value) == str(engine.value) and str(engine.value).startswith(field + ":")


@pytest.mark.parametrize("token,name", [("--kv-transfer-config={}", "kv-transfer-config"), ("--port", "port"),
                                        ("-tp", None), ("value", None)])
def test_flag_name_is_the_flag_a_word_sets(token, name):
    assert _k8s_checks.flag_name(token) == name


def test_extra_args_cannot_set_a_flag_the_pair_sets():
    with pytest.raises(_k8s_checks.SpecError, match=r"^extra_args: '--kv-transfer-config=\{\}' is set by pd_manifests"):
        pd.build(dict(BASE, extra_args=["--kv-transfer-config={}"]))


@pytest.mark.parametrize("workload", ["deployments", "stormservice"])
def test_two_served_names_with_one_dns1035_spelling_render_no_common_object(workload):
    """glm-5.2-fp8 and glm-5-2-fp8 rendered the same Deployments, Services, ConfigMap and StormService: object names
    are unique per kind and namespace, so the two sets must not meet (kube/_k8s_names.object_name)."""
    def keys(served):
        return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                for o in pd.build(dict(BASE, model_name=served, workload=workload))}
    dotted, dashed = keys("glm-5.2-fp8"), keys("glm-5-2-fp8")
    assert dotted and not dotted & dashed, dotted & dashed


def test_storm_service_name_leaves_room_for_the_pod_hostnames_aibrix_derives():
    """m9: AIBrix v0.7.0 names a stateful role's pod <storm>-roleset-<5>-<role>-<templateHash (<= 10)>-<index> and
    makes it the pod's hostname (pkg/controller/roleset/utils.go renderStormServicePod), a DNS-1123 label of at most
    63 characters (k8s.io/kubernetes pkg/apis/core/validation ValidatePodSpec, IsDNS1123Label)."""
    served = "qwen3-235b-a22b-instruct-2507-fp8-pd"
    out = pd.render(dict(BASE, model_name=served, workload="stormservice"))
    storm = [o for o in out["objects"] if o["kind"] == "StormService"][0]["metadata"]["name"]
    assert out["workloads"]["prefill"]["name"] == storm
    for role in ("prefill", "decode"):
        assert len("%s-roleset-abcde-%s-%s-%d" % (storm, role, "b" * 10, 99)) <= 63
