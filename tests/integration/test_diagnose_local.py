"""playbooks/diagnose.yml on real local engines: each failure gets its code, and the summary is printed first.

Real vLLM where it matters: a vLLM start refused by its own argument parser (exit 2), and the session's real
engine (tests/integration/conftest.py) for healthy, hung (SIGSTOP) and the port another engine then cannot bind.
engine_process runs tiny stand-ins (tests/unit/fixtures/diagnose/fake_engine.py) where a vLLM start adds
nothing: a SIGKILL and a missing model directory.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest
from llmops_testlib import ROOT, run_playbook

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process, _process_state

FAKE = os.path.join(ROOT, "tests", "unit", "fixtures", "diagnose", "fake_engine.py")


def diagnose(llmops_root, port, run_dir, name, **extra):
    """Run playbooks/diagnose.yml on ``run_dir/name``; returns (rc, verdict, output)."""
    rc, out = run_playbook("playbooks/diagnose.yml", llmops_root, port, "-e", json.dumps(
        dict({"engine_local_run_dir": str(run_dir), "engine_local_process_name": name}, **extra)), timeout=300)
    shown = out.split("Show the diagnosis (summary first, then the findings)", 1)
    assert len(shown) == 2, out[-3000:]
    m = re.search(r"msg:\s*\n\s*- '?([a-z_]+): ", shown[1])
    assert m, out[-3000:]
    return rc, m.group(1), out


def start(run_dir, name, argv, grace=0.3):
    try:
        _process.start(str(run_dir), name, argv, startup_grace=grace)
    except _process_state.ProcessError:
        pass  # it died at once: that is recorded in its state file


def wait_exited(run_dir, name, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = _process.read_state(str(run_dir), name)
        if st["state"] != "running":
            return st
        time.sleep(0.2)
    _process.stop(str(run_dir), name, timeout=5)
    pytest.fail("%s still runs after %ds" % (name, timeout))
    return None


@pytest.fixture(scope="module")
def engine(local_engine):
    assert local_engine["first_rc"] == 0, local_engine["first_output"][-3000:]
    st = _process.read_state(local_engine["run_dir"], "engine")
    assert st["state"] == "running", st
    return dict(local_engine, pid=st["pid"])


def test_real_vllm_bad_argument_exit_2(tmp_path):
    # vllm/engine/arg_utils.py: --max-model-len is parsed by human_readable_int_or_auto; argparse exits 2
    start(tmp_path, "vllm-bad-arg", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                     str(tmp_path / "model"), "--max-model-len", "not-a-number"])
    st = wait_exited(tmp_path, "vllm-bad-arg", 240)
    assert st["returncode"] == 2
    rc, verdict, out = diagnose(tmp_path, 18090, tmp_path, "vllm-bad-arg")
    assert rc != 0 and verdict == "bad_argument", out[-3000:]
    assert "error: argument --max-model-len" in out and "not-a-number" in out


def test_real_engine_healthy_then_hung_under_sigstop_then_healthy(engine):
    root, port, run_dir = engine["root"], engine["port"], engine["run_dir"]
    # asked to, the role also probes the engine (health, the served model listed) and prints it after the findings
    url = "http://127.0.0.1:%d" % port
    rc, verdict, out = diagnose(root, port, run_dir, "engine", diagnose_probe_engine_url=url)
    assert rc == 0 and verdict == "healthy", out[-3000:]
    assert "probe engine %s: ok: /health 200 and the model listed" % url in out
    os.kill(engine["pid"], signal.SIGSTOP)
    try:
        rc, verdict, out = diagnose(root, port, run_dir, "engine")
    finally:
        os.kill(engine["pid"], signal.SIGCONT)
    assert rc != 0 and verdict == "engine_hung", out[-3000:]
    assert "pid %d" % engine["pid"] in out and "kill -CONT %d" % engine["pid"] in out
    rc, verdict, out = diagnose(root, port, run_dir, "engine")
    assert rc == 0 and verdict == "healthy", out[-3000:]


def test_port_already_held_by_the_real_engine(engine, tmp_path):
    start(tmp_path, "second", [sys.executable, FAKE, "serve", "--port", str(engine["port"])], grace=2)
    wait_exited(tmp_path, "second", 30)
    rc, verdict, out = diagnose(engine["root"], engine["port"], tmp_path, "second")
    assert rc != 0 and verdict == "port_in_use", out[-3000:]
    assert "Address already in use" in out
    assert "port %d is held by pid %d" % (engine["port"], engine["pid"]) in out


def test_sigkill(tmp_path):
    start(tmp_path, "killed", [sys.executable, FAKE, "sleep", "--port", "18091"])
    os.kill(_process.read_state(str(tmp_path), "killed")["pid"], signal.SIGKILL)
    wait_exited(tmp_path, "killed", 30)
    rc, verdict, out = diagnose(tmp_path, 18091, tmp_path, "killed")
    assert rc != 0 and verdict == "crashed", out[-3000:]
    assert "signal 9 (SIGKILL)" in out


def test_missing_model_dir(tmp_path):
    missing = str(tmp_path / "nvme" / "models" / "tiny-llama" / "0000000")
    start(tmp_path, "no-model", [sys.executable, FAKE, "load", "--model", missing], grace=2)
    wait_exited(tmp_path, "no-model", 30)
    rc, verdict, out = diagnose(tmp_path, 18092, tmp_path, "no-model")
    assert rc != 0 and verdict == "model_not_found", out[-3000:]
    assert "the model %s does not exist on this host" % missing in out
