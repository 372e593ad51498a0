"""engine_process ``env`` values are no_log: never in the result, error text or any file the module writes.

The module runs as Ansible runs it (a real process reading its arguments on stdin, AnsibleModule's own
exit_json/fail_json with no_log masking), so ``invocation`` (what -vvv and AWX job events show) is the real one.
The engine still receives the values, through its process environment.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

import ansible_collections.llmops.serving as collection

TREE = os.path.dirname(os.path.dirname(os.path.dirname(list(collection.__path__)[0])))
MODULE = "ansible_collections.llmops.serving.plugins.modules.engine_process"
MASK = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def run_real(args):
    """Run the module like Ansible does; returns (result, raw stdout)."""
    out = subprocess.run([sys.executable, "-m", MODULE], input=json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=TREE),
                         timeout=60, check=False)
    raw = out.stdout.decode()
    return json.loads(raw), raw


@pytest.fixture
def secrets(tmp_path):
    s = {"token": "hf_%s" % uuid.uuid4().hex, "setting": "plain-%s" % uuid.uuid4().hex[:8]}
    started = []
    yield s, started
    for pid in started:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _files(root):
    for dirpath, dummy, names in os.walk(str(root)):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                yield os.path.join(dirpath, n), f.read()


def test_env_values_never_reach_result_or_files_but_reach_the_engine(tmp_path, secrets):
    s, started = secrets
    run_dir = tmp_path / "run"
    env = {"HF_TOKEN": s["token"], "MY_SETTING": s["setting"], "VLLM_CPU_KVCACHE_SPACE": "1"}
    args = {"name": "eng", "run_dir": str(run_dir), "env": env, "startup_grace": 0.3, "stop_timeout": 5,
            "command": [sys.executable, "-c", "import time; time.sleep(60)"]}
    r, raw = run_real(args)
    started.append(r.get("pid"))
    assert r["changed"] and r["state"] == "running", r
    assert s["token"] not in raw and s["setting"] not in raw
    assert r["invocation"]["module_args"]["env"] == {k: MASK for k in env}
    # a short value like "1" does not mask the numbers and paths the result is for
    assert isinstance(r["pid"], int) and isinstance(r["started_at"], float)
    assert r["log_file"] == str(run_dir / "eng" / "eng.log")

    for path, data in _files(run_dir):
        assert s["token"].encode() not in data and s["setting"].encode() not in data, path
    with open("/proc/%d/environ" % r["pid"], "rb") as f:
        environ = f.read().split(b"\0")
    assert ("HF_TOKEN=%s" % s["token"]).encode() in environ
    assert ("MY_SETTING=%s" % s["setting"]).encode() in environ

    # status, restart on a changed secret, stop: still nothing in clear
    for extra in ({"state": "status"}, {"env": dict(env, HF_TOKEN=s["token"] + "x")}, {"state": "stopped"}):
        r2, raw2 = run_real(dict(args, **extra))
        started.append(r2.get("pid"))
        assert not r2.get("failed"), r2
        assert s["token"] not in raw2 and s["setting"] not in raw2
    assert r2["state"] == "exited"
    for path, data in _files(run_dir):
        assert s["token"].encode() not in data, path


def test_env_values_stay_out_of_error_results(tmp_path, secrets):
    s, started = secrets
    base = {"name": "eng", "run_dir": str(tmp_path / "run"), "startup_grace": 1,
            "env": {"HF_TOKEN": s["token"], "MY_SETTING": s["setting"]}}
    failures = [
        # the engine crashes at start-up
        dict(base, command=[sys.executable, "-c", "import sys; sys.exit(3)"]),
        # refused inputs, before anything starts
        dict(base, command=["bash", "-c", "vllm serve | tee log"]),
        dict(base, command=[sys.executable, "-c", "pass"], env=dict(base["env"], **{"BAD-NAME": s["token"]})),
        dict(base, name="../x", command=[sys.executable, "-c", "pass"]),
        # the engine prints its token; the log tail in the result is masked
        dict(base, command=[sys.executable, "-c", "import os, sys; print('token', os.environ['HF_TOKEN']); sys.exit(4)"]),
    ]
    for args in failures:
        r, raw = run_real(args)
        assert r.get("failed"), r
        assert s["token"] not in raw and s["setting"] not in raw, r["msg"]
    assert any("********" in line for line in r["log_tail"])


def test_credential_on_the_command_line_is_masked_in_result_and_files(tmp_path, secrets):
    """``--api-key X`` (vLLM, SGLang) in the command: masked in the result, spec.json and the log banner."""
    s, started = secrets
    run_dir = tmp_path / "run"
    key = "sk-%s" % uuid.uuid4().hex
    args = {"name": "eng", "run_dir": str(run_dir), "startup_grace": 0.3, "stop_timeout": 5,
            "command": [sys.executable, "-c", "import time; time.sleep(60)", "--port", "1", "--api-key", key]}
    r, raw = run_real(args)
    started.append(r.get("pid"))
    assert r["changed"] and r["state"] == "running", r
    assert key not in raw and isinstance(r["pid"], int)
    assert any("credential" in str(w) and "/proc/<pid>/cmdline" in str(w) for w in r["warnings"])
    for path, data in _files(run_dir):
        assert key.encode() not in data, path
    with open("/proc/%d/cmdline" % r["pid"], "rb") as f:
        assert key.encode() in f.read().split(b"\0")  # the engine got the real argument
    r2, raw2 = run_real(dict(args, state="stopped"))
    assert r2["state"] == "exited" and key not in raw2
