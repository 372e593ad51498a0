"""engine_diagnose as a module: recorded objects, a loopback Kubernetes API, and real engine_process engines.

The local cases start real processes under engine_process (tests/unit/fixtures/diagnose/fake_engine.py: real
argparse, file and socket errors) and judge them with real signals, real sockets and a real GET /health.
"""
from __future__ import annotations

import builtins
import http.server
import json
import os
import signal
import socket
import sys
import threading
import time

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process, _process_state
from ansible_collections.llmops.serving.plugins.modules import engine_diagnose

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "diagnose")
FAKE = os.path.join(FIX, "fake_engine.py")


def _fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return yaml.safe_load(f)


def _port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- Kubernetes, recorded objects ----------------------------------------------------------------


def _k8s_args(fx, **kw):
    a = {"namespace": fx["namespace"], "name": fx["name"], "served_model_name": fx.get("served_model_name"),
         "objects": fx["objects"], "logs": fx.get("logs") or {}}
    a.update(kw)
    return a


@pytest.mark.parametrize("check_mode", [False, True])
def test_recorded_objects_give_the_verdict_and_change_nothing(run_module, check_mode):
    fx = _fixture("sglang_completed_exit0.yaml")
    r = run_module(engine_diagnose, _k8s_args(fx), check_mode=check_mode)
    assert not r.get("failed") and r["changed"] is False
    assert r["verdict"] == "crash_exit_zero"
    assert r["summary"].startswith("crash_exit_zero: pod llm-prod/qwen35-397b-sglang-6b7f8c9d5-zt2lr container engine")
    f = r["findings"][0]
    assert set(f) == {"code", "severity", "object", "evidence", "hint"}
    assert any("TypeError: 'NoneType' object cannot be interpreted as an integer" in e for e in f["evidence"])


def test_recorded_objects_are_judged_when_they_were_read_not_at_the_replay_clock(run_module):
    # the pod was created at 08:00:05 and the newest event is 08:19:40: pending for about 20 minutes when the
    # objects were read, however long ago that was
    fx = _fixture("unschedulable_gpus.yaml")
    r = run_module(engine_diagnose, _k8s_args(fx))
    assert r["verdict"] == "unschedulable_gpus"
    assert "not scheduled for 19 min" in r["summary"], r["summary"]


def test_objects_need_no_kubernetes_client(run_module, monkeypatch):
    real_import = builtins.__import__

    def no_kubernetes(name, *args, **kwargs):
        if name == "kubernetes" or name.startswith("kubernetes.") or ".k8s.client" in name:
            raise ImportError("No module named %r" % name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kubernetes)
    fx = _fixture("route_dotted_service.yaml")
    assert run_module(engine_diagnose, _k8s_args(fx))["verdict"] == "route_backend_not_found"
    r = run_module(engine_diagnose, _k8s_args(fx, objects=None))
    assert r["failed"] and "required Python library (kubernetes)" in r["msg"] and "objects" in r["msg"]


def test_logs_of_the_wrong_shape_are_refused_naming_the_key(run_module):
    fx = _fixture("healthy_vllm.yaml")
    r = run_module(engine_diagnose, _k8s_args(fx, logs={"pod-a/engine": {"older": "x"}}))
    assert r["failed"] and r["msg"].startswith("logs: the value of pod-a/engine must be")


def test_kubernetes_needs_a_namespace(run_module):
    r = run_module(engine_diagnose, {"name": "glm", "objects": []})
    assert r["failed"] and "namespace" in r["msg"]


# ---- Kubernetes, read from a loopback API server -------------------------------------------------


class _Api(http.server.BaseHTTPRequestHandler):
    """Answers list and log requests from recorded objects, like the API server (raw JSON)."""

    objects = []
    logs = {}
    seen = []
    discovery = {"/version": {"major": "1", "minor": "33", "gitVersion": "v1.33.0"},
                 "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
                 "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}}

    fail_pods = False

    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0]
        self.seen.append(self.path)
        if self.fail_pods and path.endswith("/pods"):
            return self._send(500, {"kind": "Status", "status": "Failure", "code": 500, "reason": "InternalError",
                                    "message": "etcdserver: request timed out"})
        routes = {"/api/v1/namespaces/%s/pods": "Pod", "/api/v1/namespaces/%s/events": "Event",
                  "/api/v1/namespaces/%s/services": "Service",
                  "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices": "EndpointSlice",
                  "/apis/gateway.networking.k8s.io/v1beta1/namespaces/%s/referencegrants": "ReferenceGrant",
                  "/apis/gateway.networking.k8s.io/v1/namespaces/%s/httproutes": "HTTPRoute",
                  "/apis/apps/v1/namespaces/%s/deployments": "Deployment"}
        for pattern, kind in routes.items():
            head, tail = pattern.split("%s")
            if path.startswith(head) and path.endswith(tail) and "/" not in path[len(head):-len(tail)]:
                ns = path[len(head):-len(tail)]
                items = [o for o in self.objects if o["kind"] == kind and o["metadata"].get("namespace") == ns]
                return self._send(200, {"kind": kind + "List", "apiVersion": "v1", "items": items})
        if path.endswith("/log"):
            pod = path.split("/")[-2]
            container = [q.split("=", 1)[1] for q in self.path.split("?", 1)[1].split("&") if q.startswith("container=")][0]
            which = "previous" if "previous=true" in self.path else "current"
            text = (self.logs.get("%s/%s" % (pod, container)) or {}).get(which)
            if text is None:
                return self._send(400, {"kind": "Status", "status": "Failure", "code": 400, "reason": "BadRequest",
                                        "message": "previous terminated container not found"})
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        if path in self.discovery:
            return self._send(200, self.discovery[path])
        return self._send(404, {"kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound",
                                "message": "the server could not find the requested resource"})

    def _send(self, code, data):
        body = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def api_server(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": "http://127.0.0.1:%d" % server.server_address[1]}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}],
        "users": [{"name": "lab", "user": {"token": "not-a-real-token"}}]}))
    yield str(kubeconfig)
    server.shutdown()
    server.server_close()


def test_reads_the_cluster_through_the_kubernetes_core_auth_options(run_module, api_server):
    fx = _fixture("sglang_completed_exit0.yaml")
    _Api.objects = [dict(o) for o in fx["objects"]]
    _Api.logs = fx["logs"]
    _Api.seen = []
    r = run_module(engine_diagnose, {"namespace": fx["namespace"], "name": fx["name"], "kubeconfig": api_server},
                   check_mode=True)
    assert not r.get("failed"), r
    assert r["verdict"] == "crash_exit_zero"
    assert any("TypeError: 'NoneType'" in e for e in r["findings"][0]["evidence"])
    # the previous container's log was read, and the CRDs that are not installed here were skipped
    assert any("/log?" in p and "previous=true" in p for p in _Api.seen)
    assert any("leaderworkersets" in p for p in _Api.seen)


def test_an_api_error_while_reading_is_a_clean_failure(run_module, api_server, monkeypatch):
    monkeypatch.setattr(_Api, "fail_pods", True)
    r = run_module(engine_diagnose, {"namespace": "llm-lab", "name": "glm", "kubeconfig": api_server})
    assert r["failed"] and r["msg"].startswith("reading namespace llm-lab from the cluster failed: the API server "
                                               "answered 500 Internal Server Error; check")


def test_an_unreachable_cluster_is_a_clean_failure(run_module, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": "http://127.0.0.1:%d" % _port()}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}],
        "users": [{"name": "lab", "user": {"token": "not-a-real-token"}}]}))
    r = run_module(engine_diagnose, {"namespace": "llm-lab", "name": "glm", "kubeconfig": str(kubeconfig)})
    assert r["failed"] and r["msg"].startswith("kubeconfig: cannot create a Kubernetes API client")
    assert "not-a-real-token" not in json.dumps(r)


# ---- local: real engines under engine_process ---------------------------------------------------


def _start(tmp_path, name, argv, grace=0.3):
    """Start ``argv`` under engine_process; an engine that dies at once is recorded (not raised)."""
    try:
        _process.start(str(tmp_path), name, argv, startup_grace=grace)
    except _process_state.ProcessError:
        pass


def _wait_exited(tmp_path, name, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _process.read_state(str(tmp_path), name)["state"] != "running":
            return
        time.sleep(0.05)
    raise AssertionError("engine did not exit")


def _wait_for(check, timeout=20):
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "the fake engine did not get there in %ds" % timeout
        time.sleep(0.05)


def _proc_state(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _listens(port):
    def check():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    return check


def _logged(tmp_path, name, text):
    return lambda: text in (open(_process_state.paths(str(tmp_path), name)["log"]).read())


def _diagnose(run_module, tmp_path, name, **kw):
    r = run_module(engine_diagnose, dict({"platform": "local", "run_dir": str(tmp_path), "name": name,
                                          "health_timeout": 1.0}, **kw))
    assert not r.get("failed"), r
    return r


def _evidence(r):
    return "\n".join(e for f in r["findings"] for e in f["evidence"])


def test_local_bad_argument_exit_2(run_module, tmp_path):
    _start(tmp_path, "eng", [sys.executable, FAKE, "serve", "--max-model-len", "not-a-number"], grace=2)
    r = _diagnose(run_module, tmp_path, "eng")
    assert r["verdict"] == "bad_argument"
    assert "fake_engine.py: error: argument --max-model-len: invalid int value: 'not-a-number'" in r["summary"]


def test_local_sigkill_is_a_crash_by_signal(run_module, tmp_path):
    _start(tmp_path, "eng", [sys.executable, FAKE, "sleep", "--port", str(_port())])
    _wait_for(_logged(tmp_path, "eng", "Loading safetensors"))
    pid = _process.read_state(str(tmp_path), "eng")["pid"]
    os.kill(pid, signal.SIGKILL)
    _wait_exited(tmp_path, "eng")
    r = _diagnose(run_module, tmp_path, "eng")
    assert r["verdict"] == "crashed"
    assert "the engine ended with signal 9 (SIGKILL)" in r["summary"]
    assert "OOM killer" in r["findings"][0]["hint"]


def test_local_missing_model_dir(run_module, tmp_path):
    missing = str(tmp_path / "models" / "tiny" / "0123abc")
    _start(tmp_path, "eng", [sys.executable, FAKE, "load", "--model", missing], grace=2)
    r = _diagnose(run_module, tmp_path, "eng")
    assert r["verdict"] == "model_not_found"
    assert "the model %s does not exist on this host" % missing in r["summary"]
    assert "FileNotFoundError: [Errno 2] No such file or directory" in _evidence(r)


def test_local_port_already_in_use_names_the_holder(run_module, tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        _start(tmp_path, "eng", [sys.executable, FAKE, "serve", "--port", str(port)], grace=2)
        r = _diagnose(run_module, tmp_path, "eng")
    finally:
        holder.close()
    assert r["verdict"] == "port_in_use"
    ev = _evidence(r)
    assert "[Errno 98] Address already in use" in ev
    assert "port %d is held by pid %d" % (port, os.getpid()) in ev


def _until_healthy(run_module, tmp_path, name, timeout=30):
    """The verdict once the engine answers (a start on a busy host takes a moment), failing after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        r = _diagnose(run_module, tmp_path, name, health_timeout=5.0)
        if r["verdict"] == "healthy" or time.monotonic() > end:
            return r
        time.sleep(0.1)


def test_local_sigstop_is_hung_and_healthy_again_after_sigcont(run_module, tmp_path):
    port = _port()
    _start(tmp_path, "eng", [sys.executable, FAKE, "serve", "--port", str(port)], grace=0.5)
    try:
        pid = _process.read_state(str(tmp_path), "eng")["pid"]
        r = _until_healthy(run_module, tmp_path, "eng")
        assert r["verdict"] == "healthy" and "answered 200" in r["summary"]
        os.kill(pid, signal.SIGSTOP)
        # signal delivery is asynchronous: diagnose once the kernel shows the process stopped (proc(5) state T)
        _wait_for(lambda: _proc_state(pid) in ("T", "t"))
        r = _diagnose(run_module, tmp_path, "eng")
        assert r["verdict"] == "engine_hung"
        assert "pid %d" % pid in r["summary"] and "(stopped)" in r["summary"]
        assert "kill -CONT %d" % pid in r["findings"][0]["hint"]
        os.kill(pid, signal.SIGCONT)
        assert _until_healthy(run_module, tmp_path, "eng")["verdict"] == "healthy"
    finally:
        _process.stop(str(tmp_path), "eng", timeout=5)


def test_local_engine_that_accepts_but_never_answers_is_hung(run_module, tmp_path):
    port = _port()
    _start(tmp_path, "eng", [sys.executable, FAKE, "mute", "--port", str(port)], grace=0.5)
    try:
        _wait_for(_listens(port))
        r = _diagnose(run_module, tmp_path, "eng", health_timeout=0.5)
        assert r["verdict"] == "engine_hung"
        assert "port %d accepts connections but GET /health gave no answer" % port in r["summary"]
    finally:
        _process.stop(str(tmp_path), "eng", timeout=5)


def test_local_engine_still_loading_then_stopped(run_module, tmp_path):
    port = _port()
    _start(tmp_path, "eng", [sys.executable, FAKE, "sleep", "--port", str(port)], grace=0.5)
    try:
        _wait_for(_logged(tmp_path, "eng", "Loading safetensors"))
        r = _diagnose(run_module, tmp_path, "eng")
        assert r["verdict"] == "still_loading"
        assert "port %d does not listen yet" % port in r["summary"]
        assert "Loading safetensors checkpoint shards: 1/2" in _evidence(r)
    finally:
        _process.stop(str(tmp_path), "eng", timeout=5)
    assert _diagnose(run_module, tmp_path, "eng")["verdict"] == "stopped"


def test_local_nothing_there_is_not_running(run_module, tmp_path):
    r = run_module(engine_diagnose, {"platform": "local", "run_dir": str(tmp_path), "name": "never-started"},
                   check_mode=True)
    assert r["verdict"] == "not_running" and r["changed"] is False


@pytest.mark.parametrize("args, field", [
    ({"name": "../etc"}, "name:"),
    ({"run_dir": "relative/run"}, "run_dir:"),
    ({"health_timeout": 0}, "health_timeout:"),
])
def test_local_bad_input_is_refused_naming_the_option(run_module, tmp_path, args, field):
    a = dict({"platform": "local", "run_dir": str(tmp_path), "name": "eng"}, **args)
    r = run_module(engine_diagnose, a)
    assert r["failed"] and r["msg"].startswith(field)
