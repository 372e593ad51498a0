"""P/D manifests for both engines, both modes and both transports, validated against the real schemas."""
from __future__ import annotations

import json
import os

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils import _pd_manifests as pd

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "..", "fixtures")
STORM_CRD = os.path.join(FIX, "pd", "aibrix-v0.7.0", "orchestration.aibrix.ai_stormservices.yaml")
PROXY_SRC = os.path.join(HERE, "..", "..", "..", "..", "roles", "pd_disagg", "files", "pd_proxy.py")
K8S_VERSION = "1.33.0"

BASE = dict(model_name="glm-5.2-fp8", image="registry.example/vllm-openai:v0.10.1-nixl",
            model_path="/models/glm-5.2-fp8", model_host_path="/mnt/nvme/models/glm-5.2-fp8/3f2a9c1",
            namespace="llm-lab", ucx_net_devices="mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
            prefill_node_selector={"llmops/pd": "prefill"}, decode_node_selector={"llmops/pd": "decode"},
            # gated models need the Hugging Face token: only ever a Secret reference
            env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                 {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}])
with open(PROXY_SRC) as _f:
    BASE["proxy_source"] = _f.read()


def _storm_schema():
    with open(STORM_CRD) as f:
        crd = yaml.safe_load(f)
    return [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"][0]["schema"]["openAPIV3Schema"]


def _pods(objs):
    """(role, pod spec, pod labels, pod annotations) of every engine pod."""
    out = []
    for o in objs:
        if o["kind"] == "StormService":
            for r in o["spec"]["template"]["spec"]["roles"]:
                t = r["template"]
                out.append((r["name"], t["spec"], t["metadata"]["labels"], t["metadata"].get("annotations", {})))
        elif o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in pd.ROLES:
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
def test_rdma_and_tcp_renderings_differ_only_in_ucx_tls(engine, mode):
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
    assert len(diffs) == 2  # one UCX_TLS per engine pod
    for path, a, b in diffs:
        assert path[-1] == "value" and path[-3] == "env"
        assert a == "rc,ud,sm,self,cuda_copy,cuda_ipc" and b == "tcp,sm,self,cuda_copy,cuda_ipc"
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
    objs = pd.build(dict(BASE, engine="sglang", image="lmsys/sglang:v0.5.4", sglang_ib_device="mlx5_0,mlx5_1"))
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
    assert ("Service", "glm-5-2-fp8") in kinds  # DNS-1035 form of the model name
    proxy = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) == "proxy"][0]
    # Only the proxy carries the AIBrix labels: the gateway never sends traffic to a bare engine.
    assert proxy["metadata"]["labels"]["model.aibrix.ai/name"] == "glm-5.2-fp8"
    for _role, _spec, labels, _ann in _pods(objs):
        assert "model.aibrix.ai/name" not in labels
    args = proxy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prefill") + 1] == "http://glm-5-2-fp8-prefill.llm-lab.svc:8000"
    assert args[args.index("--decode") + 1] == "http://glm-5-2-fp8-decode.llm-lab.svc:8000"
    cm = [o for o in objs if o["kind"] == "ConfigMap"][0]
    assert "def prefill_body" in cm["data"]["pd_proxy.py"]


@pytest.mark.parametrize("change,field", [
    (dict(model_name="Bad/Name"), "model_name:"),
    (dict(ucx_tls={"rdma": "rc"}, transport="tcp"), "ucx_tls: no entry for transport 'tcp'"),
    (dict(gpus=4), "gpus: 4 GPUs cannot hold tensor parallel size 8"),
    (dict(side_channel_port=8000), "side_channel_port: 8000 collides"),
    (dict(workload="deployments", proxy_source=""), "proxy_source:"),
    (dict(namespace="LLM"), "namespace:"),
])
def test_bad_input_names_the_field(change, field):
    with pytest.raises(pd.SpecError) as e:
        pd.build(dict(BASE, **change))
    assert str(e.value).startswith(field)
