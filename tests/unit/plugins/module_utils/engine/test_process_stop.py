"""engine_process ``stopped`` after its supervisor was SIGKILLed: SIGTERM to the engine's process group first,
SIGKILL only after ``stop_timeout``, found through /proc even when the run dir is gone.

The engine is a real Python process with a worker child in its process group (as vLLM's TP workers are); both
write a line to a file outside the run dir when they receive SIGTERM.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_state
from ansible_collections.llmops.serving.plugins.modules import engine_process
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import engines

ENGINE = r'''
import os, signal, subprocess, sys, time
marks, token, mode, role = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def note(line):
    with open(marks, "a") as f:
        f.write("%s %s\n" % (role, line))
def on_term(signum, frame):
    note("TERM")
    if mode == "exit":
        os._exit(0)
signal.signal(signal.SIGTERM, on_term)
if role == "engine":
    subprocess.Popen([sys.executable, "-c", sys.argv[5], marks, token, mode, "worker", sys.argv[5]])
note("up")
while True:
    time.sleep(0.05)
'''


def _marks(path):
    try:
        with open(str(path)) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def _start(run_module, tmp_path, token, mode, stop_timeout):
    marks = tmp_path / "marks.txt"
    args = {"name": "eng", "run_dir": str(tmp_path / "run"), "startup_grace": 0.2, "stop_timeout": stop_timeout,
            "command": [sys.executable, "-c", ENGINE, str(marks), token, mode, "engine", ENGINE]}
    r = run_module(engine_process, args)
    assert r["changed"] and r["state"] == "running", r
    assert _wait(lambda: sorted(_marks(marks)) == ["engine up", "worker up"]), _marks(marks)
    assert len(engines(token)) == 2
    return args, r, marks


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _kill_supervisor(r):
    os.kill(r["supervisor_pid"], signal.SIGKILL)
    assert _wait(lambda: not _alive(r["supervisor_pid"]))


def test_stopped_after_sigkilled_supervisor_sends_sigterm_to_the_process_group(run_module, tmp_path, token):
    args, r, marks = _start(run_module, tmp_path, token, "exit", stop_timeout=5)
    _kill_supervisor(r)
    t0 = time.monotonic()
    stopped = run_module(engine_process, dict(args, state="stopped"))
    took = time.monotonic() - t0
    assert stopped["changed"] and stopped["state"] == "exited"
    assert stopped["supervisor_lost"] and stopped["stop_signal"] == signal.SIGTERM
    assert sorted(m for m in _marks(marks) if m.endswith("TERM")) == ["engine TERM", "worker TERM"]
    assert engines(token) == []
    assert took < 5  # the engine left on SIGTERM; no wait for the SIGKILL deadline
    st = run_module(engine_process, dict(args, state="status"))
    assert st["state"] == "exited" and st["returncode"] is None and st["supervisor_lost"]
    assert "unknown status" in _process_state.describe_exit(st)


def test_started_after_sigkilled_supervisor_keeps_the_engine_and_says_so(run_module, tmp_path, token):
    args, r, marks = _start(run_module, tmp_path, token, "exit", stop_timeout=5)
    _kill_supervisor(r)
    again = run_module(engine_process, args)
    assert not again["changed"] and again["pid"] == r["pid"] and again["supervisor_lost"]
    assert any("without its supervisor" in w and "restarted" in w for w in again["warnings"])
    assert len(engines(token)) == 2
    # restarted puts it back under a supervisor: a new engine, the old group gone
    back = run_module(engine_process, dict(args, state="restarted"))
    assert back["changed"] and back["pid"] != r["pid"] and not back["supervisor_lost"]
    assert _wait(lambda: len(engines(token)) == 2 and r["pid"] not in engines(token))


def test_engine_ignoring_sigterm_is_killed_after_the_grace_period_even_without_run_dir(run_module, tmp_path, token):
    args, r, marks = _start(run_module, tmp_path, token, "ignore", stop_timeout=1)
    _kill_supervisor(r)
    shutil.rmtree(args["run_dir"])  # supervisor killed and state file gone: only /proc knows the engine

    t0 = time.monotonic()
    stopped = run_module(engine_process, dict(args, state="stopped"))
    took = time.monotonic() - t0
    assert stopped["changed"] and stopped["state"] == "exited"
    assert stopped["stop_signal"] == signal.SIGKILL and stopped["pid"] == r["pid"]
    assert sorted(m for m in _marks(marks) if m.endswith("TERM")) == ["engine TERM", "worker TERM"]
    assert engines(token) == []
    assert 1.0 <= took < 6
    # what happened is on disk again for the next run
    assert run_module(engine_process, dict(args, state="status"))["state"] == "exited"
