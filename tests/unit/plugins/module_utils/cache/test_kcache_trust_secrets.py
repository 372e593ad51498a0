"""Warm-up environment values never reach a result (what -vvv and AWX job events show), yet reach the warm-up.

The module is run through AnsibleModule's own exit path (``_return_formatted`` strips ``no_log`` values and
adds ``invocation.module_args``, ansible/module_utils/basic.py), not a mocked exit_json.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmops.serving.plugins.modules import kernel_cache

ROLE = os.path.join(os.path.dirname(os.path.abspath(kernel_cache.__file__)), "..", "..", "roles", "kernel_cache")
SECRET = "hf_kc7Wq2ZsecretTokenValue"
COMPONENTS = {"engine": "vllm", "tp": 1}
# the warm-up proves it received the token without writing it anywhere
WARMUP = ("import os, hashlib; d = os.environ['TRITON_CACHE_DIR']; "
          "open(os.path.join(d, 'seen.txt'), 'w').write(hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest())")


def run_real(args, monkeypatch):
    from ansible.module_utils import _internal

    printed = []
    monkeypatch.setattr(basic.AnsibleModule, "_record_module_result", lambda self, o: printed.append(o))
    monkeypatch.setattr(_internal, "is_controller", False)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            kernel_cache.main()
    assert len(printed) == 1
    return printed[0]


def test_warmup_env_values_are_hidden_from_the_result_and_reach_the_warmup(tmp_path, monkeypatch):
    root = tmp_path / "kc"
    args = dict(operation="prebuild", cache_root=str(root), engine="vllm", fingerprint="0123456789abcdef",
                components=COMPONENTS, warmup_command=[sys.executable, "-c", WARMUP],
                warmup_env={"HF_TOKEN": SECRET, "VLLM_CPU_KVCACHE_SPACE": "4"}, proc_root=str(tmp_path / "no-proc"))
    out = run_real(args, monkeypatch)
    assert not out.get("failed"), out.get("msg")
    assert out["status"] == "built"
    assert SECRET not in json.dumps(out, default=str)
    assert out["invocation"]["module_args"]["warmup_env"]["HF_TOKEN"] != SECRET
    import hashlib
    seen = root / "vllm" / "0123456789abcdef" / "triton" / "seen.txt"
    assert seen.read_text() == hashlib.sha256(SECRET.encode()).hexdigest()
    # a failing warm-up's message names the log, never the environment
    bad = dict(args, fingerprint="fedcba9876543210",
               warmup_command=[sys.executable, "-c", "import os, sys; print(os.environ['HF_TOKEN']); sys.exit(2)"])
    out = run_real(bad, monkeypatch)
    assert out["failed"] and "exited 2" in out["msg"] and SECRET not in json.dumps(out, default=str)


def test_role_marks_warmup_env_no_log_and_exports_the_engine_env_without_logging_it():
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as f:
        spec = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    assert spec["kernel_cache_warmup_env"]["no_log"] is True
    with open(os.path.join(ROLE, "tasks", "main.yml")) as f:
        tasks = yaml.safe_load(f)
    exports = [t for t in tasks if "kernel_cache_env" in (t.get("ansible.builtin.set_fact") or {})]
    assert len(exports) == 1 and exports[0].get("no_log") is True
    assert list(exports[0]["ansible.builtin.set_fact"]) == ["kernel_cache_env"]
