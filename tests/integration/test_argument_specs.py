"""Roles refuse missing or wrong-typed variables in argument_specs validation, naming the variable."""
from __future__ import annotations

import json
import sys

import pytest
from llmops_testlib import run_playbook

CASES = [
    ("llmops.serving.engine", {"engine_platform": "local", "engine_model_path": "/nonexistent"},
     "engine_served_model_name"),
    ("llmops.serving.engine", {"engine_served_model_name": "m", "engine_model_path": "/m", "engine_tp_size": "eight"},
     "engine_tp_size"),
    ("llmops.serving.engine", {"engine_served_model_name": "m", "engine_model_path": "/m", "engine_platform": "k8s"},
     "engine_platform"),
    ("llmops.serving.demo_model", {"demo_model_seed": "not-a-number"}, "demo_model_seed"),
    ("llmops.serving.preflight", {"preflight_paths": "/not/a/list", "preflight_min_free_bytes": "lots"},
     "preflight_min_free_bytes"),
    ("llmops.serving.model_stage", {"model_stage_src_root": "/nonexistent/shared", "model_stage_dest_root": "/nonexistent/nvme",
                                    "model_stage_models": [{"name": "m", "revision": "r"}],
                                    "model_stage_lock_timeout": "an hour"}, "model_stage_lock_timeout"),
    ("llmops.serving.diagnose", {"diagnose_name": "e", "diagnose_platform": "k8s"}, "diagnose_platform"),
]


@pytest.mark.parametrize("role,role_vars,name", CASES, ids=[c[2] for c in CASES])
def test_bad_variable_is_named_before_anything_runs(tmp_path, role, role_vars, name):
    rc, out = run_playbook("tests/integration/playbooks/argspec_role.yml", tmp_path, 18008,
                           "-e", json.dumps(dict(role_vars, role_name=role, ansible_python_interpreter=sys.executable)), "-c", "local",
                           timeout=300, inventory="localhost,")
    assert rc != 0
    assert "Validating arguments against arg spec" in out
    assert name in out, out[-2000:]
    # validation failed first: no task of the role ran
    assert "changed=0" in out
