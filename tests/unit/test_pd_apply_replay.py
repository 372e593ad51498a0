"""The P/D apply path of roles/pd_disagg, replayed offline: the role's own tasks, the cluster as its controllers run it.

The P/D objects are rendered by ``pd_manifests`` with the arguments of the role's task (templated from the role's
defaults by tests/lib/role_tasks.py, the staged nodes as the role's staging step sets them), applied in order to the
cluster model of tests/lib/kube_controllers.py (Deployment, ReplicaSet and EndpointSlice controllers, AIBrix's
StormService controller, the kubelet) whose scheduler is tests/lib/kube_scheduler.py's filters, each rule cited there.
Every poll, the cluster's objects (what ``kubectl get -o json`` returns) go to ``k8s_engine_wait`` with the arguments
of the role's wait task, once per role of its loop; on a failure, the role's rescue names the failed roles and
``engine_diagnose`` runs with the arguments of roles/diagnose over the same objects.
"""
from __future__ import annotations

import os
import socket
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process
from ansible_collections.llmops.serving.plugins.modules import engine_diagnose, k8s_engine_wait, pd_manifests
from ansible_collections.llmops.serving.tests.lib import kube_controllers as kc
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.lib import role_tasks as rt

HOST_PATH = "/mnt/nvme/models/tiny-llama"
GPU = {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1", "cpu": "128", "memory": "1Ti"}
PROXY_IMAGE = "registry.example/python:3.11-slim@sha256:" + "a" * 64


def fleet(cordoned=()):
    """Four GPU nodes, two of which staged the revision (prefill on gpu-01, decode on gpu-02), and two CPU nodes."""
    nodes = []
    for i in range(1, 5):
        name = "gpu-%02d" % i
        taints = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}] if name in cordoned else []
        nodes.append(ks.node(name, labels={"nvidia.com/gpu.present": "true"}, taints=taints, allocatable=GPU,
                             dirs=[HOST_PATH] if i <= 2 else []))
    nodes += [ks.node("cpu-%02d" % i, allocatable={"cpu": "16", "memory": "64Gi"}) for i in (1, 2)]
    return nodes


def role_vars(workload, transport, **extra):
    overrides = dict(pd_disagg_k8s_mode="apply", pd_disagg_k8s_workload=workload, pd_disagg_transport=transport,
                     pd_disagg_proxy_image=PROXY_IMAGE,
                     # what the role's staging step (engine tasks_from staged_nodes) leaves for the render task
                     pd_disagg_prefill_staged=["gpu-01"], engine_staged_nodes=["gpu-02"],
                     # the EnvoyPatchPolicy read in apply mode: none besides AIBrix's install
                     pd_disagg_gateway_policies={"resources": []})
    overrides.update(extra)
    return rt.RoleVars("pd_disagg", overrides, extra_vars_files=["roles/engine/vars/profiles.yml"])


def render(run_module, tmp_path, variables):
    task = rt.task("pd_disagg", "llmops.serving.pd_manifests", "kubernetes.yml")
    args = variables.template(task["llmops.serving.pd_manifests"])
    args["render_dir"] = str(tmp_path / "pd")
    r = run_module(pd_manifests, args)
    assert not r.get("failed"), r.get("msg")
    return r


def wait_args(variables, rendered, item, objects):
    task = rt.task("pd_disagg", "llmops.serving.k8s_engine_wait", "kubernetes.yml")
    assert variables.template(task["loop"], dict(pd_disagg_rendered=rendered)) == list(rendered["pod_selectors"])
    args = variables.template(task["llmops.serving.k8s_engine_wait"], dict(pd_disagg_rendered=rendered, item=item))
    return dict(args, objects=objects)


def deployed(variables, rendered, nodes, missing_images=()):
    cluster = kc.Cluster(namespace=variables.get("pd_disagg_namespace"), fleet=nodes)
    cluster.engines.update({variables.get("pd_disagg_model_path"): kc.Engine(load_seconds=60),
                            None: kc.Engine(load_seconds=5)})
    cluster.missing_images.update(missing_images)
    for obj in rendered["objects"]:  # the role applies them in this order
        cluster.apply(obj)
    return cluster


def poll(run_module, variables, rendered, cluster, limit=900, step=10):
    """The role's wait, one loop over its roles per poll, until every role is ready or one fails; the last
    results per role and the objects they judged."""
    for _i in range(limit // step):
        cluster.advance(step)
        objects = {"apiVersion": "v1", "kind": "List", "items": cluster.objects()}
        results = dict((item, run_module(k8s_engine_wait, wait_args(variables, rendered, item, objects)))
                       for item in rendered["pod_selectors"])
        states = [r["state"] for r in results.values()]
        if all(s == "ready" for s in states) or any(s in ("failed", "timeout") for s in states):
            return results, objects["items"]
    return results, objects["items"]


def _pods(objects, role):
    return [o for o in objects if o["kind"] == "Pod" and (o["metadata"].get("labels") or {}).get("llmops.serving/pd-role") == role]


@pytest.mark.parametrize("workload,transport", [("deployments", "rdma"), ("deployments", "tcp"),
                                                ("stormservice", "rdma"), ("stormservice", "tcp")])
def test_the_role_waits_for_prefill_decode_and_front_and_they_land_where_they_belong(run_module, tmp_path, workload,
                                                                                     transport):
    variables = role_vars(workload, transport)
    rendered = render(run_module, tmp_path, variables)
    cluster = deployed(variables, rendered, fleet())
    results, objects = poll(run_module, variables, rendered, cluster)
    roles = ["prefill", "decode", "front"] if workload == "deployments" else ["prefill", "decode"]
    assert sorted(results) == sorted(roles)
    for role, r in results.items():
        assert not r.get("failed") and r["state"] == "ready", (role, r["msg"])
        assert r["rollout"]["state"] == "done" and r["rollout"]["kind"] == rendered["workloads"][role]["kind"]
        assert [p["name"] for p in r["pods"]] == [o["metadata"]["name"] for o in _pods(objects, role)]
    assert [o["spec"]["nodeName"] for o in _pods(objects, "prefill")] == ["gpu-01"]
    assert [o["spec"]["nodeName"] for o in _pods(objects, "decode")] == ["gpu-02"]
    if workload == "deployments":
        front = _pods(objects, "front")
        assert front and all(o["spec"]["nodeName"].startswith("cpu-") for o in front)
        # the front's route is judged, and its Service's endpoints prove the front pods answer
        assert results["front"]["route"]["state"] == "ready"
        proof = results["front"]["revision_proof"]
        assert proof["by"] == "endpoints" and proof["held"] is True
        assert {e["pod"] for e in proof["ready_endpoints"]} == {o["metadata"]["name"] for o in front}
    else:
        assert rendered["route_name"] is None and "front" not in rendered["pod_selectors"]


def _rescue(run_module, variables, rendered, results, objects):
    """The role's rescue: the failed roles, the diagnose role's engine_diagnose over the objects, the message."""
    failed_roles = [item for item, r in results.items() if r.get("failed") and r["state"] in ("failed", "timeout")]
    wait_failure = "; ".join(results[i]["msg"] for i in failed_roles)
    rescue = rt.task("pd_disagg", "ansible.builtin.include_role", "kubernetes.yml",
                     name="Diagnose the role that is not serving from the cluster's evidence")
    scope = dict(pd_disagg_rendered=rendered, pd_disagg_wait_failed_roles=failed_roles)
    diag_vars = variables.template(rescue["vars"], scope)
    diag_vars["diagnose_objects"] = objects
    diagnose = rt.RoleVars("diagnose", diag_vars, data=("diagnose_objects",))
    args = diagnose.template(rt.task("diagnose", "llmops.serving.engine_diagnose")["llmops.serving.engine_diagnose"])
    args.pop("kubeconfig", None), args.pop("context", None)
    result = run_module(engine_diagnose, args)
    fail = rt.task("pd_disagg", "ansible.builtin.fail", "kubernetes.yml", name="Fail with the diagnosis")
    msg = variables.template(fail["ansible.builtin.fail"]["msg"],
                             dict(scope, diagnose_result=result, pd_disagg_wait_failure=wait_failure))
    return failed_roles, diag_vars, result, msg


def test_decode_pods_with_no_feasible_node_stop_the_wait_with_the_diagnosis(run_module, tmp_path):
    """The one node that staged the decode revision is cordoned: the decode pod can go nowhere (its required node
    affinity names only gpu-02). The wait stops within a few polls, not at its timeout, and the diagnosis says why."""
    variables = role_vars("deployments", "rdma")
    rendered = render(run_module, tmp_path, variables)
    cluster = deployed(variables, rendered, fleet(cordoned=("gpu-02",)))
    results, objects = poll(run_module, variables, rendered, cluster)
    assert results["decode"]["state"] == "failed", results["decode"]["msg"]
    assert cluster.clock() - kc._timeline.parse_time("2026-08-02T08:00:00Z") <= 180
    assert "Preemption is not helpful" in results["decode"]["msg"] or "no node can ever take it" in results["decode"]["msg"]
    assert results["prefill"]["state"] != "failed" and results["front"]["state"] != "failed"
    failed_roles, diag_vars, result, msg = _rescue(run_module, variables, rendered, results, objects)
    assert failed_roles == ["decode"] and diag_vars["diagnose_name"] == rendered["workloads"]["decode"]["name"]
    codes = [f["code"] for f in result["findings"]]
    assert "unschedulable" in codes, result["summary"]
    assert msg.startswith("decode: ") and result["summary"] in msg and "(the wait: " in msg
    assert "node.kubernetes.io/unschedulable" in msg


def test_a_front_image_the_registry_does_not_have_stops_the_wait_with_the_diagnosis(run_module, tmp_path):
    variables = role_vars("deployments", "tcp")
    rendered = render(run_module, tmp_path, variables)
    cluster = deployed(variables, rendered, fleet(), missing_images=(PROXY_IMAGE,))
    results, objects = poll(run_module, variables, rendered, cluster)
    assert results["front"]["state"] == "failed", results["front"]["msg"]
    assert cluster.clock() - kc._timeline.parse_time("2026-08-02T08:00:00Z") <= 120
    assert "image_pull" in results["front"]["msg"] and "not found" in results["front"]["msg"]
    failed_roles, diag_vars, result, msg = _rescue(run_module, variables, rendered, results, objects)
    assert failed_roles == ["front"]
    assert diag_vars["diagnose_name"] == rendered["workloads"]["front"]["name"]
    assert "image_pull" in [f["code"] for f in result["findings"]], result["summary"]
    assert msg.startswith("front: ") and PROXY_IMAGE in msg


def _block_of(role, tasks_file, module, name):
    """The block task of ``roles/<role>/tasks/<tasks_file>`` whose block holds the task ``name`` calling ``module``."""
    inner = rt.task(role, module, tasks_file, name=name)
    for outer in rt._walk(rt._tasks(os.path.join(rt.ROOT, "roles", role, "tasks", tasks_file))):  # pylint: disable=protected-access
        if inner in (outer.get("block") or []):
            return outer, inner
    raise LookupError(name)


def test_the_pair_is_applied_once_to_the_cluster_the_wait_reads():
    """Production review 2, M2: the P/D apply passed no kubeconfig/context (on a bastion with several clusters it
    applied to the current context while the wait watched the configured one) and ran once per prefill/decode host.
    It now applies as the engine role does (roles/engine/tasks/kubernetes.yml) and as its own wait reads."""
    block, apply = _block_of("pd_disagg", "kubernetes.yml", "kubernetes.core.k8s", "Apply the P/D objects in order")
    args = apply["kubernetes.core.k8s"]
    wait = rt.task("pd_disagg", "llmops.serving.k8s_engine_wait", "kubernetes.yml")["llmops.serving.k8s_engine_wait"]
    assert args["kubeconfig"] == wait["kubeconfig"] and args["context"] == wait["context"]
    assert "pd_disagg_k8s_kubeconfig" in args["kubeconfig"] and "pd_disagg_k8s_context" in args["context"]
    assert block.get("run_once") is True


# A decode engine that serves (GET /health 200) while its log holds a failed NIXL handshake with the prefill side:
# what vLLM 0.32 logs (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py NixlConnectorWorker
# ._log_failure) when the decode worker cannot reach the prefill engine's side channel.
SERVING_DECODE = r"""
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
print("(APIServer pid=9) INFO:     Application startup complete.", flush=True)
print("(EngineCore_DP0 pid=10) ERROR 12-06 10:41:07 [base_worker.py:1355] NIXL transfer failure: handshake_failed | "
      "Context: {'failure_type': 'handshake_failed', 'request_id': 'cmpl-1', 'engine_id': 'd-0', "
      "'remote_engine_id': 'p-0', 'remote_request_id': 'cmpl-1', 'remote_host': '127.0.0.1', 'remote_port': 5600, "
      "'num_local_blocks': 1, 'num_remote_blocks': 1, 'local_block_ids_sample': [1]}", flush=True)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_local_pair_whose_route_fails_is_diagnosed_by_the_rescue_naming_the_failed_kv_transfer(run_module, tmp_path):
    """roles/pd_disagg/tasks/local.yml: both engines answered their health checks, then no completion passed through
    the proxy (the decode side's KV never arrived). The route's rescue diagnoses each engine of the pair with the
    diagnose role's arguments, and the decode engine's verdict names the failed handshake and its remote; before, the
    role failed with the probe's message alone."""
    block, route = _block_of("pd_disagg", "local.yml", "llmops.serving.engine_probe",
                             "Route one greedy completion through the proxy (prefill, KV over NIXL, then decode)")
    assert route["register"] == "pd_disagg_first_route" and route["retries"] == 3
    rescue = {t.get("name"): t for t in block["rescue"]}
    include = rescue["Diagnose the prefill and decode engines after the failed route"]
    assert include["loop"] == ["pd-prefill", "pd-decode"]
    run_dir = str(tmp_path / "run")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _process.start(run_dir, "pd-decode", [sys.executable, "-c", SERVING_DECODE, "--port", str(port)], startup_grace=0.5)
    try:
        variables = rt.RoleVars("pd_disagg", {"pd_disagg_local_run_dir": run_dir})
        diag_vars = variables.template(include["vars"], {"pd_disagg_diagnosed": "pd-decode"})
        assert diag_vars["diagnose_platform"] == "local" and diag_vars["diagnose_fail_on_error"] is False
        diagnose = rt.RoleVars("diagnose", diag_vars)
        args = diagnose.template(rt.task("diagnose", "llmops.serving.engine_diagnose")["llmops.serving.engine_diagnose"])
        result = {}
        for dummy in range(50):  # the stand-in's port opens a moment after its start
            result = run_module(engine_diagnose, args)
            if result.get("verdict") != "still_loading":
                break
            time.sleep(0.1)
    finally:
        _process.stop(run_dir, "pd-decode", timeout=10)
    assert result["verdict"] == "kv_transfer_failed", result.get("summary")
    finding = next(f for f in result["findings"] if f["code"] == "kv_transfer_failed")
    assert "handshake_failed x1" in finding["evidence"][0] and "127.0.0.1:5600" in finding["evidence"][1]
    fail = rescue["Fail after the diagnosis of the route"]["ansible.builtin.fail"]["msg"]
    msg = variables.template(fail, {"pd_disagg_route_failure": "route: HTTP 500 from the proxy"})
    assert msg.startswith("no completion passed through the prefill/decode pair (route: HTTP 500 from the proxy)")
