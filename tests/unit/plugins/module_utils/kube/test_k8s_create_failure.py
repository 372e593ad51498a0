"""A pod the controller cannot create fails the wait within about a minute, quoting the API server's refusal
(kube/_k8s_revision.create_failure).

Upstream (kubernetes/kubernetes v1.33.0 unless named otherwise; the test double tests/lib/kube_controllers.py restates
each rule beside its model):

* ``pkg/controller/replicaset/replica_set_utils.go`` ``calculateStatus``: a failed create sets the ReplicaSet
  condition ``ReplicaFailure`` True, reason ``FailedCreate``, the error as message, once (its lastTransitionTime is the
  first failure); it is removed when creating succeeds.
* ``pkg/controller/deployment/progress.go`` ``syncRolloutStatus`` / ``getReplicaFailures``: the Deployment carries a copy.
* ``pkg/controller/controller_utils.go`` ``RealPodControl.createPods``: the Warning Event ``FailedCreate``
  "Error creating: <error>" on the ReplicaSet.
* ``pkg/controller/statefulset/stateful_pod_control.go`` ``recordPodEvent``: the StatefulSet controller (a
  LeaderWorkerSet's groups) sets no condition, only ``FailedCreate`` Events "create Pod <pod> in StatefulSet <set>
  failed error: <error>".
* vllm-project/aibrix v0.7.0 ``pkg/controller/roleset/sync.go`` ``calculateStatus``: the RoleSet condition
  ``ReplicaFailure`` True, reason "reconcile roleset error", message the errors; RoleSets carry the label
  ``storm-service-name`` (``pkg/controller/stormservice/rolesetoperations.go`` ``renderRoleSet``).
* ``staging/src/k8s.io/pod-security-admission/admission/admission.go``: ``violates PodSecurity "baseline:latest": ...``.

Before: the wait listed only Pod Events and never read ``ReplicaFailure``; with no pod at all it said "0 of 1 new
replicas have been updated" until its 4500 s timeout (shorter than progressDeadlineSeconds 5760).
"""
from __future__ import annotations

import email.utils

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_revision, _k8s_shape
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait as w
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

PATH = "/mnt/nvme/models/GLM-5.2-FP8/rev-a"


def _engine_deployment():
    """The engine Deployment with the staged model on a hostPath, as the collection renders it."""
    dep = kc.deployment(PATH)
    dep["spec"]["template"]["spec"]["volumes"] = [
        {"name": "model", "hostPath": {"path": "/mnt/nvme/models", "type": "Directory"}}]
    return dep


class _Polls(object):
    """wait_rollout over the model: each sleep lets that many seconds pass on the cluster."""

    def __init__(self, cluster):
        self.cluster, self.t = cluster, 0.0

    def clock(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds
        self.cluster.advance(seconds)


def _wait(cluster, timeout=4500):
    polls = _Polls(cluster)
    return w.wait_rollout(cluster.fetch, timeout=timeout, poll_interval=10, check_route=False, clock=polls.clock,
                          sleep=polls.sleep)


def test_a_namespace_that_refuses_the_pods_fails_the_wait_within_about_a_minute_quoting_the_refusal():
    cluster = kc.Cluster()
    cluster.pod_security = "baseline"
    cluster.apply(_engine_deployment())
    v = _wait(cluster)
    assert v["state"] == "failed", v["message"]
    assert 60 <= v["elapsed"] <= 80, v["elapsed"]
    assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "model")' in v["message"]
    assert "ReplicaFailure" in v["message"] and "pod-security.kubernetes.io/enforce=privileged" in v["message"]


def test_a_refusal_that_clears_within_the_minute_is_waited_through():
    """A quota freed or a webhook back within seconds: the controller retries by itself and the rollout finishes."""
    cluster = kc.Cluster()
    cluster.engines[PATH] = kc.Engine(load_seconds=30)
    cluster.pod_security = "baseline"
    cluster.apply(_engine_deployment())
    cluster.advance(30)
    first = w.judge(cluster.fetch, check_route=False)
    assert first["state"] == "waiting" and "cannot create its pods for" in first["message"], first["message"]
    cluster.pod_security = None
    v = _wait(cluster, timeout=600)
    assert v["state"] == "ready", v["message"]
    rs = [o for o in cluster.objects() if o["kind"] == "ReplicaSet"][0]
    assert not [c for c in rs["status"].get("conditions", []) if c["type"] == "ReplicaFailure"]


def test_while_a_pod_of_the_workload_terminates_a_refusal_is_waiting_not_failed():
    """What a terminating pod holds (quota, a node) frees up when it is gone."""
    cluster = kc.Cluster()
    cluster.apply(_engine_deployment())
    cluster.advance(1)
    objs = cluster.objects()
    dep = [o for o in objs if o["kind"] == "Deployment"][0]
    pod = dict([o for o in objs if o["kind"] == "Pod"][0])
    pod["metadata"] = dict(pod["metadata"], deletionTimestamp=_iso(cluster.clock()))
    since = cluster.clock() - 300
    dep["status"]["conditions"] = [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                    "message": 'exceeded quota: gpu, requested: requests.nvidia.com/gpu=8',
                                    "lastTransitionTime": _iso(since)}]
    out = _k8s_revision.create_failure(_k8s_shape.shape(dep), [], [], [_k8s_shape.shape(pod)], cluster.clock())
    assert out["state"] == "waiting" and "terminate" in out["message"]
    out = _k8s_revision.create_failure(_k8s_shape.shape(dep), [], [], [], cluster.clock())
    assert out["state"] == "failed" and "exceeded quota" in out["message"] and "for 300 s" in out["message"]


def _iso(t):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
    return _timeline.iso(t)


T0 = _k8s_shape.parse_time("2026-08-02T08:00:00Z")


def _lws():
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "glm-5-2-fp8-vllm-019f2c25", "namespace": "llm-lab", "uid": "lws-1", "generation": 1},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}}, "status": {"replicas": 0}}


def _sts_event(sts, count, first, last, pod):
    # kubernetes pkg/controller/statefulset/stateful_pod_control.go recordPodEvent: Warning FailedCreate
    # "create Pod <pod> in StatefulSet <set> failed error: <err>"
    return {"kind": "Event", "type": "Warning", "reason": "FailedCreate", "count": count,
            "message": 'create Pod %s in StatefulSet %s failed error: pods "%s" is forbidden: violates PodSecurity '
                       '"baseline:latest": host namespaces (hostNetwork=true)' % (pod, sts, pod),
            "involvedObject": {"kind": "StatefulSet", "name": sts, "namespace": "llm-lab"},
            "firstTimestamp": _iso(first), "lastTimestamp": _iso(last)}


def test_a_leaderworkerset_whose_statefulset_cannot_create_its_leader_fails_from_its_events():
    """The StatefulSet controller sets no condition: its FailedCreate Events, seen twice over a minute, decide."""
    lws = _lws()
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": lws["metadata"]["name"], "namespace": "llm-lab",
                        "labels": {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"]}},
           "spec": {"replicas": 1}, "status": {"replicas": 0}}
    other = dict(sts, metadata=dict(sts["metadata"], name="another", labels={}))
    ev = _sts_event(sts["metadata"]["name"], 12, T0, T0 + 70, sts["metadata"]["name"] + "-0")
    objs = [lws, sts, other, ev, _sts_event("another", 50, T0, T0 + 70, "another-0")]
    owned = _k8s_revision.owned_controllers(_k8s_shape.shape(lws), _k8s_shape.shape_objects(objs))
    assert [o["metadata"]["name"] for o in owned] == [sts["metadata"]["name"]]
    fetch = dict(pods=[], route=None, workload=lws, replicasets=[], controllers=[sts, other], events=[ev],
                 dates=[email.utils.formatdate(T0 + 70, usegmt=True)])
    v = w.judge(lambda: fetch, check_route=False)
    assert v["state"] == "failed" and "hostNetwork=true" in v["message"] and "for 70 s" in v["message"], v["message"]
    early = dict(fetch, dates=[email.utils.formatdate(T0 + 30, usegmt=True)],
                 events=[_sts_event(sts["metadata"]["name"], 6, T0, T0 + 30, sts["metadata"]["name"] + "-0")])
    assert w.judge(lambda: early, check_route=False)["state"] == "waiting"
    once = dict(fetch, events=[_sts_event(sts["metadata"]["name"], 1, T0, T0, sts["metadata"]["name"] + "-0")])
    assert "cannot create" not in w.judge(lambda: once, check_route=False)["message"]  # one Event is no pattern
    created = dict(fetch, controllers=[dict(sts, status={"replicas": 1})])
    assert "cannot create" not in w.judge(lambda: created, check_route=False)["message"]  # the Events are history


def test_a_storm_service_whose_roleset_cannot_create_pods_fails_from_the_roleset_condition():
    storm = {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "StormService",
             "metadata": {"name": "glm-5-2-fp8-320dd373", "namespace": "llm-lab", "generation": 1},
             "spec": {"replicas": 1}, "status": {"observedGeneration": 1}}
    roleset = {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "RoleSet",
               "metadata": {"name": "glm-5-2-fp8-320dd373-roleset-x7k2p", "namespace": "llm-lab",
                            "labels": {"storm-service-name": "glm-5-2-fp8-320dd373"}},
               "status": {"conditions": [{"type": "ReplicaFailure", "status": "True",
                                          "reason": "reconcile roleset error",
                                          "message": '[pods "glm-5-2-fp8-320dd373-roleset-x7k2p-prefill-7b9c4d-0" is '
                                                     'forbidden: exceeded quota: gpu]',
                                          "lastTransitionTime": _iso(T0)}]}}
    fetch = dict(pods=[], route=None, workload=storm, controllers=[roleset], events=[],
                 dates=[email.utils.formatdate(T0 + 65, usegmt=True)])
    v = w.judge(lambda: fetch, check_route=False)
    assert v["state"] == "failed" and "exceeded quota: gpu" in v["message"] and "RoleSet " in v["message"], v["message"]


def test_the_deployment_model_reports_a_refused_create_as_upstream_does():
    """The double must not be kinder than the controllers: ReplicaFailure on the ReplicaSet and its copy on the
    Deployment, FailedCreate Events on the ReplicaSet, no pod."""
    cluster = kc.Cluster()
    cluster.pod_security = "baseline"
    dep = _engine_deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    cluster.apply(dep)
    cluster.advance(3)
    objs = cluster.objects()
    rs = [o for o in objs if o["kind"] == "ReplicaSet"][0]
    d = [o for o in objs if o["kind"] == "Deployment"][0]
    rs_fail = [c for c in rs["status"]["conditions"] if c["type"] == "ReplicaFailure"][0]
    d_fail = [c for c in d["status"]["conditions"] if c["type"] == "ReplicaFailure"][0]
    assert rs_fail["status"] == "True" and rs_fail["reason"] == "FailedCreate"
    assert rs_fail["lastTransitionTime"] == _iso(cluster.clock() - 2)  # the first failure, not the latest
    assert d_fail["message"] == rs_fail["message"] and d_fail["lastTransitionTime"] == rs_fail["lastTransitionTime"]
    assert rs_fail["message"].startswith('pods "%s-' % rs["metadata"]["name"])
    assert ('violates PodSecurity "baseline:latest": non-default capabilities (container "engine" must not include '
            '"IPC_LOCK" in securityContext.capabilities.add), hostPath volumes (volume "model")') in rs_fail["message"]
    evs = [e for e in objs if e["kind"] == "Event" and e["involvedObject"]["kind"] == "ReplicaSet"]
    assert evs and all(e["reason"] == "FailedCreate" and e["message"].startswith("Error creating: pods ") for e in evs)
    assert not [o for o in objs if o["kind"] == "Pod"]
