"""The engine role renders both engines' Kubernetes objects through ansible-playbook (no cluster needed)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(ROOT, "tests", "integration", "playbooks", "engine_render.yml")
BIN = os.path.dirname(sys.executable)

# Rendered without SSH to the nodes: the nodes that hold the revision are named (engine_k8s_staged_nodes).
STAGED = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]
CASES = {
    "vllm": dict(engine_name="vllm", engine_served_model_name="glm-5.2-fp8-vllm",
                 engine_image="vllm/vllm-openai:v0.26.0", engine_k8s_staged_nodes=STAGED),
    "sglang": dict(engine_name="sglang", engine_served_model_name="glm-5.2-fp8-sglang-test",
                   engine_image="lmsysorg/sglang:v0.5.16", engine_model_source="shared_fs"),
}


def play(tmp_path, extra, inventory="localhost,", args=()):
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = os.path.join(ROOT, "ansible.cfg")
    # the working tree first (root conftest links it under .build/pycoll), then what `make install` put there
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(
        [os.path.join(ROOT, ".build", "pycoll"), os.path.join(ROOT, ".build", "collections")])
    env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "ansible-tmp")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    varfile = tmp_path / ("vars-%d.json" % len(list(tmp_path.glob("vars-*.json"))))
    varfile.write_text(json.dumps(dict(extra, ansible_python_interpreter=sys.executable)))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, PLAYBOOK, "-e", "@%s" % varfile] + list(args),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def recap_changed(output):
    m = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", output)
    assert m, output[-3000:]
    return int(m.group(1))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_role_renders_valid_objects_idempotently(tmp_path, engine):
    out = tmp_path / "manifests"
    extra = dict(CASES[engine], engine_namespace="llm-lab", engine_render_dir=str(out),
                 engine_model_path="/mnt/nvme/models/GLM-5.2-FP8/v1",
                 engine_k8s_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    rc, output = play(tmp_path, extra)
    assert rc == 0, output[-4000:]
    assert recap_changed(output) >= 1
    assert "concurrent reads" in output
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    objs = [yaml.safe_load((out / f).read_text()) for f in kust["resources"]]
    kinds = {o["kind"]: o for o in objs}
    assert list(kinds) == ["Service", "ReferenceGrant", "HTTPRoute", "Deployment"]
    model = CASES[engine]["engine_served_model_name"]
    assert kinds["HTTPRoute"]["metadata"]["name"] == model + "-router"
    assert kinds["HTTPRoute"]["metadata"]["namespace"] == "aibrix-system"
    svc = kinds["Service"]["metadata"]["name"]
    # the DNS-1035 spelling, with the served name's hash where the spelling changed it (kube/_k8s_names.object_name)
    spelled = model.replace(".", "-")
    assert svc == (spelled if spelled == model else "%s-%s" % (spelled, hashlib.sha256(model.encode()).hexdigest()[:8]))
    assert kinds["Service"]["metadata"]["namespace"] == "llm-lab"
    assert kinds["HTTPRoute"]["spec"]["rules"][0]["backendRefs"][0]["name"] == svc
    pod = kinds["Deployment"]["spec"]["template"]
    assert pod["metadata"]["labels"]["model.aibrix.ai/name"] == model
    assert pod["metadata"]["labels"]["model.aibrix.ai/engine"] == engine
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 3600
    # second run: nothing to change
    rc, output = play(tmp_path, extra)
    assert rc == 0, output[-4000:]
    assert recap_changed(output) == 0


def test_role_refuses_keyless_exists_toleration_before_writing(tmp_path):
    out = tmp_path / "manifests"
    extra = dict(CASES["vllm"], engine_namespace="llm-lab", engine_render_dir=str(out),
                 engine_model_path="/mnt/nvme/models/GLM-5.2-FP8/v1",
                 engine_k8s_tolerations=[{"operator": "Exists"}])
    rc, output = play(tmp_path, extra)
    assert rc != 0
    assert "operator Exists without a key" in output
    assert not out.exists()


def test_role_refuses_missing_image(tmp_path):
    extra = dict(CASES["vllm"], engine_image="", engine_namespace="llm-lab",
                 engine_render_dir=str(tmp_path / "m"), engine_model_path="/mnt/nvme/models/GLM-5.2-FP8/v1")
    rc, output = play(tmp_path, extra)
    assert rc != 0 and "engine_image is empty" in output


def _rendered(out):
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    return [yaml.safe_load((out / f).read_text()) for f in kust["resources"]]


def test_role_renders_a_two_node_engine_with_the_profile_data(tmp_path):
    """TP=8 x PP=2 over two nodes: one LeaderWorkerSet group; the profile comes from vars/profiles.yml."""
    out = tmp_path / "manifests"
    extra = dict(CASES["vllm"], engine_namespace="llm-lab", engine_render_dir=str(out),
                 engine_model_path="/mnt/nvme/models/GLM-5.2-FP8/v1", engine_k8s_profile="glm-5.2-fp8",
                 engine_k8s_pp_size=2, engine_k8s_nodes=2, engine_replicas=2)
    rc, output = play(tmp_path, extra)
    assert rc == 0, output[-4000:]
    kinds = [o["kind"] for o in _rendered(out)]
    assert kinds == ["Service", "ReferenceGrant", "HTTPRoute", "PodDisruptionBudget", "LeaderWorkerSet"]
    lws = _rendered(out)[-1]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2 and lws["spec"]["replicas"] == 2
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert leader[leader.index("--kv-cache-dtype") + 1] == "fp8"
    assert leader[leader.index("--nnodes") + 1] == "2"
    assert "-> LeaderWorkerSet" in output


def test_role_refuses_an_image_older_than_the_profile_before_writing(tmp_path):
    out = tmp_path / "manifests"
    extra = dict(CASES["vllm"], engine_image="vllm/vllm-openai:v0.25.1", engine_namespace="llm-lab",
                 engine_render_dir=str(out), engine_model_path="/m", engine_k8s_profile="glm-5.2-fp8")
    rc, output = play(tmp_path, extra)
    assert rc != 0 and "older than profile glm-5.2-fp8 needs (0.26.0b2.dev1 or newer)" in output
    assert not out.exists()


def test_role_default_profile_is_none_and_site_profiles_extend_the_data(tmp_path):
    out = tmp_path / "manifests"
    base = dict(CASES["sglang"], engine_namespace="llm-lab", engine_render_dir=str(out), engine_model_path="/m")
    rc, output = play(tmp_path, base)
    assert rc == 0, output[-4000:]
    args = _rendered(out)[-1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--reasoning-parser" not in args and "--speculative-algorithm" not in args
    site = {"qwen3-32b": {"description": "Qwen3 32B", "sglang": {"min_version": "0.5.0", "args": {"reasoning-parser": "qwen3"}}}}
    rc, output = play(tmp_path, dict(base, engine_k8s_profile="qwen3-32b", engine_k8s_profiles=site))
    assert rc == 0, output[-4000:]
    args = _rendered(out)[-1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--reasoning-parser") + 1] == "qwen3"


def test_role_pins_the_engine_to_the_hosts_that_staged_the_revision(tmp_path):
    """Without named nodes the role looks for model_stage's completion marker on the hosts (here the play's one
    host, the inventory has no colocated group): none - it fails naming the host, before writing anything; then
    the marker is there - the Deployment requires that node."""
    out, rev = tmp_path / "manifests", tmp_path / "nvme" / "GLM-5.2-FP8" / "v1"
    rev.mkdir(parents=True)
    extra = dict(CASES["vllm"], engine_namespace="llm-lab", engine_render_dir=str(out), engine_model_path=str(rev),
                 engine_k8s_staged_nodes=[])
    rc, output = play(tmp_path, extra)
    assert rc != 0 and "no host of group colocated has staged it (not on localhost)" in output, output[-3000:]
    assert "engine_replicas 1 needs 1 node(s) holding %s" % rev in output
    assert not out.exists()
    (rev / ".llmops-staged.json").write_text("{}")
    rc, output = play(tmp_path, dict(extra, k8s_node_name="gpu-node-7"))
    assert rc == 0, output[-4000:]
    pod = _rendered(out)[-1]["spec"]["template"]["spec"]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-7"]}]}]}
    assert "engine pods only on gpu-node-7" in output


def test_check_mode_counts_the_hosts_that_will_stage_the_revision(tmp_path):
    """A Check job before the first stage: the revision is not on the node yet (the stage play would write it), so
    the group's hosts count, it says so, and nothing is written."""
    out = tmp_path / "manifests"
    extra = dict(CASES["vllm"], engine_namespace="llm-lab", engine_render_dir=str(out),
                 engine_model_path=str(tmp_path / "nvme" / "rev"), engine_k8s_staged_nodes=[])
    rc, output = play(tmp_path, extra, args=["--check"])
    assert rc == 0, output[-4000:]
    assert "is not staged on localhost yet (a real run stages it first)" in output
    assert "engine pods only on localhost" in output
    assert not out.exists()


def test_a_host_in_the_colocated_and_a_pd_group_fails_before_rendering(tmp_path):
    """Colocated and P/D pods take whole GPU nodes: a host in both groups would let one take the other's node."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "colocated": {"hosts": {"localhost": {"ansible_connection": "local"}}},
        "decode": {"hosts": {"localhost": None}}}}}))
    out = tmp_path / "manifests"
    extra = dict(CASES["vllm"], engine_namespace="llm-lab", engine_render_dir=str(out), engine_k8s_staged_nodes=[],
                 engine_model_path=str(tmp_path / "rev"))
    rc, output = play(tmp_path, extra, inventory=str(inv))
    assert rc != 0 and "localhost is in group colocated and in prefill or decode" in output, output[-3000:]
    assert not out.exists()
