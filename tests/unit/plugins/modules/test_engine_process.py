"""engine_process: real child processes, real exit statuses."""
from __future__ import annotations

import json
import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process
from ansible_collections.llmops.serving.plugins.modules import engine_process

SLEEPER = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(120)"]


def _args(tmp_path, **kw):
    a = {"name": "eng", "run_dir": str(tmp_path), "command": SLEEPER, "startup_grace": 0.5, "stop_timeout": 5}
    a.update(kw)
    return a


def test_start_is_idempotent_and_restart_on_changed_spec(run_module, tmp_path):
    r1 = run_module(engine_process, _args(tmp_path))
    try:
        assert r1["changed"] and r1["state"] == "running"
        assert _process_run.pid_alive(r1["pid"])
        r2 = run_module(engine_process, _args(tmp_path))
        assert not r2["changed"] and r2["pid"] == r1["pid"]
        r3 = run_module(engine_process, _args(tmp_path, env={"X": "value-of-x-7"}))
        assert r3["changed"] and r3["pid"] != r1["pid"]
        assert not _process_run.pid_alive(r1["pid"])
        # the env value is never written in clear into results (the name is, masked, in invocation)
        assert "value-of-x-7" not in json.dumps(r3)
        assert r3["invocation"]["module_args"]["env"] == {"X": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}
    finally:
        r4 = run_module(engine_process, _args(tmp_path, state="stopped"))
    assert r4["changed"] and r4["state"] == "exited"
    assert r4["signal"] == 15 and r4["stop_requested"] is True
    assert not run_module(engine_process, _args(tmp_path, state="stopped"))["changed"]


def test_immediate_crash_fails_with_the_real_exit_status(run_module, tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('bad flag --foo', file=sys.stderr); sys.exit(2)"]
    r = run_module(engine_process, _args(tmp_path, command=cmd, startup_grace=2))
    assert r["failed"]
    assert "exit status 2" in r["msg"]
    assert r["returncode"] == 2
    assert any("bad flag --foo" in line for line in r["log_tail"])


def test_late_crash_is_recorded_not_masked(run_module, tmp_path):
    cmd = [sys.executable, "-c", "import time, sys; time.sleep(1.5); sys.exit(7)"]
    r = run_module(engine_process, _args(tmp_path, command=cmd, startup_grace=0.2))
    assert r["changed"] and r["state"] == "running"
    for dummy in range(100):
        st = run_module(engine_process, _args(tmp_path, state="status"))
        if st["state"] != "running":
            break
        time.sleep(0.1)
    assert st["state"] == "exited" and st["returncode"] == 7
    # the next start reports what happened before
    r2 = run_module(engine_process, _args(tmp_path, command=SLEEPER))
    try:
        assert r2["previous"]["returncode"] == 7
    finally:
        run_module(engine_process, _args(tmp_path, state="stopped"))


def test_check_mode_starts_nothing(run_module, tmp_path):
    r = run_module(engine_process, _args(tmp_path), check_mode=True)
    assert r["changed"]
    assert _process.read_state(str(tmp_path), "eng")["state"] == "absent"


def test_started_requires_command(run_module, tmp_path):
    r = run_module(engine_process, {"name": "eng", "run_dir": str(tmp_path)})
    assert r["failed"] and "command" in r["msg"]
