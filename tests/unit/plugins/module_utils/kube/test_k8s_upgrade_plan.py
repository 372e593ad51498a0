"""The upgrade plan's pure parts (kube/_k8s_upgrade.py) and the engine/image rule of kube/_k8s_checks.py: what is
recorded of A, the room beside A, the refusals, the plan's text; the cluster-model replays are in
tests/unit/test_k8s_upgrade_replay.py."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks, _k8s_engine, _k8s_upgrade as up
from ansible_collections.llmops.serving.plugins.modules import k8s_upgrade_plan
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import PROFILES

DIGEST = "@sha256:" + "d" * 64


def build(engine="vllm", image="vllm/vllm-openai:v0.26.0" + DIGEST, path="/mnt/nvme/models/tiny/a", replicas=2,
          staged=("gpu-01", "gpu-02")):
    return _k8s_engine.build(dict(engine=engine, served_model_name="tiny", namespace="llm-lab", model_path=path,
                                  image=image, replicas=replicas, staged_nodes=list(staged), model_source="staged_nvme",
                                  profiles=PROFILES, tp_size=8))


# ---- the engine switch: an image of the other engine's project is refused ------------------------------------- #


@pytest.mark.parametrize("engine,image,other", [
    ("sglang", "vllm/vllm-openai:v0.26.0" + DIGEST, "vllm"),
    ("sglang", "docker.io/vllm/vllm-openai:v0.26.0", "vllm"),
    ("sglang", "registry.example:5000/mirror/vllm/vllm-openai:v0.26.0", "vllm"),
    ("vllm", "lmsysorg/sglang:v0.5.16" + DIGEST, "sglang"),
])
def test_an_engine_switch_to_an_image_of_the_other_engine_is_refused(engine, image, other):
    with pytest.raises(_k8s_checks.SpecError) as e:
        build(engine=engine, image=image)
    msg = str(e.value)
    assert msg.startswith("image: ") and "%s's image" % other in msg and "cannot run engine %s" % engine in msg
    assert _k8s_checks.ENGINE_IMAGE_REPOSITORIES[engine] in msg  # names the fix: the engine's own image


@pytest.mark.parametrize("engine,image", [("vllm", "vllm/vllm-openai:v0.26.0" + DIGEST),
                                          ("sglang", "lmsysorg/sglang:v0.5.16" + DIGEST),
                                          ("vllm", "registry.example/team/vllm-custom:v0.26.0" + DIGEST)])
def test_the_engine_s_own_or_an_unknown_image_is_not_refused(engine, image):
    assert build(engine=engine, image=image)["objects"]


# ---- A as recorded ------------------------------------------------------------------------------------------------ #


def test_recorded_drops_what_the_server_and_controllers_set_and_keeps_the_rest():
    dep = next(o for o in build()["objects"] if o["kind"] == "Deployment")
    live = copy.deepcopy(dep)
    live["metadata"].update(resourceVersion="123", uid="u-1", generation=4, creationTimestamp="2026-01-01T00:00:00Z",
                            managedFields=[{"manager": "kubectl"}])
    live["metadata"].setdefault("annotations", {}).update({"deployment.kubernetes.io/revision": "3",
                                                           "kubectl.kubernetes.io/last-applied-configuration": "{}"})
    live["status"] = {"replicas": 2}
    rec = up.recorded(live)
    assert rec == dep
    assert live["metadata"]["uid"] == "u-1"  # the live object is not changed


# ---- room beside A --------------------------------------------------------------------------------------------- #


def test_room_counts_free_gpus_on_schedulable_nodes_that_staged_b():
    nodes = [{"metadata": {"name": n}, "spec": {"unschedulable": n == "gpu-04"},
              "status": {"allocatable": {"nvidia.com/gpu": "8"}}} for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04")]
    pods = [{"spec": {"nodeName": "gpu-01", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
             "status": {"phase": "Running"}},
            {"spec": {"nodeName": "gpu-02", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
             "status": {"phase": "Running"}},
            {"spec": {"nodeName": "gpu-03", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
             "status": {"phase": "Succeeded"}}]
    allocated = up.allocated_gpus(pods)
    assert allocated == {"gpu-01": 8, "gpu-02": 4}
    # gpu-01 is full, gpu-02 has 4 (not 8), gpu-03's pod ended, gpu-04 is cordoned; gpu-02..04 staged B
    assert up.node_room(nodes, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], 8, allocated) == {"gpu-03": 1}
    assert up.node_room(nodes, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], 4, allocated) == {"gpu-02": 1, "gpu-03": 2}
    assert up.node_room(nodes, ["gpu-01", "gpu-02"], 8, allocated) == {}


def _nodes(*busy, free=()):
    return ([{"name": n, "allocatable": 8, "allocated": 8} for n in busy]
            + [{"name": n, "allocatable": 8, "allocated": 0} for n in free])


def test_the_plan_of_a_deployment_with_room_for_two(run_module):
    a = build(replicas=3, staged=("gpu-01", "gpu-02", "gpu-03"))
    b = build(path="/mnt/nvme/models/tiny/b", replicas=3, staged=("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"))
    r = run_module(k8s_upgrade_plan, dict(live=a["objects"], rendered=b["objects"],
                                          nodes=_nodes("gpu-01", "gpu-02", "gpu-03", free=("gpu-04", "gpu-05")),
                                          staged_nodes=["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"],
                                          pinned=["rev-a"], a_ref="tiny@a", b_ref="tiny@b"))
    assert not r.get("failed"), r.get("msg")
    p = r["plan"]
    assert (p["form"], p["unit"], p["units"], p["surge"], p["waves"], p["outage"]) == ("Deployment", "replica", 3, 2, [2, 1], False)
    assert p["room"] == {"gpu-04": 1, "gpu-05": 1} and p["pinned"] == ["rev-a"]
    canary = p["steps"][0]["apply"][0]
    assert canary["metadata"]["name"] == "tiny-canary" and canary["spec"]["replicas"] == 1
    assert canary["spec"]["selector"]["matchLabels"][up.CANARY_LABEL] == "canary"
    wave = p["steps"][1]
    assert wave["delete"] == [{"kind": "Deployment", "name": "tiny-canary", "apiVersion": "apps/v1"}]
    assert wave["apply"][-1]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 2, "maxUnavailable": 0}
    assert p["rollback"] == {"delete": [{"kind": "Deployment", "name": "tiny-canary", "apiVersion": "apps/v1"}], "apply": p["record"],
                             "wait": [{"kind": "Deployment", "name": "tiny", "replicas": 3,  # A's pods, all of them again
                                       "selector": next(o for o in p["record"] if o["kind"] == "Deployment")["spec"]["selector"]["matchLabels"]}]}
    assert [o["kind"] for o in p["record"]] == [o["kind"] for o in a["objects"]]
    assert any(line.startswith("rollback: delete Deployment tiny-canary") for line in r["lines"])
    assert r["changed"] is False


def test_a_single_replica_without_room_is_refused_before_anything_changes(run_module):
    a = build(replicas=1, staged=("gpu-01",))
    b = build(path="/mnt/nvme/models/tiny/b", replicas=1, staged=("gpu-01",))
    r = run_module(k8s_upgrade_plan, dict(live=a["objects"], rendered=b["objects"], nodes=_nodes("gpu-01", free=("gpu-02",)),
                                          staged_nodes=["gpu-01"]))
    assert r["failed"] and r["reason"] == "outage"
    assert "engine_allow_outage" in r["msg"] and "Stage B on a spare node" in r["msg"]
    # the free node did not stage B: it is no room for B
    assert "room on staged nodes: none" in r["msg"]


def test_a_storm_service_pair_is_refused_naming_why(run_module):
    storm = {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "StormService", "metadata": {"name": "m"},
             "spec": {"replicas": 1}}
    r = run_module(k8s_upgrade_plan, dict(live=[storm], rendered=[storm], nodes=[], staged_nodes=[]))
    assert r["failed"] and r["reason"] == "pd_stormservice" and "would mix generations" in r["msg"]


def test_no_a_is_refused(run_module):
    b = build(path="/mnt/nvme/models/tiny/b")
    r = run_module(k8s_upgrade_plan, dict(live=[], rendered=b["objects"], nodes=[], staged_nodes=[]))
    assert r["failed"] and r["reason"] == "no_workload"


def test_b_already_serving_is_a_plan_without_steps_even_with_the_api_server_s_defaults(run_module):
    """A second run after the upgrade: the live Deployment is B plus what the API server defaulted and the wave
    strategy the upgrade applied; the plan changes nothing. A changed argument is an upgrade again."""
    b = build(path="/mnt/nvme/models/tiny/b")
    live = copy.deepcopy(b["objects"])
    dep = next(o for o in live if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0].update(terminationMessagePath="/dev/termination-log",
                                                            terminationMessagePolicy="File")
    dep["spec"]["template"]["spec"].update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    dep["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
    dep["metadata"].update(uid="u", resourceVersion="9", generation=3)
    nodes = _nodes("gpu-01", "gpu-02")
    r = run_module(k8s_upgrade_plan, dict(live=live, rendered=b["objects"], nodes=nodes, staged_nodes=["gpu-01", "gpu-02"]))
    assert r["plan"]["noop"] is True and r["plan"]["steps"] == [] and r["lines"][0].startswith("B already serves")
    changed = build(path="/mnt/nvme/models/tiny/b", image="vllm/vllm-openai:v0.27.0" + DIGEST)
    r = run_module(k8s_upgrade_plan, dict(live=live, rendered=changed["objects"], nodes=nodes,
                                          staged_nodes=["gpu-01", "gpu-02"], allow_outage=True))
    assert r["plan"]["noop"] is False and r["plan"]["steps"]


def test_a_s_kernel_cache_directory_is_read_from_its_pods_so_gc_keeps_it_during_the_upgrade():
    """The upgrade passes A's kernel-cache hostPath to the kernel_cache role's gc as in use (roles/upgrade/tasks/
    kubernetes.yml), so B's prebuild on a node never removes the cache A's pods load; none mounted: None."""
    cached = _k8s_engine.build(dict(engine="vllm", served_model_name="tiny", namespace="llm-lab",
                                    model_path="/mnt/nvme/models/tiny/a", image="vllm/vllm-openai:v0.26.0" + DIGEST,
                                    replicas=2, staged_nodes=["gpu-01", "gpu-02"], model_source="staged_nvme",
                                    profiles=PROFILES, tp_size=8,
                                    kernel_cache_dir="/mnt/nvme/kernel-cache/vllm/0123abcd/engine"))
    a = up.serving(cached["objects"], "tiny")
    assert (a["revision"], a["kernel_cache_dir"]) == ("a", "/mnt/nvme/kernel-cache/vllm/0123abcd/engine")
    assert up.serving(build()["objects"], "tiny")["kernel_cache_dir"] is None
