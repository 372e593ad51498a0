"""A malformed ``state.json`` never stops engine_process from stopping its engine.

``state.json`` is written by the supervisor, but anything can replace it (another tool, a restored backup, a full
disk that truncated it, a hostile local user). Whatever it holds (wrong types, a nesting bomb, a FIFO, a
truncated document, ``10**400``, a pid that names another process) ``stopped`` still finds the engine by its
identity in ``/proc`` and stops it; the file is named in a warning, never followed into a hang or a traceback,
and a pid it names is never signalled unless that process carries the engine's identity.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_state
from ansible_collections.llmops.serving.plugins.modules import engine_process
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import engines


def _args(run_dir, tok, **kw):
    a = {"name": "eng", "run_dir": str(run_dir), "startup_grace": 0.2, "stop_timeout": 5,
         "command": [sys.executable, "-c", "import time; time.sleep(60)", tok]}
    a.update(kw)
    return a


def _start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def decoy():
    """A live process that is not the engine (as a state file could name one); killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def _wrong_types(r, decoy_pid):
    return json.dumps({"state": "running", "pid": [r["pid"]], "supervisor_pid": str(r["supervisor_pid"]),
                       "pid_start": {"x": 1}, "supervisor_start": True, "returncode": "0", "signal": [15],
                       "spec_hash": 7, "started_at": "yesterday"})


def _lies_about_pids(r, decoy_pid):
    # a live process with its real start time: the file is well formed, only its pids are not the engine's
    start = _start_time(decoy_pid)
    return json.dumps({"state": "running", "pid": decoy_pid, "pid_start": start, "supervisor_pid": decoy_pid,
                       "supervisor_start": start, "spec_hash": "0" * 16})


def _bool_pids(r, decoy_pid):
    return json.dumps({"state": "running", "pid": True, "supervisor_pid": True, "pid_start": None})


CONTENTS = {
    "wrong types": _wrong_types,
    "pids of another process": _lies_about_pids,
    "booleans for pids": _bool_pids,
    "nesting bomb": lambda r, d: "[" * 100000 + "]" * 100000,
    "truncated": lambda r, d: json.dumps({"state": "running", "pid": r["pid"]})[:17],
    "number 10**400": lambda r, d: '{"state": "running", "pid": 1%s}' % ("0" * 400),
    "NaN": lambda r, d: '{"state": "running", "pid": NaN}',
    "not an object": lambda r, d: "[1, 2, 3]",
    "oversized": lambda r, d: json.dumps({"state": "running", "pad": "x" * (1 << 20)}),
    "not UTF-8": lambda r, d: b'{"state": "\xff\xfe"}',
}


def _replace_state(path, content):
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode())
    os.replace(tmp, path)


@pytest.mark.parametrize("supervisor", ["alive", "killed"])
@pytest.mark.parametrize("kind", sorted(CONTENTS))
def test_stopped_stops_the_engine_whatever_the_state_file_holds(run_module, tmp_path, token, decoy, kind, supervisor):
    args = _args(tmp_path / "run", token)
    r = run_module(engine_process, args)
    assert r["changed"] and r["state"] == "running", r
    if supervisor == "killed":
        os.kill(r["supervisor_pid"], signal.SIGKILL)
        end = time.monotonic() + 5
        while _alive(r["supervisor_pid"]) and time.monotonic() < end:
            time.sleep(0.02)
    _replace_state(r["state_file"], CONTENTS[kind](r, decoy))

    status = run_module(engine_process, dict(args, state="status"))
    assert not status.get("failed"), status
    assert status["state"] == "running" and status["pid"] == r["pid"]
    assert r["state_file"] in status["state_file_error"]
    assert any(r["state_file"] in w and "identity" in w for w in status["warnings"]), status["warnings"]

    stopped = run_module(engine_process, dict(args, state="stopped"))
    assert not stopped.get("failed"), stopped
    assert stopped["changed"] and stopped["state"] == "exited"
    assert engines(token) == []
    assert _alive(decoy), "a pid named only by the state file was signalled"


def test_a_fifo_state_file_neither_hangs_nor_hides_the_engine(run_module, tmp_path, token):
    args = _args(tmp_path / "run", token)
    r = run_module(engine_process, args)
    os.kill(r["supervisor_pid"], signal.SIGKILL)
    os.unlink(r["state_file"])
    os.mkfifo(r["state_file"])  # opening it for reading would block forever without O_NONBLOCK
    t0 = time.monotonic()
    stopped = run_module(engine_process, dict(args, state="stopped"))
    assert time.monotonic() - t0 < 5
    assert stopped["changed"] and stopped["state"] == "exited" and stopped["pid"] == r["pid"]
    assert "FIFO" in " ".join(stopped["warnings"])
    assert engines(token) == []
    # engine_probe's reader of the same file: absent, not a hang
    assert _process_state.read_state_file(r["state_file"]) == {"state": "absent"} or \
        _process_state.read_state_file(r["state_file"])["state"] == "exited"


def test_state_fields_of_the_wrong_type_are_dropped_and_named():
    st, dropped = _process_state.clean_state({"state": "running", "pid": "12", "supervisor_pid": 0, "pid_start": -1,
                                              "signal": 15.0, "returncode": None, "started_at": 3, "x" * 100: 1})
    assert st == {"state": "running", "started_at": 3.0, "returncode": None}
    assert dropped == sorted(["pid", "supervisor_pid", "pid_start", "signal", "x" * 64 + "..."])
    assert _process_state.clean_state({"state": "dancing"}) == ({}, ["state"])


def test_describe_exit_of_a_state_file_with_a_list_for_signal_does_not_raise(tmp_path):
    path = str(tmp_path / "state.json")
    with open(path, "w") as f:
        json.dump({"state": "exited", "signal": [9], "returncode": "x"}, f)
    st = _process_state.read_state_file(path)
    assert st["state"] == "exited" and "signal" not in st
    assert _process_state.describe_exit(st) == "exit status None"


def test_a_state_file_naming_another_live_process_after_the_engine_is_gone_signals_nothing(
        run_module, tmp_path, token, decoy):
    """Engine and supervisor are gone; the state file names a live session leader with its true start time.
    It runs another command than spec.json records, so it is not taken for the engine."""
    args = _args(tmp_path / "run", token)
    r = run_module(engine_process, args)
    os.kill(r["supervisor_pid"], signal.SIGKILL)
    os.killpg(r["pid"], signal.SIGKILL)
    end = time.monotonic() + 5
    while (engines(token) or _alive(r["supervisor_pid"])) and time.monotonic() < end:
        time.sleep(0.02)
    _replace_state(r["state_file"], _lies_about_pids(r, decoy))
    stopped = run_module(engine_process, dict(args, state="stopped"))
    assert not stopped.get("failed"), stopped
    assert not stopped["changed"] and stopped["state"] == "lost"
    assert _alive(decoy)
