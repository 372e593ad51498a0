"""engine_manifests as a playbook sees it: render, idempotence, check and diff mode, refusals."""
from __future__ import annotations

import os

import yaml
from ansible.module_utils.common.warnings import get_warning_messages

from ansible_collections.llmops.serving.plugins.modules import engine_manifests

ARGS = dict(
    engine="vllm",
    served_model_name="glm-5.2-fp8-vllm",
    namespace="llm-lab",
    model_path="/mnt/nvme/models/GLM-5.2-FP8/v1",
    image="vllm/vllm-openai:v0.26.0@sha256:" + "c" * 64,
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)


def test_returns_objects_without_writing(run_module, tmp_path):
    r = run_module(engine_manifests, ARGS)
    assert not r.get("failed"), r
    assert r["changed"] is False and r["files"] == []
    assert r["service_name"] == "glm-5-2-fp8-vllm-019f2c25"
    assert r["route_name"] == "glm-5.2-fp8-vllm-router"
    assert [o["kind"] for o in r["objects"]] == ["Service", "ReferenceGrant", "HTTPRoute", "Deployment"]
    assert r["read_concurrency"]["concurrent_reads"] == 8


def test_render_then_idempotent(run_module, tmp_path):
    out = tmp_path / "gitops"
    r1 = run_module(engine_manifests, dict(ARGS, render_dir=str(out)))
    assert r1["changed"] is True
    assert sorted(os.listdir(out)) == sorted(r1["files"] + [".llmops-manifests.json"])
    dep = yaml.safe_load((out / "40-deployment-glm-5-2-fp8-vllm-019f2c25.yaml").read_text())
    assert dep["spec"]["template"]["metadata"]["labels"]["model.aibrix.ai/name"] == "glm-5.2-fp8-vllm"
    r2 = run_module(engine_manifests, dict(ARGS, render_dir=str(out)))
    assert r2["changed"] is False


def test_check_mode_reports_but_does_not_write(run_module, tmp_path):
    out = tmp_path / "gitops"
    r = run_module(engine_manifests, dict(ARGS, render_dir=str(out)), check_mode=True)
    assert r["changed"] is True
    assert not out.exists()


def test_diff_shows_the_changed_file_only(run_module, tmp_path):
    out = tmp_path / "gitops"
    run_module(engine_manifests, dict(ARGS, render_dir=str(out)))
    r = run_module(engine_manifests, dict(ARGS, render_dir=str(out), startup_timeout=5400), check_mode=True, diff=True)
    assert r["changed"] is True
    assert [d["after_header"] for d in r["diff"]] == ["40-deployment-glm-5-2-fp8-vllm-019f2c25.yaml"]
    # the startup window is the timeout plus max(300 s, 10 %): 3960 s and 5940 s at a 10 s period
    assert "failureThreshold: 396" in r["diff"][0]["before"] and "failureThreshold: 594" in r["diff"][0]["after"]
    # check mode left the file as it was
    assert "failureThreshold: 396" in (out / "40-deployment-glm-5-2-fp8-vllm-019f2c25.yaml").read_text()


def test_refuses_key_less_exists_toleration_before_writing(run_module, tmp_path):
    out = tmp_path / "gitops"
    r = run_module(engine_manifests, dict(ARGS, render_dir=str(out), tolerations=[{"operator": "Exists"}]))
    assert r["failed"] is True
    assert "tolerations[0]: operator Exists without a key" in r["msg"]
    assert not out.exists()


def test_shared_fs_over_budget_warns(run_module):
    r = run_module(engine_manifests, dict(ARGS, engine="sglang", image="lmsysorg/sglang:v0.5.16@sha256:" + "c" * 64,
                                          model_source="shared_fs", replicas=4))
    assert r["read_concurrency"]["concurrent_reads"] == 64
    assert any("exceeds read_streams_warn" in w for w in get_warning_messages())


def test_route_timeout_is_a_deprecated_alias_of_route_request_timeout(run_module):
    """The old name still sets the HTTPRoute request timeout, and says it is deprecated."""
    from ansible.module_utils.common import warnings as w

    results = {}
    for name in ("route_request_timeout", "route_timeout"):
        w._global_deprecations.clear()  # pylint: disable=protected-access
        r = run_module(engine_manifests, dict(ARGS, **{name: "900s"}))
        results[name] = (r, [d for d in w.get_deprecation_messages() if "route_timeout" in d["msg"]])
    for name, (r, _deprecations) in results.items():
        assert not r.get("failed"), (name, r)
        route = [o for o in r["objects"] if o["kind"] == "HTTPRoute"][0]
        assert route["spec"]["rules"][0]["timeouts"] == {"request": "900s"}
    assert results["route_timeout"][0]["objects"] == results["route_request_timeout"][0]["objects"]
    assert results["route_request_timeout"][1] == []
    assert [(d["version"], d["collection_name"]) for d in results["route_timeout"][1]] == [("1.0.0", "llmops.serving")]


def test_profiles_init_and_multi_node_through_the_module(run_module):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    with open(os.path.join(root, "roles", "engine", "vars", "profiles.yml")) as f:
        profiles = yaml.safe_load(f)["engine_k8s_builtin_profiles"]
    r = run_module(engine_manifests, dict(ARGS, profile="glm-5.2-fp8", profiles=profiles, pp_size=2, nodes=2,
                                          init="/usr/bin/tini", cpu_request="48"))
    assert not r.get("failed"), r
    assert r["workload"]["kind"] == "LeaderWorkerSet" and r["deployment_name"] is None
    assert r["command"][:3] == ["/usr/bin/tini", "-g", "--"] and "--kv-cache-dtype" in r["command"]
    lws = r["objects"][-1]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["requests"]["cpu"] == "48"
    old = run_module(engine_manifests, dict(ARGS, image="vllm/vllm-openai:v0.25.1", profile="glm-5.2-fp8", profiles=profiles))
    assert old["failed"] is True and "older than profile glm-5.2-fp8 needs" in old["msg"]
