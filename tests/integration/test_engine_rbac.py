"""The engine role writes the two identities' RBAC (tasks/rbac.yml) exactly as _k8s_rbac renders them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes_validate
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_rbac

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
K8S_VERSION = "1.33.0"


def _env(tmp_path):
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = os.path.join(ROOT, "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(
        [os.path.join(ROOT, ".build", "pycoll"), os.path.join(ROOT, ".build", "collections")])
    env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "ansible-tmp")
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def test_rbac_task_file_writes_the_rendered_identities(tmp_path):
    env = _env(tmp_path)
    out = tmp_path / "rbac"
    extra = dict(engine_namespace="llm-lab", engine_gateway_namespace="aibrix-system", engine_served_model_name="m",
                 engine_k8s_rbac_dir=str(out), engine_k8s_rbac_names={"deploy": "ci-deploy"},
                 ansible_python_interpreter=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-c", "local", "-m", "include_role",
                           "-a", "name=llmops.serving.engine tasks_from=rbac", "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "rbac.yaml") as f:
        written = [d for d in yaml.safe_load_all(f) if d]
    assert written == _k8s_rbac.rbac_objects("llm-lab", "aibrix-system", {"deploy": "ci-deploy"})
    for obj in written:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert "kubectl apply -f %s/rbac.yaml" % out in proc.stdout


def test_the_role_writes_the_rbac_beside_a_render_when_asked(tmp_path):
    """engine_k8s_render_rbac: the main entry point writes rbac.yaml too (and leaves it out by default)."""
    playbook = os.path.join(ROOT, "tests", "integration", "playbooks", "engine_render.yml")
    base = dict(engine_name="vllm", engine_served_model_name="glm-5.2-fp8-vllm", engine_image="vllm/vllm-openai:v0.26.0",
                engine_model_source="shared_fs", engine_model_path="/models/glm", engine_namespace="llm-lab",
                engine_render_dir=str(tmp_path / "manifests"), ansible_python_interpreter=sys.executable)
    for render_rbac in (False, True):
        out = tmp_path / ("rbac-%s" % render_rbac)
        extra = dict(base, engine_k8s_rbac_dir=str(out), engine_k8s_render_rbac=render_rbac)
        proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", playbook, "-e", json.dumps(extra)],
                              cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert (out / "rbac.yaml").exists() is render_rbac
    with open(out / "rbac.yaml") as f:
        assert [d for d in yaml.safe_load_all(f) if d] == _k8s_rbac.rbac_objects("llm-lab", "aibrix-system")
