"""A model that needs two 8-GPU nodes (TP=8 x PP=2) is rendered as one LeaderWorkerSet group of two pods.

No LeaderWorkerSet CRD is vendored here, so the object is checked against the fields of the upstream v1 API as
read in kubernetes-sigs/lws, tag v0.7.0, ``api/leaderworkerset/v1/leaderworkerset_types.go`` (restated in
:func:`check_lws`); the two pod templates are checked by kubernetes-validate as core/v1 PodTemplates.
Engine rendezvous flags: vLLM ``--nnodes/--node-rank/--master-addr/--master-port`` and ``--headless`` on the
other nodes (vllm-project/vllm PR #23691, ``docs/serving/parallelism_scaling.md``); SGLang ``--nnodes
--node-rank --dist-init-addr`` (sgl-project/sglang ``docs/references/multi_node_deployment/lws_pd/lws-examples``).
"""
from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route as route
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import K8S_VERSION, PROFILES

DIGEST = "@sha256:" + "e" * 64
VLLM = dict(engine="vllm", served_model_name="glm-5.2-fp8-2n", namespace="llm-lab", model_path="/mnt/nvme/models/GLM-5.2-FP8/v1",
            image="vllm/vllm-openai:v0.26.0" + DIGEST, tp_size=8, pp_size=2, nodes=2, profile="glm-5.2-fp8", profiles=PROFILES)
SGLANG = dict(VLLM, engine="sglang", image="lmsysorg/sglang:v0.5.16" + DIGEST)

# ---- leaderworkerset_types.go (v0.7.0), restated ------------------------------------------------ #
LWS_SPEC = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"}
LWS_TEMPLATE = {"leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy"}
STARTUP_POLICIES = {"LeaderCreated", "LeaderReady"}                  # +kubebuilder:validation:Enum
RESTART_POLICIES = {"Default", "RecreateGroupOnPodRestart", "None"}  # +kubebuilder:validation:Enum
ROLLOUT_TYPES = {"RollingUpdate"}                                    # +kubebuilder:validation:Enum
ROLLING_UPDATE = {"partition", "maxUnavailable", "maxSurge"}
# env vars the LeaderWorkerSet webhook adds to every container (LwsLeaderAddress, LwsGroupSize, LwsWorkerIndex)
LWS_ENV = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def check_lws(obj):
    assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and obj["kind"] == "LeaderWorkerSet"
    assert names.is_dns1123_subdomain(obj["metadata"]["name"])
    spec = obj["spec"]
    assert set(spec) <= LWS_SPEC
    assert isinstance(spec["replicas"], int) and spec["replicas"] >= 0
    assert spec["startupPolicy"] in STARTUP_POLICIES
    assert spec["rolloutStrategy"]["type"] in ROLLOUT_TYPES
    ru = spec["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert set(ru) <= ROLLING_UPDATE
    assert not (ru.get("maxSurge", 0) == 0 and ru.get("maxUnavailable", 1) == 0)  # "can not be 0 if MaxSurge is 0"
    tpl = spec["leaderWorkerTemplate"]
    assert set(tpl) <= LWS_TEMPLATE and "workerTemplate" in tpl                    # workerTemplate is required
    assert isinstance(tpl["size"], int) and tpl["size"] >= 1                       # "The minimum is 1"
    assert tpl["restartPolicy"] in RESTART_POLICIES
    for key in ("leaderTemplate", "workerTemplate"):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": tpl[key]}, K8S_VERSION, strict=True)


def test_the_validator_is_not_vacuous():
    obj = _lws(k8s.build(VLLM))
    for path, value in ((("spec", "startupPolicy"), "WhenReady"),
                        (("spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),
                        (("spec", "leaderWorkerTemplate", "size"), 0)):
        bad = yaml.safe_load(yaml.safe_dump(obj))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(AssertionError):
            check_lws(bad)
    bad = yaml.safe_load(yaml.safe_dump(obj))
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_lws(bad)


def _lws(built):
    return [o for o in built["objects"] if o["kind"] == "LeaderWorkerSet"][0]


def _containers(built):
    tpl = _lws(built)["spec"]["leaderWorkerTemplate"]
    return tpl["leaderTemplate"]["spec"]["containers"][0], tpl["workerTemplate"]["spec"]["containers"][0]


def _arg(args, flag):
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("params", [VLLM, SGLANG], ids=["vllm", "sglang"])
def test_two_node_engine_is_one_leaderworkerset_group(params):
    built = k8s.build(params)
    kinds = [o["kind"] for o in built["objects"]]
    assert kinds == ["Service", "ReferenceGrant", "HTTPRoute", "LeaderWorkerSet"]
    lws = _lws(built)
    check_lws(lws)
    assert built["workload"] == {"kind": "LeaderWorkerSet", "name": lws["metadata"]["name"]}
    spec = lws["spec"]
    assert spec["leaderWorkerTemplate"]["size"] == 2
    # workers start with the leader (the leader cannot be Ready before every node joined: LeaderReady deadlocks)
    assert spec["startupPolicy"] == "LeaderCreated"
    # a restarted rank cannot rejoin the NCCL group: the whole group is recreated
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
    leader, worker = _containers(built)
    for c in (leader, worker):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"     # 16 GPUs over two pods
        assert c["resources"]["requests"]["cpu"] == "32"
    assert "startupProbe" in leader and "readinessProbe" in leader
    assert not any(k in worker for k in ("startupProbe", "readinessProbe", "livenessProbe"))  # no HTTP server there
    for tpl in ("leaderTemplate", "workerTemplate"):
        assert spec["leaderWorkerTemplate"][tpl]["spec"]["shareProcessNamespace"] is True


def test_vllm_rendezvous_flags():
    leader, worker = _containers(k8s.build(VLLM))
    for c in (leader, worker):
        a = c["args"]
        assert (_arg(a, "--tensor-parallel-size"), _arg(a, "--pipeline-parallel-size"), _arg(a, "--nnodes")) == ("8", "2", "2")
        assert _arg(a, "--master-addr") == "$(LWS_LEADER_ADDRESS)" and _arg(a, "--master-port") == "29501"
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert _arg(leader["args"], "--node-rank") == "0" and "--headless" not in leader["args"]
    assert _arg(worker["args"], "--node-rank") == "$(LWS_WORKER_INDEX)" and "--headless" in worker["args"]


def test_sglang_rendezvous_flags():
    leader, worker = _containers(k8s.build(SGLANG))
    for c in (leader, worker):
        a = c["args"]
        assert (_arg(a, "--tp-size"), _arg(a, "--pp-size"), _arg(a, "--nnodes")) == ("8", "2", "2")
        # the rendezvous port is not the HTTP port
        assert _arg(a, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000" and _arg(a, "--port") == "8000"
    assert _arg(leader["args"], "--node-rank") == "0"
    assert _arg(worker["args"], "--node-rank") == "$(LWS_WORKER_INDEX)"


@pytest.mark.parametrize("params", [VLLM, SGLANG], ids=["vllm", "sglang"])
def test_every_variable_in_the_arguments_is_defined_for_the_kubelet(params):
    # the kubelet expands $(NAME) only from the container's environment: ours, or what the LWS webhook adds
    for c in _containers(k8s.build(params)):
        defined = {e["name"] for e in c.get("env", [])} | LWS_ENV
        used = set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(c["args"])))
        assert used and used <= defined
        env = {e["name"]: e for e in c["env"]}
        assert env["LWS_WORKER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['%s']" % WORKER_INDEX_LABEL


def test_only_the_leader_is_routed():
    built = k8s.build(VLLM)
    lws = _lws(built)
    tpl = lws["spec"]["leaderWorkerTemplate"]
    leader_labels = tpl["leaderTemplate"]["metadata"]["labels"]
    worker_labels = tpl["workerTemplate"]["metadata"]["labels"]
    # AIBrix v0.7.0's route controller watches LeaderWorkerSets too: no model label on the object itself
    assert route.workload_problems([lws]) == []
    assert "model.aibrix.ai/name" not in lws["metadata"]["labels"]
    # the gateway's pod informer routes to pods with the label: only the leader serves HTTP
    assert leader_labels["model.aibrix.ai/name"] == "glm-5.2-fp8-2n"
    assert "model.aibrix.ai/name" not in worker_labels
    svc = [o for o in built["objects"] if o["kind"] == "Service"][0]
    sel = svc["spec"]["selector"]
    assert all(leader_labels.get(k) == v for k, v in sel.items())
    assert not all(worker_labels.get(k) == v for k, v in sel.items())
    assert built["pod_selector"] == sel
    http = [o for o in built["objects"] if o["kind"] == "HTTPRoute"][0]
    assert http["spec"]["rules"][0]["backendRefs"][0]["name"] == svc["metadata"]["name"]


def test_a_long_dotted_model_name_still_fits_statefulset_names():
    model = "glm-5.2-fp8-" + "x" * 45 + ".v1.2"          # 62 characters, dots included
    assert len(model) == 62
    built = k8s.build(dict(VLLM, served_model_name=model))
    lws = _lws(built)
    check_lws(lws)
    # worker StatefulSet <lws>-<group>, its pods labelled controller-revision-hash=<sts>-<10 hex>: <= 63
    assert len(lws["metadata"]["name"]) <= names.STATEFULSET_BASE_MAX
    assert len(lws["metadata"]["name"] + "-99999-" + "a" * 10) <= 63
    assert built["route_name"] == model + "-router"


def test_several_groups_get_a_disruption_budget_over_all_their_pods():
    built = k8s.build(dict(VLLM, replicas=2))
    pdb = [o for o in built["objects"] if o["kind"] == "PodDisruptionBudget"][0]
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)
    tpl = _lws(built)["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        labels = tpl[key]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())


@pytest.mark.parametrize("override, match", [
    ({"image": "vllm/vllm-openai:v0.10.1", "profile": "none"}, r"^image: .* older than multi-node serving without Ray"),
    ({"nodes": 3}, r"^nodes: tp_size x pp_size = 16 GPUs cannot be split evenly over 3 nodes"),
    ({"dist_port": 8000}, r"^dist_port: 8000 must be a TCP port other than port"),
    ({"engine_args": {"nnodes": 4}}, r"^engine_args: 'nnodes' is set by the collection"),
    ({"extra_args": ["--master-addr=10.0.0.1"]}, r"^extra_args: '--master-addr=10.0.0.1' is set by the collection"),
])
def test_multi_node_mistakes_are_refused(override, match):
    with pytest.raises(_k8s_checks.SpecError, match=match):
        k8s.build(dict(VLLM, **override))


def test_an_unknown_vllm_version_warns_for_multi_node():
    built = k8s.build(dict(VLLM, image="vllm/vllm-openai:latest", profile="none"))
    assert any("multi-node serving without Ray" in w and _k8s_checks.VLLM_MULTINODE_MIN in w for w in built["warnings"])


# --------------------------------------------------------------------------------------------- #
# m2: the rollout of a re-applied LeaderWorkerSet, by what each LWS version reports
# --------------------------------------------------------------------------------------------- #

def _lws_status(generation, v09, observed=None, hash_="old111"):
    """A re-applied LWS right after the apply, its old group still Ready. kubernetes-sigs/lws: v0.8.0
    (pkg/controllers/leaderworkerset_controller.go makeCondition) writes conditions without observedGeneration and no
    status.observedGeneration; v0.9.0 (#807, api/leaderworkerset/v1/leaderworkerset_types.go ObservedGeneration,
    setConditions) sets both to the generation it reconciled."""
    status = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
              "conditions": [{"type": "Available", "status": "True", "reason": "AllGroupsReady",
                              "lastTransitionTime": "2026-08-02T08:00:00Z"}]}
    if v09:
        status["observedGeneration"] = observed
        status["conditions"][0]["observedGeneration"] = observed
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "glm", "namespace": "llm-lab", "generation": generation},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}}, "status": status}
    pod = {"kind": "Pod", "metadata": {"name": "glm-0", "namespace": "llm-lab", "creationTimestamp": "2026-08-02T07:00:00Z",
                                       "labels": {"leaderworkerset.sigs.k8s.io/template-revision-hash": hash_}},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    return lws, pod


def test_an_lws_before_v0_9_is_not_ready_from_its_old_group_after_a_re_apply():
    """m2: the replay S2 (generation 2, v0.8-shaped status, old leader Ready) read "ready | revision old111 rolled out".
    Without observedGeneration nothing tells the controller saw generation 2: the wait refuses to call it ready and
    names the LWS version that fixes it."""
    lws, pod = _lws_status(2, v09=False)
    v = _k8s_wait.evaluate([pod], check_route=False, workload=lws)
    assert v["state"] == "failed" and "v0.9.0" in v["message"] and "observedGeneration" in v["message"], v["message"]
    first, pod = _lws_status(1, v09=False)  # a first apply has no old revision to mistake for the new one
    assert _k8s_wait.evaluate([pod], check_route=False, workload=first)["state"] == "ready"


def test_an_lws_from_v0_9_is_judged_by_its_observed_generation():
    lws, pod = _lws_status(2, v09=True, observed=1)
    v = _k8s_wait.evaluate([pod], check_route=False, workload=lws)
    assert v["state"] == "waiting" and "observe generation 2" in v["message"], v["message"]
    lws, pod = _lws_status(2, v09=True, observed=2)
    assert _k8s_wait.evaluate([pod], check_route=False, workload=lws)["state"] == "ready"


def _lws_on(cluster, path):
    """The collection's two-node engine (LeaderWorkerSet) for ``path``, applied to the model ``cluster``; its fetch
    selects the leader pods as k8s_engine_wait does (pod_selector)."""
    built = k8s.build(dict(VLLM_TWO_NODES, model_path=path))
    lws = [o for o in built["objects"] if o["kind"] == "LeaderWorkerSet"][0]
    cluster.apply(lws)
    selector = built["pod_selector"]

    def fetch():
        f = cluster.fetch()
        f["pods"] = [p for p in f["pods"] if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        return f
    return fetch


VLLM_TWO_NODES = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab",
                      image="vllm/vllm-openai:v0.26.0@sha256:" + "a" * 64, nodes=2, pp_size=2)


@pytest.mark.parametrize("version", [(0, 8), (0, 9)])
def test_right_after_a_re_apply_the_old_group_is_never_ready(version):
    """m2 against the LWS model (tests/lib/kube_controllers.py, kubernetes-sigs/lws leaderworkerset_controller.go):
    the poll right after the apply, before the controller reconciled generation 2, sees the old group Ready and an
    Available status. LWS v0.9+ tells it by observedGeneration (waiting); before v0.9 nothing does (refused)."""
    from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

    cluster = kc.Cluster()
    cluster.lws_version = version
    cluster.engines.update({"/m/a": kc.Engine(load_seconds=30), "/m/b": kc.Engine(load_seconds=30)})
    fetch = _lws_on(cluster, "/m/a")
    cluster.advance(120)
    assert _k8s_wait.judge(fetch, check_route=False)["state"] == "ready"
    _lws_on(cluster, "/m/b")  # generation 2, not reconciled yet
    v = _k8s_wait.judge(fetch, check_route=False)
    if version >= (0, 9):
        assert v["state"] == "waiting" and "observe generation 2" in v["message"], v["message"]
        for _i in range(30):
            cluster.advance(10)
            v = _k8s_wait.judge(fetch, check_route=False)
            if v["state"] != "waiting":
                break
        assert v["state"] == "ready" and v["revision"]["model_path"] == "/m/b", v["message"]
    else:
        assert v["state"] == "failed" and "v0.9.0" in v["message"], v["message"]


def test_the_lws_model_names_and_labels_groups_as_upstream():
    from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

    cluster = kc.Cluster()
    _lws_on(cluster, "/m/a")
    cluster.advance(2)
    objs = cluster.objects()
    lws = [o for o in objs if o["kind"] == "LeaderWorkerSet"][0]
    name = lws["metadata"]["name"]
    assert sorted(o["metadata"]["name"] for o in objs if o["kind"] == "StatefulSet") == [name, name + "-0"]
    pods = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Pod"}
    assert sorted(pods) == [name + "-0", name + "-0-1"]
    labels = pods[name + "-0-1"]["metadata"]["labels"]
    assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == "1" and labels["leaderworkerset.sigs.k8s.io/name"] == name
    assert lws["status"]["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in lws["status"]["conditions"]}["Progressing"] == "True"


def test_a_leaderworkerset_whose_pods_the_namespace_refuses_fails_within_about_a_minute():
    """M1 for LeaderWorkerSets: the StatefulSet controller reports a refused create only as FailedCreate Events on
    the StatefulSet (pkg/controller/statefulset/stateful_pod_control.go recordPodEvent), no condition."""
    from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

    cluster = kc.Cluster()
    cluster.pod_security = "baseline"
    fetch = _lws_on(cluster, "/m/a")
    cluster.advance(30)
    assert _k8s_wait.judge(fetch, check_route=False)["state"] == "waiting"
    cluster.advance(40)
    v = _k8s_wait.judge(fetch, check_route=False)
    assert v["state"] == "failed" and "StatefulSet" in v["message"] and "violates PodSecurity" in v["message"], v["message"]
