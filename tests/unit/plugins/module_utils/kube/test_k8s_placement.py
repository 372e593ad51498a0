"""Engine and P/D pods run only where their bytes are; multi-node engines get the P/D roles' RDMA knobs; probes fit.

The cluster is tests/lib/kube_scheduler.py (kube-scheduler's NodeAffinity, TaintToleration, NodeResourcesFit and
required pod anti-affinity, and the kubelet's hostPath check, each restated from kubernetes/kubernetes v1.33.0),
with more GPU nodes than hold the revision.
"""
from __future__ import annotations

import os

import kubernetes_validate
import pytest

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_manifests as pd
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import K8S_VERSION, ROOT

REV = "/mnt/nvme/models/GLM-5.2-FP8/3f2a9c1"
DIGEST = "@sha256:" + "d" * 64
GPU_TAINTS = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
ENGINE = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab", model_path=REV,
              image="vllm/vllm-openai:v0.26.0" + DIGEST, tolerations=TOLERATIONS)
with open(os.path.join(ROOT, "roles", "pd_disagg", "files", "pd_proxy.py")) as _f:
    PROXY_SRC = _f.read()
PD = dict(engine="vllm", model_name="glm-5.2-fp8-pd", namespace="llm-lab", image="vllm/vllm-openai:v0.26.0" + DIGEST,
          model_path="/models/glm", model_host_path=REV, proxy_source=PROXY_SRC, tolerations=TOLERATIONS,
          proxy_image="registry.example/python:3.11-slim" + DIGEST, proxy_port=8080,
          ucx_net_devices={"rdma": "mlx5_0:1,mlx5_1:1", "tcp": "net1"})


def cluster(gpu_nodes=8, staged=(), cpu_nodes=1):
    """``gpu_nodes`` H20 nodes (GPU operator labels, a GPU taint, 8 GPUs, an RDMA device pool), the revision
    directory only on ``staged``, plus untainted CPU nodes."""
    nodes = []
    for i in range(1, gpu_nodes + 1):
        name = "h20-gpu-%02d" % i
        nodes.append(ks.node(name, labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H20"},
                             taints=GPU_TAINTS, dirs={REV} if name in staged else set(),
                             allocatable={"cpu": "190", "memory": "2000Gi", "nvidia.com/gpu": "8",
                                          "rdma/rdma_shared_device_a": "1000"}))
    for i in range(1, cpu_nodes + 1):
        nodes.append(ks.node("cpu-%02d" % i, allocatable={"cpu": "32", "memory": "128Gi"}))
    return nodes


def engine_pods(objects):
    return [p for p in ks.pods_of(objects) if "nvidia.com/gpu" in ks.pod_requests(p[3])]


# ------------------------------------------------------------------------------------------------ #
# The scheduler model restates upstream (a wrong model would make every placement test meaningless)
# ------------------------------------------------------------------------------------------------ #


def test_the_model_restates_kube_scheduler_filters():
    n = ks.node("gpu-1", labels={"pool": "gpu", "gen": "9"}, taints=GPU_TAINTS, allocatable={"nvidia.com/gpu": "8"})
    # nodeSelectorTerms are ORed, expressions of one term ANDed; an empty term matches nothing
    # (component-helpers scheduling/corev1/nodeaffinity/nodeaffinity.go)

    def aff(*terms):
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}}
    assert ks.node_affinity(aff({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]},
                                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}]}), n) is None
    assert ks.node_affinity(aff({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]},
                                                      {"key": "gen", "operator": "Lt", "values": ["9"]}]}), n)
    assert ks.node_affinity(aff({}), n) and ks.node_affinity(aff(), n)
    assert ks.node_affinity(aff({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}), n) is None
    assert ks.node_affinity({"nodeSelector": {"pool": "cpu"}}, n)
    # NotIn and DoesNotExist hold where the label is absent (apimachinery labels/selector.go Requirement.Matches)
    assert ks.node_affinity(aff({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}), n) is None
    # taints: NoSchedule must be tolerated; a toleration's empty effect matches every effect
    # (pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go, k8s.io/api core/v1/toleration.go)
    assert ks.taint_toleration({}, n)
    assert ks.taint_toleration({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, n) is None
    assert ks.taint_toleration({"tolerations": [{"key": "nvidia.com/gpu", "value": "other"}]}, n)
    assert ks.taint_toleration({}, ks.node("x", taints=[{"key": "k", "effect": "PreferNoSchedule"}])) is None
    # extended resources: a node that does not list one has none (noderesources/fit.go fitsRequest)
    pod = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}}}]}
    assert ks.resources_fit(pod, n) == "Insufficient rdma/rdma_shared_device_a"
    # the kubelet checks hostPath type Directory at mount (pkg/volume/hostpath/host_path.go checkType)
    vol = {"volumes": [{"name": "m", "hostPath": {"path": REV, "type": "Directory"}}]}
    assert ks.mount_errors(vol, n) == ["hostPath type check failed: %s is not a directory" % REV]
    assert ks.mount_errors(vol, ks.node("y", dirs={REV})) == []


# ------------------------------------------------------------------------------------------------ #
# Item 1: pods only where the revision is
# ------------------------------------------------------------------------------------------------ #


@pytest.mark.parametrize("replicas,nodes", [(1, 1), (2, 1), (2, 2)])
def test_every_engine_pod_is_feasible_only_on_the_staged_nodes(replicas, nodes):
    staged = ["h20-gpu-%02d" % i for i in (2, 3, 5, 7)][: replicas * nodes]
    params = dict(ENGINE, replicas=replicas, staged_nodes=staged)
    if nodes > 1:
        params.update(nodes=nodes, pp_size=nodes)
    built = k8s.build(params)
    pods = engine_pods(built["objects"])
    assert len(pods) == replicas * nodes  # every Deployment pod, every LeaderWorkerSet leader and worker
    nodes_ = cluster(8, staged)
    for pod in pods:
        assert set(ks.feasible(pod, nodes_)) == set(staged), pod[0]
    placed = ks.schedule(built["objects"], nodes_)
    assert sorted(n for _o, n, _e in placed) == sorted(staged)
    assert all(errors == [] for _o, _n, errors in placed), placed  # the hostPath mounts where they landed
    assert built["staged_nodes"] == sorted(staged)


def test_without_staged_nodes_a_pod_can_land_where_the_mount_fails():
    """What the pinning prevents: an unpinned engine is feasible on every GPU node, and on an unstaged one the
    kubelet fails the mount after scheduling."""
    built = k8s.build(dict(ENGINE))
    pod = engine_pods(built["objects"])[0]
    nodes_ = cluster(8, ["h20-gpu-05"])
    assert len(ks.feasible(pod, nodes_)) == 8
    assert any("staged_nodes is not set" in w for w in built["warnings"])
    _owner, where, errors = ks.schedule(built["objects"], nodes_)[0]
    assert where == "h20-gpu-01" and errors == ["hostPath type check failed: %s is not a directory" % REV]


def test_fewer_staged_nodes_than_pods_fail_before_rendering_naming_them():
    with pytest.raises(_k8s_checks.SpecError) as e:
        k8s.build(dict(ENGINE, replicas=3, staged_nodes=["h20-gpu-01", "h20-gpu-02", "h20-gpu-02"]))
    assert "staged on 2 node(s) (h20-gpu-01, h20-gpu-02)" in str(e.value) and "replicas 3" in str(e.value)
    with pytest.raises(_k8s_checks.SpecError) as e:
        k8s.build(dict(ENGINE, nodes=2, pp_size=2, replicas=2, staged_nodes=["a", "b", "c"]))
    assert "replicas 2 x nodes 2" in str(e.value) and "needs 4 pod(s)" in str(e.value)
    with pytest.raises(_k8s_checks.SpecError, match="staged_nodes: 'Bad Node!' is not a node name"):
        k8s.build(dict(ENGINE, staged_nodes=["Bad Node!"]))


@pytest.mark.parametrize("workload", ["engine", "lws", "pd"])
def test_pods_are_pinned_by_node_name_where_the_hostname_label_differs(workload):
    """m1: the inventory's k8s_node_name is the node's name (``kubectl get nodes``); the kubelet's
    ``kubernetes.io/hostname`` label is its hostname, which a cloud provider or --node-name sets apart
    (pkg/kubelet/kubelet_node_status.go initialNode; kubernetes/kops#10413). Pinned on the label, every node failed
    "didn't match Pod's node affinity"; pinned on metadata.name (matchFields, one name per term:
    pkg/apis/core/validation validateNodeFieldSelectorRequirement), the pods go to the staged nodes only."""
    nodes_ = cluster(4, [])
    for n in nodes_:
        n["name"], n["labels"]["kubernetes.io/hostname"] = "ip-10-0-0-%s.ec2.internal" % n["name"][-2:], n["name"]
        n["dirs"] = {REV}
    staged = sorted(n["name"] for n in nodes_ if n["labels"].get("nvidia.com/gpu.present"))[1:3]
    if workload == "pd":
        objs = pd.build(dict(PD, prefill_nodes=staged[:1], decode_nodes=staged[1:]))
    else:
        params = dict(ENGINE, staged_nodes=staged)
        if workload == "lws":
            params.update(nodes=2, pp_size=2)
        objs = k8s.build(params)["objects"]
    pods = engine_pods(objs)
    assert pods
    for pod in pods:
        assert ks.feasible(pod, nodes_) and set(ks.feasible(pod, nodes_)) <= set(staged), (pod[0], ks.feasible(pod, nodes_))
    for obj in objs:
        if obj["kind"] == "Deployment":
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_pinning_is_anded_with_the_sites_own_node_affinity():
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]}}}
    built = k8s.build(dict(ENGINE, affinity=own, staged_nodes=["h20-gpu-02"]))
    nodes_ = cluster(4, ["h20-gpu-02"])
    for n in nodes_:
        n["labels"]["pool"] = "b"
    # either of the site's terms, but only on the staged node
    assert ks.feasible(engine_pods(built["objects"])[0], nodes_) == ["h20-gpu-02"]
    kubernetes_validate.validate([o for o in built["objects"] if o["kind"] == "Deployment"][0], K8S_VERSION, strict=True)


def test_pd_roles_stay_on_their_groups_nodes_and_the_front_off_gpu_nodes():
    colocated, prefill, decode = ["h20-gpu-01"], ["h20-gpu-02", "h20-gpu-04"], ["h20-gpu-03"]
    for workload in ("stormservice", "deployments"):
        r = pd.render(dict(PD, workload=workload, prefill_replicas=2, prefill_nodes=prefill, decode_nodes=decode))
        nodes_ = cluster(8, prefill + decode + colocated)
        for owner, labels, ns, spec in ks.pods_of(r["objects"]):
            role = labels.get(pd.ROLE_LABEL)
            where = ks.feasible((owner, labels, ns, spec), nodes_)
            if role in ("prefill", "decode"):
                assert set(where) == set(prefill if role == "prefill" else decode), (workload, role)
                assert not set(where) & set(colocated)
            else:
                assert where == ["cpu-01"], owner  # no GPU node, though it has room
        placed = ks.schedule(r["objects"], nodes_)
        assert all(n and not errors for _o, n, errors in placed), placed
        assert r["nodes"] == {"prefill": sorted(prefill), "decode": decode}
    with pytest.raises(_k8s_checks.SpecError, match=r"prefill_nodes: the revision is staged on 1 node\(s\) \(h20-gpu-02\)"):
        pd.render(dict(PD, prefill_replicas=2, prefill_nodes=["h20-gpu-02"], decode_nodes=decode))
    with pytest.raises(_k8s_checks.SpecError, match="h20-gpu-03 are in both"):
        pd.render(dict(PD, prefill_nodes=["h20-gpu-03"], decode_nodes=decode))


# ------------------------------------------------------------------------------------------------ #
# Item 5: one RDMA definition for multi-node engines and the P/D roles
# ------------------------------------------------------------------------------------------------ #


def _rdma_view(spec, annotations):
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env") or []
           if e["name"] in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")}
    return dict(resource={k: v for k, v in c["resources"]["limits"].items() if k.startswith("rdma/")},
                caps=c.get("securityContext", {}).get("capabilities", {}).get("add"),
                host_network=spec.get("hostNetwork", False), dns=spec.get("dnsPolicy"), env=env,
                networks=annotations.get("k8s.v1.cni.cncf.io/networks"))


def test_leaderworkerset_pods_get_the_pd_roles_rdma_knobs():
    knobs = dict(resource="rdma/rdma_shared_device_a", count=1, nccl_ib_hca="mlx5_0,mlx5_1", socket_ifname="net1")
    lws = k8s.build(dict(ENGINE, nodes=2, pp_size=2, staged_nodes=["a", "b"],
                         rdma=dict(knobs, networks="llm-lab/rdma-net-0")))
    obj = [o for o in lws["objects"] if o["kind"] == "LeaderWorkerSet"][0]
    pdr = pd.render(dict(PD, rdma_resource=knobs["resource"], nccl_ib_hca=knobs["nccl_ib_hca"],
                         socket_ifname=knobs["socket_ifname"],
                         pod_annotations={"k8s.v1.cni.cncf.io/networks": "llm-lab/rdma-net-0"}))
    role = pdr["objects"][0]["spec"]["template"]["spec"]["roles"][0]["template"]
    want = _rdma_view(role["spec"], role["metadata"]["annotations"])
    assert want["resource"] == {"rdma/rdma_shared_device_a": "1"} and want["caps"] == ["IPC_LOCK"]
    assert want["env"] == {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "net1", "GLOO_SOCKET_IFNAME": "net1"}
    for which in ("leaderTemplate", "workerTemplate"):
        tpl = obj["spec"]["leaderWorkerTemplate"][which]
        assert _rdma_view(tpl["spec"], tpl["metadata"].get("annotations", {})) == want, which
    # LeaderWorkerSet is a CRD: its pod templates are validated as Pods
    for which in ("leaderTemplate", "workerTemplate"):
        tpl = obj["spec"]["leaderWorkerTemplate"][which]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **tpl["metadata"]},
                                      "spec": tpl["spec"]}, K8S_VERSION, strict=True)
    host = k8s.build(dict(ENGINE, nodes=2, pp_size=2, staged_nodes=["a", "b"], rdma=dict(knobs, host_network=True)))
    spec = [o for o in host["objects"] if o["kind"] == "LeaderWorkerSet"][0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_rdma_knobs_are_checked_and_not_set_twice():
    with pytest.raises(_k8s_checks.SpecError, match="rdma: unknown key"):
        k8s.build(dict(ENGINE, rdma={"hca": "mlx5_0"}))
    with pytest.raises(_k8s_checks.SpecError, match="networks .Multus. and host_network exclude each other"):
        k8s.build(dict(ENGINE, rdma={"networks": "rdma-net", "host_network": True}))
    with pytest.raises(_k8s_checks.SpecError, match="env: NCCL_IB_HCA is set by rdma"):
        k8s.build(dict(ENGINE, rdma={"nccl_ib_hca": "mlx5_0"}, env=[{"name": "NCCL_IB_HCA", "value": "mlx5_1"}]))
    with pytest.raises(_k8s_checks.SpecError, match="env: NCCL_SOCKET_IFNAME is set by the collection"):
        pd.render(dict(PD, socket_ifname="net1", env=[{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]))


# ------------------------------------------------------------------------------------------------ #
# Item 7 (P/D front) and item 9 (probes)
# ------------------------------------------------------------------------------------------------ #


def test_pd_front_advertises_metrics_only_where_they_answer_and_is_a_site_image():
    proxy = pd.render(dict(PD, workload="deployments"))
    front = [o for o in proxy["objects"] if o["kind"] == "Deployment"
             and o["spec"]["template"]["metadata"]["labels"].get(pd.ROLE_LABEL) == "front"][0]
    # pd_proxy.py's /metrics holds its own counters, not an engine's: it advertises no metric port (AIBrix reads
    # engine metrics from the port a pod advertises: pkg/cache/cache_metrics.go, vllm-project/aibrix v0.7.0), and
    # a scrape of the default port that still reaches it is answered (tests/unit/test_pd_proxy_robust.py)
    assert "model.aibrix.ai/metric-port" not in front["spec"]["template"]["metadata"]["labels"]
    assert 'if path == "/metrics":' in PROXY_SRC
    router = pd.render(dict(PD, engine="sglang", workload="deployments", image="lmsysorg/sglang:v0.5.16" + DIGEST))
    rfront = [o for o in router["objects"] if o["kind"] == "Deployment"
              and o["spec"]["template"]["metadata"]["labels"].get(pd.ROLE_LABEL) == "front"][0]
    assert rfront["spec"]["template"]["metadata"]["labels"]["model.aibrix.ai/metric-port"] == str(pd.ROUTER_METRICS_PORT)
    with pytest.raises(_k8s_checks.SpecError, match="proxy_image: required .* a site choice"):
        pd.render(dict(PD, workload="deployments", proxy_image=""))
    # the proxy answers a scrape of its default port, so port 8000 needs no warning any more
    assert not any("404" in w for w in pd.render(dict(PD, workload="deployments", proxy_port=8000))["warnings"])


def test_pd_role_deployments_have_a_progress_deadline_from_the_startup_timeout():
    r = pd.render(dict(PD, workload="deployments", startup_timeout=5400))
    for o in r["objects"]:
        if o["kind"] == "Deployment" and o["spec"]["template"]["metadata"]["labels"].get(pd.ROLE_LABEL) in _pd_checks.ROLES:
            # the default 600 s would call a 90-minute cold start ProgressDeadlineExceeded
            assert o["spec"]["progressDeadlineSeconds"] > r["startup_window_seconds"] > 5400
    assert r["progress_deadline_seconds"] > r["startup_window_seconds"]
    assert r["pod_selectors"]["front"][pd.ROLE_LABEL] == "front" and r["replicas"]["front"] == 1


@pytest.mark.parametrize("engine,image", [("vllm", "vllm/vllm-openai:v0.26.0"), ("sglang", "lmsysorg/sglang:v0.5.16")])
def test_probe_timeouts_cover_the_engines_own_health_budget(engine, image):
    c = [o for o in k8s.build(dict(ENGINE, engine=engine, image=image + DIGEST, staged_nodes=["n1"]))["objects"]
         if o["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if engine == "sglang":
            # /health waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for its one-token generation
            # (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py health_generate)
            assert c[probe]["timeoutSeconds"] > 20, probe
        assert c[probe]["periodSeconds"] > c[probe]["timeoutSeconds"] or probe == "startupProbe", probe
