"""engine_process is one engine per name: concurrent starts, a deleted run dir, names that would leave run_dir.

Real supervisors and real engines (tiny Python sleepers whose argv carries a per-test token, so the test can
count the engines that really run by reading /proc/*/cmdline).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

import ansible_collections.llmops.serving as collection
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process
from ansible_collections.llmops.serving.plugins.modules import engine_process
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import engines

TREE = os.path.dirname(os.path.dirname(os.path.dirname(list(collection.__path__)[0])))
MODULE = "ansible_collections.llmops.serving.plugins.modules.engine_process"


def delete(path):
    """rm -rf as one step: the supervisor recreates its state file within a second, which can race rmtree."""
    gone = "%s.deleted-%s" % (path, uuid.uuid4().hex)
    os.rename(str(path), gone)
    shutil.rmtree(gone)


def sleeper(tok, seconds=60):
    return [sys.executable, "-c", "import time; time.sleep(%d)" % seconds, tok]


def _until_dead(pid, within=10.0):
    """Until ``pid`` has died (gone, or a zombie: no command line): a SIGKILL takes effect when the process is next
    scheduled, which on a loaded machine can be after the next look at /proc (it was then seen alive)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if not f.read():
                    return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError("pid %d still alive %.0f s after SIGKILL" % (pid, within))


def _args(run_dir, tok, **kw):
    a = {"name": "eng", "run_dir": str(run_dir), "command": sleeper(tok), "startup_grace": 0.5, "stop_timeout": 5}
    a.update(kw)
    return a


def test_concurrent_started_for_one_name_start_one_engine(tmp_path, token):
    """Four ``state: started`` at once (real module processes): one starts the engine, three report it."""
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": _args(tmp_path / "run", token)}).encode()
    env = dict(os.environ, PYTHONPATH=TREE)
    procs = [subprocess.Popen([sys.executable, "-m", MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env) for dummy in range(4)]
    for p in procs:  # all four are waiting for their arguments; release them together
        p.stdin.write(payload)
    for p in procs:
        p.stdin.close()
    results = []
    for p in procs:
        out = p.stdout.read()
        p.wait(timeout=60)
        p.stdout.close()
        p.stderr.close()
        results.append(json.loads(out))
    assert [r.get("failed", False) for r in results] == [False] * 4, results
    assert sorted(r["changed"] for r in results) == [False, False, False, True]
    assert {r["state"] for r in results} == {"running"}
    pids = {r["pid"] for r in results}
    assert len(pids) == 1
    assert engines(token) == sorted(pids)


def test_deleted_run_dir_does_not_orphan_the_engine(run_module, tmp_path, token):
    run_dir = tmp_path / "run"
    r1 = run_module(engine_process, _args(run_dir, token))
    assert r1["changed"] and r1["state"] == "running"
    delete(run_dir)

    r2 = run_module(engine_process, _args(run_dir, token))
    assert not r2.get("failed"), r2
    assert not r2["changed"] and r2["state"] == "running" and r2["pid"] == r1["pid"]
    assert engines(token) == [r1["pid"]]
    assert any("/proc/%d/fd/1" % r1["pid"] in w for w in r2["warnings"])  # where the deleted log still is

    st = run_module(engine_process, _args(run_dir, token, state="status"))
    assert st["state"] == "running" and st["pid"] == r1["pid"]

    # a changed spec replaces the engine: still exactly one
    r3 = run_module(engine_process, _args(run_dir, token, command=sleeper(token, 61)))
    assert r3["changed"] and r3["pid"] != r1["pid"]
    assert engines(token) == [r3["pid"]]

    delete(run_dir)
    r4 = run_module(engine_process, _args(run_dir, token, state="stopped"))
    assert r4["changed"] and r4["state"] == "exited"
    assert engines(token) == []


def test_engine_is_found_by_its_identity_when_the_state_file_lies(run_module, tmp_path, token):
    """A state file rewritten to 'exited' (restored backup, another tool) does not hide a running engine."""
    run_dir = tmp_path / "run"
    r1 = run_module(engine_process, _args(run_dir, token))
    os.kill(r1["supervisor_pid"], signal.SIGKILL)  # nothing rewrites state.json any more
    _until_dead(r1["supervisor_pid"])
    with open(r1["state_file"], "w") as f:
        json.dump({"state": "exited", "returncode": 0, "pid": 1}, f)
    r2 = run_module(engine_process, _args(run_dir, token))
    assert not r2["changed"] and r2["pid"] == r1["pid"] and r2["recovered"] and r2["supervisor_lost"]
    assert any("without its supervisor" in w for w in r2["warnings"])
    assert engines(token) == [r1["pid"]]


def test_identity_key_is_the_same_for_every_spelling_of_run_dir(tmp_path):
    real = tmp_path / "run"
    real.mkdir()
    os.symlink(str(real), str(tmp_path / "link"))
    key = _process.identity_key(str(real), "eng")
    assert _process.identity_key(str(tmp_path / "link"), "eng") == key
    assert _process.identity_key(str(real) + "/", "eng") == key
    assert _process.identity_key(str(real), "eng2") != key


@pytest.mark.parametrize("bad", ["../x", "ABS", "a/b", "", ".", "..", "../../etc"])
@pytest.mark.parametrize("state", ["started", "stopped"])
def test_name_cannot_escape_run_dir(run_module, tmp_path, token, bad, state):
    name = str(tmp_path / "abs") if bad == "ABS" else bad
    run_dir = tmp_path / "d1" / "run"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = run_module(engine_process, _args(run_dir, token, name=name, state=state))
    assert r["failed"]
    assert r["msg"].startswith("name: "), r["msg"]
    assert "name: vllm" in r["msg"] and r["reason"] == "bad_name"
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing created, inside or outside
    assert engines(token) == []


def test_name_through_a_symlink_is_refused(run_module, tmp_path, token):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(str(elsewhere), str(run_dir / "eng"))
    r = run_module(engine_process, _args(run_dir, token))
    assert r["failed"] and r["msg"].startswith("name: ") and "symlink" in r["msg"]
    assert os.listdir(str(elsewhere)) == []
    assert engines(token) == []


def test_relative_run_dir_is_refused(run_module, tmp_path, token):
    r = run_module(engine_process, _args("relative/run", token))
    assert r["failed"] and r["msg"].startswith("run_dir: ") and "absolute" in r["msg"]
    assert engines(token) == []
