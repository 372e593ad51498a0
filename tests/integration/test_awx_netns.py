"""The diagnose job template run as AWX runs it against a fleet of network namespaces reached over SSH.

The fleet inventory (tests/lib/netns.py: each host a network namespace with its own sshd) has a k8s_api host and a
colocated GPU node; the job's Kubernetes credential points at a loopback API server that only the execution
environment (this process's network namespace) can reach, as AWX injects it (K8S_AUTH_*, tests/lib/awx_harness.py
kubernetes_env). The job must read the cluster once, from the EE (llmops_k8s_delegate_to: localhost in the
template's extra_vars), with the credential's token, while its play runs on the k8s_api host over SSH: the gateway
probe (not a Kubernetes call) reaches a gateway on the fleet's bridge from that host's own address.
"""
from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib import netns

# list endpoints answer an empty list; a named object is 404 (the engine was never applied)
_LISTS = ("pods", "events", "deployments", "replicasets", "services", "httproutes", "statefulsets", "stormservices",
          "leaderworkersets", "endpoints", "endpointslices", "referencegrants", "nodes")


class _KubeAPI(http.server.BaseHTTPRequestHandler):
    """A Kubernetes API with nothing in it, recording the path and the Authorization header of each request."""

    seen = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0].rstrip("/")
        _KubeAPI.seen.append((path, self.headers.get("Authorization")))
        if path.rsplit("/", 1)[-1] in _LISTS:
            status, body = 200, {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}
        else:
            status, body = 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                 "code": 404, "message": "%s not found" % path.rsplit("/", 1)[-1]}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


class _Gateway(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style gateway on the fleet's bridge, recording which address each request came from."""

    seen = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Gateway.seen.append((self.client_address[0], self.path, self.headers.get("Authorization")))
        body = {"object": "list", "data": [{"id": "glm-5.2-fp8-vllm", "object": "model"}]}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


@pytest.fixture(scope="module")
def fleet():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    with netns.Fleet(2) as f:
        yield f


def _inventory(fleet, path):
    """A site inventory directory: the first node is the k8s_api host, the second the colocated GPU node."""
    api, gpu = fleet.nodes[0], fleet.nodes[1]
    doc = {"all": {"vars": {"engine_platform": "kubernetes", "engine_namespace": "llm-serving",
                            "engine_k8s_service": "glm-5-2-fp8-vllm", "engine_served_model_name": "glm-5.2-fp8-vllm"},
                   "children": {"k8s_api": {"hosts": {api.name: fleet.hostvars(api)}},
                                "gpu_nodes": {"children": {"colocated": {"hosts": {gpu.name: fleet.hostvars(gpu)}}}}}}}
    os.makedirs(path)
    with open(os.path.join(path, "hosts.yml"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def test_diagnose_reads_the_cluster_once_from_the_ee_with_the_credential(fleet, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KubeAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # the controller's end of the fleet's bridge: the nodes reach it, as they reach a gateway
    bridge = (netns.SUBNET % fleet.fid) + ".1"
    gateway = http.server.ThreadingHTTPServer((bridge, 0), _Gateway)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    token, gw_token = "k8s-" + os.urandom(8).hex(), "gw-" + os.urandom(8).hex()
    _KubeAPI.seen, _Gateway.seen = [], []
    try:
        ctl = awx.Controller(str(tmp_path / "jobs"), collections=awx.build_collection(str(tmp_path / "collection")),
                             settings={"llmops_awx_inventory_path": _inventory(fleet, str(tmp_path / "site"))},
                             # the diagnose template holds the read-only cluster credential
                             credentials={"llmops Kubernetes read-only": {
                                 "host": "http://127.0.0.1:%d" % server.server_address[1], "bearer_token": token}},
                             task_env=fleet.ansible_env({}))
        job = ctl.launch("llmops diagnose", answers={
            "diagnose_fail_on_error": "false", "diagnose_gateway_token": gw_token,
            "diagnose_probe_gateway_url": "http://%s:%d" % (bridge, gateway.server_address[1])})
    finally:
        for srv in (server, gateway):
            srv.shutdown()
            srv.server_close()
    assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), job.summary()
    assert "-l colocated:k8s_api" in job.cmdline
    reads = [e["event_data"] for e in job.events if e.get("event") == "runner_on_ok"
             and e["event_data"].get("task", "").endswith("Read the evidence and name the cause")]
    # once, for the k8s_api host's play, run in the EE (delegated to localhost), not over SSH on node0
    api_host = fleet.nodes[0].name
    assert [(r["host"], r["res"].get("_ansible_delegated_vars", {}).get("ansible_host")) for r in reads] == [
        (api_host, "localhost")]
    # the cluster saw the credential's token on every request, and only from here (the API listens on loopback)
    assert _KubeAPI.seen and {auth for _path, auth in _KubeAPI.seen} == {"Bearer " + token}
    # the gateway probe is not delegated: it ran on the k8s_api host, over SSH in its namespace (its address)
    assert _Gateway.seen and {addr for addr, _p, _a in _Gateway.seen} == {fleet.nodes[0].address}
    assert {auth for _a, _p, auth in _Gateway.seen} == {"Bearer " + gw_token}
    assert "probe gateway http://%s" % bridge in job.stdout
    assert token not in json.dumps(job.events) and gw_token not in json.dumps(job.events)


def test_the_stage_job_copies_on_the_gpu_nodes_only(fleet, tmp_path):
    """The template's limit (gpu_nodes) and the plays' groups keep staging off the k8s_api host: only the GPU node
    reads the shared filesystem and gets the verified copy on its NVMe."""
    from ansible_collections.llmops.serving.tests.lib import stage_synth

    api, gpu = fleet.nodes[0], fleet.nodes[1]
    src = os.path.join(fleet.shared, "models")
    stage_synth.write_checkpoint(os.path.join(src, "tiny-fleet", "r1"), 256 * 1024, shards=2)
    inv = str(tmp_path / "site")
    os.makedirs(inv)
    site = {"model_stage_src_root": src, "model_stage_fleet_slots_dir": os.path.join(fleet.shared, ".slots"),
            "model_stage_fleet_read_streams": 4, "model_stage_min_free_bytes": 0, "model_stage_textfile_dir": "",
            "model_stage_poll_interval": 1}
    hosts = {}
    for node in (api, gpu):
        hosts[node.name] = dict(fleet.hostvars(node), model_stage_dest_root=os.path.join(node.nvme, "models"),
                                model_stage_progress_dir=os.path.join(node.dir, "progress"))
    doc = {"all": {"vars": site, "children": {"k8s_api": {"hosts": {api.name: hosts[api.name]}},
                                              "gpu_nodes": {"children": {"colocated": {"hosts": {gpu.name: hosts[gpu.name]}}}}}}}
    with open(os.path.join(inv, "hosts.yml"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    ctl = awx.Controller(str(tmp_path / "jobs"), collections=awx.build_collection(str(tmp_path / "collection")),
                         settings={"llmops_awx_inventory_path": inv}, task_env=fleet.ansible_env({}))
    job = ctl.launch("llmops stage model", answers={"stage_model_name": "tiny-fleet", "stage_model_revision": "r1"})
    assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), job.summary()
    assert job.cmdline == "-u root --forks=64 -l gpu_nodes"
    hosts_ran = {e["event_data"]["host"] for e in job.events if e.get("event") in ("runner_on_ok", "runner_on_skipped")}
    assert hosts_ran == {gpu.name}
    assert os.path.isfile(os.path.join(gpu.nvme, "models", "tiny-fleet", "r1", "config.json"))
    assert not os.path.exists(os.path.join(api.nvme, "models"))
    assert job.artifacts["llmops_staged_path"] == os.path.join(gpu.nvme, "models", "tiny-fleet", "r1")
