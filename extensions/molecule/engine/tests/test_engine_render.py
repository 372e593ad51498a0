"""engine (kubernetes, render): valid objects of the expected kinds, named and labelled for AIBrix, the engine
command line and GPUs the variables asked for, and the staged model mounted read-only."""
from __future__ import annotations

import pytest

MODEL = "glm-5.2-fp8"               # engine_served_model_name in converge.yml
NAME = "glm-5-2-fp8-320dd373"       # the DNS-1035 name derived from it (the dot: with the served name's hash)
MODEL_PATH = "/mnt/nvme/models/glm-5.2-fp8/3f2a9c1"
LABEL = "model.aibrix.ai/name"


@pytest.fixture
def objects(tree, root):
    return tree.rendered(root + "/manifests/" + MODEL)


def by_kind(objects):
    out = {}
    for dummy, obj in objects:
        assert obj["kind"] not in out, "two %s objects" % obj["kind"]
        out[obj["kind"]] = obj
    return out


def test_every_object_is_valid_and_of_the_expected_kind(objects, k8s_validate):
    assert [o["kind"] for dummy, o in objects] == [
        "Service", "ReferenceGrant", "HTTPRoute", "PodDisruptionBudget", "Deployment"]
    for name, obj in objects:
        k8s_validate(obj)
        assert name.endswith("-%s-%s.yaml" % (obj["kind"].lower(), obj["metadata"]["name"]))


def test_names_labels_and_routing_follow_the_served_model_name(objects):
    k = by_kind(objects)
    dep, svc, route = k["Deployment"], k["Service"], k["HTTPRoute"]
    assert dep["metadata"]["name"] == svc["metadata"]["name"] == NAME
    assert dep["metadata"]["namespace"] == svc["metadata"]["namespace"] == "llm-serving"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[LABEL] == MODEL
    assert all(pod_labels.get(key) == value for key, value in svc["spec"]["selector"].items())
    assert all(pod_labels.get(key) == value for key, value in dep["spec"]["selector"]["matchLabels"].items())
    assert all(pod_labels.get(key) == value for key, value in
               k["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items())
    assert route["metadata"]["namespace"] == "aibrix-system"
    refs = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert {(r["name"], r["namespace"], r["port"]) for r in refs} == {(NAME, "llm-serving", 8000)}
    grant = k["ReferenceGrant"]["spec"]
    assert grant["from"][0]["namespace"] == "aibrix-system" and grant["to"][0]["name"] == NAME


def test_the_engine_runs_the_staged_model_on_eight_gpus(objects):
    dep = by_kind(objects)["Deployment"]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    (engine,) = [c for c in pod["containers"] if c["name"] == "engine"]
    assert engine["image"].startswith("vllm/vllm-openai:v0.11.0@sha256:")
    args = engine["args"]
    assert args[0] == MODEL_PATH
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--served-model-name") + 1] == MODEL
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    mount = [m for m in engine["volumeMounts"] if m["mountPath"] == MODEL_PATH]
    assert len(mount) == 1 and mount[0]["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount[0]["name"]]
    assert volume["hostPath"]["path"] == MODEL_PATH
