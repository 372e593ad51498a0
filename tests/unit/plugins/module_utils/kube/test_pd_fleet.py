"""P/D on a real fleet: what an RDMA cluster needs, pods that are not BestEffort, the colocated engine's command line."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_manifests as pd
from ansible_collections.llmops.serving.tests.lib import aibrix_oracle as oracle

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(HERE, "..", "..", "..", "..")
with open(os.path.join(ROOT, "roles", "pd_disagg", "files", "pd_proxy.py")) as _f:
    PROXY_SRC = _f.read()
with open(os.path.join(ROOT, "roles", "engine", "vars", "profiles.yml")) as _f:
    PROFILES = yaml.safe_load(_f)["engine_k8s_builtin_profiles"]

MODEL = "glm-5.2-fp8"
IMAGES = {"vllm": "vllm/vllm-openai:v0.26.0@sha256:" + "b" * 64, "sglang": "lmsysorg/sglang:v0.5.16@sha256:" + "c" * 64}


def render(engine="vllm", workload="stormservice", **extra):
    params = dict(engine=engine, workload=workload, model_name=MODEL, namespace="llm-lab", image=IMAGES[engine],
                  model_path="/models/glm", model_host_path="/mnt/nvme/models/glm/3f2a9c1", proxy_source=PROXY_SRC,
                  ucx_net_devices={"rdma": "mlx5_0:1,mlx5_1:1", "tcp": "eth0"},
                  proxy_image="registry.example/python:3.11-slim@sha256:" + "a" * 64)
    params.update(extra)
    return pd.render(params)


def pods(objs):
    """(what, pod spec, pod metadata) of every pod template: prefill, decode, front."""
    out = []
    for o in objs:
        if o["kind"] == "StormService":
            for r in o["spec"]["template"]["spec"]["roles"]:
                out.append((r["name"], r["template"]["spec"], r["template"]["metadata"]))
        elif o["kind"] == "Deployment":
            meta = o["spec"]["template"]["metadata"]
            out.append((meta["labels"].get(pd.ROLE_LABEL), o["spec"]["template"]["spec"], meta))
    return out


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def qos_class(spec):
    """Kubernetes pkg/apis/core/helper/qos/qos.go GetPodQOS: only cpu and memory count.

    BestEffort when no container requests or limits either; Guaranteed when every container has cpu and memory
    limits equal to its requests; else Burstable.
    """
    counted = ("cpu", "memory")
    any_set, guaranteed = False, True
    for c in spec["containers"]:
        req = {k: v for k, v in (c.get("resources", {}).get("requests") or {}).items() if k in counted}
        lim = {k: v for k, v in (c.get("resources", {}).get("limits") or {}).items() if k in counted}
        any_set = any_set or bool(req or lim)
        if set(lim) != set(counted) or any(req.get(k, lim[k]) != lim[k] for k in counted):
            guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


ALL = [(e, w) for e in ("vllm", "sglang") for w in ("stormservice", "deployments")]

# --------------------------------------------------------------------------------------------- #
# Not BestEffort
# --------------------------------------------------------------------------------------------- #


@pytest.mark.parametrize("engine,workload", ALL)
def test_no_pod_is_best_effort_and_engines_request_cpu_and_memory_for_8_gpus(engine, workload):
    """A BestEffort pod is the first the kubelet evicts under memory pressure; GPU requests do not count."""
    found = pods(render(engine, workload)["objects"])
    assert {w for w, _s, _m in found} >= {"prefill", "decode"}
    for what, spec, _meta in found:
        assert qos_class(spec) == "Burstable", what
        if what in _pd_checks.ROLES:
            req = spec["containers"][0]["resources"]["requests"]
            # the engine role's default: 4 CPUs and 32 GiB per GPU
            assert (req["cpu"], req["memory"], req["nvidia.com/gpu"]) == ("32", "256Gi", "8")
            assert "memory" not in spec["containers"][0]["resources"]["limits"]


def test_requests_are_role_variables():
    objs = render("sglang", "deployments", engine_cpu_request="48", engine_memory_request="512Gi",
                  proxy_resources={"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"memory": "16Gi"}})["objects"]
    for what, spec, _meta in pods(objs):
        res = spec["containers"][0]["resources"]
        if what in _pd_checks.ROLES:
            assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("48", "512Gi")
        else:
            assert res == {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
    with pytest.raises(_k8s_checks.SpecError, match="^engine_resources.requests: do not set nvidia.com/gpu"):
        render(engine_resources={"requests": {"nvidia.com/gpu": "4"}})
    with pytest.raises(_k8s_checks.SpecError, match="^proxy_resources.limits.memory: '2 Gi' is not a Kubernetes quantity"):
        render(workload="deployments", proxy_resources={"limits": {"memory": "2 Gi"}})


# --------------------------------------------------------------------------------------------- #
# TCP vs RDMA: UCX_NET_DEVICES per transport
# --------------------------------------------------------------------------------------------- #


def test_tcp_run_names_a_netdev_for_ucx_and_rdma_the_hca_ports():
    """UCX's tcp transport enumerates /sys/class/net (uct_tcp_query_devices, src/uct/tcp/tcp_iface.c), its IB
    transports name device:port (ucx_info -d): one UCX_NET_DEVICES cannot serve both."""
    for transport, want in (("rdma", "mlx5_0:1,mlx5_1:1"), ("tcp", "eth0")):
        for what, spec, _meta in pods(render(transport=transport)["objects"]):
            assert env_of(spec["containers"][0])["UCX_NET_DEVICES"] == want, (transport, what)


def test_a_single_device_string_is_the_rdma_value_and_tcp_keeps_a_netdev():
    """The old option form (a string) named RDMA ports, which also went to the TCP run: no network device."""
    objs = render(transport="tcp", ucx_net_devices="mlx5_0:1,mlx5_3:1")["objects"]
    for _what, spec, _meta in pods(objs):
        assert env_of(spec["containers"][0])["UCX_NET_DEVICES"] == "eth0"
    rdma = render(transport="rdma", ucx_net_devices="mlx5_0:1,mlx5_3:1")["objects"]
    assert env_of(pods(rdma)[0][1]["containers"][0])["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_3:1"


@pytest.mark.parametrize("devices,message", [
    ({"rdma": "mlx5_0:1", "tcp": "mlx5_0:1"}, "^ucx_net_devices.tcp: 'mlx5_0:1' is an RDMA device:port"),
    ({"rdma": "mlx5_0", "tcp": "eth0"}, r"^ucx_net_devices.rdma: 'mlx5_0' has no port; .* \(mlx5_0:1"),
    ({"rdma": "", "tcp": "eth0"}, "^ucx_net_devices.rdma: empty"),
])
def test_device_names_of_the_wrong_kind_are_refused(devices, message):
    with pytest.raises(_k8s_checks.SpecError, match=message):
        render(ucx_net_devices=devices)


def test_mooncake_cannot_be_the_tcp_control():
    with pytest.raises(_k8s_checks.SpecError, match="^transport: tcp with sglang_transfer_backend mooncake"):
        render("sglang", transport="tcp", sglang_transfer_backend="mooncake")


# --------------------------------------------------------------------------------------------- #
# What an RDMA cluster needs on the pods
# --------------------------------------------------------------------------------------------- #

RDMA_CLUSTER = dict(
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                 {"key": "rdma", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    pod_annotations={"k8s.v1.cni.cncf.io/networks": "rdma-net-ipam"},
    env=[{"name": "UCX_IB_GID_INDEX", "value": "3"}, {"name": "NCCL_IB_GID_INDEX", "value": "3"},
         {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}, {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1"}],
    gpu_resource="nvidia.com/gpu", image_pull_secret="registry-pull",
    hf_token_secret={"name": "hf-token", "key": "token"},
    kernel_cache_dir="/mnt/nvme/kernel-cache/3f2a", kernel_cache_env={"TRITON_CACHE_DIR": "/mnt/nvme/kernel-cache/3f2a/triton"},
    rdma_resource="rdma/hca_shared_devices_a", startup_timeout=5400,
)


@pytest.mark.parametrize("engine,workload", ALL)
def test_engine_pods_carry_what_an_rdma_cluster_needs(engine, workload):
    objs = render(engine, workload, **RDMA_CLUSTER)["objects"]
    seen = set()
    for what, spec, meta in pods(objs):
        assert spec["imagePullSecrets"] == [{"name": "registry-pull"}], what
        if what not in _pd_checks.ROLES:
            # the front stays off GPU nodes: no GPU tolerations, a node without the GPU operator's label
            assert "tolerations" not in spec, what
            assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}]}
            continue
        assert spec["tolerations"] == RDMA_CLUSTER["tolerations"], what
        seen.add(what)
        c = spec["containers"][0]
        env = env_of(c)
        assert meta["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net-ipam"
        assert (env["UCX_IB_GID_INDEX"], env["NCCL_IB_GID_INDEX"], env["NCCL_SOCKET_IFNAME"]) == ("3", "3", "eth0")
        assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
        assert env["TRITON_CACHE_DIR"] == "/mnt/nvme/kernel-cache/3f2a/triton"
        assert {"name": "kernel-cache", "mountPath": "/mnt/nvme/kernel-cache/3f2a"} in c["volumeMounts"]
        assert {"name": "kernel-cache", "hostPath": {"path": "/mnt/nvme/kernel-cache/3f2a", "type": "Directory"}} \
            in spec["volumes"]
        assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
        # the startup probe covers the startup window; the others have timeouts (the default 1 s is too short
        # for an engine busy with a long prefill)
        s = c["startupProbe"]
        assert s["periodSeconds"] * s["failureThreshold"] >= 5400
        assert all(c[p]["timeoutSeconds"] >= 5 for p in ("startupProbe", "readinessProbe", "livenessProbe"))
        if engine == "sglang":
            # the KV managers advertise this address to the other role (get_local_ip_auto reads SGLANG_HOST_IP)
            assert env["SGLANG_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        else:
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        if workload == "stormservice":
            # AIBrix's gateway scrapes model.aibrix.ai/metric-port (pkg/cache/utils.go getPodMetricPort)
            assert meta["labels"]["model.aibrix.ai/metric-port"] == "8000"
            if engine == "sglang" and what == "prefill":
                assert meta["annotations"]["model.aibrix.ai/sglang-bootstrap-port"] == "8998"
    assert seen == {"prefill", "decode"}


def test_host_network_and_the_gpu_resource_name():
    objs = render(host_network=True, gpu_resource="nvidia.com/h20", gpus=8)["objects"]
    for _what, spec, _meta in pods(objs):
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert spec["containers"][0]["resources"]["requests"]["nvidia.com/h20"] == "8"
        assert "nvidia.com/gpu" not in spec["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize("engine,workload", ALL)
def test_xpyd_replica_counts_render_and_route(engine, workload):
    objs = render(engine, workload, prefill_replicas=2, decode_replicas=3)["objects"]
    if workload == "stormservice":
        roles = {r["name"]: r["replicas"] for r in objs[0]["spec"]["template"]["spec"]["roles"]}
    else:
        roles = {o["metadata"]["labels"][pd.ROLE_LABEL]: o["spec"]["replicas"] for o in objs
                 if o["kind"] == "Deployment" and o["metadata"]["labels"].get(pd.ROLE_LABEL) in _pd_checks.ROLES}
    assert roles == {"prefill": 2, "decode": 3}
    v = oracle.route(objs, MODEL)
    assert v.ok and v.disaggregated, v


def test_proxy_prefill_timeout_is_a_variable_and_not_30_seconds():
    """A 128K-token prefill takes minutes; pd_proxy's own default (--prefill-timeout 30) would cut it."""
    objs = render(workload="deployments")["objects"]
    args = [o for o in objs if o["kind"] == "Deployment" and "pd-proxy" in o["metadata"]["name"]][0][
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert float(args[args.index("--prefill-timeout") + 1]) >= 600
    assert float(args[args.index("--decode-timeout") + 1]) >= 1800
    objs = render(workload="deployments", proxy_prefill_timeout=1200)["objects"]
    args = [o for o in objs if o["kind"] == "Deployment" and "pd-proxy" in o["metadata"]["name"]][0][
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prefill-timeout") + 1] == "1200"


# --------------------------------------------------------------------------------------------- #
# The same engine as the colocated one
# --------------------------------------------------------------------------------------------- #

PD_ONLY = {"vllm": {"--kv-transfer-config"},
           "sglang": {"--disaggregation-mode", "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port"}}


def _without(argv, flags):
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in flags:
            skip = True
            continue
        out.append(tok)
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("model_source", ["staged_nvme", "shared_fs"])
def test_pd_engines_run_the_colocated_engine_command_line(engine, model_source):
    """Same profile, engine_args and loader strategy: the argv is the engine role's plus the P/D flags only."""
    engine_args = {"max-model-len" if engine == "vllm" else "context-length": 65536}
    colocated = k8s.build(dict(engine=engine, served_model_name=MODEL, namespace="llm-lab", model_path="/models/glm",
                               image=IMAGES[engine], profile="glm-5.2-fp8", profiles=PROFILES, engine_args=engine_args,
                               model_source=model_source))
    want = [o for o in colocated["objects"] if o["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    want_argv = want["command"] + want["args"]
    objs = render(engine, profile="glm-5.2-fp8", profiles=PROFILES, engine_args=engine_args,
                  model_source=model_source)["objects"]
    for role, spec, _meta in pods(objs):
        c = spec["containers"][0]
        argv = c["command"] + c["args"]
        flags = PD_ONLY[engine] | ({"--enable-metrics"} if engine == "sglang" else set())
        core = [t for t in _without(argv, PD_ONLY[engine]) if t != "--enable-metrics"]
        assert core == [t for t in want_argv if t != "--enable-metrics"], role
        if engine == "vllm":
            kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cuda"}
            assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
            assert argv[argv.index("--max-model-len") + 1] == "65536"
            assert argv[argv.index("--tool-call-parser") + 1] == "glm47"
        else:
            assert argv[argv.index("--disaggregation-mode") + 1] == role
            assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
            assert argv[argv.index("--context-length") + 1] == "65536"
            assert "--enable-metrics" in argv and flags


def test_pd_flags_cannot_be_given_through_engine_args():
    with pytest.raises(_k8s_checks.SpecError, match="^engine_args: 'kv-transfer-config' is set by pd_manifests"):
        render(engine_args={"kv-transfer-config": "{}"})
    with pytest.raises(_k8s_checks.SpecError, match="^extra_args: '--disaggregation-mode=decode' is set by pd_manifests"):
        render("sglang", extra_args=["--disaggregation-mode=decode"])
    with pytest.raises(_k8s_checks.SpecError, match="^engine_args: 'served-model-name' is set by the collection"):
        render(engine_args={"served-model-name": "other"})


def test_the_default_profile_adds_no_tuning_flags():
    """A Llama user must not get GLM parsers: profile none is the default, as in the engine role."""
    for _role, spec, _meta in pods(render()["objects"]):
        argv = spec["containers"][0]["args"]
        assert "--tool-call-parser" not in argv and "--kv-cache-dtype" not in argv
