"""playbooks/upgrade.yml on inventories/local against the real vLLM CPU engine: a revision upgrade with proof and
automatic rollback.

The demo engine serves A (the demo model, seed 0). Three B revisions are tried on the same shared filesystem:
files that fail verification (nothing changes), files that verify but that the engine cannot load (a config.json
whose context is shorter than the engine's --max-model-len: transformers loads it, vLLM refuses it at start, so the
engine is stopped, B fails, and A is restarted and proven), and a good B (the demo model with another seed), which
ends serving with answers equal to B's own transformers reference; the same run again changes nothing.

Each test reads what serves from the engine itself: its process (pid), its command line (spec.json) and greedy
answers compared with transformers on the served files.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest
from llmops_testlib import recap, run_playbook

from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference
from ansible_collections.llmops.serving.plugins.modules import demo_model, engine_probe

PORT = 18451
PROMPTS = ["The model is staged", "Prefill computes the prompt"]
#: The soak is short here: each test's point is the switch and the rollback, not the wait.
FAST = ["-e", "upgrade_soak_seconds=3", "-e", "kernel_cache_enabled=false"]


def _upgrade(fleet, revision, *extra):
    started = time.monotonic()
    rc, out = run_playbook("playbooks/upgrade.yml", fleet["root"], PORT,
                           "-e", json.dumps({"upgrade_model": {"name": "tiny-llama", "revision": revision}}),
                           *(FAST + list(extra)), timeout=1500)
    return rc, out, time.monotonic() - started


def _served(fleet):
    """(pid, model directory) of the engine that runs now."""
    run = os.path.join(fleet["root"], "run", "engine")
    with open(os.path.join(run, "spec.json")) as f:
        command = json.load(f)["command"]
    with open(os.path.join(run, "state.json")) as f:
        state = json.load(f)
    return state.get("pid"), command[command.index("--model") + 1]


def _answers_equal_reference(run_module, fleet, model_dir):
    # transformers' answer for a revision is computed once here too (the test's own cache, not the role's)
    ref, _w = _reference.cached_reference(model_dir, PROMPTS, 16, python=sys.executable,
                                          cache_dir=os.path.join(fleet["root"], "test-references"))
    checks = [{"type": "completion", "prompt": r["prompt"], "max_tokens": 16, "expect_token_ids": r["token_ids"]}
              for r in ref["references"]]
    r = run_module(engine_probe, {"base_url": "http://127.0.0.1:%d" % PORT, "model": "tiny-llama", "checks": checks,
                                  "deadline": 60})
    return not r.get("failed"), r.get("msg")


def _copy_revision(fleet, name):
    dst = os.path.join(fleet["shared"], name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(fleet["a_src"], dst)
    return dst


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("llmops-upgrade")
    rc, out = run_playbook("playbooks/site.yml", root, PORT, "-e", "kernel_cache_enabled=false", timeout=1500)
    assert rc == 0, out[-4000:]
    shared = os.path.join(str(root), "shared", "models", "tiny-llama")
    (a_rev,) = [d for d in os.listdir(shared) if not d.startswith(".")]
    info = {"root": str(root), "shared": shared, "a_rev": a_rev, "a_src": os.path.join(shared, a_rev),
            "a_dest": os.path.join(str(root), "nvme", "models", "tiny-llama", a_rev), "times": {}}
    yield info
    run_playbook("playbooks/stop.yml", root, PORT, timeout=300)


def test_b_whose_files_fail_verification_changes_nothing(fleet, run_module):
    src = _copy_revision(fleet, "bad-files")
    shard = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))[0]
    with open(os.path.join(src, shard), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(src, shard)) - 4096)
    before = _served(fleet)
    rc, out, seconds = _upgrade(fleet, "bad-files")
    fleet["times"]["bad files"] = seconds
    assert rc != 0, out[-3000:]
    assert "failed before the engine changed, while staging B" in out, out[-3000:]
    assert "Nothing changed: tiny-llama@%s still serves" % fleet["a_rev"] in out
    assert _served(fleet) == before
    ok, msg = _answers_equal_reference(run_module, fleet, fleet["a_dest"])
    assert ok, msg


def test_b_the_engine_cannot_load_rolls_back_to_a(fleet, run_module):
    src = _copy_revision(fleet, "short-context")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["max_position_embeddings"] = 64  # the engine runs --max-model-len 512 (inventories/local)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(config, f)
    sums = os.path.join(src, "SHA256SUMS")
    if os.path.exists(sums):  # the edited config.json is this revision's own file now
        os.remove(sums)
    pid_a, path_a = _served(fleet)
    rc, out, seconds = _upgrade(fleet, "short-context")
    fleet["times"]["engine cannot load B"] = seconds
    assert rc != 0, out[-3000:]
    assert "upgrade to tiny-llama@short-context failed" in out, out[-3000:]
    assert "Rolled back: tiny-llama@%s serves again" % fleet["a_rev"] in out, out[-3000:]
    # the engine was really stopped and started on B, then A was started again
    assert "Serve and wait for one correct answer from short-context" in out
    pid_now, path_now = _served(fleet)
    assert path_now == path_a and pid_now != pid_a
    ok, msg = _answers_equal_reference(run_module, fleet, fleet["a_dest"])
    assert ok, msg
    with open(os.path.join(fleet["root"], "run", "engine.serving.json")) as f:
        assert json.load(f)["revision"] == fleet["a_rev"]


def test_good_b_serves_with_its_own_reference_answers_then_changes_nothing(fleet, run_module):
    b = run_module(demo_model, {"models_root": os.path.dirname(fleet["shared"]), "seed": 1})
    assert b["revision"] != fleet["a_rev"]
    rc, out, seconds = _upgrade(fleet, b["revision"])
    fleet["times"]["good B"] = seconds
    assert rc == 0, out[-4000:]
    assert "upgraded tiny-llama@%s -> tiny-llama@%s" % (fleet["a_rev"], b["revision"]) in out
    b_dest = os.path.join(fleet["root"], "nvme", "models", "tiny-llama", b["revision"])
    assert _served(fleet)[1] == b_dest
    ok, msg = _answers_equal_reference(run_module, fleet, b_dest)
    assert ok, msg
    # A was pinned while B was staged: still on disk, left to retention
    assert os.path.isdir(fleet["a_dest"])
    served = _served(fleet)
    rc, out, seconds = _upgrade(fleet, b["revision"])
    fleet["times"]["same B again"] = seconds
    assert rc == 0, out[-4000:]
    assert recap(out)["changed"] == 0, out[-4000:]
    assert "already serves, proven again: nothing changed" in out
    assert _served(fleet) == served
    print("upgrade wall times (s): %s" % json.dumps({k: round(v, 1) for k, v in fleet["times"].items()}))


def test_check_mode_prints_the_plan_and_changes_nothing(fleet):
    served = _served(fleet)
    rc, out, dummy = _upgrade(fleet, fleet["a_rev"], "--check")
    assert rc == 0, out[-3000:]
    assert "switch: the engine restarts on B" in out and "check mode: nothing is changed" in out
    assert _served(fleet) == served


def test_nothing_serving_is_refused_before_anything_changes(tmp_path):
    rc, out = run_playbook("playbooks/upgrade.yml", tmp_path, PORT + 7,
                           "-e", json.dumps({"upgrade_model": {"name": "tiny-llama", "revision": "x"}}), timeout=600)
    assert rc != 0
    assert "there is no serving revision to fall back to" in out, out[-3000:]
    assert not os.path.exists(tmp_path / "nvme" / "models" / "tiny-llama")
