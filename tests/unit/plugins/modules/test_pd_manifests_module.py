"""llmops.serving.pd_manifests: render to a directory, idempotent, honest check and diff mode."""
from __future__ import annotations

import os

import yaml

from ansible_collections.llmops.serving.plugins.modules import pd_manifests

ARGS = dict(model_name="glm-5.2-fp8", image="vllm/vllm-openai:v0.10.1", model_path="/models/glm",
            ucx_net_devices="mlx5_0:1,mlx5_1:1", proxy_image="registry.example/python:3.11-slim")


def test_renders_writes_and_is_idempotent(run_module, tmp_path):
    dest = str(tmp_path / "pd")
    check = run_module(pd_manifests, dict(ARGS, render_dir=dest), check_mode=True, diff=True)
    assert check["changed"] is True and not os.path.exists(dest)
    assert any(d["after_header"].endswith("stormservice-glm-5-2-fp8-320dd373.yaml") for d in check["diff"])
    first = run_module(pd_manifests, dict(ARGS, render_dir=dest))
    assert first["changed"] is True
    # the render's warnings (a tag-only image, AIBrix's original_route timeout unchecked) lie next to the objects
    assert first["files"] == ["10-stormservice-glm-5-2-fp8-320dd373.yaml", "NOTES.txt", "kustomization.yaml"]
    with open(os.path.join(dest, "NOTES.txt")) as f:
        notes = f.read()
    assert "original_route" in notes and "pinned by tag only" in notes
    with open(os.path.join(dest, first["files"][0])) as f:
        obj = yaml.safe_load(f)
    assert obj["kind"] == "StormService" and obj == first["objects"][0]
    again = run_module(pd_manifests, dict(ARGS, render_dir=dest))
    assert again["changed"] is False


def test_switching_transport_rewrites_only_ucx_tls_and_net_devices(run_module, tmp_path):
    dest = str(tmp_path / "pd")
    run_module(pd_manifests, dict(ARGS, render_dir=dest, transport="rdma"))
    r = run_module(pd_manifests, dict(ARGS, render_dir=dest, transport="tcp"), diff=True)
    assert r["changed"] is True and len(r["diff"]) == 1
    before = r["diff"][0]["before"].splitlines()
    after = r["diff"][0]["after"].splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 4
    assert sorted(set((a.strip(), b.strip()) for a, b in changed)) == [
        ("value: mlx5_0:1,mlx5_1:1", "value: eth0"),
        ("value: rc,ud,sm,self,cuda_copy,cuda_ipc", "value: tcp,sm,self,cuda_copy,cuda_ipc")]


def test_switching_mode_removes_stale_files(run_module, tmp_path):
    dest = str(tmp_path / "pd")
    run_module(pd_manifests, dict(ARGS, render_dir=dest))
    r = run_module(pd_manifests, dict(ARGS, render_dir=dest, workload="deployments", proxy_source="print('proxy')\n"))
    assert r["removed"] == ["10-stormservice-glm-5-2-fp8-320dd373.yaml"]
    assert not os.path.exists(os.path.join(dest, "10-stormservice-glm-5-2-fp8-320dd373.yaml"))
    assert [o["kind"] for o in r["objects"]] == ["Deployment", "Service", "Deployment", "Service", "ConfigMap",
                                                 "Deployment", "Service", "ReferenceGrant", "HTTPRoute"]
    assert r["route_name"] == "glm-5.2-fp8-router" and r["service_name"] == "glm-5-2-fp8-320dd373"


def test_bad_input_fails_before_writing(run_module, tmp_path):
    dest = str(tmp_path / "pd")
    r = run_module(pd_manifests, dict(ARGS, render_dir=dest, gpus=2))
    assert r["failed"] and r["msg"].startswith("gpus: 2 GPUs cannot hold tensor parallel size 8")
    assert not os.path.exists(dest)


def _deprecated(names):
    from ansible.module_utils.common import warnings as w

    return sorted(n for n in names for d in w.get_deprecation_messages() if "'%s'" % n in d["msg"]
                  and d["version"] == "1.0.0" and d["collection_name"] == "llmops.serving")


def test_mode_and_dest_are_deprecated_aliases_of_workload_and_render_dir(run_module, tmp_path):
    """Tasks written with the old names render the same files, and are told the new names."""
    from ansible.module_utils.common import warnings as w

    new_dir, old_dir = tmp_path / "new", tmp_path / "old"
    w._global_deprecations.clear()  # pylint: disable=protected-access
    new = run_module(pd_manifests, dict(ARGS, render_dir=str(new_dir), workload="deployments", proxy_source="p\n"))
    assert _deprecated(["mode", "dest"]) == []
    old = run_module(pd_manifests, dict(ARGS, dest=str(old_dir), mode="deployments", proxy_source="p\n"))
    assert _deprecated(["mode", "dest"]) == ["dest", "mode"]
    assert not old.get("failed"), old
    assert old["objects"] == new["objects"] and old["files"] == new["files"]
    assert [o["kind"] for o in old["objects"]][:2] == ["Deployment", "Service"]
    for name in old["files"]:
        assert (old_dir / name).read_text() == (new_dir / name).read_text()


def test_warnings_and_refusals_reach_the_play(run_module):
    """A tag without a digest warns (the engine role's image rule); a TCP entry naming an RDMA port is refused."""
    r = run_module(pd_manifests, dict(ARGS))
    assert any("pinned by tag only" in w for w in r["warnings"])
    assert r["startup_window_seconds"] >= 3600
    r = run_module(pd_manifests, dict(ARGS, ucx_net_devices={"tcp": "mlx5_0:1"}))
    assert r["failed"] and r["msg"].startswith("ucx_net_devices.tcp: 'mlx5_0:1' is an RDMA device:port")


def test_render_warnings_lie_next_to_the_objects_and_go_when_they_are_answered(run_module, tmp_path):
    """In render mode the cluster's EnvoyPatchPolicy is not read: the StormService path's original_route timeout
    (120 s in AIBrix v0.7.0, config/gateway/gateway.yaml) is said in NOTES.txt beside the objects a GitOps
    reviewer reads; once the profile bounds the answer under it, the note is removed with the next render."""
    dest = tmp_path / "pd"
    long_answers = dict(ARGS, image="vllm/vllm-openai:v0.10.1@sha256:" + "a" * 64, engine_args={"max-model-len": 131072})
    first = run_module(pd_manifests, dict(long_answers, render_dir=str(dest)))
    assert "NOTES.txt" in first["files"]
    notes = (dest / "NOTES.txt").read_text()
    assert "original_route" in notes and "120" in notes and "pinned by tag only" not in notes
    # kubectl apply -f and kustomize read YAML only: the notes are not a resource
    assert "NOTES.txt" not in yaml.safe_load((dest / "kustomization.yaml").read_text())["resources"]
    bounded = run_module(pd_manifests, dict(long_answers, engine_args={"max-model-len": 4096}, render_dir=str(dest)))
    assert bounded["removed"] == ["NOTES.txt"] and not (dest / "NOTES.txt").exists()
