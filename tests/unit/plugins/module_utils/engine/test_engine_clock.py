"""A local engine's durations never come from the wall clock (``common/_clock``).

Before: the supervisor timed its stop on ``time.time()`` (a clock stepped back after SIGTERM: SIGKILL never came;
stepped ahead: SIGKILL at once, no grace); ``engine_probe``'s ``probe_seconds`` was a difference of two wall
readings; ``engine_diagnose`` judged an engine "hung" from ``time.time()`` minus the supervisor's ``started_at``
(a clock a year ahead made a loading engine hung) and said how long ago it ended the same way.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose_local, _probe, _process
from ansible_collections.llmops.serving.plugins.module_utils.engine._diagnose import command_facts
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import engines

YEAR = 365 * 86400.0
ENGINE = r'''
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1], "a").write("TERM\n"))
open(sys.argv[1], "a").write("up\n")
while True:
    time.sleep(0.05)
'''
#: runs the supervisor with ``time.time`` stepping ``STEP`` seconds at every call (a clock being stepped)
STEPPING = r'''
import runpy, sys, time
real, calls, step = time.time, [0], float(sys.argv[1])
def stepping():
    calls[0] += 1
    return real() + calls[0] * step
time.time = stepping
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _wait(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _stepping_python(tmp_path, step):
    wrapper = tmp_path / "python"
    quoted = STEPPING.replace("'", "'\"'\"'")
    wrapper.write_text("#!/bin/sh\nexec %s -c '%s' %s \"$@\"\n" % (sys.executable, quoted, step))
    wrapper.chmod(0o755)
    return str(wrapper)


def _start_ignoring_term(tmp_path, token, stop_timeout, step):
    marks = tmp_path / "marks"
    st = _process.start(str(tmp_path / "run"), "eng", [sys.executable, "-c", ENGINE, str(marks), token],
                        stop_timeout=stop_timeout, startup_grace=0.2, python=_stepping_python(tmp_path, step))
    assert _wait(lambda: marks.exists() and "up" in marks.read_text(), 10)
    os.kill(st["supervisor_pid"], signal.SIGTERM)  # what engine_process state=stopped sends
    assert _wait(lambda: "TERM" in marks.read_text(), 5)
    return marks


def test_the_stop_timeout_ends_an_engine_that_ignores_sigterm_with_the_wall_clock_running_backwards(tmp_path, token):
    """Before: ``time.time() - requested`` stayed negative and the engine was never SIGKILLed."""
    _start_ignoring_term(tmp_path, token, stop_timeout=1, step=-3600.0)
    assert _wait(lambda: not engines(token), 8), "the supervisor never sent SIGKILL"


def test_the_stop_timeout_is_a_grace_period_with_the_wall_clock_leaping_ahead(tmp_path, token):
    """Before: a year passed between two readings and SIGKILL came in the first second, the grace never given."""
    _start_ignoring_term(tmp_path, token, stop_timeout=3, step=YEAR)
    time.sleep(2.0)
    assert engines(token), "SIGKILLed before stop_timeout"
    assert _wait(lambda: not engines(token), 8)


def test_probe_seconds_is_a_duration_on_the_monotonic_clock(monkeypatch):
    real, calls = time.time, [0]

    def stepping():
        calls[0] += 1
        return real() + calls[0] * YEAR
    monkeypatch.setattr(time, "time", stepping)
    ok, _results, timeline, _warnings, _msg = _probe.run("http://127.0.0.1:9", "m", [], deadline=0)
    assert ok and 0 <= timeline["probe_seconds"] < 5  # before: a year


def _running_facts(tmp_path, running_s, started_at):
    state = {"state": "running", "pid": 4242, "pid_start": 1, "started_at": started_at}
    return {"name": "eng", "run_dir": str(tmp_path), "state": state,
            "command": command_facts([sys.executable, "-c", "pass"]), "log_file": str(tmp_path / "log"), "log": "",
            "model_missing": None, "stopped": [], "health": None, "port_holders": [],
            "ages": {"running_s": running_s, "ended_ago_s": None, "ran_s": None}}


@pytest.mark.parametrize("step", [YEAR, -YEAR])
def test_a_loading_engine_is_not_hung_because_the_wall_clock_moved(tmp_path, monkeypatch, step):
    real = time.time
    facts = _running_facts(tmp_path, 60.0, real() - 60.0)
    monkeypatch.setattr(time, "time", lambda: real() + step)
    res = _diagnose_local.diagnose_local(facts)
    assert res["verdict"] == "still_loading", res  # before: a year ahead read as 'engine_hung'
    assert "has been starting for 60 s" in res["findings"][0]["evidence"][0]


def test_a_loading_engine_past_any_cold_start_is_hung_by_its_process_age(tmp_path):
    res = _diagnose_local.diagnose_local(_running_facts(tmp_path, 3 * 3600.0, time.time()))
    assert res["verdict"] == "engine_hung" and "no cold start takes longer than" in json.dumps(res)


def test_an_unknown_age_is_shown_as_unknown_and_judges_nothing(tmp_path):
    res = _diagnose_local.diagnose_local(_running_facts(tmp_path, None, time.time() - 10 * 3600))
    assert res["verdict"] == "still_loading" and "has been starting for ?" in res["findings"][0]["evidence"][0]


def _proc(tmp_path, uptime):
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    (root / "uptime").write_text("%.2f 1.00\n" % uptime)
    return str(root)


def test_engine_ages_come_from_one_clock_each(tmp_path, monkeypatch):
    hz = os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(time, "time", lambda: 0.0)  # no wall reading of this process enters
    ages = _diagnose_local.engine_ages({"state": "running", "pid_start": 400 * hz}, str(tmp_path / "state.json"),
                                       _proc(tmp_path, 1000.0))
    assert ages == {"running_s": 600.0, "ended_ago_s": None, "ran_s": None}
    state = tmp_path / "state.json"
    state.write_text("{}")
    st = os.stat(str(state))
    os.utime(str(state), (st.st_atime, st.st_mtime - 300))  # the supervisor wrote it when the engine ended
    ages = _diagnose_local.engine_ages({"state": "exited", "started_at": 5000.0, "ended_at": 5090.0},
                                       str(state), _proc(tmp_path, 1000.0))
    assert 299.0 <= ages["ended_ago_s"] < 330.0 and ages["ran_s"] == 90.0
    # the supervisor's clock stepped back between start and end: 0, never a negative run
    assert _diagnose_local.engine_ages({"state": "exited", "started_at": 5090.0, "ended_at": 5000.0},
                                       str(state))["ran_s"] == 0.0


def test_an_ended_engine_says_how_long_ago_on_the_filesystem_clock(tmp_path, monkeypatch):
    """The message of an engine that exited: the wall clock a year ahead changes nothing."""
    run = str(tmp_path / "run")
    try:
        _process.start(run, "quick", [sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"],
                       startup_grace=0.1)
    except _process.ProcessError:
        pass
    assert _wait(lambda: _process.read_state(run, "quick")["state"] == "exited", 10)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + YEAR)
    res = _diagnose_local.diagnose_local(_diagnose_local.local_facts(run, "quick"))
    ended = [e for f in res["findings"] for e in f["evidence"] if e.startswith("it ended ")]
    assert ended and ended[0].split(" ago")[0] in ("it ended %d s" % s for s in range(0, 30)), ended
