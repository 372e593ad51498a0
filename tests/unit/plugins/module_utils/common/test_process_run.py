"""_process_run.python_json (asking an engine's interpreter), _process_run.Child / stop_group (a warm-up's process
group) and _preflight.find_bin, with real interpreters, scripts and processes."""
from __future__ import annotations

import os
import stat
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _moe
from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
from ansible_collections.llmops.serving.plugins.module_utils.engine import _preflight, _reference


def _script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_python_json_reads_the_last_line_and_passes_args_and_stdin():
    code = "import json, sys; print('noise from an import'); print(json.dumps([sys.argv[1:], sys.stdin.read()]))"
    assert _process_run.python_json(sys.executable, code, ["a", "b"], stdin="fed") == [["a", "b"], "fed"]


def test_python_json_failures_keep_the_interpreters_error_output(tmp_path):
    with pytest.raises(_process_run.PythonFailed) as e:
        _process_run.python_json(sys.executable, "import sys; sys.stderr.write('ModuleNotFoundError: vllm\\n'); sys.exit(4)")
    assert e.value.returncode == 4 and e.value.stderr == "ModuleNotFoundError: vllm"
    with pytest.raises(OSError):
        _process_run.python_json(str(tmp_path / "no-python"), "print(1)")
    with pytest.raises(ValueError):
        _process_run.python_json(sys.executable, "print('not json')")


def test_callers_turn_a_failing_interpreter_into_their_own_message(tmp_path):
    broken = _script(tmp_path, "python", "echo 'Segmentation fault (core dumped)' >&2\nexit 139\n")
    with pytest.raises(_moe.MoeError, match=r"^engine_python: .*python failed: Segmentation fault \(core dumped\)$"):
        _moe.locate_engine("vllm", broken)
    with pytest.raises(_reference.ReferenceError_, match=r"reference generation with .*python exited 139: Segmentation"):
        _reference.greedy_reference("/m", ["hi"], python=broken, timeout=30)
    rt = _preflight.engine_runtime(broken, ["vllm"])
    assert rt["importable"] is False and rt["reason"] == "engine python failed: Segmentation fault (core dumped)"


def test_reference_request_reaches_the_interpreter_on_stdin(tmp_path):
    fake = _script(tmp_path, "python", 'req=$(cat)\necho "{\\"references\\": [], \\"request\\": $req}"\n')
    out = _reference.greedy_reference("/models/tiny", ["a"], max_new_tokens=3, python=fake, timeout=30)
    assert out["request"] == {"model_path": "/models/tiny", "prompts": ["a"], "max_new_tokens": 3, "dtype": "float32"}


def test_find_bin_looks_where_get_bin_path_looks(tmp_path, monkeypatch):
    tool = _script(tmp_path, "nvidia-smi", "exit 0\n")
    plain = tmp_path / "not-executable"
    plain.write_text("")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _preflight.find_bin("nvidia-smi") == tool
    assert _preflight.find_bin(tool) == tool
    assert _preflight.find_bin("not-executable") is None and _preflight.find_bin(str(plain)) is None
    assert _preflight.find_bin("surely-no-such-tool") is None
    assert _preflight.gpu_inventory("surely-no-such-tool")["reason"] == "surely-no-such-tool not found"


def _alive_within(pid, alive, within=5.0):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if _process_run.pid_alive(pid) == alive:
            return True
        time.sleep(0.05)
    return False


def test_child_stop_ends_the_whole_group_and_kills_what_ignores_sigterm(tmp_path):
    pidfile = tmp_path / "worker.pid"
    log = tmp_path / "warmup.log"
    # the leader ignores SIGTERM (SIGKILL after the grace period); its worker is a plain sleep
    cmd = ["sh", "-c", "trap '' TERM; sleep 60 & echo $! > %s; echo started; while :; do sleep 0.1; done" % pidfile]
    child = _process_run.Child(cmd, str(log))
    deadline = time.monotonic() + 5
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(pidfile.read_text())
    assert child.wait(0.2) is None and child.returncode is None
    t0 = time.monotonic()
    child.stop(grace=0.5)
    assert time.monotonic() - t0 < 5
    assert child.returncode == -9
    assert _alive_within(worker, False)
    assert "started" in log.read_text()


def test_stop_group_of_a_group_that_is_gone_sends_nothing():
    child = _process_run.Child([sys.executable, "-c", "pass"], os.devnull)
    assert child.wait(10) == 0
    assert _process_run.stop_group(child.pid, 1) is None
    child.stop()
