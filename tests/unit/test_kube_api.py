"""The stand-in Kubernetes API (tests/lib/kube_api.py) answers as kube-apiserver does where the role depends on it.

Restated from kubernetes/kubernetes v1.33.0 (``staging/src/k8s.io/apiserver/pkg/endpoints/handlers``: 201 on create,
409 ``AlreadyExists``, 404 ``NotFound`` with ``<resource>.<group> "<name>" not found``; ``metadata.generation``
bumped on a spec change, ``pkg/registry/apps/deployment/strategy.go``; label selectors,
``staging/src/k8s.io/apimachinery/pkg/labels/selector.go``) and kubernetes.core 6.2.0 (``plugins/module_utils/apply.py``
PATCHes with ``application/merge-patch+json``).
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from ansible_collections.llmops.serving.tests.lib import kube_api
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks

TOKEN = "t0ken"
NS = "llm-lab"
GPU = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}


def _call(api, method, path, body=None, token=TOKEN, ctype="application/json"):
    req = urllib.request.Request(api.url + path, method=method, data=None if body is None else json.dumps(body).encode())
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if body is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # nosec: loopback test server
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _deployment(name="eng", pin=None, path="/nvme/models/m/r1"):
    spec = {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve"],
                            "args": [path, "--port", "8000"], "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}},
                            "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1,
                                             "failureThreshold": 100}}],
            "volumes": [{"name": "model", "hostPath": {"path": path, "type": "Directory"}}]}
    if pin:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [pin]}]}]}}}
    labels = {"app.kubernetes.io/name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": spec}}}


@pytest.fixture
def api():
    nodes = [ks.node("gpu-a", allocatable=GPU), ks.node("gpu-b", allocatable=GPU)]
    with kube_api.KubeAPI(TOKEN, nodes, NS, has_dir=lambda node, path: node == "gpu-b") as srv:
        yield srv


def test_requests_need_the_token_and_are_recorded(api):
    assert _call(api, "GET", "/api/v1/namespaces/%s/pods" % NS, token="wrong")[0] == 401
    assert _call(api, "GET", "/version", token=None)[0] == 200  # system:public-info-viewer
    assert [(r["method"], r["authorization"], r["status"], r["client"]) for r in api.requests] == [
        ("GET", "Bearer wrong", 401, "127.0.0.1"), ("GET", None, 200, "127.0.0.1")]


def test_discovery_lists_what_the_role_applies_and_nothing_else(api):
    assert _call(api, "GET", "/api")[1]["versions"] == ["v1"]
    groups = {g["name"]: g["preferredVersion"]["version"] for g in _call(api, "GET", "/apis")[1]["groups"]}
    assert groups["apps"] == "v1" and groups["gateway.networking.k8s.io"] == "v1"
    kinds = {r["kind"] for r in _call(api, "GET", "/apis/gateway.networking.k8s.io/v1beta1")[1]["resources"]}
    assert kinds == {"ReferenceGrant"}
    assert _call(api, "GET", "/apis/orchestration.aibrix.ai/v1alpha1")[0] == 404  # no such CRD installed


def test_create_conflict_not_found_and_merge_patch(api):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "eng", "namespace": NS},
           "spec": {"selector": {"app.kubernetes.io/name": "eng"}, "ports": [{"name": "http", "port": 8000}]}}
    path = "/api/v1/namespaces/%s/services" % NS
    code, body = _call(api, "GET", path + "/eng")
    assert (code, body["reason"], body["message"]) == (404, "NotFound", 'services "eng" not found')
    code, body = _call(api, "POST", path, svc)
    assert code == 201 and body["metadata"]["generation"] == 1 and body["metadata"]["uid"]
    code, body = _call(api, "POST", path, svc)
    assert (code, body["reason"]) == (409, "AlreadyExists")
    patch = "application/merge-patch+json"
    assert _call(api, "PATCH", path + "/eng", {"metadata": {"labels": {"a": "b"}}}, ctype=patch)[1]["metadata"]["generation"] == 1
    code, body = _call(api, "PATCH", path + "/eng", {"spec": {"ports": [{"name": "http", "port": 9000}]}}, ctype=patch)
    assert code == 200 and body["metadata"]["generation"] == 2 and body["spec"]["ports"][0]["port"] == 9000
    assert body["metadata"]["labels"] == {"a": "b"}
    assert _call(api, "PATCH", path + "/eng", [{"op": "remove", "path": "/spec"}],
                 ctype="application/json-patch+json")[0] == 415
    dry = _call(api, "POST", path + "?dryRun=All", dict(svc, metadata={"name": "other", "namespace": NS}))
    assert dry[0] == 201 and _call(api, "GET", path + "/other")[0] == 404
    bad = _call(api, "POST", path, dict(svc, metadata={"name": "x", "namespace": "elsewhere"}))
    assert bad[0] == 400 and "namespace" in bad[1]["message"]
    assert [r["dry_run"] for r in api.writes()] == [False, False, False, False, False, True, False]


def test_label_selectors_follow_the_api_grammar():
    match = kube_api.label_matcher("app in (a, b),tier!=db,!legacy,zone")
    assert match({"app": "a", "zone": "z"}) and match({"app": "b", "tier": "web", "zone": "z"})
    assert not match({"app": "c", "zone": "z"}) and not match({"app": "a", "tier": "db", "zone": "z"})
    assert not match({"app": "a", "legacy": "", "zone": "z"}) and not match({"app": "a"})
    with pytest.raises(ValueError):
        kube_api.label_matcher("app >< x")


def test_a_pinned_deployment_runs_on_its_node_and_an_unpinned_one_fails_to_mount_elsewhere(api):
    """The controllers make a ReplicaSet and a pod labelled pod-template-hash; the scheduler honours the pin although
    gpu-a sorts first; without the pin the pod lands on gpu-a, where the revision's hostPath is missing."""
    path = "/apis/apps/v1/namespaces/%s/deployments" % NS
    assert _call(api, "POST", path, _deployment("pinned", pin="gpu-b"))[0] == 201
    api.cluster.advance(5)
    pods = _call(api, "GET", "/api/v1/namespaces/%s/pods?labelSelector=app.kubernetes.io/name%%3Dpinned" % NS)[1]["items"]
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "gpu-b" and "kind" not in pods[0]
    assert pods[0]["metadata"]["labels"]["pod-template-hash"]
    assert {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}["Ready"] == "True"
    dep = _call(api, "GET", path + "/pinned")[1]
    assert dep["status"]["availableReplicas"] == 1 and dep["status"]["observedGeneration"] == 1

    assert _call(api, "POST", path, _deployment("loose"))[0] == 201
    api.cluster.advance(5)
    pod = [p for p in api.pods() if p["metadata"]["labels"]["app.kubernetes.io/name"] == "loose"][0]
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    events = _call(api, "GET", "/api/v1/namespaces/%s/events?fieldSelector=involvedObject.name%%3D%s"
                   % (NS, pod["metadata"]["name"]))[1]["items"]
    assert any(e["reason"] == "FailedMount" and "hostPath type check failed" in e["message"] for e in events)


def test_a_pod_that_fits_nowhere_stays_pending_with_the_schedulers_reasons(api):
    dep = _deployment("big")
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "16"}}
    assert _call(api, "POST", "/apis/apps/v1/namespaces/%s/deployments" % NS, dep)[0] == 201
    api.cluster.advance(3)
    pod = api.pods()[0]
    assert pod["spec"].get("nodeName") is None and pod["status"]["phase"] == "Pending"
    cond = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"][0]
    assert cond["reason"] == "Unschedulable" and cond["message"] == "0/2 nodes are available: Insufficient nvidia.com/gpu."
