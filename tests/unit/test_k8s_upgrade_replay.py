"""A Kubernetes revision upgrade, replayed on the cluster model: the plan of ``k8s_upgrade_plan`` executed step by
step against tests/lib/kube_controllers.py (Deployment/ReplicaSet, LeaderWorkerSet and EndpointSlice controllers,
the kubelet, the scheduler of tests/lib/kube_scheduler.py), every wait judged by ``k8s_engine_wait`` over the
cluster's objects, a failure rolled back the way the plan says (delete what B added, re-apply A's recorded objects).

The objects are the collection's own: A and B rendered by ``_k8s_engine.build`` (Deployment, LeaderWorkerSet) and by
``pd_manifests`` with the arguments of roles/pd_disagg's task (the P/D pair). Each test ends with the revision that
serves, the pods by revision, and A's objects compared with what the plan recorded.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine, _k8s_upgrade as up
from ansible_collections.llmops.serving.plugins.modules import (engine_manifests, k8s_canary_answer, k8s_engine_wait,
                                                                k8s_upgrade_plan, pd_manifests)
from ansible_collections.llmops.serving.tests.lib import aibrix_oracle
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.lib import refusals
from ansible_collections.llmops.serving.tests.lib import role_tasks as rt
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import PROFILES

NS = "llm-lab"
A_PATH, B_PATH = "/mnt/nvme/models/tiny/rev-a", "/mnt/nvme/models/tiny/rev-b"
IMAGE = "vllm/vllm-openai:v0.26.0@sha256:" + "d" * 64
MISSING = "vllm/vllm-openai:v0.99.0@sha256:" + "e" * 64
GPU = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1Ti"}


class Cluster(kc.Cluster):
    """The cluster model, plus ``kubectl delete`` (cascading: a workload's controllers go, their pods terminate)
    and ``kubectl drain``; ``answers_as``: a model path whose engine answers ``/v1/models`` with another root (the
    directory staged as B holds A's files)."""

    answers_as = {}

    def delete(self, kind, name):
        if kind == "Deployment" and name in self.deployments:
            dep = self.deployments.pop(name)
            for rs in [r for r in self.replicasets.values() if r["metadata"]["ownerReferences"][0]["uid"] == dep["metadata"]["uid"]]:
                del self.replicasets[rs["metadata"]["name"]]
                self._terminate(lambda p, rs=rs: p["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"])
        elif kind == "LeaderWorkerSet" and name in self.lwss:
            self.lwss.pop(name)
            for sts in [s for s in self.statefulsets if s == name or s.startswith(name + "-")]:
                del self.statefulsets[sts]
            self._terminate(lambda p: (p["metadata"].get("labels") or {}).get(self.LWS + "name") == name)
        elif kind == "Service":
            self.services.pop(name, None)
            self.endpointslices.pop(name, None)
        else:
            self.others.pop((kind, self.ns, name), None)

    def _terminate(self, match):
        for pod in list(self.pods.values()):
            if match(pod) and not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = self._iso()
                pod["x-terminating-since"] = self.t
                # the garbage collector deletes what the pod owns (an LWS leader owns its group's worker
                # StatefulSet, kubernetes-sigs/lws pod_controller.go), and with it the workers
                for name, sts in list(self.statefulsets.items()):
                    if any(r.get("uid") == pod["metadata"]["uid"] for r in sts["metadata"]["ownerReferences"]):
                        del self.statefulsets[name]
                        self._terminate(lambda p, sts=sts: p["metadata"]["ownerReferences"][0].get("uid") == sts["metadata"]["uid"])

    def drain(self, node):
        n = next(x for x in self.fleet if x["name"] == node)
        n["taints"].append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        self._terminate(lambda p: p["spec"].get("nodeName") == node)

    def _sync_deployment(self, dep):
        # pkg/controller/deployment/rolling.go reconcileNewReplicaSet: a new ReplicaSet with more replicas than the
        # Deployment is scaled down to it (a lowered spec.replicas, as the plan's "make room" applies)
        want = kc._without_hash(dep["spec"]["template"])  # pylint: disable=protected-access
        for rs in self._owned(dep):
            if kc._without_hash(rs["spec"]["template"]) == want and rs["spec"]["replicas"] > dep["spec"].get("replicas", 1):  # pylint: disable=protected-access
                rs["spec"]["replicas"] = dep["spec"].get("replicas", 1)
        return kc.Cluster._sync_deployment(self, dep)  # pylint: disable=protected-access

    def _probe(self, pod, kind):
        # a container without the probe is never failed by it (pkg/kubelet/prober/prober_manager.go: no prober
        # worker for an absent probe; the result stays Success): the LeaderWorkerSet's workers have none
        if not pod["spec"]["containers"][0].get(kind):
            return 1, 10 ** 9, 0
        return kc.Cluster._probe(self, pod, kind)  # pylint: disable=protected-access

    def root(self, pod):
        path = kc.model_path(pod)
        return self.answers_as.get(path, path)


def fleet(n=4, a_on=("gpu-01", "gpu-02"), b_on=("gpu-01", "gpu-02", "gpu-03"), b_dirs=None):
    nodes = []
    for i in range(1, n + 1):
        name = "gpu-%02d" % i
        dirs = ([A_PATH] if name in a_on else []) + ([B_PATH] if name in (b_dirs if b_dirs is not None else b_on) else [])
        nodes.append(ks.node(name, labels={"nvidia.com/gpu.present": "true"}, allocatable=GPU, dirs=dirs))
    return nodes


def node_objects(cluster):
    """The nodes as the API lists them (``kubectl get nodes -o json``)."""
    return [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n["name"], "labels": n["labels"]},
             "spec": {"taints": n["taints"]}, "status": {"allocatable": n["allocatable"]}} for n in cluster.fleet]


def render(path, staged, replicas=2, image=IMAGE, nodes=1, args=None):
    return _k8s_engine.build(dict(engine="vllm", served_model_name="tiny", namespace=NS, model_path=path, image=image,
                                  replicas=replicas, staged_nodes=list(staged), model_source="staged_nvme",
                                  profiles=PROFILES, tp_size=8 * nodes, nodes=nodes, extra_args=args or []))


def live_of(cluster, objects):
    """A's objects as the API returns them now (the workload, its Service, route, grant and PDB)."""
    names = set((o["kind"], o["metadata"]["name"]) for o in objects)
    return [o for o in cluster.objects() if (o["kind"], o["metadata"]["name"]) in names]


def revision(pod):
    return {A_PATH: "A", B_PATH: "B"}.get(kc.model_path(pod), kc.model_path(pod) or "front")


def pods_by_revision(cluster):
    out = {}
    for p in sorted(cluster.pods.values(), key=lambda p: p["metadata"]["name"]):
        if p["metadata"].get("deletionTimestamp"):
            state = "terminating"
        elif cluster._ready(p):  # pylint: disable=protected-access
            state = "ready"
        else:
            cs = (p["status"].get("containerStatuses") or [{}])[0]
            state = (cs.get("state") or {}).get("waiting", {}).get("reason") or p["status"].get("phase", "Pending")
        out.setdefault(revision(p), []).append("%s@%s:%s" % (p["metadata"]["name"], p["spec"].get("nodeName") or "-", state))
    return out


def judge(run_module, cluster, w, kind):
    """``k8s_engine_wait`` as kubernetes_step.yml calls it for one wait of a step (its container and Service when the
    plan names them)."""
    objects = cluster.objects()
    pods = [o for o in objects if o["kind"] == "Pod" and not o["metadata"].get("deletionTimestamp")
            and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in w["selector"].items())]
    ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
    models = {"object": "list", "data": [{"id": "tiny", "root": cluster.root(ready[0])}]} if ready else None
    args = dict(namespace=NS, selector=w["selector"], replicas=w["replicas"], workload_kind=kind,
                workload_name=w["name"], objects={"apiVersion": "v1", "kind": "List", "items": objects})
    if w.get("container"):
        args["container"] = w["container"]
    if w.get("service"):
        args["service_name"] = w["service"]
    if models:
        args["models"] = models
    return run_module(k8s_engine_wait, args)


def wait(run_module, cluster, waits, limit=900, step=10, soak=0, observe=None):
    """Poll until every wait is ready (then ``soak`` more seconds, judged again) or one fails or ``limit`` passes;
    ``observe(cluster)`` at every poll."""
    results = {}
    for _i in range(limit // step):
        cluster.advance(step)
        if observe:
            observe(cluster)
        results = dict((w["name"], judge(run_module, cluster, w, w["kind"])) for w in waits)
        states = [r["state"] for r in results.values()]
        if any(s in ("failed", "timeout") for s in states):
            break
        if all(s == "ready" for s in states):
            if soak:
                cluster.advance(soak)
                results = dict((w["name"], judge(run_module, cluster, w, w["kind"])) for w in waits)
            break
    bad = dict((n, r) for n, r in results.items() if r["state"] != "ready")
    return not bad, "; ".join("%s: %s" % (n, r["msg"]) for n, r in sorted(bad.items()))


def execute(run_module, cluster, plan, during=None, soak=60, limit=900, observe=None, canary_check=None, poll=10):
    """The plan's steps in order, each: delete, apply, wait (+ soak for the canary); on a failure the rollback.
    ``observe(cluster)`` at every poll and after every step; ``canary_check(cluster, step)`` after the canary's
    wait, as kubernetes_step.yml's checks after it (the pinned answer, the SLO gate): a message fails the step.
    Returns ``(outcome, failure, sequence)``; ``sequence`` is ``[(step, pods by revision)]``."""
    seq = [("A serves", pods_by_revision(cluster))]
    for i, step in enumerate(plan["steps"]):
        for r in step["delete"]:
            cluster.delete(r["kind"], r["name"])
        for obj in step["apply"]:
            cluster.apply(copy.deepcopy(obj))
        if during:
            during(i, step, cluster)
        ok, why = wait(run_module, cluster, step["wait"], limit=limit, soak=soak if step.get("canary") else 0,
                       observe=observe, step=poll) if step["wait"] else (True, "")
        if not step["wait"]:
            cluster.advance(10)
        if ok and step.get("canary") and canary_check:
            why = canary_check(cluster, step) or ""
            ok = not why
        if observe:
            observe(cluster)
        seq.append((step["name"], pods_by_revision(cluster)))
        if not ok:
            for r in plan["rollback"]["delete"]:
                cluster.delete(r["kind"], r["name"])
            for obj in plan["rollback"]["apply"]:
                cluster.apply(copy.deepcopy(obj))
            cluster.advance(10)
            # kubernetes_roll.yml's rescue: wait until each of A's recorded workloads is Ready again
            back, why_back = wait(run_module, cluster, plan["rollback"]["wait"], limit=900, observe=observe, step=poll)
            assert back, why_back
            cluster.advance(60)
            seq.append(("rollback: re-applied A's recorded objects", pods_by_revision(cluster)))
            return "rolled back", why, seq
    cluster.advance(60)
    seq.append(("done", pods_by_revision(cluster)))
    return "upgraded", "", seq


def make_plan(run_module, cluster, a_objects, b, staged, **kw):
    r = run_module(k8s_upgrade_plan, dict(live=live_of(cluster, a_objects), rendered=b["objects"],
                                          nodes=node_objects(cluster), pods=[o for o in cluster.objects() if o["kind"] == "Pod"],
                                          staged_nodes=staged, **kw))
    return r


def deployed(a, nodes, engines=None):
    cluster = Cluster(namespace=NS, fleet=nodes)
    cluster.answers_as = {}
    cluster.engines.update(engines or {A_PATH: kc.Engine(load_seconds=60), B_PATH: kc.Engine(load_seconds=60)})
    for obj in a["objects"]:
        cluster.apply(copy.deepcopy(obj))
    cluster.advance(200)
    assert set(pods_by_revision(cluster)) == {"A"}, pods_by_revision(cluster)
    return cluster


def assert_a_restored(cluster, plan):
    """A's objects in the cluster equal what the plan recorded, and only A's pods run, all Ready."""
    live = dict(((o["kind"], o["metadata"]["name"]), up.recorded(o)) for o in cluster.objects())
    for rec in plan["record"]:
        got = live[(rec["kind"], rec["metadata"]["name"])]
        assert got.get("spec") == rec.get("spec") and got["metadata"].get("labels") == rec["metadata"].get("labels"), rec["kind"]
    byrev = pods_by_revision(cluster)
    assert set(byrev) == {"A"} and all(p.endswith(":ready") for p in byrev["A"]), byrev


def show(seq):
    print("\npod-level sequence:")
    for step, pods in seq:
        print("  %s" % step)
        for rev, names in sorted(pods.items()):
            print("    %s: %s" % (rev, ", ".join(names)))


# ---- Deployment ------------------------------------------------------------------------------------------------


def test_deployment_good_upgrade_canary_beside_a_then_waves_by_the_spare_node(run_module):
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    b = render(B_PATH, ["gpu-01", "gpu-02", "gpu-03"])
    cluster = deployed(a, fleet())
    plan = make_plan(run_module, cluster, a["objects"], b, ["gpu-01", "gpu-02", "gpu-03"])
    assert not plan.get("failed"), plan.get("msg")
    p = plan["plan"]
    assert p["room"] == {"gpu-03": 1} and p["surge"] == 1 and p["waves"] == [1, 1] and not p["outage"]
    assert [s["name"].split(":")[0] for s in p["steps"]] == ["canary", "waves"]
    outcome, why, seq = execute(run_module, cluster, p)
    show(seq)
    assert outcome == "upgraded", why
    byrev = pods_by_revision(cluster)
    assert set(byrev) == {"B"} and len(byrev["B"]) == 2 and all(x.endswith(":ready") for x in byrev["B"])
    assert "tiny-canary" not in cluster.deployments
    # the canary ran beside A: at the canary step both of A's pods still served
    canary_step = dict(seq)[p["steps"][0]["name"]]
    assert len([x for x in canary_step["A"] if x.endswith(":ready")]) == 2 and canary_step["B"][0].endswith(":ready")


def test_deployment_canary_image_not_found_rolls_back_and_a_never_stopped(run_module, capsys):
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    b = render(B_PATH, ["gpu-01", "gpu-02", "gpu-03"], image=MISSING)
    cluster = deployed(a, fleet())
    cluster.missing_images.add(MISSING)
    p = make_plan(run_module, cluster, a["objects"], b, ["gpu-01", "gpu-02", "gpu-03"])["plan"]
    outcome, why, seq = execute(run_module, cluster, p)
    with capsys.disabled():  # the failing canary's pod-level sequence, in the test output even without -s
        show(seq)
    assert outcome == "rolled back" and "image_pull" in why and MISSING in why, why
    canary = dict(seq)[p["steps"][0]["name"]]
    assert any("ErrImagePull" in x or "ImagePullBackOff" in x for x in canary["B"]), canary
    assert len([x for x in canary["A"] if x.endswith(":ready")]) == 2  # A kept serving throughout
    assert_a_restored(cluster, p)
    assert [step for step, _pods in seq] == ["A serves"] + [s["name"] for s in p["steps"][:1]] + [
        "rollback: re-applied A's recorded objects"]


def test_deployment_canary_with_the_wrong_answer_fails_the_revision_proof(run_module):
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    b = render(B_PATH, ["gpu-01", "gpu-02", "gpu-03"])
    cluster = deployed(a, fleet())
    cluster.answers_as = {B_PATH: A_PATH}  # B's directory holds A's files: the canary answers as A
    p = make_plan(run_module, cluster, a["objects"], b, ["gpu-01", "gpu-02", "gpu-03"])["plan"]
    outcome, why, seq = execute(run_module, cluster, p)
    assert outcome == "rolled back" and "not from the current revision's %s" % B_PATH in why, why
    assert_a_restored(cluster, p)


def test_deployment_wave_fails_after_a_good_canary_and_a_is_restored(run_module):
    """gpu-04 was reported as having staged B but its directory is gone: the canary (gpu-03) passes, a wave pod
    on gpu-04 never mounts, the wave fails, the recorded Deployment is re-applied."""
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    staged = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    b = render(B_PATH, staged)
    cluster = deployed(a, fleet(b_on=staged, b_dirs=["gpu-01", "gpu-02", "gpu-03"]))
    p = make_plan(run_module, cluster, a["objects"], b, staged)["plan"]
    assert p["surge"] == 2 and p["waves"] == [2]
    outcome, why, seq = execute(run_module, cluster, p, limit=600)
    show(seq)
    assert outcome == "rolled back", why
    waves = dict(seq)[p["steps"][1]["name"]]
    assert any("gpu-04" in x and ":ready" not in x for x in waves["B"]), waves
    assert_a_restored(cluster, p)


def test_deployment_node_drained_mid_roll_still_ends_on_b(run_module):
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    staged = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    b = render(B_PATH, staged)
    cluster = deployed(a, fleet(b_on=staged))
    p = make_plan(run_module, cluster, a["objects"], b, staged)["plan"]

    def drain(i, step, c):
        if step["name"].startswith("waves"):
            c.advance(30)
            c.drain("gpu-02")

    outcome, why, seq = execute(run_module, cluster, p, during=drain)
    show(seq)
    assert outcome == "upgraded", why
    byrev = pods_by_revision(cluster)
    assert set(byrev) == {"B"} and len(byrev["B"]) == 2 and not any("@gpu-02" in x for x in byrev["B"]), byrev


def test_the_only_pod_without_room_is_refused_naming_both_fixes(run_module):
    a = render(A_PATH, ["gpu-01"], replicas=1)
    b = render(B_PATH, ["gpu-01"], replicas=1)
    cluster = deployed(a, fleet(a_on=("gpu-01",), b_on=("gpu-01",)))
    r = make_plan(run_module, cluster, a["objects"], b, ["gpu-01"])
    assert r["failed"] and r["reason"] == "outage", r
    assert "engine_allow_outage" in r["msg"] and "Stage B on a spare node" in r["msg"]
    r = make_plan(run_module, cluster, a["objects"], b, ["gpu-01"], allow_outage=True)
    assert not r.get("failed") and r["plan"]["outage"] is True
    assert r["plan"]["steps"][0]["apply"][0]["spec"]["replicas"] == 0  # A stops first: stated, accepted
    # B staged on a spare node: no outage, the canary goes beside A
    b2 = render(B_PATH, ["gpu-01", "gpu-02"], replicas=1)
    r = make_plan(run_module, cluster, a["objects"], b2, ["gpu-01", "gpu-02"])
    assert not r.get("failed") and r["plan"]["surge"] == 1 and not r["plan"]["outage"]


# ---- LeaderWorkerSet -------------------------------------------------------------------------------------------


def _lws_pods(cluster, rev):
    return list(pods_by_revision(cluster).get(rev, []))


def test_lws_good_upgrade_and_a_failing_canary_group(run_module):
    staged = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    a = render(A_PATH, ["gpu-01", "gpu-02"], replicas=1, nodes=2)
    b = render(B_PATH, staged, replicas=1, nodes=2)
    cluster = deployed(a, fleet(b_on=staged))
    p = make_plan(run_module, cluster, a["objects"], b, staged)["plan"]
    assert p["form"] == "LeaderWorkerSet" and p["unit"] == "group" and p["pods_per_unit"] == 2 and p["surge"] == 1
    outcome, why, seq = execute(run_module, cluster, p)
    show(seq)
    assert outcome == "upgraded", why
    assert set(pods_by_revision(cluster)) == {"B"} and len(_lws_pods(cluster, "B")) == 2

    bad = render(B_PATH, staged, replicas=1, nodes=2, image=MISSING)
    cluster = deployed(a, fleet(b_on=staged))
    cluster.missing_images.add(MISSING)
    p = make_plan(run_module, cluster, a["objects"], bad, staged)["plan"]
    outcome, why, seq = execute(run_module, cluster, p)
    assert outcome == "rolled back" and "image_pull" in why, why
    assert_a_restored(cluster, p)


def test_lws_wave_fails_after_a_good_canary_and_a_node_drained_mid_roll(run_module):
    staged = ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "gpu-06"]
    a = render(A_PATH, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], replicas=2, nodes=2)
    b = render(B_PATH, staged, replicas=2, nodes=2)
    # gpu-03 lost B's directory: the canary group (gpu-05, gpu-06) passes, the group rolled onto gpu-03 cannot mount
    cluster = deployed(a, fleet(n=6, a_on=staged[:4], b_on=staged, b_dirs=["gpu-01", "gpu-02", "gpu-04", "gpu-05", "gpu-06"]))
    p = make_plan(run_module, cluster, a["objects"], b, staged)["plan"]
    assert p["surge"] == 1 and p["waves"] == [1, 1]
    outcome, why, seq = execute(run_module, cluster, p, limit=600)
    show(seq)
    assert outcome == "rolled back" and "mount" in why, why
    assert dict(seq)[p["steps"][0]["name"]]["B"] and all(x.endswith(":ready") for x in dict(seq)[p["steps"][0]["name"]]["B"])
    cluster.advance(600)
    assert_a_restored(cluster, p)

    cluster = deployed(a, fleet(n=6, a_on=staged[:4], b_on=staged))
    p = make_plan(run_module, cluster, a["objects"], b, staged)["plan"]

    def drain(i, step, c):
        if step["name"].startswith("waves"):
            c.advance(20)
            c.drain("gpu-01")

    outcome, why, seq = execute(run_module, cluster, p, during=drain)
    show(seq)
    assert outcome == "upgraded", why
    byrev = pods_by_revision(cluster)
    assert set(byrev) == {"B"} and len(byrev["B"]) == 4 and not any("@gpu-01:" in x for x in byrev["B"]), byrev


def test_deployment_without_room_gives_one_replica_for_the_canary_then_rolls_one_at_a_time(run_module):
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    b = render(B_PATH, ["gpu-01", "gpu-02"])
    cluster = deployed(a, fleet(b_on=("gpu-01", "gpu-02")))
    p = make_plan(run_module, cluster, a["objects"], b, ["gpu-01", "gpu-02"])["plan"]
    assert p["surge"] == 0 and p["waves"] == [1, 1] and not p["outage"]
    assert p["steps"][0]["apply"][0]["spec"]["replicas"] == 1  # A gives one replica's GPUs to the canary
    wave_b = p["steps"][-1]["apply"][-1]
    assert wave_b["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    outcome, why, seq = execute(run_module, cluster, p)
    show(seq)
    assert outcome == "upgraded", why
    assert set(pods_by_revision(cluster)) == {"B"} and len(pods_by_revision(cluster)["B"]) == 2


# ---- P/D pair (Deployments) ------------------------------------------------------------------------------------


def pd_render(run_module, tmp_path, path, sub, prefill=("gpu-01", "gpu-03"), decode=("gpu-02", "gpu-04"), replicas=1,
              engine_image=None, workload="deployments"):
    variables = rt.RoleVars("pd_disagg", dict(
        pd_disagg_k8s_mode="apply", pd_disagg_k8s_workload=workload, pd_disagg_transport="tcp",
        pd_disagg_proxy_image="registry.example/python:3.11-slim@sha256:" + "a" * 64, pd_disagg_model_path=path,
        pd_disagg_model_host_path=path, pd_disagg_prefill_replicas=replicas, pd_disagg_decode_replicas=replicas,
        pd_disagg_prefill_staged=list(prefill), engine_staged_nodes=list(decode),
        pd_disagg_gateway_policies={"resources": []}), extra_vars_files=["roles/engine/vars/profiles.yml"])
    task = rt.task("pd_disagg", "llmops.serving.pd_manifests", "kubernetes.yml")
    args = variables.template(task["llmops.serving.pd_manifests"])
    args["render_dir"] = str(tmp_path / sub)
    r = run_module(pd_manifests, args)
    assert not r.get("failed"), r.get("msg")
    if engine_image:  # B's engine image (upgrade_engine_image), on prefill and decode
        for o in r["objects"]:
            for c in (o.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []):
                if c["name"] == "engine":
                    c["image"] = engine_image
    return r


def pd_cluster(gpu_nodes=4, b_missing=()):
    nodes = []
    for i in range(1, gpu_nodes + 1):
        name = "gpu-%02d" % i
        nodes.append(ks.node(name, labels={"nvidia.com/gpu.present": "true"},
                             dirs=[A_PATH] + ([] if name in b_missing else [B_PATH]),
                             allocatable=dict(GPU, **{"rdma/rdma_shared_device_a": "1"})))
    nodes += [ks.node("cpu-%02d" % i, allocatable={"cpu": "16", "memory": "64Gi"}) for i in (1, 2)]
    cluster = Cluster(namespace=NS, fleet=nodes)
    cluster.answers_as = {}
    cluster.engines.update({A_PATH: kc.Engine(load_seconds=60), B_PATH: kc.Engine(load_seconds=60),
                            None: kc.Engine(load_seconds=5)})
    return cluster


def pd_reach(cluster):
    """Per front pod: the revisions of the pods its prefill and decode URLs resolve to (EndpointSlices)."""
    out = {}
    for pod in cluster.pods.values():
        labels = pod["metadata"].get("labels") or {}
        if labels.get(up.ROLE_LABEL) != "front" or pod["metadata"].get("deletionTimestamp"):
            continue
        args = pod["spec"]["containers"][0].get("args") or []
        revs, roles = set(), set()
        for flag in ("--prefill", "--decode"):
            svc = up._url_service(args, flag)  # pylint: disable=protected-access
            for ep in (cluster.endpointslices.get(svc) or {}).get("endpoints", []):
                if ep["conditions"]["ready"]:
                    revs.add(revision(cluster.pods[ep["targetRef"]["name"]]) if ep["targetRef"]["name"] in cluster.pods else "?")
                    roles.add(flag)
        out[pod["metadata"]["name"]] = ("B" if labels.get(up.GENERATION_LABEL) else "A", revs, roles)
    return out


def test_a_router_that_selects_pods_without_the_generation_would_mix_and_is_refused(run_module, tmp_path):
    """SGLang's router discovers its prefill/decode pods by label; A's router selects them without the generation
    label, so B's canary pods would be among them: the plan refuses before anything changes."""
    a = pd_render(run_module, tmp_path, A_PATH, "a")
    b = pd_render(run_module, tmp_path, B_PATH, "b")
    for obj in a["objects"]:  # A's front as an SGLang router: discovery by the role's labels
        if obj["kind"] == "Deployment" and up._role(obj) == "front":  # pylint: disable=protected-access
            obj["spec"]["template"]["spec"]["containers"][0]["args"] = [
                "--prefill-selector", "%s=tiny-llama" % up.MODEL_LABEL, "%s=prefill" % up.ROLE_LABEL,
                "--decode-selector", "%s=tiny-llama" % up.MODEL_LABEL, "%s=decode" % up.ROLE_LABEL]
    cluster = pd_cluster()
    for obj in a["objects"]:
        cluster.apply(copy.deepcopy(obj))
    cluster.advance(60)
    r = make_plan(run_module, cluster, a["objects"], b, {"prefill": ["gpu-01", "gpu-03"], "decode": ["gpu-02", "gpu-04"]})
    assert r["failed"] and r["reason"] == "pd_generations_mix", r
    assert up.GENERATION_LABEL in r["msg"] and "canary" in r["msg"]


def test_b_stack_fronts_are_wired_to_their_own_generation(run_module, tmp_path):
    b = pd_render(run_module, tmp_path, B_PATH, "b")
    stack, front_service = up.generation_stack(b["objects"], "g1", b["objects"][0]["metadata"]["namespace"])
    names = dict((o["metadata"]["name"], o) for o in stack)
    reach = up.front_reach(stack)
    assert reach == {"tiny-llama-pd-proxy-g1": {"prefill": ["tiny-llama-prefill-g1"], "decode": ["tiny-llama-decode-g1"]}}
    front = names["tiny-llama-pd-proxy-g1"]
    assert front["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == "tiny-llama-pd-proxy-g1"
    assert front_service["spec"]["selector"] == {up.NAME_LABEL: "tiny-llama-pd-proxy-g1"}
    # the generation is both roles' templates, replicas excluded
    roles = up.pd_roles(b["objects"])
    g = up.pd_generation(roles["prefill"]["spec"]["template"], roles["decode"]["spec"]["template"])
    scaled = copy.deepcopy(roles["decode"])
    scaled["spec"]["replicas"] = 5
    assert up.pd_generation(roles["prefill"]["spec"]["template"], scaled["spec"]["template"]) == g
    changed = copy.deepcopy(roles["decode"]["spec"]["template"])
    changed["spec"]["containers"][0]["args"].append("--max-num-seqs=8")
    assert up.pd_generation(roles["prefill"]["spec"]["template"], changed) != g


def assert_pd_a(cluster, plan):
    live = dict(((o["kind"], o["metadata"]["name"]), up.recorded(o)) for o in cluster.objects())
    for rec in plan["record"]:
        got = live[(rec["kind"], rec["metadata"]["name"])]
        assert got.get("spec") == rec.get("spec"), rec["metadata"]["name"]


# ---- the role (roles/upgrade/tasks/kubernetes*.yml) -------------------------------------------------------------


B_OVERRIDES = {"model_path", "image", "extra_args", "staged_nodes"}


def test_the_role_renders_b_with_the_engine_role_s_own_arguments_but_b_s():
    """B's objects come from the engine role's engine_manifests arguments, the same keys and templates, except B's
    revision, image, arguments and staged nodes (and no render_dir): a new engine argument cannot be forgotten."""
    engine = rt.task("engine", "llmops.serving.engine_manifests", "kubernetes.yml")["llmops.serving.engine_manifests"]
    mine = rt.task("upgrade", "llmops.serving.engine_manifests", "kubernetes_roll.yml")["llmops.serving.engine_manifests"]
    assert set(mine) == set(engine) - {"render_dir"}
    assert dict((k, v) for k, v in mine.items() if k not in B_OVERRIDES) == \
        dict((k, v) for k, v in engine.items() if k not in B_OVERRIDES | {"render_dir"})
    assert "upgrade_k8s_b_path" in mine["model_path"] and "upgrade_engine_image" in mine["image"]
    assert "upgrade_engine_args" in mine["extra_args"]


def test_the_role_s_render_plan_and_roll_replayed_on_the_cluster(run_module):
    """The role's own tasks: B rendered with the arguments of its task (templated from the engine role's defaults,
    the inventory's values given here), the plan with the arguments of its plan task, then the plan run on the
    cluster model with a canary whose image is not found: A stays and its recorded objects are back."""
    overrides = dict(engine_platform="kubernetes", engine_name="vllm", engine_served_model_name="tiny",
                     engine_namespace=NS, engine_image=IMAGE, engine_tp_size=8, engine_replicas=2,
                     engine_model_source="staged_nvme", engine_model_path=A_PATH,
                     upgrade_model={"name": "tiny", "revision": "rev-b"}, model_stage_dest_root="/mnt/nvme/models",
                     upgrade_engine_image=MISSING, upgrade_engine_args=[], engine_allow_outage=False,
                     engine_staged_nodes=["gpu-01", "gpu-02", "gpu-03"], upgrade_pinned=["rev-a"],
                     upgrade_k8s_staged=["gpu-01", "gpu-02", "gpu-03"], upgrade_k8s_a={"serving": {"form": "Deployment"}},
                     upgrade_k8s_compile_minutes=15, ansible_play_hosts_all=["h1"], hostvars={"h1": {}},
                     upgrade_a_ref="tiny@rev-a", upgrade_b_ref="tiny@rev-b", kernel_cache_env={})
    variables = rt.RoleVars("engine", dict(overrides, upgrade_k8s_b_path=B_PATH),
                            extra_vars_files=["roles/engine/vars/profiles.yml"])

    def flatten(items):  # ansible.builtin.flatten, all levels
        out = []
        for x in items:
            out.extend(flatten(x) if isinstance(x, list) else [x])
        return out

    variables.env.filters["flatten"] = flatten
    variables.env.filters["extract"] = lambda host, hv, key: hv[host].get(key, variables.env.undefined(key))

    def args_of(task, **given):
        # env is built with Ansible's dict2items (not in tests/lib/role_tasks.py): the inventory here sets none
        raw = dict((k, v) for k, v in task["llmops.serving.engine_manifests"].items() if k != "env")
        return dict(variables.template(raw), env=[], **given)

    b = run_module(engine_manifests, args_of(rt.task("upgrade", "llmops.serving.engine_manifests", "kubernetes_roll.yml")))
    assert not b.get("failed"), b.get("msg")
    b_dep = next(o for o in b["objects"] if o["kind"] == "Deployment")
    assert kc.model_path(b_dep["spec"]["template"]) == B_PATH and b_dep["spec"]["template"]["spec"]["containers"][0]["image"] == MISSING
    engine_task = rt.task("engine", "llmops.serving.engine_manifests", "kubernetes.yml")
    a = run_module(engine_manifests, dict(args_of(engine_task), staged_nodes=["gpu-01", "gpu-02"], model_path=A_PATH,
                                          render_dir=None))
    assert not a.get("failed"), a.get("msg")
    cluster = deployed(a, fleet())
    cluster.missing_images.add(MISSING)
    plan_task = rt.task("upgrade", "llmops.serving.k8s_upgrade_plan", "kubernetes_roll.yml")
    fleet_read = {"results": [{"resources": node_objects(cluster)},
                              {"resources": [o for o in cluster.objects() if o["kind"] == "Pod"]}]}
    args = variables.template(plan_task["llmops.serving.k8s_upgrade_plan"], dict(
        upgrade_k8s_b=b, upgrade_k8s_fleet=fleet_read,
        upgrade_k8s_live={"results": [{"resources": [o]} for o in live_of(cluster, b["objects"])]}))
    r = run_module(k8s_upgrade_plan, args)
    assert not r.get("failed"), r.get("msg")
    p = r["plan"]
    assert p["pinned"] == ["rev-a"] and p["surge"] == 1
    outcome, why, seq = execute(run_module, cluster, p)
    assert outcome == "rolled back" and "image_pull" in why, why
    assert_a_restored(cluster, p)


@pytest.mark.parametrize("platform,image,phase,allowed,goes_to", [
    ("kubernetes", IMAGE, "all", True, "kubernetes.yml"),
    ("kubernetes", "", "all", True, "kubernetes.yml"),
    ("kubernetes", "", "canary", False, None),  # the phases are the local engine's
    ("local", "", "all", True, "local.yml"),
    ("local", IMAGE, "all", False, None),  # a local engine has no image
    ("slurm", "", "all", False, None),
])
def test_the_role_routes_kubernetes_to_its_plan_and_keeps_the_local_path(platform, image, phase, allowed, goes_to):
    import jinja2

    env = jinja2.Environment()
    scope = dict(engine_platform=platform, upgrade_engine_image=image, upgrade_phase=phase, group_names=["colocated"])
    check = rt.task("upgrade", "ansible.builtin.assert", "main.yml")["ansible.builtin.assert"]
    assert all(env.compile_expression(t)(**scope) for t in check["that"]) is allowed
    if not allowed:
        msg = env.from_string(check["fail_msg"]).render(**scope)
        assert ("upgrade_engine_image" in msg) if platform == "local" else (
            "upgrade_phase" in msg if platform == "kubernetes" else "engine_platform=slurm" in msg), msg
        return
    included = [t for t in rt._walk(rt._tasks(os.path.join(rt.ROOT, "roles", "upgrade", "tasks", "main.yml")))  # pylint: disable=protected-access
                if "ansible.builtin.include_tasks" in t or "ansible.builtin.meta" in t]
    ran = []
    for t in included:
        when = t.get("when") or []
        if all(env.compile_expression(w)(**scope) for w in (when if isinstance(when, list) else [when])):
            if "ansible.builtin.meta" in t:
                break  # end_role: nothing after it runs
            ran.append(t["ansible.builtin.include_tasks"])
    assert ran[:1] == [goes_to] and (platform == "local" or ran == ["kubernetes.yml"])
    if platform == "local":  # a P/D pair's host (the playbook's prefill and decode groups) runs no local upgrade
        scope["group_names"] = ["prefill"]
        assert not [t for t in included if "ansible.builtin.include_tasks" in t and all(
            env.compile_expression(w)(**scope) for w in (t.get("when") if isinstance(t.get("when"), list) else [t.get("when")]))]


# ---- the role on a P/D pair (roles/upgrade/tasks/kubernetes.yml, kubernetes_pd.yml, kubernetes_roll.yml) --------


PD_OVERRIDES = {"model_path", "model_host_path", "image", "extra_args", "prefill_nodes", "decode_nodes", "proxy_source",
                "render_dir", "gateway_policies"}


def test_the_role_renders_b_s_pair_with_the_pd_role_s_own_arguments_but_b_s():
    """B's pair comes from roles/pd_disagg's pd_manifests arguments, the same keys and templates, except B's
    revision (inside the pod and on the node), image, engine arguments, the nodes that staged B, and no render_dir."""
    pd = rt.task("pd_disagg", "llmops.serving.pd_manifests", "kubernetes.yml")["llmops.serving.pd_manifests"]
    mine = rt.task("upgrade", "llmops.serving.pd_manifests", "kubernetes_pd.yml")["llmops.serving.pd_manifests"]
    assert set(mine) == set(pd) - {"render_dir"}
    assert dict((k, v) for k, v in mine.items() if k not in PD_OVERRIDES) == \
        dict((k, v) for k, v in pd.items() if k not in PD_OVERRIDES)
    assert "upgrade_k8s_b_path" in mine["model_path"] and "upgrade_k8s_b_path" in mine["model_host_path"]
    assert "upgrade_engine_image" in mine["image"] and "upgrade_engine_args" in mine["extra_args"]
    assert "pd_proxy.py" in mine["proxy_source"] and "upgrade_k8s_pd_policies" in mine["gateway_policies"]
    assert pd["gateway_policies"].replace("pd_disagg_gateway_policies", "upgrade_k8s_pd_policies").replace(
        "pd_disagg_gateway_extension_policies", "upgrade_k8s_pd_extension_policies") == mine["gateway_policies"]


PD_ROLE_CASES = {
    # name: (GPU nodes, replicas per role, B staged {prefill, decode}, nodes missing B's directory, B's engine image,
    #        (node drained, when the step's name starts so), the outcome)
    "good": (4, 1, (["gpu-01", "gpu-03"], ["gpu-02", "gpu-04"]), (), "", None, "upgraded"),
    "canary image not found": (4, 1, (["gpu-01", "gpu-03"], ["gpu-02", "gpu-04"]), (), MISSING, None, "rolled back"),
    "no room: A gives a pair first": (4, 2, (["gpu-01", "gpu-03"], ["gpu-02", "gpu-04"]), (), "", None, "upgraded"),
    # gpu-08 lost B's directory: the canary passes, the wave's decode pod there never mounts
    "wave fails after the canary": (8, 2, (["gpu-01", "gpu-03", "gpu-05", "gpu-07"], ["gpu-02", "gpu-04", "gpu-06", "gpu-08"]),
                                    ("gpu-08",), "", None, "rolled back"),
    # A's prefill node is drained while the route moves: A serves on what it has left, B never needed that node
    "node drained mid-roll": (8, 2, (["gpu-01", "gpu-03", "gpu-05", "gpu-07"], ["gpu-02", "gpu-04", "gpu-06", "gpu-08"]),
                              (), "", ("gpu-01", "route"), "upgraded"),
    # B's canary decode node is drained during the wave and there is no other room: the wave fails, A comes back whole
    "B's node drained mid-roll": (6, 2, (["gpu-01", "gpu-03", "gpu-05"], ["gpu-02", "gpu-04", "gpu-06"]), (), "",
                                  ("gpu-06", "wave"), "rolled back"),
}


def pd_roles_ready(cluster):
    """``{(generation A/B, role): Ready pods}`` of the engine roles."""
    out = {}
    for pod in cluster.pods.values():
        labels = pod["metadata"].get("labels") or {}
        if labels.get(up.ROLE_LABEL) in ("prefill", "decode") and cluster._ready(pod) \
                and not pod["metadata"].get("deletionTimestamp"):  # pylint: disable=protected-access
            key = (revision(pod), labels[up.ROLE_LABEL])
            out[key] = out.get(key, 0) + 1
    return out


def role_pd_upgrade(run_module, tmp_path, case):
    """The role's tasks on a P/D pair: A deployed by roles/pd_disagg's own task; A named by kubernetes.yml's
    k8s_upgrade_plan task (form P/D), B rendered by kubernetes_pd.yml's pd_manifests task, the nodes that staged B
    kept by its set_fact, the plan by kubernetes_roll.yml's plan task, each templated from the roles' defaults with
    the inventory's values given here; then the plan's steps and the rollback as kubernetes_step.yml and the
    rescue run them, every front pod's reach observed at every poll."""
    gpu_nodes, replicas, (pre, dec), missing, image, drain, _expect = PD_ROLE_CASES[case]
    a = pd_render(run_module, tmp_path, A_PATH, "a", ["gpu-01", "gpu-03"][:replicas], ["gpu-02", "gpu-04"][:replicas], replicas)
    cluster = pd_cluster(gpu_nodes, b_missing=missing)
    if image:
        cluster.missing_images.add(image)
    for obj in a["objects"]:
        cluster.apply(copy.deepcopy(obj))
    cluster.advance(200)
    inventory = dict(
        pd_disagg_k8s_mode="apply", pd_disagg_k8s_workload="deployments", pd_disagg_transport="tcp",
        pd_disagg_proxy_image="registry.example/python:3.11-slim@sha256:" + "a" * 64, pd_disagg_model_path=A_PATH,
        pd_disagg_model_host_path=A_PATH, pd_disagg_prefill_replicas=replicas, pd_disagg_decode_replicas=replicas,
        engine_served_model_name="tiny", engine_k8s_gpu_resource="nvidia.com/gpu", engine_allow_outage=False,
        upgrade_engine_image=image, upgrade_engine_args=[], upgrade_pinned=["rev-a"], upgrade_a_ref="tiny-llama@rev-a",
        upgrade_b_ref="tiny-llama@rev-b", upgrade_k8s_b_path=B_PATH,
        upgrade_k8s_pd_policies={"resources": []}, upgrade_k8s_pd_extension_policies={"resources": []},
        # what the role's "Find the prefill/decode nodes that staged B" includes leave behind
        upgrade_k8s_pd_prefill_staged=list(pre), engine_staged_nodes=list(dec),
        upgrade_k8s_a={"serving": {"form": "P/D"}}, upgrade_k8s_compile_minutes=15, ansible_play_hosts_all=["h1"],
        hostvars={"h1": {}},
        # what kubernetes.yml names for a P/D pair
        upgrade_k8s_served_name="tiny-llama", upgrade_k8s_probe_headers={},
        upgrade_k8s_probe_checks=[{"type": "chat", "prompt": "Reply with exactly FP8_OK.", "expect": "FP8_OK"}])
    variables = rt.RoleVars("pd_disagg", inventory, extra_vars_files=["roles/engine/vars/profiles.yml"])
    variables.env.filters["flatten"] = lambda items: [x for i in items for x in (i if isinstance(i, list) else [i])]
    variables.env.filters["extract"] = lambda host, hv, key: hv[host].get(key, variables.env.undefined(key))
    workloads = [o for o in cluster.objects() if o["kind"] == "Deployment"]
    name_task = rt.task("upgrade", "llmops.serving.k8s_upgrade_plan", "kubernetes.yml")
    r = run_module(k8s_upgrade_plan, variables.template(name_task["llmops.serving.k8s_upgrade_plan"], dict(
        upgrade_k8s_workloads={"results": [{"resources": workloads}, {"resources": []}]})))
    serving = r["serving"]
    assert serving["form"] == "P/D" and serving["revision"] == "rev-a" and serving["prefill"] == "tiny-llama-prefill", serving
    render_task = rt.task("upgrade", "llmops.serving.pd_manifests", "kubernetes_pd.yml")
    b = run_module(pd_manifests, variables.template(render_task["llmops.serving.pd_manifests"]))
    assert not b.get("failed"), b.get("msg")
    staged_task = rt.task("upgrade", "ansible.builtin.set_fact", "kubernetes_pd.yml", name="Keep the nodes that staged B, per role")
    staged = variables.template(staged_task["ansible.builtin.set_fact"])["upgrade_k8s_staged"]
    assert staged == {"prefill": list(pre), "decode": list(dec)}
    plan_task = rt.task("upgrade", "llmops.serving.k8s_upgrade_plan", "kubernetes_roll.yml")
    live = live_of(cluster, a["objects"])
    r = run_module(k8s_upgrade_plan, variables.template(plan_task["llmops.serving.k8s_upgrade_plan"], dict(
        upgrade_k8s_b=b, upgrade_k8s_staged=staged,
        upgrade_k8s_fleet={"results": [{"resources": node_objects(cluster)},
                                       {"resources": [o for o in cluster.objects() if o["kind"] == "Pod"]}]},
        upgrade_k8s_live={"results": [{"resources": [o]} for o in live]})))
    assert not r.get("failed"), r.get("msg")
    p = r["plan"]
    assert all(k["state"] == "off" for k in p["kernel_cache"]) and len(p["kernel_cache"]) == len(set(pre) | set(dec))
    reach_log, together = [], []

    def observe(c):
        reach_log.append(pd_reach(c))

    def during(i, step, c):
        if drain and step["name"].startswith(drain[1]) and not any(n["name"] == drain[0] and n["taints"] for n in c.fleet):
            c.advance(5)
            c.drain(drain[0])

    def after_wait(c, step):
        together.append((step["name"], pd_roles_ready(c)))
        with gateway(c) as url:  # the answer must come from B's front (which reaches B's pair only)
            answer = canary_answer(run_module, variables, c, step, url)
        answers.append(answer)
        return answer.get("msg") if answer.get("failed") else None

    answers = []
    cluster.gateway_rng = random.Random(3)
    outcome, why, seq = execute(run_module, cluster, p, during=during, observe=observe, limit=600, poll=30,
                                canary_check=after_wait)
    for answer in answers:
        assert not answer.get("failed") and p["generations"]["b"] in answer["pod"], answer
        assert "-pd-proxy-" in answer["pod"] and len(answer["canary"]) == 3  # B's front answered, of B's three
        assert answer["others"] and all(p["generations"]["b"] not in o for o in answer["others"]), answer
    assert bool(answers) == (case != "canary image not found")
    return cluster, p, outcome, why, seq, reach_log, together


@pytest.mark.parametrize("case", sorted(PD_ROLE_CASES))
def test_the_role_upgrades_a_pd_pair_generations_apart_replayed_on_the_cluster(run_module, tmp_path, capsys, case):
    cluster, p, outcome, why, seq, reach_log, together = role_pd_upgrade(run_module, tmp_path, case)
    expect, replicas = PD_ROLE_CASES[case][-1], PD_ROLE_CASES[case][1]
    if case == "canary image not found":
        with capsys.disabled():  # the failing P/D canary's pod-level sequence, in the test output even without -s
            show(seq)
    assert outcome == expect, why
    gen_b = p["generations"]["b"]
    assert p["form"] == "P/D" and p["canary"]["names"][:2] == ["tiny-llama-prefill-" + gen_b, "tiny-llama-decode-" + gen_b]
    # at no poll of any step does a front pod reach pods of two generations (or of the other one)
    assert len(reach_log) > (2 if case == "canary image not found" else len(p["steps"])), len(reach_log)
    for reach in reach_log:
        for front, (gen, revs, _roles) in reach.items():
            assert revs <= {gen}, (front, gen, revs)
    # and not vacuously: B's front reached B's pods at some poll (unless B never came up), and at the end every front
    # reaches a Ready prefill and a Ready decode pod
    assert any(v[1] == {"B"} for reach in reach_log for v in reach.values()) or case == "canary image not found"
    assert pd_reach(cluster) and all(r == {"--prefill", "--decode"} for _g, _v, r in pd_reach(cluster).values())
    # one P/D group moves together: the canary is one prefill and one decode of B, Ready together
    for step, ready in together:
        assert ready.get(("B", "prefill")) == ready.get(("B", "decode")) == 1, (step, ready)
    # each wave that became Ready holds as many of B's prefill as decode pods (the one that failed did not)
    passed = seq[1:-2] if outcome == "rolled back" else seq[1:]
    for step, pods in passed:
        if step.startswith("wave"):
            b = [x for x in pods.get("B", []) if x.endswith(":ready")]
            assert len([x for x in b if "-prefill-" in x]) == len([x for x in b if "-decode-" in x]), (step, pods)
    byrev = pods_by_revision(cluster)
    if expect == "rolled back":
        assert set(byrev) == {"A", "front"} and len(byrev["A"]) == 2 * replicas and all(x.endswith(":ready") for x in byrev["A"]), byrev
        assert not any(p["generations"]["b"] in x for x in byrev["front"]), byrev
        assert_pd_a(cluster, p)
        if case == "canary image not found":
            assert "image_pull" in why, why
        if case == "wave fails after the canary":
            assert together and "mount" in why and p["wave_surge"] == 1, why  # the canary passed before the wave failed
    else:
        assert set(byrev) == {"B", "front"} and len(byrev["B"]) == 2 * replicas and all(x.endswith(":ready") for x in byrev["B"]), byrev
        assert all(p["generations"]["b"] in x for x in byrev["front"]), byrev
        assert not [o for o in cluster.deployments if o in [r["name"] for r in p["retire"]]]  # A's pair retired
        if case == "node drained mid-roll":
            assert not any("@gpu-01:" in x for x in byrev["B"]), byrev
        if case == "no room: A gives a pair first":
            assert p["surge"] == 0 and p["steps"][0]["name"].startswith("make room")


# ---- a StormService pair: refused, for AIBrix's own reasons -----------------------------------------------------


def _storm_pod(storm, role, roleset, name):
    """A pod of ``storm``'s ``role`` as the RoleSet controller makes it (pkg/controller/constants/stormservice.go:
    the role template's labels plus role-name, roleset-name and storm-service-name)."""
    t = next(r["template"] for r in storm["spec"]["template"]["spec"]["roles"] if r["name"] == role)
    labels = dict(t["metadata"]["labels"], **{"role-name": role, "roleset-name": roleset,
                                              "storm-service-name": storm["metadata"]["name"]})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels,
                                                            "annotations": dict(t["metadata"].get("annotations") or {})},
            "spec": copy.deepcopy(t["spec"])}


def test_a_stormservice_pair_is_refused_with_aibrix_s_reasons_shown_on_the_gateway_oracle(run_module, tmp_path):
    a = pd_render(run_module, tmp_path, A_PATH, "a", workload="stormservice")
    b = pd_render(run_module, tmp_path, B_PATH, "b", workload="stormservice")
    storm_a, storm_b = a["objects"][0], b["objects"][0]
    assert storm_a["kind"] == storm_b["kind"] == "StormService"
    # the plan and the role's first read refuse before anything changes, naming the upstream behaviours
    words = ("RollingManagerSequential", "roleset-name", "#1321", "pd_disagg_k8s_workload: deployments")
    refusals.assert_refused(run_module(k8s_upgrade_plan, dict(live=a["objects"], rendered=b["objects"], nodes=[],
                                                              staged_nodes=[])), reason="pd_stormservice", words=words)
    r = run_module(k8s_upgrade_plan, dict(live=a["objects"], served_model_name="tiny", pd_model_name="tiny-llama"))
    refusals.assert_refused(r, reason="pd_stormservice", words=words)
    assert r["serving"]["form"] == "StormService" and r["serving"]["revision"] == "rev-a"
    model = storm_a["spec"]["template"]["spec"]["roles"][0]["template"]["metadata"]["labels"][aibrix_oracle.NAME]
    # 1. B in A's StormService: midway through RollingManagerSequential the RoleSet's prefill runs B's template and
    # its decode A's; the pd router pairs them (one RoleSet)
    b_in_a = copy.deepcopy(storm_b)
    b_in_a["metadata"]["name"] = storm_a["metadata"]["name"]
    midway = [_storm_pod(b_in_a, "prefill", "rs-0", "rs-0-prefill-0"), _storm_pod(storm_a, "decode", "rs-0", "rs-0-decode-0")]
    pairs = aibrix_oracle.pd_candidates(midway, model)
    assert pairs == {"rs-0": {"prefill": ["rs-0-prefill-0"], "decode": ["rs-0-decode-0"],
                              "storm_service": storm_a["metadata"]["name"]}}
    assert kc.model_path(midway[0]) == B_PATH and kc.model_path(midway[1]) == A_PATH  # one request, two generations
    # 2. B in a StormService of its own: never paired with A's pods, but a candidate of every request from the moment
    # its pods exist, with no route object that could hold it back (AIBrix makes none for a StormService)
    storm_b["metadata"]["name"] = storm_a["metadata"]["name"] + "-b"
    both = aibrix_oracle.pd_candidates([storm_a, storm_b], model)
    assert sorted(c["storm_service"] for c in both.values()) == sorted([storm_a["metadata"]["name"], storm_b["metadata"]["name"]])
    assert all(c["prefill"][0].rsplit("-prefill-", 1)[0] == c["decode"][0].rsplit("-decode-", 1)[0] for c in both.values())
    assert aibrix_oracle.controller_objects(storm_a) == [] and aibrix_oracle.controller_objects(storm_b) == []


# ---- the canary's answer, pinned to a canary pod (kubernetes_step.yml, k8s_canary_answer) -------------------------


@contextlib.contextmanager
def gateway(cluster, wrong=()):
    """AIBrix's gateway in front of the cluster model: a completion with a routing strategy goes to the pod the
    gateway picks (``Cluster.gateway_completion``: its cache of Ready pods labelled with the model), whose engine
    answers ``FP8_OK`` unless its revision is in ``wrong``; the answer carries the gateway's response headers
    (``target-pod`` ...). A P/D front answers as its generation's pair."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got = cluster.gateway_completion(model=body.get("model"), strategy=self.headers.get("routing-strategy"))
            status, headers, text = 503, {}, "no pod"
            if got is not None:
                status, headers = got
                pod = cluster.pods.get(headers.get("target-pod"), {})
                labels = (pod.get("metadata") or {}).get("labels") or {}
                rev = ("B" if labels.get(up.GENERATION_LABEL) else "A") if labels.get(up.ROLE_LABEL) == "front" else revision(pod)
                text = "WRONG" if rev in wrong else "FP8_OK"
            doc = {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
            data = json.dumps(doc if status == 200 else {"error": {"message": text}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield "http://127.0.0.1:%d" % srv.server_address[1]
    finally:
        srv.shutdown()


def canary_answer(run_module, variables, cluster, step, url):
    """kubernetes_step.yml's pod listing and k8s_canary_answer task, templated from the role's task."""
    task = rt.task("upgrade", "llmops.serving.k8s_canary_answer", "kubernetes_step.yml")
    args = variables.template(task["llmops.serving.k8s_canary_answer"], dict(
        upgrade_k8s_probe_url=url, upgrade_k8s_step=step, engine_startup_timeout=5,
        upgrade_k8s_pods={"resources": [o for o in cluster.objects() if o["kind"] == "Pod"]}))
    return run_module(k8s_canary_answer, args)


def engine_role_vars(**extra):
    overrides = dict(engine_platform="kubernetes", engine_name="vllm", engine_served_model_name="tiny",
                     engine_namespace=NS, engine_image=IMAGE, upgrade_k8s_served_name="tiny", upgrade_k8s_probe_headers={},
                     upgrade_k8s_probe_checks=[{"type": "models"}, {"type": "chat", "prompt": "Reply with exactly FP8_OK.",
                                                                    "expect": "FP8_OK", "model_header": True}])
    overrides.update(extra)
    return rt.RoleVars("engine", overrides, extra_vars_files=["roles/engine/vars/profiles.yml"])


CANARY_CASES = {
    # name: (the gateway's pod cache lag in seconds, revisions that answer wrongly, the outcome, the reason)
    "the canary answers": (0, (), "upgraded", None),
    "the gateway never picks the canary": (10 ** 6, (), "rolled back", "canary_not_reached"),
    "the canary answers wrongly": (0, ("B",), "rolled back", "canary_wrong"),
}


@pytest.mark.parametrize("case", sorted(CANARY_CASES))
def test_the_canary_s_answer_must_come_from_a_canary_pod(run_module, case):
    lag, wrong, expect, reason = CANARY_CASES[case]
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    b = render(B_PATH, ["gpu-01", "gpu-02", "gpu-03"])
    cluster = deployed(a, fleet())
    cluster.gateway_rng = random.Random(7)
    cluster.gateway_delay = lag
    p = make_plan(run_module, cluster, a["objects"], b, ["gpu-01", "gpu-02", "gpu-03"])["plan"]
    variables = engine_role_vars()
    results = []

    def check(c, step):
        with gateway(c, wrong) as url:
            r = canary_answer(run_module, variables, c, step, url)
        results.append(r)
        return r.get("msg") if r.get("failed") else None

    outcome, why, seq = execute(run_module, cluster, p, canary_check=check)
    r = results[0]
    assert outcome == expect, why
    canary_pods = [x.split("@")[0] for x in dict(seq)[p["steps"][0]["name"]]["B"]]
    assert r["canary"] == canary_pods and len(r["others"]) == 2  # the canary's pod and A's two, by name
    if reason is None:
        assert r["pod"] in canary_pods and r["answers"][-1]["pods"] == [r["pod"]] and r["answers"][-1]["ok"]
        # the pick is the gateway's: A's pods answered first, and were not counted
        assert all(not x["canary"] for x in r["answers"][:-1]) and len(r["answers"]) <= 20
        assert r["canary_address"]["url"].endswith(":8000") and r["a_address"]["name"] in r["others"]
        assert set(pods_by_revision(cluster)) == {"B"}
    else:
        refusals.assert_refused(r, reason=reason, words=canary_pods)
        if reason == "canary_not_reached":  # bounded, and the failure names the pods that answered
            assert len(r["answers"]) == up_attempts(1, 3) and all(o in r["msg"] for o in r["others"]), r["msg"]
            assert "not B's" in r["msg"]
        assert_a_restored(cluster, p)


def up_attempts(canary, routable):
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_canary
    return _k8s_canary.attempts_for(canary, routable)


# ---- B's kernel cache, stated before any pod changes (kubernetes.yml, kubernetes_roll.yml) -----------------------


def test_the_plan_states_b_s_kernel_cache_on_each_staged_node_before_anything_changes(run_module):
    """Each host that staged B runs the kernel_cache role for B's fingerprint (B's revision, image, arguments) and
    reports hit or miss; the plan, made before the first change, states it per staged node, and B's pods mount the
    directory the role gave (the published checkout on a hit, the capture directory on a miss: the same path)."""
    include = next(t for t in rt._walk(rt._tasks(os.path.join(rt.ROOT, "roles", "upgrade", "tasks", "kubernetes.yml")))  # pylint: disable=protected-access
                   if (t.get("ansible.builtin.include_role") or {}).get("name") == "llmops.serving.kernel_cache")
    assert include["vars"]["kernel_cache_model_path"] == "{{ upgrade_k8s_b_path }}"
    assert include["vars"]["kernel_cache_model_revision"] == "{{ upgrade_model.revision }}"
    assert include["vars"]["engine_image"] == "{{ upgrade_k8s_b_image }}"
    kdir = "/var/cache/llmops/kernels/vllm/.run/0123abcd-0"
    staged = ["gpu-01", "gpu-02", "gpu-03"]
    hostvars = {
        "h1": {"upgrade_k8s_kcache": {"node": "gpu-01", "status": "hit", "fingerprint": "0123abcd", "dir": kdir, "capturing": False}},
        "h2": {"upgrade_k8s_kcache": {"node": "gpu-02", "status": "miss", "fingerprint": "0123abcd", "dir": kdir, "capturing": True}},
        "h3": {},  # gpu-03 staged B but its host reported nothing
    }
    variables = engine_role_vars(
        engine_tp_size=8, engine_replicas=2, engine_model_source="staged_nvme", engine_model_path=A_PATH,
        upgrade_model={"name": "tiny", "revision": "rev-b"}, upgrade_engine_image="", upgrade_engine_args=[],
        engine_allow_outage=False, engine_staged_nodes=staged, upgrade_k8s_staged=staged, upgrade_pinned=["rev-a"],
        upgrade_a_ref="tiny@rev-a", upgrade_b_ref="tiny@rev-b", upgrade_k8s_b_path=B_PATH, kernel_cache_env={},
        kernel_cache_engine_dir=kdir, upgrade_k8s_a={"serving": {"form": "Deployment"}}, upgrade_k8s_compile_minutes=15,
        ansible_play_hosts_all=sorted(hostvars), hostvars=hostvars)
    variables.env.filters["flatten"] = lambda items: [x for i in items for x in (i if isinstance(i, list) else [i])]
    variables.env.filters["extract"] = lambda host, hv, key: hv[host].get(key, variables.env.undefined(key))
    render_task = rt.task("upgrade", "llmops.serving.engine_manifests", "kubernetes_roll.yml")
    raw = dict((k, v) for k, v in render_task["llmops.serving.engine_manifests"].items() if k != "env")
    b = run_module(engine_manifests, dict(variables.template(raw), env=[]))
    assert not b.get("failed"), b.get("msg")
    b_dep = next(o for o in b["objects"] if o["kind"] == "Deployment")
    assert any((v.get("hostPath") or {}).get("path") == kdir for v in b_dep["spec"]["template"]["spec"]["volumes"])
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    cluster = deployed(a, fleet())
    before = cluster.objects()
    plan_task = rt.task("upgrade", "llmops.serving.k8s_upgrade_plan", "kubernetes_roll.yml")
    r = run_module(k8s_upgrade_plan, variables.template(plan_task["llmops.serving.k8s_upgrade_plan"], dict(
        upgrade_k8s_b=b, upgrade_k8s_fleet={"results": [{"resources": node_objects(cluster)},
                                                        {"resources": [o for o in cluster.objects() if o["kind"] == "Pod"]}]},
        upgrade_k8s_live={"results": [{"resources": [o]} for o in live_of(cluster, b["objects"])]})))
    assert not r.get("failed"), r.get("msg")
    assert [(k["node"], k["state"]) for k in r["plan"]["kernel_cache"]] == [("gpu-01", "hit"), ("gpu-02", "miss"), ("gpu-03", "unknown")]
    text = "\n".join(r["lines"])
    assert "B's kernel cache (fingerprint 0123abcd), before any pod changes:" in text
    assert "gpu-01: hit: B's published cache is mounted (%s)" % kdir in text
    assert ("gpu-02: miss: B compiles at its start, +15 min cold start; captured into %s after its first correct "
            "answer, published when the upgrade ends" % kdir) in text
    assert "gpu-03: not checked" in text
    assert cluster.objects() == before  # stated before anything changed
    # kernel caches off, or a P/D pair (its pods mount pd_disagg_kernel_cache_dir): said so for every staged node
    off = up.kernel_cache_state({"prefill": ["gpu-01"], "decode": ["gpu-02"]}, [], enabled=False, compile_minutes=15,
                                off_reason="a P/D pair mounts pd_disagg_kernel_cache_dir")
    assert [(k["node"], k["state"]) for k in off] == [("gpu-01", "off"), ("gpu-02", "off")]
    assert "B compiles at its start, +15 min cold start" in off[0]["line"] and "pd_disagg_kernel_cache_dir" in off[0]["line"]


# ---- the SLO gate on the canary (kubernetes_step.yml includes slo.yml) -------------------------------------------


def test_an_slo_breach_on_the_canary_rolls_back_to_a_and_a_serves(run_module, capsys):
    """After the canary's correct answer, kubernetes_step.yml includes slo.yml when upgrade_slo is set, with the
    URLs of one A pod alone and the canary alone (pod IPs from the listing) and the client host; slo.yml failing
    (a breached limit, simulated here: the gate itself is tested with its own file) rolls back to A."""
    include = next(t for t in rt._walk(rt._tasks(os.path.join(rt.ROOT, "roles", "upgrade", "tasks", "kubernetes_step.yml")))  # pylint: disable=protected-access
                   if str(t.get("ansible.builtin.include_tasks", "")).endswith("slo.yml"))
    a = render(A_PATH, ["gpu-01", "gpu-02"])
    b = render(B_PATH, ["gpu-01", "gpu-02", "gpu-03"])
    cluster = deployed(a, fleet())
    cluster.gateway_rng = random.Random(11)
    p = make_plan(run_module, cluster, a["objects"], b, ["gpu-01", "gpu-02", "gpu-03"])["plan"]
    groups = {"bench_clients": ["bench-01"], "k8s_api": ["api-01"]}
    variables = engine_role_vars(upgrade_slo={"ttft_p95_ms": 500}, groups=groups, engine_k8s_delegate_to="")
    gate = []

    def check(c, step):
        with gateway(c) as url:
            answer = canary_answer(run_module, variables, c, step, url)
        if answer.get("failed"):
            return answer["msg"]
        extra = dict(upgrade_k8s_canary_answer=answer)
        if not variables.template("{{ %s }}" % include["when"], extra):
            return None
        ips = dict((n, pod["status"].get("podIP")) for n, pod in c.pods.items())  # the pods as listed then
        gate.append((answer, variables.template(include["vars"], extra), ips))
        return "upgrade_slo: ttft_p95_ms 912 ms > 500 ms on the canary (A: 410 ms)"  # what slo.yml fails with

    outcome, why, seq = execute(run_module, cluster, p, canary_check=check)
    with capsys.disabled():
        show(seq)
    assert outcome == "rolled back" and "ttft_p95_ms" in why, why
    (answer, slo, ips), = gate
    canary_step = dict(seq)[p["steps"][0]["name"]]
    a_pods = [x.split("@")[0] for x in canary_step["A"]]
    assert slo["upgrade_slo_b_url"] == "http://%s:8000" % ips[answer["pod"]] and answer["pod"] in answer["canary"]
    assert any(slo["upgrade_slo_a_url"] == "http://%s:8000" % ips[n] for n in a_pods), (slo, a_pods)
    assert slo["upgrade_slo_delegate"] == "bench-01"
    assert_a_restored(cluster, p)
    # no bench_clients group: the client runs on the Kubernetes API delegate; no upgrade_slo: no gate
    assert variables.template(include["vars"]["upgrade_slo_delegate"], dict(groups={"k8s_api": ["api-01"]})) == "api-01"
    assert variables.template("{{ %s }}" % include["when"], dict(upgrade_slo={})) is False


@pytest.mark.parametrize("slo,url,form,allowed", [({"ttft_p95_ms": 500}, "", "P/D", False),
                                                  ({"ttft_p95_ms": 500}, "http://gw", "P/D", True),
                                                  ({}, "", "Deployment", False), ({}, "http://gw", "Deployment", True)])
def test_an_upgrade_without_the_gateway_is_refused_before_anything_changes(slo, url, form, allowed):
    """The canary's proof is a correct answer from a pod of B through the gateway: no URL, no proof (with or without
    an SLO gate, which compares the pod that answered with one of A's), refused naming the form's variable."""
    check = rt.task("upgrade", "ansible.builtin.assert", "kubernetes.yml",
                    name="Refuse an upgrade whose canary nothing could prove (no gateway URL)")["ansible.builtin.assert"]
    variables = engine_role_vars(upgrade_slo=slo, upgrade_k8s_probe_url=url, upgrade_k8s_a={"serving": {"form": form}})
    assert variables.template("{{ %s }}" % check["that"]) is allowed
    if not allowed:
        msg = variables.template(check["fail_msg"])
        var = "pd_disagg_k8s_probe_url" if form == "P/D" else "engine_k8s_probe_url"
        assert msg.startswith(var + " is empty:") and "AIBrix gateway's URL" in msg and "Nothing changed" in msg


@pytest.mark.parametrize("target, form, allowed", [("aibrix_gateway", "Deployment", True), ("engine", "Deployment", False),
                                                   ("engine", "LeaderWorkerSet", False), ("engine", "P/D", True)])
def test_an_upgrade_probed_through_a_service_is_refused_before_anything_changes(target, form, allowed):
    """engine_k8s_probe_target: engine makes engine_k8s_probe_url a Service: its answer names no pod, so the canary
    could never be proven (k8s_canary_answer would fail no_pod_named after B's canary was created and roll back).
    Refused before B is staged, naming the two variables to set (a P/D pair is probed through its own URL)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "roles", "upgrade", "tasks", "kubernetes.yml")) as f:
        names = [t.get("name") for t in yaml.safe_load(f)]
    gate = "Refuse an upgrade whose canary would be probed through a Service (no pod named)"
    assert names.index(gate) < names.index("Stage B on this node while A serves (A pinned), on the nodes of A's form's groups")
    check = rt.task("upgrade", "ansible.builtin.assert", "kubernetes.yml", name=gate)["ansible.builtin.assert"]
    variables = engine_role_vars(engine_k8s_probe_target=target, upgrade_k8s_a={"serving": {"form": form}})
    assert variables.template("{{ %s }}" % check["that"]) is allowed
    if not allowed:
        msg = variables.template(check["fail_msg"])
        assert msg.startswith("engine_k8s_probe_target is engine: ") and "names none" in msg
        assert "engine_k8s_probe_target to aibrix_gateway" in msg and "Nothing changed" in msg


def test_the_attempts_are_enough_uniform_picks_of_the_gateway_s_pods_and_bounded():
    from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_canary
    # one canary pod among 3 routable: (2/3)^18 < 1/1000 <= (2/3)^17
    assert _k8s_canary.attempts_for(1, 3) == 18
    assert _k8s_canary.attempts_for(1, 2) == 10  # a P/D canary: B's front beside A's
    assert _k8s_canary.attempts_for(1, 10 ** 4) == _k8s_canary.MAX_ATTEMPTS and _k8s_canary.attempts_for(0, 5) == 3
    pods = [{"metadata": {"name": n, "labels": dict({"app": n.split("-", maxsplit=1)[0]}, **({_k8s_canary.MODEL_LABEL: "m"} if l else {}))}}
            for n, l in (("front-b", True), ("prefill-b", False), ("front-a", True))]
    canary, others = _k8s_canary.canary_pods(pods, [{"app": "front"}, {"app": "prefill"}], "m")
    assert canary == ["front-a", "front-b", "prefill-b"] and others == []
    canary, others = _k8s_canary.canary_pods(pods, [{"app": "prefill"}], "m")
    assert canary == ["prefill-b"] and others == ["front-a", "front-b"]
    assert _k8s_canary.routable(pods, ["front-b", "prefill-b"], "m") == ["front-b"]
