"""playbooks/site.yml generates the demo model only where the inventory asks for it (inventories/local).

Both runs are check-mode runs of the real playbook on localhost with the working tree as the collection. A named
model (``site_models``, even an empty list) turns the demo model off; the runs stop at the first staging check
where there is nothing to stage.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.join(ROOT, "playbooks", "site.yml")
DEMO_TASK = "llmops.serving.demo_model : Generate the tiny model"


def _site_check_run(inventory, llmops_root, *extra, models=True):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        # the conftest's link to the working tree, not an installed copy
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(ROOT, ".build", "pycoll"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "LLMOPS_ROOT": str(llmops_root),
    })
    extra_vars = {"preflight_engine_python": ""}
    if models:
        extra_vars["site_models"] = []
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), SITE, "--check",
           "-e", json.dumps(extra_vars)] + list(extra)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("no JSON report from ansible-playbook:\n" + (proc.stdout + proc.stderr)[-3000:])
    results = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            results[task["task"]["name"]] = task["hosts"]["localhost"]
    return results, proc.stdout + proc.stderr


def _fleet_inventory(tmp_path):
    """A fleet-style inventory: its own group_vars, no demo_model_enabled."""
    inv = tmp_path / "fleet"
    (inv / "group_vars" / "gpu_nodes").mkdir(parents=True)
    (inv / "hosts.yml").write_text(json.dumps({"gpu_nodes": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (inv / "group_vars" / "gpu_nodes" / "main.yml").write_text(json.dumps({
        "demo_model_models_root": str(tmp_path / "shared" / "models"),
        "preflight_paths": [str(tmp_path)],
    }))
    return inv


def test_a_fleet_inventory_does_not_generate_the_demo_model(tmp_path):
    results, out = _site_check_run(_fleet_inventory(tmp_path), tmp_path / "root")
    assert results["llmops.serving.preflight : Publish the preflight facts"].get("failed") is not True, out[-3000:]
    demo = results[DEMO_TASK]
    assert demo.get("skipped") is True, demo
    assert "demo_model_enabled" in demo.get("false_condition", ""), demo
    assert not (tmp_path / "shared").exists()


def test_the_local_inventory_generates_the_demo_model(tmp_path):
    # no model named (no site_models, no stage_model_name): the local inventory's demo model is the one served
    results, out = _site_check_run(os.path.join(ROOT, "inventories", "local"), tmp_path, models=False)
    demo = results[DEMO_TASK]
    assert demo.get("skipped") is not True, out[-3000:]
    # check mode: it would create the model (nothing is written)
    assert demo["changed"] is True, demo
    assert demo["path"].startswith(str(tmp_path / "shared" / "models" / "tiny-llama") + os.sep)


def test_a_fleet_inventory_without_site_models_is_told_what_to_set(tmp_path):
    # demo model off and no site_models: the staging play says what to set instead of an undefined variable
    results, out = _site_check_run(_fleet_inventory(tmp_path), tmp_path / "root", models=False)
    check = results["Check that there is a model to stage, named completely"]
    assert check.get("failed") is True, check
    assert "site_models" in check["msg"] and "demo_model_enabled" in check["msg"], check
    assert "undefined" not in check["msg"]
