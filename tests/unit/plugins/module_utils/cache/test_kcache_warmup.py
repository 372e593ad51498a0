"""The kernel-cache warm-up with real processes and a real loopback server: ``mode: serve`` polls through
``_probe.retry`` and ``_http``, and the warm-up's whole process group is stopped afterwards (``_process_run.Child``)."""
from __future__ import annotations

import os
import socket
import sys
import textwrap
import time

import pytest
from ansible.module_utils import urls  # noqa: F401  pylint: disable=unused-import

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache, _kcache_build
from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run

# _http imports ansible's opener on its first request; imported here, so that import (up to a second on a loaded
# machine) does not delay the first probe past the engine's start-up and the first probe meets a refused connection.

ENGINE = textwrap.dedent("""
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, answer, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    time.sleep(delay)  # loading: connections are refused meanwhile

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps({"choices": [{"text": answer + " " + body["prompt"]}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    print("serving on", port, flush=True)
    HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


class _Log(object):
    def __init__(self):
        self.lines = []

    def __call__(self, msg):
        self.lines.append(msg)


def _warmup(tmp_path, port, answer="OK", delay="0.4", expect="OK", timeout=30, mode="serve"):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    return {"command": [sys.executable, str(script), str(port), answer, delay], "mode": mode,
            "url": "http://127.0.0.1:%d/v1/completions" % port, "body": {"prompt": "The model is staged"},
            "expect": expect, "timeout": timeout}


def _gone(pid, within=5.0):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _process_run.pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_serve_mode_waits_for_the_first_correct_answer_then_stops_the_engine(tmp_path, free_port):
    port = free_port()
    log, logfile = _Log(), str(tmp_path / "prebuild.log")
    out = _kcache_build.run_warmup(_warmup(tmp_path, port), dict(os.environ), log, logfile, poll=0.1)
    assert out["response"] == "OK The model is staged"
    assert any(line.startswith("first correct response after") for line in log.lines)
    assert any(line.startswith("waiting for http://127.0.0.1:%d" % port) for line in log.lines)
    with open(logfile) as f:
        assert "serving on %d" % port in f.read()
    with pytest.raises(OSError):  # the engine was stopped: nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_serve_mode_fails_at_once_when_the_engine_exits(tmp_path, free_port):
    w = _warmup(tmp_path, free_port(), timeout=60)
    w["command"] = [sys.executable, "-c", "import sys; sys.exit(3)"]
    t0 = time.monotonic()
    with pytest.raises(_kcache.KCacheError, match=r"warmup_command exited 3 before answering; see "):
        _kcache_build.run_warmup(w, dict(os.environ), _Log(), str(tmp_path / "log"), poll=0.1)
    assert time.monotonic() - t0 < 10


def test_serve_mode_times_out_on_wrong_answers_and_says_what_came_back(tmp_path, free_port):
    port = free_port()
    w = _warmup(tmp_path, port, answer="garbage", delay="0", expect="OK", timeout=2)
    t0 = time.monotonic()
    with pytest.raises(_kcache.KCacheError) as e:
        _kcache_build.run_warmup(w, dict(os.environ), _Log(), str(tmp_path / "log"), poll=0.1)
    msg = str(e.value)
    assert msg.startswith("warmup_timeout: no correct response from http://127.0.0.1:%d/v1/completions after 2s" % port)
    assert "garbage The model is staged" in msg
    assert time.monotonic() - t0 < 10


def test_workers_left_behind_by_the_warmup_are_stopped(tmp_path):
    """A warm-up whose main process exits but leaves a worker in its process group (a compile worker, an
    engine's GPU process) does not keep running after the warm-up, writing into a directory being published."""
    pidfile = tmp_path / "worker.pid"
    w = {"command": ["sh", "-c", "sleep 60 & echo $! > %s; exit 0" % pidfile], "mode": "run", "timeout": 30}
    out = _kcache_build.run_warmup(w, dict(os.environ), _Log(), str(tmp_path / "log"))
    assert out["response"] is None
    assert _gone(int(pidfile.read_text()))


def test_a_warmup_command_that_cannot_start_names_it(tmp_path):
    w = {"command": [str(tmp_path / "no-such-engine")], "mode": "run"}
    with pytest.raises(_kcache.KCacheError, match="warmup_command: cannot start .*no-such-engine"):
        _kcache_build.run_warmup(w, dict(os.environ), _Log(), str(tmp_path / "log"))
