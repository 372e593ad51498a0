"""The wait on a rollout, driven by the controller model in tests/lib/kube_controllers.py (kubernetes/kubernetes
v1.33.0 pkg/controller/deployment/rolling.go, sync.go; pkg/controller/replicaset/replica_set.go;
pkg/kubelet/prober/worker.go, pkg/kubelet/kuberuntime/kuberuntime_manager.go - cited rule by rule there).

A rollout from revision A to revision B is not "ready" until B answers: the old pods are Ready right after the
re-apply, and the Service answers from them until they are gone.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_k8s, _k8s_revision, _k8s_shape, _k8s_wait
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

A = "/mnt/nvme/models/GLM-5.2-FP8/rev-a"
B = "/mnt/nvme/models/GLM-5.2-FP8/rev-b"


def _poll(cluster, replicas, answer=True, **kw):
    return _k8s_wait.judge(cluster.fetch, answer=cluster.models if answer else None,
                           replicas=replicas, check_route=False, **kw)


def _roll_until_settled(cluster, replicas, limit=900, step=10):
    """Poll every ``step`` seconds as k8s_engine_wait does; every verdict, until ready or failed."""
    seen = []
    for _i in range(limit // step):
        v = _poll(cluster, replicas)
        seen.append((cluster.clock(), v, cluster.objects()))
        if v["state"] in ("ready", "failed"):
            return seen
        cluster.advance(step)
    return seen


def _deployed(replicas, engines=None):
    cluster = kc.Cluster()
    cluster.engines.update(engines or {A: kc.Engine(load_seconds=60), B: kc.Engine(load_seconds=90)})
    cluster.apply(kc.deployment(A, replicas=replicas))
    seen = _roll_until_settled(cluster, replicas)
    assert seen[-1][1]["state"] == "ready", seen[-1][1]["message"]
    return cluster


def _pods(objects, path=None):
    return [o for o in objects if o["kind"] == "Pod" and (path is None or path in o["spec"]["containers"][0]["args"])]


def test_the_model_rolls_one_pod_at_a_time_and_never_surges():
    """maxSurge 0 / maxUnavailable 1 (rolling.go): never more pods than replicas exist that are not terminating."""
    cluster = _deployed(2)
    cluster.apply(kc.deployment(B, replicas=2))
    for _s in range(40):
        cluster.advance(5)
        live = [p for p in _pods(cluster.objects()) if not p["metadata"].get("deletionTimestamp")]
        assert len(live) <= 2
    hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in _pods(cluster.objects())}
    assert len(hashes) == 1 and all(B in p["spec"]["containers"][0]["args"] for p in _pods(cluster.objects()))


def test_rollout_from_a_to_b_is_not_ready_until_b_answers():
    cluster = _deployed(2)
    cluster.apply(kc.deployment(B, replicas=2))
    # right after the re-apply: two pods of A are Ready, the controller has not even observed the new generation
    first = _poll(cluster, 2)
    assert len(_pods(cluster.objects(), A)) == 2
    assert first["state"] == "waiting" and "rolling" in first["message"], first["message"]
    assert "observe generation 2" in first["message"]

    seen = _roll_until_settled(cluster, 2)
    t_ready, ready, objects = seen[-1]
    assert ready["state"] == "ready", ready["message"]
    # every verdict before it was not ready, although A pods were Ready and answering for most of the time
    assert all(v["state"] == "waiting" for _t, v, _o in seen[:-1])
    assert any(any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
               for _t, _v, objs in seen[:-1] for p in _pods(objs, A))
    # at ready: only B pods, the rollout done, and the answer proven to come from B
    assert _pods(objects, A) == [] and len(_pods(objects, B)) == 2
    assert ready["rollout"]["state"] == "done" and ready["rollout"]["updated"] == 2
    assert ready["revision"]["model_path"] == B and ready["revision"]["proven"] is True
    assert ready["revision"]["answered_roots"] == [B]
    assert sorted(ready["revision"]["pods"]) == sorted(p["metadata"]["name"] for p in _pods(objects, B))
    # B needs 90 s to load per pod, one pod at a time: the wait cannot have said ready before both loaded
    assert t_ready - seen[0][0] >= 2 * 90


def test_one_replica_rollout_waits_through_the_gap_without_any_ready_pod():
    cluster = _deployed(1)
    cluster.apply(kc.deployment(B, replicas=1))
    seen = _roll_until_settled(cluster, 1)
    states = [v["state"] for _t, v, _o in seen]
    assert states[-1] == "ready" and set(states[:-1]) == {"waiting"}
    messages = " | ".join(v["message"] for _t, v, _o in seen[:-1])
    assert "new replicas have been updated" in messages or "old replica" in messages or "available" in messages


def test_an_answer_from_the_old_revision_keeps_the_rollout_waiting():
    """The controller is done, but the serving URL still answers from A (for example a gateway's endpoint cache
    that lags): not ready."""
    cluster = _deployed(1)
    cluster.apply(kc.deployment(B, replicas=1))
    seen = _roll_until_settled(cluster, 1)
    assert seen[-1][1]["state"] == "ready"
    stale = {"object": "list", "data": [{"id": "glm-5.2-fp8-vllm", "root": A}]}
    v = _k8s_wait.judge(cluster.fetch, answer=lambda: stale, replicas=1, check_route=False)
    assert v["state"] == "waiting" and v["revision"]["proven"] is False
    assert "answers from %s, not from the current revision's %s" % (A, B) in v["message"]
    none = _k8s_wait.judge(cluster.fetch, answer=lambda: None, replicas=1, check_route=False)
    assert none["state"] == "waiting"


def test_a_liveness_kill_of_a_serving_vllm_is_engine_hung_in_the_wait_and_the_diagnosis():
    """B serves, then stops answering /health: the kubelet kills it (SIGTERM, vLLM exits 0) and restarts it."""
    cluster = _deployed(1, {A: kc.Engine(load_seconds=60), B: kc.Engine(load_seconds=60, hang_after=30)})
    cluster.apply(kc.deployment(B, replicas=1))
    seen = _roll_until_settled(cluster, 1)
    # it may be judged ready while B serves; the kill comes after: keep polling as a later wait would
    for _i in range(30):
        v = _poll(cluster, 1)
        if v["state"] == "failed":
            break
        cluster.advance(10)
    assert v["state"] == "failed", v["message"]
    pod = v["pods"][0]
    assert pod["diagnosis"]["code"] == "engine_hung", v["message"]
    assert pod["last_exit"]["exit_code"] == 0 and "crash_exit_zero" not in v["message"]
    assert "clean shutdown on the kubelet's SIGTERM" in v["message"]
    res = _diagnose_k8s.diagnose_kubernetes(cluster.objects(), {}, namespace="llm-lab", name="glm-5-2-fp8-vllm",
                                            now=cluster.clock())
    assert res["verdict"] == "engine_hung", res["summary"]
    assert seen  # the rollout itself had settled before the kill


def test_diagnose_judges_only_the_current_revision_while_rolling():
    cluster = _deployed(2)
    cluster.apply(kc.deployment(B, replicas=2))
    cluster.advance(15)  # one A pod gone, one B pod loading, one A pod Ready
    objects = cluster.objects()
    assert _pods(objects, A) and _pods(objects, B)
    res = _diagnose_k8s.diagnose_kubernetes(objects, {}, namespace="llm-lab", name="glm-5-2-fp8-vllm", now=cluster.clock())
    assert res["verdict"] != "healthy"
    codes = [f["code"] for f in res["findings"]]
    assert "rolling" in codes
    rolling = next(f for f in res["findings"] if f["code"] == "rolling")
    assert any("earlier revision do not count" in e for e in rolling["evidence"])
    # no finding is about a pod of A
    a_names = {p["metadata"]["name"] for p in _pods(objects, A)}
    assert not any(n in f["object"] for f in res["findings"] for n in a_names)


def test_progress_deadline_exceeded_fails_the_wait_and_is_rollout_stalled():
    cluster = _deployed(1, {A: kc.Engine(load_seconds=60), B: kc.Engine(load_seconds=10 ** 6)})
    manifest = kc.deployment(B, replicas=1)
    manifest["spec"]["progressDeadlineSeconds"] = 120
    cluster.apply(manifest)
    cluster.advance(200)
    v = _poll(cluster, 1)
    assert v["state"] == "failed" and "exceeded its progress deadline" in v["message"], v["message"]
    res = _diagnose_k8s.diagnose_kubernetes(cluster.objects(), {}, namespace="llm-lab", name="glm-5-2-fp8-vllm",
                                            now=cluster.clock())
    assert "rollout_stalled" in [f["code"] for f in res["findings"]]


# ---- LeaderWorkerSet and StormService: their own status, the same rule --------------------------------------------

def _lws(generation=2, updated=1, ready=1, conds=None):
    """kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go: status replicas/readyReplicas/
    updatedReplicas and the Available / Progressing / UpdateInProgress conditions."""
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "glm-5-2-fp8-vllm", "namespace": "llm-lab", "generation": generation},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": {"spec": {"containers": [
                {"name": "engine", "args": ["--model", B]}]}}}},
            "status": {"replicas": 1, "readyReplicas": ready, "updatedReplicas": updated, "conditions": conds or []}}


def _lws_pod(name, revision, created, ready=True):
    return {"metadata": {"name": name, "namespace": "llm-lab", "creationTimestamp": created,
                         "labels": {"leaderworkerset.sigs.k8s.io/name": "glm-5-2-fp8-vllm",
                                    "leaderworkerset.sigs.k8s.io/template-revision-hash": revision}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                           "lastTransitionTime": created}],
                       "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0, "started": ready,
                                              "state": {"running": {"startedAt": created}}}]}}


def test_leaderworkerset_update_in_progress_is_rolling_and_old_groups_do_not_count():
    updating = [{"type": "UpdateInProgress", "status": "True", "reason": "GroupsUpdating"},
                {"type": "Available", "status": "True", "reason": "AllGroupsReady"}]
    pods = [_lws_pod("glm-5-2-fp8-vllm-0", "6f8d9c", "2026-08-02T08:00:00Z"),
            _lws_pod("glm-5-2-fp8-vllm-1", "7a1b2c", "2026-08-02T09:00:00Z", ready=False)]
    v = _k8s_wait.evaluate(pods, None, check_route=False, workload=_lws(updated=0, ready=0, conds=updating))
    assert v["state"] == "waiting" and "UpdateInProgress" in v["message"]
    assert v["rollout"]["revision"] == "7a1b2c" and v["rollout"]["current_pods"] == ["glm-5-2-fp8-vllm-1"]
    # done, as LWS v0.9.0+ reports it (status.observedGeneration, kubernetes-sigs/lws#807); without it a finished
    # rollout is not told from the old one (test_k8s_lws.py)
    done = [{"type": "Available", "status": "True", "reason": "AllGroupsReady", "observedGeneration": 2}]
    pods = [_lws_pod("glm-5-2-fp8-vllm-1", "7a1b2c", "2026-08-02T09:00:00Z")]
    finished = _lws(conds=done)
    finished["status"]["observedGeneration"] = 2
    v = _k8s_wait.evaluate(pods, None, check_route=False, workload=finished)
    assert v["state"] == "ready" and v["revision"]["model_path"] == B


def test_stormservice_between_revisions_is_rolling():
    """AIBrix v0.7.0 StormService status: observedGeneration, currentRevision, updateRevision, updatedReplicas,
    updatedReadyReplicas (config/crd orchestration.aibrix.ai_stormservices.yaml)."""
    storm = {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "StormService",
             "metadata": {"name": "glm-pd", "namespace": "llm-lab", "generation": 3},
             "spec": {"replicas": 1, "template": {"spec": {"roles": []}}},
             "status": {"observedGeneration": 3, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 0,
                        "updatedReadyReplicas": 0, "currentRevision": "glm-pd-5d4c", "updateRevision": "glm-pd-7f9e"}}
    ro = _k8s_revision.rollout_status(_k8s_shape.shape(storm), [], [])
    assert ro["state"] == "rolling" and "glm-pd-5d4c to glm-pd-7f9e" in ro["message"]
    storm["status"].update(updatedReplicas=1, updatedReadyReplicas=1, currentRevision="glm-pd-7f9e")
    assert _k8s_revision.rollout_status(_k8s_shape.shape(storm), [], [])["state"] == "done"
    storm["metadata"]["generation"] = 4
    assert "observe generation 4" in _k8s_revision.rollout_status(_k8s_shape.shape(storm), [], [])["message"]


def test_stormservice_pods_are_told_by_their_roleset_and_role_revision_not_a_pod_label():
    """m11: AIBrix v0.7.0 labels a RoleSet storm-service-revision (stormservice/rolesetoperations.go renderRoleSet),
    never its pods; a pod carries roleset-name and its role's revision (roleset/utils.go renderStormServicePod). With
    InPlaceUpdate the StormService controller re-renders the RoleSet first (new revision label, role-revision
    annotation 2) and the RoleSet controller replaces the pod after: in between, the old pod is Ready and the status
    can read rolled out. The old pod must not count."""
    cluster = kc.Cluster()
    cluster.engines[A] = kc.Engine(load_seconds=30)
    storm = {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "StormService",
             "metadata": {"name": "glm-pd", "labels": {}},
             "spec": {"replicas": 1, "updateStrategy": {"type": "InPlaceUpdate"},
                      "template": {"metadata": {"labels": {"app.kubernetes.io/name": "glm-pd"}}, "spec": {"roles": [
                          {"name": "prefill", "replicas": 1, "stateful": True,
                           "template": kc.deployment(A)["spec"]["template"]}]}}}}
    cluster.apply(storm)
    cluster.advance(120)
    objs = cluster.objects()
    (pod,) = [o for o in objs if o["kind"] == "Pod"]
    assert "storm-service-revision" not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"]["roleset-name"] and pod["metadata"]["labels"][_k8s_revision.ROLE_REVISION_KEY] == "1"
    workload = [o for o in objs if o["kind"] == "StormService"][0]
    rolesets = [o for o in objs if o["kind"] == "RoleSet"]
    v = _k8s_wait.evaluate([pod], check_route=False, workload=workload, controllers=rolesets)
    assert v["state"] == "ready" and v["rollout"]["current_pods"] == [pod["metadata"]["name"]], v["message"]
    # the StormService controller has re-rendered the RoleSet in place; the RoleSet controller has not acted yet
    new_rev = "glm-pd-b2b2b2b2b2"
    rolesets[0]["metadata"]["labels"]["storm-service-revision"] = new_rev
    rolesets[0]["metadata"]["annotations"][_k8s_revision.ROLE_REVISION_KEY + ".prefill"] = "2"
    workload["metadata"]["generation"] += 1
    workload["status"].update(observedGeneration=workload["metadata"]["generation"], currentRevision=new_rev,
                              updateRevision=new_rev)
    v = _k8s_wait.evaluate([pod], check_route=False, workload=workload, controllers=rolesets)
    assert v["state"] == "waiting" and v["rollout"]["current_pods"] == [], v["message"]
    assert "0/1 engine pod(s) of the current revision Ready" in v["message"]
