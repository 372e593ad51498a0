"""playbooks/site.yml on inventories/local: the kernel-cache warm-up runs the engine's own command line.

The engine role publishes the argv it starts (tasks_from: argv, before the kernel cache); the local inventory's
warm-up runs it on the next port. A stand-in for ``python -m vllm.entrypoints.openai.api_server`` (set as
``engine_local_python``) records the argv of every start and answers like the API server, so no engine runs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

FAKE_ENGINE = r"""#!%s
# Stands in for `python -m vllm.entrypoints.openai.api_server ...`: records its argv, writes one compile-cache
# entry where the kernel cache points the engine, and serves /health, /v1/models and /v1/completions.
import http.server, json, os, sys

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
name = args[args.index("--served-model-name") + 1]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv-%%d.json" %% port), "w") as f:
    json.dump(sys.argv, f)
triton = os.environ.get("TRITON_CACHE_DIR")
if triton and not os.path.isdir(os.path.join(triton, "KEY")):
    os.makedirs(os.path.join(triton, "KEY"))
    with open(os.path.join(triton, "KEY", "k.cubin"), "wb") as f:
        f.write(b"\x7fELF" * 64)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send({"object": "list", "data": [{"id": name, "object": "model"}]})
        else:
            self._send({})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"choices": [{"index": 0, "text": " is staged", "finish_reason": "length"}]})


http.server.ThreadingHTTPServer((args[args.index("--host") + 1], port), Handler).serve_forever()
"""


def _free_pair(start=18430, stop=18470):
    """Two consecutive free loopback ports (the engine's and the warm-up's)."""
    for port in range(start, stop, 2):
        socks = []
        try:
            for p in (port, port + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no two free ports in %d-%d" % (start, stop))


def _run(playbook, root, port, extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"), LLMOPS_ROOT=str(root),
               LLMOPS_ENGINE_PORT=str(port), ANSIBLE_LOCAL_TEMP=str(root / "ansible-tmp"),
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(ROOT, "inventories", "local"),
                           os.path.join(ROOT, playbook), "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def site(tmp_path):
    fake = tmp_path / "bin" / "fake-engine"
    fake.parent.mkdir()
    fake.write_text(FAKE_ENGINE % sys.executable)
    fake.chmod(0o755)
    port = _free_pair()
    extra = {
        "engine_local_python": str(fake),
        # the fake serves no tokens to compare with transformers, and imports none of the engine's modules
        "engine_reference_check": False,
        "preflight_engine_modules": ["json"],
        # arguments the role appends: both starts must carry them
        "engine_local_args": ["--dtype", "bfloat16", "--seed", "7"],
    }
    yield dict(root=tmp_path / "root", port=port, extra=extra, records=fake.parent)
    _run("playbooks/stop.yml", tmp_path / "root", port, {})


def test_warmup_runs_the_engines_argv_on_the_next_port(site):
    root, port = site["root"], site["port"]
    root.mkdir()
    rc, out = _run("playbooks/site.yml", root, port, site["extra"])
    assert rc == 0, out[-5000:]
    with open(str(site["records"] / ("argv-%d.json" % (port + 1)))) as f:
        warmup = json.load(f)
    with open(str(site["records"] / ("argv-%d.json" % port))) as f:
        engine = json.load(f)
    with open(str(root / "run" / "engine" / "spec.json")) as f:
        assert json.load(f)["command"] == engine  # what engine_process started is what the fake recorded
    # the same command line, the listen port apart
    i = engine.index("--port") + 1
    assert (engine[i], warmup[i]) == (str(port), str(port + 1))
    assert warmup[:i] + warmup[i + 1:] == engine[:i] + engine[i + 1:]
    assert engine[:3] == [str(site["records"] / "fake-engine"), "-m", "vllm.entrypoints.openai.api_server"]
    assert engine[engine.index("--seed") + 1] == "7"
    assert "kernel cache vllm/" in out and "(built in" in out
