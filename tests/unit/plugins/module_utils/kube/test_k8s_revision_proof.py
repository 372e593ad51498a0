"""The readiness answer proves it came from the new revision on the gateway path too (AIBrix's /v1/models names no
``root``): from the pod the gateway's answer names (``target-pod``/``target-pod-ip``, vllm-project/aibrix v0.7.0
pkg/plugins/gateway/gateway_rsp_headers.go), else from the Service's EndpointSlices (kubernetes/kubernetes v1.33.0
staging/src/k8s.io/endpointslice/utils.go podToEndpoint; k8s.io/api discovery/v1 types.go EndpointConditions).

Rollouts run through tests/lib/kube_controllers.py (the Deployment, ReplicaSet and EndpointSlice controllers, the
kubelet and the gateway's pod cache, each cited there). With ``maxSurge: 1, maxUnavailable: 0`` (what Kubernetes'
25%/25% default resolves to for one replica: pkg/controller/deployment/util/deployment_util.go ResolveFenceposts,
surge rounded up, unavailable down) the Deployment reports the rollout done the moment the old pod is marked for
deletion, while the Service's endpoints and the gateway's cache still list it for a few seconds.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_revision, _k8s_wait
from ansible_collections.llmops.serving.plugins.modules import k8s_engine_wait
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

A = "/mnt/nvme/models/GLM-5.2-FP8/rev-a"
B = "/mnt/nvme/models/GLM-5.2-FP8/rev-b"
#: what AIBrix's metadata service answers for /v1/models (python/aibrix/aibrix/metadata/api/v1/models.py): no root
GATEWAY_MODELS = {"object": "list", "data": [{"id": "glm-5.2-fp8-vllm", "object": "model", "owned_by": "aibrix"}]}


def _surge(model_path):
    manifest = kc.deployment(model_path)
    manifest["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
    return manifest


def _cluster(endpoints_delay=0, gateway_delay=0, surge=True):
    cluster = kc.Cluster()
    cluster.engines.update({A: kc.Engine(load_seconds=30), B: kc.Engine(load_seconds=40)})
    cluster.endpoints_delay, cluster.gateway_delay = endpoints_delay, gateway_delay
    cluster.apply_service(kc.service())
    cluster.apply(_surge(A) if surge else kc.deployment(A))
    cluster.advance(120)
    return cluster


def _pods_of(objects, path):
    return {o["metadata"]["name"] for o in objects if o["kind"] == "Pod" and path in o["spec"]["containers"][0]["args"]}


def _ready_endpoint_pods(objects):
    return {e["targetRef"]["name"] for o in objects if o["kind"] == "EndpointSlice" for e in o["endpoints"]
            if e["conditions"]["ready"]}


def _poll_every_second(cluster, limit=240, step=1, **kw):
    """Judge the cluster each second (a poll of the wait can land on any second) until ready; every (objects,
    verdict)."""
    seen = []
    for _s in range(limit // step):
        objects = cluster.objects()
        v = _k8s_wait.judge(cluster.fetch, replicas=1, check_route=False, **kw)
        seen.append((objects, v))
        if v["state"] in ("ready", "failed"):
            break
        cluster.advance(step)
    return seen


def test_not_ready_while_an_old_pod_is_still_a_ready_endpoint_of_the_service():
    cluster = _cluster(endpoints_delay=4)
    a_pods = _pods_of(cluster.objects(), A)
    cluster.apply(_surge(B))
    seen = _poll_every_second(cluster, answer=lambda: GATEWAY_MODELS)
    objects, ready = seen[-1]
    assert ready["state"] == "ready", ready["message"]
    # no verdict said ready while an A pod could still answer through the Service
    for objs, v in seen:
        if _ready_endpoint_pods(objs) & a_pods:
            assert v["state"] != "ready", v["message"]
    # and there were such polls after the Deployment itself reported the rollout done
    held_back = [v for objs, v in seen if v["rollout"]["state"] == "done" and _ready_endpoint_pods(objs) & a_pods]
    assert held_back, "the scenario never had the rollout done with an A endpoint left"
    v = held_back[0]
    assert v["state"] == "waiting" and v["revision_proof"]["by"] == "endpoints" and not v["revision_proof"]["held"]
    old = sorted(_ready_endpoint_pods(seen[[x for _o, x in seen].index(v)][0]) & a_pods)[0]
    assert "Service llm-lab/glm-5-2-fp8-vllm still has 1 ready endpoint(s) outside the current revision" in v["message"]
    assert "pod %s" % old in v["message"] and "wait for the rollout" in v["message"]
    # ready: only B endpoints, and the proof says so
    proof = ready["revision_proof"]
    assert proof["by"] == "endpoints" and proof["held"] is True and proof["service"] == "llm-lab/glm-5-2-fp8-vllm"
    assert {e["pod"] for e in proof["ready_endpoints"]} == _pods_of(objects, B)
    assert all(e["revision"] == ready["revision"]["revision"] for e in proof["ready_endpoints"])
    assert "every ready endpoint of Service llm-lab/glm-5-2-fp8-vllm is a pod of the current revision" in ready["message"]
    # the result names the current pods with their IPs
    b_pod = next(o for o in objects if o["kind"] == "Pod" and o["metadata"]["name"] in _pods_of(objects, B))
    assert ready["revision"]["pod_addresses"] == [dict(name=b_pod["metadata"]["name"], ip=b_pod["status"]["podIP"])]


def test_a_leftover_pod_the_service_selects_keeps_the_rollout_waiting_until_it_is_gone():
    """The collection's own rollout (maxSurge 0) is done, but a pod outside the Deployment with the engine's labels
    (left by an earlier workload) is still a ready endpoint: half the answers come from it."""
    cluster = _cluster(surge=False)
    leftover = next(o for o in cluster.objects() if o["kind"] == "Pod")
    leftover = {"apiVersion": "v1", "kind": "Pod", "spec": leftover["spec"],
                "metadata": {"name": "glm-5-2-fp8-vllm-old-0", "labels": dict(leftover["metadata"]["labels"])}}
    del leftover["metadata"]["labels"]["pod-template-hash"]
    leftover["spec"].pop("nodeName", None)
    cluster.add_pod(leftover)
    cluster.apply(kc.deployment(B))
    seen = _poll_every_second(cluster, limit=400, step=10, answer=lambda: GATEWAY_MODELS)
    v = seen[-1][1]
    assert v["state"] == "waiting" and v["rollout"]["state"] == "done", v["message"]
    assert "glm-5-2-fp8-vllm-old-0" in _ready_endpoint_pods(seen[-1][0])
    assert "pod glm-5-2-fp8-vllm-old-0 (10.244." in v["message"] and "of an earlier revision" in v["message"]
    assert "deleted or relabelled" in v["message"]
    del cluster.pods["glm-5-2-fp8-vllm-old-0"]
    cluster.advance(1)
    v = _k8s_wait.judge(cluster.fetch, replicas=1, check_route=False, answer=lambda: GATEWAY_MODELS)
    assert v["state"] == "ready" and v["revision_proof"]["by"] == "endpoints", v["message"]


def test_not_ready_while_the_gateway_answers_from_an_old_pod():
    """A routing strategy picks the pod from the gateway's cache, which trails the API: its answer names the pod
    (target-pod / target-pod-ip); an A pod there is "rolling", a B pod is the proof."""
    cluster = _cluster(gateway_delay=4)
    a_pods = _pods_of(cluster.objects(), A)
    cluster.apply(_surge(B))
    answers = []

    def served(revision):
        got = cluster.gateway_completion(strategy="least-request")
        answers.append(got[1] if got else None)
        return got[1] if got else None

    seen = _poll_every_second(cluster, answer=lambda: GATEWAY_MODELS, served=served)
    objects, ready = seen[-1]
    assert ready["state"] == "ready", ready["message"]
    from_a = [v for _o, v in seen if (v["revision_proof"] or {}).get("pod") in a_pods]
    assert from_a, "the gateway never answered from an A pod after the rollout was done"
    v = from_a[0]
    assert v["state"] == "waiting" and v["revision_proof"]["by"] == "target-pod-ip" and not v["revision_proof"]["held"]
    a_pod = v["revision_proof"]["pod"]
    assert "the gateway's answer came from pod %s (10.244." % a_pod in v["message"]
    assert "not from a Ready pod of the current revision %s" % ready["revision"]["revision"] in v["message"]
    assert "wait for the rollout" in v["message"]
    proof = ready["revision_proof"]
    assert proof["by"] == "target-pod-ip" and proof["held"] is True and proof["pod"] in _pods_of(objects, B)
    b_ip = next(o["status"]["podIP"] for o in objects if o["kind"] == "Pod" and o["metadata"]["name"] == proof["pod"])
    assert proof["ip"] == b_ip and proof["revision"] == proof["current_revision"] == ready["revision"]["revision"]
    assert answers[-1]["target-pod-ip"] == "%s:8000" % b_ip


def test_without_a_routing_strategy_the_answer_names_no_pod_and_the_endpoints_decide():
    cluster = _cluster(endpoints_delay=4)
    cluster.apply(_surge(B))

    def served(revision):
        got = cluster.gateway_completion()
        return got[1] if got else None

    seen = _poll_every_second(cluster, answer=lambda: GATEWAY_MODELS, served=served)
    ready = seen[-1][1]
    assert ready["state"] == "ready" and ready["revision_proof"]["by"] == "endpoints"
    assert any(v["revision_proof"] and v["revision_proof"]["by"] == "endpoints" and not v["revision_proof"]["held"]
               for _o, v in seen)


def test_an_answer_from_a_current_pod_that_is_not_ready_is_no_proof():
    pods = [{"kind": "Pod", "metadata": {"name": "e-1", "labels": {"pod-template-hash": "h2"}}, "status": {"podIP": "10.0.0.9"}}]
    proof, why = _k8s_revision.revision_proof(dict(pods=["e-1"], ready_pods=[], revision="h2"),
                                              dict(revision_label="pod-template-hash"), pods,
                                              served={"target-pod": "e-1", "target-pod-ip": "10.0.0.9:8000"})
    assert proof["held"] is False and "a pod of the current revision that is not Ready" in why
    proof, why = _k8s_revision.revision_proof(dict(pods=["e-1"], ready_pods=["e-1"], revision="h2"),
                                              dict(revision_label="pod-template-hash"), pods,
                                              served={"target-pod-ip": "10.0.0.9:8000"})
    assert proof == dict(by="target-pod-ip", held=True, pod="e-1", ip="10.0.0.9", revision="h2", current_revision="h2")
    assert why is None


def test_an_endpoint_whose_readiness_is_unknown_counts_as_ready():
    """discovery/v1 EndpointConditions.ready: "a nil value ... consumers should interpret this unknown state as
    ready"."""
    slices = [{"endpoints": [{"addresses": ["10.0.0.5"], "targetRef": {"kind": "Pod", "name": "old-1"}},
                             {"addresses": ["10.0.0.6"], "conditions": {"ready": False}, "targetRef": {"name": "old-2"}}]}]
    assert _k8s_revision.ready_endpoints(slices) == [dict(pod="old-1", addresses=["10.0.0.5"])]


# ---- the module: objects replay covers EndpointSlices and the gateway's answer -----------------------------------

REPLAY = dict(namespace="llm-lab", selector={"app.kubernetes.io/name": "glm-5-2-fp8-vllm"},
              workload_name="glm-5-2-fp8-vllm", service_name="glm-5-2-fp8-vllm")


def test_objects_replay_judges_the_recorded_endpointslices_and_gateway_answer(run_module):
    cluster = _cluster(endpoints_delay=4)
    a_pods = _pods_of(cluster.objects(), A)
    cluster.apply(_surge(B))
    for _s in range(240):
        cluster.advance(1)
        objs = cluster.objects()
        dep = next(o for o in objs if o["kind"] == "Deployment")
        if dep["status"].get("updatedReplicas") == 1 and dep["status"].get("replicas") == 1 \
                and _ready_endpoint_pods(objs) & a_pods:
            break
    lagging = {"apiVersion": "v1", "kind": "List", "items": objs}
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=lagging, models=GATEWAY_MODELS))
    assert r["failed"] is True and r["state"] == "waiting", r["msg"]
    assert r["revision_proof"]["by"] == "endpoints" and r["revision_proof"]["held"] is False
    assert sorted(_ready_endpoint_pods(objs) & a_pods)[0] in r["msg"]
    cluster.advance(10)
    done = cluster.objects()
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=done, models=GATEWAY_MODELS))
    assert not r.get("failed"), r["msg"]
    assert r["revision_proof"]["by"] == "endpoints" and r["revision_proof"]["held"] is True
    a_ip = "10.244.0.1"
    old = sorted(a_pods)[0]
    headers = {"target-pod": old, "target-pod-ip": a_ip + ":8000", "routing-strategy": "least-request"}
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=done, answer_headers=headers))
    assert r["failed"] is True and r["revision_proof"]["by"] == "target-pod-ip"
    assert "the gateway's answer came from pod %s" % old in r["msg"]
    b_pod = next(o for o in done if o["kind"] == "Pod")
    headers = {"Target-Pod": b_pod["metadata"]["name"], "Target-Pod-IP": b_pod["status"]["podIP"] + ":8000"}
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=done, answer_headers=headers))
    assert not r.get("failed"), r["msg"]
    assert r["revision_proof"]["held"] is True and r["revision_proof"]["pod"] == b_pod["metadata"]["name"]


def test_recorded_objects_without_endpointslices_leave_the_proof_to_what_was_recorded(run_module):
    cluster = _cluster()
    cluster.apply(_surge(B))
    cluster.advance(120)
    objs = [o for o in cluster.objects() if o["kind"] != "EndpointSlice"]
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=objs))
    assert not r.get("failed"), r["msg"]
    assert r["revision_proof"] is None


def test_gateway_url_needs_a_workload_and_no_credentials(run_module):
    r = run_module(k8s_engine_wait, dict(namespace="llm-lab", selector={"a": "b"}, gateway_url="http://gw.example"))
    assert r["failed"] is True and r["msg"].startswith("gateway_url: needs workload_name")
    r = run_module(k8s_engine_wait, dict(REPLAY, gateway_url="http://admin:s3cret@gw.example"))
    assert r["failed"] is True and "s3cret" not in str(r) and r["reason"] == "credentials_in_url"


def test_a_recorded_answer_header_of_the_wrong_type_is_a_clean_error(run_module):
    """An int or a list as target-pod-ip was an AttributeError traceback ('int' object has no attribute 'strip')
    once the rollout was ready."""
    cluster = _cluster()
    cluster.apply(_surge(B))
    cluster.advance(400)
    done = cluster.objects()
    for value in (5, ["10.244.0.1:8000"], {"ip": "10.244.0.1"}, True):
        r = run_module(k8s_engine_wait, dict(REPLAY, objects=done,
                                             answer_headers={"target-pod": "e-1", "target-pod-ip": value}))
        assert r["failed"] and r["reason"] == "answer_headers_type", r["msg"]
        assert r["msg"].startswith("answer_headers.target-pod-ip: must be a string") and type(value).__name__ in r["msg"]
