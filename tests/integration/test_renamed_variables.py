"""Role variables renamed for one meaning per word: an old name still works (render mode, no cluster needed),
says it is deprecated (an Ansible deprecation warning) and names its replacement; the new name does the same
without the warning."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

ENGINE = dict(engine_platform="kubernetes", engine_k8s_mode="render", engine_name="vllm",
              engine_served_model_name="glm-5.2-fp8-vllm", engine_image="vllm/vllm-openai:v0.26.0",
              engine_namespace="llm-lab", engine_model_path="/mnt/nvme/models/GLM-5.2-FP8/v1",
              engine_k8s_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
              # rendered without SSH to the nodes: the nodes that hold the revision are named
              engine_k8s_staged_nodes=["gpu-node-1"])
PD = dict(pd_disagg_platform="kubernetes", pd_disagg_model_name="glm-5.2-fp8", pd_disagg_prefill_nodes=["gpu-p1"],
          pd_disagg_decode_nodes=["gpu-d1"], pd_disagg_proxy_image="registry.example/python:3.11-slim")
# What a role resolved, written after it ran (role defaults stay visible to the play's post_tasks).
RESOLVED = {
    "engine": ["engine_k8s_route_request_timeout", "engine_k8s_route_condition_timeout"],
    "pd_disagg": ["pd_disagg_k8s_mode", "pd_disagg_k8s_workload", "pd_disagg_render_dir"],
}


def play(tmp_path, role, extra):
    """Run ``role`` with ``extra`` as extra vars; returns (rc, output, resolved variables or None)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    resolved = tmp_path / ("resolved-%d.json" % len(list(tmp_path.glob("resolved-*.json"))))
    playbook = tmp_path / ("%s.yml" % role)
    playbook.write_text(yaml.safe_dump([{
        "name": "Render", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "roles": [{"role": "llmops.serving.%s" % role}],
        "post_tasks": [{"name": "Save what the role resolved", "ansible.builtin.copy": {
            "dest": str(resolved), "mode": "0644",
            "content": "{{ {%s} | to_json }}" % ", ".join("'%s': %s" % (v, v) for v in RESOLVED[role])}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps(dict(extra, ansible_python_interpreter=sys.executable)))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", str(playbook),
                           "-e", "@%s" % varfile], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    out = proc.stdout + proc.stderr
    return proc.returncode, " ".join(out.split()), json.loads(resolved.read_text()) if resolved.exists() else None


def notice(old, new):
    """The deprecation warning Ansible shows for a renamed variable still set (llmops.serving.deprecated_vars)."""
    return "[DEPRECATION WARNING]: %s is renamed %s" % (old, new)


def rendered(directory):
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return {name: (directory / name).read_text() for name in kust["resources"]}


def route_timeout(files):
    route = [o for o in map(yaml.safe_load, files.values()) if o["kind"] == "HTTPRoute"][0]
    return route["spec"]["rules"][0]["timeouts"]


def test_engine_route_timeout_names(tmp_path):
    rc, out, new = play(tmp_path / "new", "engine", dict(ENGINE, engine_render_dir=str(tmp_path / "new" / "m"),
                                                         engine_k8s_route_request_timeout="900s",
                                                         engine_k8s_route_condition_timeout=42))
    assert rc == 0, out[-3000:]
    assert "[DEPRECATED]" not in out and "[DEPRECATION WARNING]" not in out
    assert new == {"engine_k8s_route_request_timeout": "900s", "engine_k8s_route_condition_timeout": 42}
    rc, out, old = play(tmp_path / "old", "engine", dict(ENGINE, engine_render_dir=str(tmp_path / "old" / "m"),
                                                         engine_k8s_route_timeout="900s",
                                                         engine_k8s_route_wait_timeout=42))
    assert rc == 0, out[-3000:]
    assert old == new
    assert notice("engine_k8s_route_timeout", "engine_k8s_route_request_timeout") in out
    assert notice("engine_k8s_route_wait_timeout", "engine_k8s_route_condition_timeout") in out
    assert route_timeout(rendered(tmp_path / "old" / "m")) == {"request": "900s"}
    assert rendered(tmp_path / "old" / "m") == rendered(tmp_path / "new" / "m")
    # neither set: the documented defaults
    rc, out, default = play(tmp_path / "default", "engine", dict(ENGINE, engine_render_dir=str(tmp_path / "default" / "m")))
    assert rc == 0, out[-3000:]
    assert default == {"engine_k8s_route_request_timeout": "0s", "engine_k8s_route_condition_timeout": 300}
    assert "[DEPRECATED]" not in out and "[DEPRECATION WARNING]" not in out


def test_pd_workload_and_render_dir_names(tmp_path):
    rc, out, new = play(tmp_path / "new", "pd_disagg", dict(PD, pd_disagg_k8s_workload="deployments",
                                                            pd_disagg_render_dir=str(tmp_path / "new" / "pd")))
    assert rc == 0, out[-3000:]
    assert "[DEPRECATED]" not in out and "[DEPRECATION WARNING]" not in out
    assert new == {"pd_disagg_k8s_mode": "render", "pd_disagg_k8s_workload": "deployments",
                   "pd_disagg_render_dir": str(tmp_path / "new" / "pd")}
    assert any(n.startswith("30-deployment-") for n in rendered(tmp_path / "new" / "pd"))
    # the proxy's ConfigMap carries the role's pd_proxy.py byte for byte (lookup('file') strips the end by default)
    maps = [o for o in map(yaml.safe_load, rendered(tmp_path / "new" / "pd").values()) if o["kind"] == "ConfigMap"]
    with open(os.path.join(ROOT, "roles", "pd_disagg", "files", "pd_proxy.py")) as f:
        assert [m["data"]["pd_proxy.py"] for m in maps] == [f.read()]
    rc, out, old = play(tmp_path / "old", "pd_disagg", dict(PD, pd_disagg_k8s_mode="deployments",
                                                            pd_disagg_manifest_dir=str(tmp_path / "old" / "pd")))
    assert rc == 0, out[-3000:]
    assert old == dict(new, pd_disagg_k8s_mode="deployments", pd_disagg_render_dir=str(tmp_path / "old" / "pd"))
    assert notice("pd_disagg_manifest_dir", "pd_disagg_render_dir") in out
    assert "[DEPRECATED] pd_disagg_k8s_mode deployments names the workload, now pd_disagg_k8s_workload" in out
    assert rendered(tmp_path / "old" / "pd") == rendered(tmp_path / "new" / "pd")
    assert "rendered into %s" % (tmp_path / "old" / "pd") in out


def test_pd_apply_names(tmp_path):
    """pd_disagg_k8s_mode apply (new) and pd_disagg_k8s_apply true (deprecated) both apply; render does not."""
    def applies(out):
        # apply mode talks to the API server: it reads the gateway's EnvoyPatchPolicy, then applies (a failed apply
        # is reported by the block's rescue); there is no cluster here, so the first call to the API fails
        for chunk in out.split("TASK [")[1:]:
            if chunk.startswith("llmops.serving.pd_disagg : Read AIBrix's EnvoyPatchPolicy"):
                ran = chunk.split("PLAY RECAP")[0]
                return "fatal: [localhost]" in ran or "ok: [localhost]" in ran
        return "Report what the API server refused" in out

    base = dict(PD, pd_disagg_render_dir=str(tmp_path / "pd"))
    rc, out, dummy = play(tmp_path / "render", "pd_disagg", base)
    assert rc == 0 and not applies(out), out[-3000:]
    # apply: the objects go to kubernetes.core.k8s
    for extra in ({"pd_disagg_k8s_mode": "apply"}, {"pd_disagg_k8s_apply": True}):
        rc, out, dummy = play(tmp_path / next(iter(extra)), "pd_disagg", dict(base, **extra))
        assert rc != 0 and applies(out), (extra, out[-3000:])
        assert (notice("pd_disagg_k8s_apply", "pd_disagg_k8s_mode") in out) == ("pd_disagg_k8s_apply" in extra)
