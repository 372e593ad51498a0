"""k8s_engine_wait: the module's verdicts and messages over recorded API objects (the client is faked)."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_shape, _k8s_wait
from ansible_collections.llmops.serving.plugins.modules import k8s_engine_wait

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "k8s")
with open(os.path.join(FIX, "pods.yaml")) as f:
    PODS = yaml.safe_load(f)
with open(os.path.join(FIX, "routes.yaml")) as f:
    ROUTES = yaml.safe_load(f)

ARGS = dict(namespace="llm-lab", selector={"app.kubernetes.io/name": "glm-5-2-fp8-vllm"},
            route_name="glm-5.2-fp8-vllm-router", timeout=60, route_condition_timeout=20, poll_interval=1)


@pytest.fixture
def cluster(monkeypatch):
    """Serve a scripted sequence of (pods, route) reads; never sleeps."""
    state = {"seq": []}
    monkeypatch.setattr(k8s_engine_wait, "HAS_K8S", True)
    monkeypatch.setattr(k8s_engine_wait, "make_fetch", lambda params: lambda: (
        state["seq"].pop(0) if len(state["seq"]) > 1 else state["seq"][0]))
    clock = {"t": 0.0}
    real = _k8s_wait.wait_rollout

    def fast(fetch, **kw):
        return real(fetch, clock=lambda: clock["t"], sleep=lambda s: clock.__setitem__("t", clock["t"] + s), **kw)

    monkeypatch.setattr(_k8s_wait, "wait_rollout", fast)
    return state


def test_ready_returns_pod_timeline(run_module, cluster):
    cluster["seq"] = [([PODS["loading"]], ROUTES["accepted"]), ([PODS["ready"]], ROUTES["accepted"])]
    r = run_module(k8s_engine_wait, ARGS)
    assert not r.get("failed"), r
    assert r["state"] == "ready" and r["route"]["accepted"] and r["route"]["resolved_refs"]
    stages = [s["stage"] for s in r["timelines"][0]["stages"]]
    assert stages == ["pod_created", "scheduled", "container_started", "pod_ready"]


def test_ref_not_permitted_fails_with_reason(run_module, cluster):
    cluster["seq"] = [([PODS["ready"]], ROUTES["ref_not_permitted"])]
    r = run_module(k8s_engine_wait, ARGS)
    assert r["failed"] is True
    assert "RefNotPermitted" in r["msg"] and "ReferenceGrant" in r["msg"]


def test_crashed_engine_fails_with_exit_status(run_module, cluster):
    cluster["seq"] = [([PODS["completed_exit0"]], ROUTES["accepted"])]
    r = run_module(k8s_engine_wait, ARGS)
    assert r["failed"] is True and r["state"] == "failed"
    assert "exit code 0" in r["msg"]


def test_check_mode_reads_once_and_does_not_fail_while_waiting(run_module, cluster):
    cluster["seq"] = [([PODS["loading"]], ROUTES["accepted"])]
    r = run_module(k8s_engine_wait, ARGS, check_mode=True)
    assert not r.get("failed") and r["state"] == "waiting"


def test_empty_selector_is_refused(run_module):
    r = run_module(k8s_engine_wait, dict(ARGS, selector={}))
    assert r["failed"] is True and r["msg"].startswith("selector:")


class _FakeApiServer:
    """A minimal API server on a port of 18300-18309 serving recorded objects through the real client."""

    def __init__(self, pods, route, logs=None, date=None):
        import http.server
        import threading
        from urllib.parse import urlparse, parse_qs

        outer = self
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def date_time_string(self, timestamp=None):
                # the API server's clock (the Date header every answer carries), when the test sets it apart
                import email.utils
                return email.utils.formatdate(date, usegmt=True) if date is not None else \
                    http.server.BaseHTTPRequestHandler.date_time_string(self, timestamp)

            def do_GET(self):
                url = urlparse(self.path)
                outer.requests.append((url.path, parse_qs(url.query)))
                log_of = url.path.rsplit("/", 2) if url.path.endswith("/log") else None
                if log_of and (logs or {}).get(log_of[1]) is not None:
                    data = logs[log_of[1]].encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if url.path == "/api/v1/namespaces/llm-lab/pods":
                    body, code = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}, 200
                elif url.path == "/apis/gateway.networking.k8s.io/v1/namespaces/aibrix-system/httproutes/glm-5.2-fp8-vllm-router" and route:
                    body, code = route, 200
                else:
                    body, code = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}, 404
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        for port in range(18300, 18310):
            try:
                self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
                break
            except OSError:
                continue
        else:
            pytest.skip("no free port in 18300-18309")
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path):
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": self.url}}],
            "users": [{"name": "lab", "user": {}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}]}))
        return str(path)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_real_client_path_reads_pods_and_route(run_module, tmp_path):
    pytest.importorskip("kubernetes")
    srv = _FakeApiServer([PODS["ready"]], ROUTES["accepted"])
    try:
        r = run_module(k8s_engine_wait, dict(ARGS, kubeconfig=srv.kubeconfig(tmp_path / "kubeconfig")))
    finally:
        srv.close()
    assert not r.get("failed"), r
    assert r["state"] == "ready" and r["pods"][0]["name"] == "glm-5-2-fp8-vllm-7d9c6b5f4-k7w9m"
    assert r["pods"][0]["created"] == _k8s_shape.parse_time("2026-08-02T08:00:05Z")
    assert ("/api/v1/namespaces/llm-lab/pods", {"labelSelector": ["app.kubernetes.io/name=glm-5-2-fp8-vllm"]}) in srv.requests


def test_real_client_missing_route_times_out_with_not_found(run_module, tmp_path):
    pytest.importorskip("kubernetes")
    srv = _FakeApiServer([PODS["ready"]], None)
    try:
        r = run_module(k8s_engine_wait, dict(ARGS, kubeconfig=srv.kubeconfig(tmp_path / "kubeconfig"), timeout=1, poll_interval=1))
    finally:
        srv.close()
    assert r["failed"] is True and r["state"] == "timeout"
    assert "HTTPRoute does not exist" in r["msg"]


def _deprecations():
    from ansible.module_utils.common import warnings as w

    return [d for d in w.get_deprecation_messages() if "route_timeout" in d["msg"]]


def test_route_timeout_is_a_deprecated_alias_of_route_condition_timeout(run_module, cluster):
    """The old name still sets how long a False route condition is tolerated, and says it is deprecated."""
    from ansible.module_utils.common import warnings as w

    args = dict((k, v) for k, v in ARGS.items() if k != "route_condition_timeout")
    results = {}
    for name in ("route_condition_timeout", "route_timeout"):
        w._global_deprecations.clear()  # pylint: disable=protected-access
        cluster["seq"] = [([PODS["ready"]], ROUTES["ref_not_permitted"])]
        results[name] = (run_module(k8s_engine_wait, dict(args, **{name: 7})), _deprecations())
    for name, (r, deprecations) in results.items():
        assert r["failed"] is True and "route not usable for 7s" in r["msg"], (name, r["msg"])
    assert results["route_condition_timeout"][1] == []
    assert [(d["version"], d["collection_name"]) for d in results["route_timeout"][1]] == [("1.0.0", "llmops.serving")]


with open(os.path.join(FIX, "restarts.yaml")) as f:
    RESTARTS = yaml.safe_load(f)


def test_real_client_reads_the_previous_log_and_names_the_masked_crash(run_module, tmp_path):
    """A pod Ready again after an exit-0 restart fails the wait; the message carries the previous run's exception."""
    pytest.importorskip("kubernetes")
    pod = RESTARTS["pods"]["ready_after_exit0"]
    name = pod["metadata"]["name"]
    srv = _FakeApiServer([pod], ROUTES["accepted"], logs=RESTARTS["logs"])
    try:
        r = run_module(k8s_engine_wait, dict(ARGS, kubeconfig=srv.kubeconfig(tmp_path / "kubeconfig"), log_tail_lines=500))
    finally:
        srv.close()
    assert r["failed"] is True and r["state"] == "failed"
    assert "crash_exit_zero" in r["msg"] and "restarted 1 time(s)" in r["msg"]
    assert "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered'" in r["msg"]
    assert r["pods"][0]["diagnosis"]["code"] == "crash_exit_zero"
    log_reads = [q for path, q in srv.requests if path == "/api/v1/namespaces/llm-lab/pods/%s/log" % name]
    assert log_reads == [{"container": ["engine"], "previous": ["true"], "tailLines": ["500"]}]


def test_max_restarts_tolerates_a_restart_of_a_ready_pod(run_module, cluster):
    cluster["seq"] = [([RESTARTS["pods"]["ready_after_exit0"]], ROUTES["accepted"])]
    assert run_module(k8s_engine_wait, ARGS)["failed"] is True
    r = run_module(k8s_engine_wait, dict(ARGS, max_restarts=1))
    assert not r.get("failed"), r
    assert r["state"] == "ready"


def test_oom_killed_restart_fails_naming_the_oom_killer(run_module, cluster):
    cluster["seq"] = [([RESTARTS["pods"]["oom_killed"]], ROUTES["accepted"])]
    r = run_module(k8s_engine_wait, ARGS)
    assert r["failed"] is True and "oom_killed" in r["msg"] and "memory limit" in r["msg"]


def test_negative_max_restarts_is_refused(run_module):
    r = run_module(k8s_engine_wait, dict(ARGS, max_restarts=-1))
    assert r["failed"] is True and r["msg"].startswith("max_restarts:")


# --------------------------------------------------------------------------------------------- #
# objects: a recorded API answer judged by the same code, offline (rollouts from tests/lib/kube_controllers.py)
# --------------------------------------------------------------------------------------------- #

REPLAY = dict(namespace="llm-lab", selector={"app.kubernetes.io/name": "glm-5-2-fp8-vllm"}, workload_name="glm-5-2-fp8-vllm")


def _rolled_cluster():
    from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

    cluster = kc.Cluster()
    cluster.engines.update({"/models/a": kc.Engine(load_seconds=30), "/models/b": kc.Engine(load_seconds=30)})
    cluster.apply(kc.deployment("/models/a"))
    cluster.advance(120)
    cluster.apply(kc.deployment("/models/b"))
    return cluster


def test_objects_replay_a_rollout_offline_rolling_then_ready(run_module):
    cluster = _rolled_cluster()
    cluster.advance(1)
    mid = {"apiVersion": "v1", "kind": "List", "items": cluster.objects()}
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=mid))
    assert r["failed"] is True and r["state"] == "waiting", r
    assert r["rollout"]["state"] == "rolling" and "rolling" in r["msg"]
    cluster.advance(240)
    done = cluster.objects()
    answer = {"object": "list", "data": [{"id": "glm-5.2-fp8-vllm", "root": "/models/b"}]}
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=done, models=answer))
    assert not r.get("failed"), r["msg"]
    assert r["state"] == "ready" and r["revision"]["model_path"] == "/models/b" and r["revision"]["proven"] is True
    old = {"object": "list", "data": [{"id": "glm-5.2-fp8-vllm", "root": "/models/a"}]}
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=done, models=old))
    assert r["failed"] is True and "not from the current revision's /models/b" in r["msg"]


def test_objects_that_nest_too_deeply_are_refused_cleanly(run_module):
    deep = []
    for _i in range(200):
        deep = [deep]
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=[{"kind": "Pod", "metadata": {"labels": deep}}]))
    assert r["failed"] is True and r["reason"] == "depth" and r["msg"].startswith("objects")


def test_objects_with_wrong_typed_fields_are_judged_not_raised(run_module):
    cluster = _rolled_cluster()
    cluster.advance(240)
    objs = cluster.objects()
    for o in objs:
        if o["kind"] == "Pod":
            o["status"]["containerStatuses"] = {"engine": "ready"}
            o["status"]["conditions"][0]["status"] = ["True"]
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=objs))
    assert r["state"] in ("waiting", "failed", "ready") and "Traceback" not in r.get("msg", "")


def test_models_url_needs_a_workload_and_no_credentials(run_module):
    r = run_module(k8s_engine_wait, dict(ARGS, models_url="http://gw.example"))
    assert r["failed"] is True and r["msg"].startswith("models_url: needs workload_name")
    r = run_module(k8s_engine_wait, dict(REPLAY, models_url="http://admin:s3cret@gw.example"))
    assert r["failed"] is True and "s3cret" not in str(r) and r["reason"] == "credentials_in_url"


def test_objects_are_judged_at_the_time_they_were_recorded(run_module):
    """A recording replayed later is judged at its newest timestamp: a pod no node can take (kube-scheduler's
    "Preemption is not helpful" for every node) is still waiting 20 s after creation and fails once that has lasted a
    minute, however long ago the objects were recorded."""
    from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc
    from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks

    cordoned = ks.node("gpu-node-01", taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
    cluster = kc.Cluster(fleet=[cordoned])
    cluster.apply(kc.deployment("/models/a"))
    cluster.advance(20)
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=cluster.objects()))
    assert r["state"] == "waiting", r["msg"]
    assert "not scheduled" in r["msg"] and "Preemption is not helpful" in r["msg"]
    cluster.advance(70)
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=cluster.objects()))
    assert r["state"] == "failed" and "no node can ever take it" in r["msg"], r["msg"]
    import re
    waited = re.search(r"not scheduled for (\d+) s", r["msg"])
    assert waited and 60 <= int(waited.group(1)) <= 90, r["msg"]


def test_real_client_judges_a_pending_pod_by_the_api_servers_date_not_the_controllers_clock(run_module, tmp_path,
                                                                                            monkeypatch):
    """The controller's clock 20 minutes ahead of the cluster: a pod the API server has held Pending for 5 s (its
    answers' Date header, RFC 9110 section 6.6.1) waits; the same pod at Date +901 s fails on schedule_timeout."""
    pytest.importorskip("kubernetes")
    import time

    created = _k8s_shape.parse_time(PODS["never_scheduled"]["metadata"]["creationTimestamp"])
    monkeypatch.setattr(time, "time", lambda: created + 5 + 20 * 60)
    for age, state in ((5, "timeout"), (901, "failed")):
        srv = _FakeApiServer([PODS["never_scheduled"]], ROUTES["accepted"], date=created + age)
        try:
            r = run_module(k8s_engine_wait, dict(ARGS, kubeconfig=srv.kubeconfig(tmp_path / "kubeconfig"), timeout=1,
                                                 poll_interval=1))
        finally:
            srv.close()
        assert r["state"] == state, (age, r["msg"])
        assert ("limit 900s" in r["msg"]) == (state == "failed"), r["msg"]


def test_objects_of_a_namespace_that_refuses_the_pods_fail_quoting_the_refusal(run_module):
    """M1: PodSecurity "baseline" refuses the engine's hostPath pod; the ReplicaSet controller reports ReplicaFailure
    and FailedCreate Events (kubernetes pkg/controller/replicaset/replica_set_utils.go calculateStatus,
    pkg/controller/controller_utils.go; restated by tests/lib/kube_controllers.py), and no pod exists. A minute in, the
    wait fails naming the refusal; before, it waited 4500 s on "0 of 1 new replicas have been updated"."""
    from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc

    cluster = kc.Cluster()
    cluster.pod_security = "baseline"
    dep = kc.deployment("/models/a")
    dep["spec"]["template"]["spec"]["volumes"] = [{"name": "model", "hostPath": {"path": "/models", "type": "Directory"}}]
    cluster.apply(dep)
    cluster.advance(20)
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=cluster.objects()))
    assert r["state"] == "waiting" and "cannot create its pods for 19 s" in r["msg"], r["msg"]
    cluster.advance(60)
    r = run_module(k8s_engine_wait, dict(REPLAY, objects=cluster.objects()))
    assert r["state"] == "failed", r["msg"]
    assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "model")' in r["msg"]
