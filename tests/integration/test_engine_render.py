"""The engine role renders both engines' Kubernetes objects through ansible-playbook (no cluster needed)."""
from __future__ import annotations

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

CASES = {
    "vllm": dict(engine_name="vllm", engine_served_model_name="glm-5.2-fp8-vllm",
                 engine_image="vllm/vllm-openai:v0.26.0"),
    "sglang": dict(engine_name="sglang", engine_served_model_name="glm-5.2-fp8-sglang-test",
                   engine_image="lmsysorg/sglang:v0.5.16", engine_model_source="shared_fs"),
}


def play(tmp_path, extra):
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
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", PLAYBOOK, "-e", "@%s" % varfile],
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
    assert svc == model.replace(".", "-") and kinds["Service"]["metadata"]["namespace"] == "llm-lab"
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
