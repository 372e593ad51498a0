"""pd_disagg (kubernetes, render): valid objects for both workloads, the two roles labelled for AIBrix, NIXL
configured, and the transport changing UCX_TLS / UCX_NET_DEVICES only."""
from __future__ import annotations

import json
import os

MODEL = "tiny-llama"
HOST_PATH = "/mnt/nvme/models/tiny-llama/0123456789ab"
LABEL = "model.aibrix.ai/name"
UCX_TLS = {"rdma": "rc,ud,sm,self,cuda_copy,cuda_ipc", "tcp": "tcp,sm,self,cuda_copy,cuda_ipc"}  # role defaults


def engine_env(pod_spec):
    (engine,) = [c for c in pod_spec["containers"] if c["name"] == "engine"]
    return engine, dict((e["name"], e.get("value")) for e in engine.get("env", []))


def check_engine(pod_spec, transport):
    engine, env = engine_env(pod_spec)
    assert env["UCX_TLS"] == UCX_TLS[transport]
    args = engine["args"]
    assert args[args.index("--served-model-name") + 1] == MODEL
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "NixlConnector" and kv["kv_role"] == "kv_both"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    volumes = dict((v["name"], v) for v in pod_spec["volumes"])
    assert [volumes[m["name"]]["hostPath"]["path"] for m in engine["volumeMounts"] if m["name"] == "model"] == [HOST_PATH]
    return env


def test_stormservice_has_a_prefill_and_a_decode_role_for_the_gateway(tree, root, k8s_validate):
    objects = tree.rendered(root + "/manifests/pd-stormservice")
    assert [o["kind"] for dummy, o in objects] == ["StormService"]
    storm = objects[0][1]
    k8s_validate(storm)
    roles = dict((r["name"], r) for r in storm["spec"]["template"]["spec"]["roles"])
    assert sorted(roles) == ["decode", "prefill"]
    for name, role in roles.items():
        labels = role["template"]["metadata"]["labels"]
        assert labels[LABEL] == MODEL and labels["llmops.serving/pd-role"] == name
        config = json.loads(role["template"]["metadata"]["annotations"]["model.aibrix.ai/config"])
        assert config["profiles"][config["defaultProfile"]]["routingStrategy"] == "pd"
        env = check_engine(role["template"]["spec"], "rdma")
        assert env["UCX_NET_DEVICES"] == "all"


def test_deployments_pair_behind_the_proxy_route(tree, root, k8s_validate):
    objects = tree.rendered(root + "/manifests/pd-deployments")
    kinds = [(o["kind"], o["metadata"]["name"]) for dummy, o in objects]
    assert kinds == [
        ("Deployment", "tiny-llama-prefill"), ("Service", "tiny-llama-prefill"),
        ("Deployment", "tiny-llama-decode"), ("Service", "tiny-llama-decode"),
        ("ConfigMap", "tiny-llama-pd-proxy"), ("Deployment", "tiny-llama-pd-proxy"),
        ("Service", "tiny-llama"), ("ReferenceGrant", "tiny-llama-from-aibrix-system"),
        ("HTTPRoute", "tiny-llama-router")]
    by_name = {}
    for dummy, obj in objects:
        k8s_validate(obj)
        by_name[(obj["kind"], obj["metadata"]["name"])] = obj
    for role in ("prefill", "decode"):
        dep = by_name[("Deployment", "tiny-llama-" + role)]
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["llmops.serving/pd-role"] == role
        svc = by_name[("Service", "tiny-llama-" + role)]
        assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
        env = check_engine(dep["spec"]["template"]["spec"], "tcp")
        assert env["UCX_NET_DEVICES"] == "eth0"
    # the proxy runs the role's own pd_proxy.py, byte for byte
    with open(os.path.join(os.environ["MOLECULE_PROJECT_DIRECTORY"], "roles", "pd_disagg", "files", "pd_proxy.py")) as f:
        assert list(by_name[("ConfigMap", "tiny-llama-pd-proxy")]["data"].values()) == [f.read()]
    proxy_labels = by_name[("Deployment", "tiny-llama-pd-proxy")]["spec"]["template"]["metadata"]["labels"]
    front = by_name[("Service", "tiny-llama")]
    assert all(proxy_labels.get(k) == v for k, v in front["spec"]["selector"].items())
    route = by_name[("HTTPRoute", "tiny-llama-router")]
    refs = [ref["name"] for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert set(refs) == {"tiny-llama"}
