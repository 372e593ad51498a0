"""playbooks/site.yml on inventories/local against the real vLLM CPU engine."""
from __future__ import annotations

import glob
import json
import os
import sys

import pytest
from llmops_testlib import recap, run_playbook

from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference
from ansible_collections.llmops.serving.plugins.modules import engine_probe

PROMPTS = ["The model is staged", "Prefill computes the prompt"]


def _served_model_dir(root):
    dirs = glob.glob(os.path.join(root, "nvme", "models", "tiny-llama", "[0-9a-f]*[0-9a-f]"))
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def reference(local_engine):
    return _reference.greedy_reference(_served_model_dir(local_engine["root"]), PROMPTS, 16, python=sys.executable)


def test_first_run_serves_and_matches_transformers(local_engine):
    out = local_engine["first_output"]
    assert local_engine["first_rc"] == 0, out[-4000:]
    assert "reference match: engine greedy tokens == transformers generate for 2 prompt(s)" in out
    timeline_file = os.path.join(local_engine["run_dir"], "engine", "timeline.json")
    with open(timeline_file) as f:
        timeline = json.load(f)
    assert 0 < timeline["port_open"] <= timeline["health"] <= timeline["models"] <= timeline["first_correct"]
    assert recap(out)["failed"] == 0
    # the engine serves the staged NVMe copy, not the shared filesystem
    with open(os.path.join(local_engine["run_dir"], "engine", "spec.json")) as f:
        command = json.load(f)["command"]
    assert command[command.index("--model") + 1] == _served_model_dir(local_engine["root"])
    assert os.path.isfile(os.path.join(_served_model_dir(local_engine["root"]), ".llmops-staged.json"))


def test_second_run_changes_nothing(local_engine):
    rc, out = run_playbook("playbooks/site.yml", local_engine["root"], local_engine["port"])
    assert rc == 0, out[-4000:]
    assert recap(out)["changed"] == 0, out[-4000:]
    assert "engine already running" in out


def test_engine_tokens_equal_an_independent_transformers_run(run_module, local_engine, reference):
    checks = [{"type": "completion", "prompt": r["prompt"], "max_tokens": 16, "expect_token_ids": r["token_ids"]}
              for r in reference["references"]]
    r = run_module(engine_probe, {"base_url": local_engine["base_url"], "model": "tiny-llama", "checks": checks,
                                  "deadline": 60})
    assert not r.get("failed"), r["msg"]
    assert [c["token_ids"] for c in r["checks"]] == [x["token_ids"] for x in reference["references"]]


def test_every_probe_kind_on_the_real_engine(run_module, local_engine, reference):
    base = {"base_url": local_engine["base_url"], "model": "tiny-llama", "deadline": 60}
    first = reference["references"][0]
    chat = run_module(engine_probe, dict(base, checks=[{"type": "chat", "prompt": "Hello", "max_tokens": 8}]))
    assert not chat.get("failed"), chat["msg"]
    chat_text = chat["checks"][0]["text"]
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}}]
    r = run_module(engine_probe, dict(base, checks=[
        {"type": "health"},
        {"type": "models"},
        {"type": "completion", "prompt": first["prompt"], "expect_token_ids": first["token_ids"]},
        {"type": "chat", "prompt": "Hello", "max_tokens": 8, "expect": chat_text},
        {"type": "json_schema", "prompt": "Answer yes or no.", "schema": schema, "max_tokens": 32},
        {"type": "tool_call", "prompt": "Weather in Paris?", "tools": tools, "max_tokens": 128,
         "expect_function": "get_weather"},
        {"type": "stream", "prompt": first["prompt"], "max_tokens": 16, "expect": first["text"],
         "stream_timeout": 60},
        {"type": "cancel", "prompt": first["prompt"], "max_tokens": 64},
    ]))
    assert not r.get("failed"), r["msg"]
    by = {c["type"]: c for c in r["checks"]}
    assert by["json_schema"]["output"]["answer"] in ("yes", "no")
    assert by["tool_call"]["arguments"]["city"] in ("Paris", "Rome")
    assert by["stream"]["ttft_ms"] > 0 and by["stream"]["text"] == first["text"]
    assert by["cancel"]["health_after_cancel"] == 200


def test_probe_failures_on_the_real_engine(run_module, local_engine, reference):
    base = {"base_url": local_engine["base_url"], "deadline": 30}
    first = reference["references"][0]
    wrong = list(first["token_ids"])
    wrong[-1] = (wrong[-1] + 1) % 400
    r = run_module(engine_probe, dict(base, model="tiny-llama", checks=[
        {"type": "completion", "prompt": first["prompt"], "expect_token_ids": wrong}]))
    assert r["failed"] and "!= expected" in r["msg"] and r["checks"][0]["attempts"] == 1
    r = run_module(engine_probe, dict(base, model="tiny-llama-typo", checks=[{"type": "models"}]))
    assert r["failed"] and "does not list 'tiny-llama-typo'" in r["msg"]
    r = run_module(engine_probe, dict(base, model="tiny-llama-typo", checks=[{"type": "completion"}]))
    assert r["failed"] and "is not served" in r["msg"]


def test_engine_crash_is_reported_with_its_exit_status(tmp_path):
    """A vLLM that exits non-zero must fail the play with that status, never look like success."""
    # kernel cache off: its warm-up would run the same bad arguments and stop the play before the engine
    rc, out = run_playbook("playbooks/site.yml", tmp_path, 18009,
                           "-e", '{"engine_extra_args": ["--max-model-len", "not-a-number"], "kernel_cache_enabled": false}')
    assert rc != 0
    assert "exit status 2" in out, out[-3000:]
    # the failed wait ends with the diagnosis (engine_diagnose through the diagnose role), not a timeout
    assert "bad_argument" in out and "--max-model-len" in out, out[-3000:]
    with open(os.path.join(str(tmp_path), "run", "engine", "state.json")) as f:
        state = json.load(f)
    assert state["state"] == "exited" and state["returncode"] == 2
