"""The deploy job template (playbooks/site.yml) run as AWX runs it against a fleet of network namespaces over SSH.

The fleet inventory (tests/lib/netns.py) has a k8s_api host (node1) and one colocated GPU node (node2, Kubernetes
node ``h20-gpu-02``). The job's Kubernetes credential points at a stand-in API server (tests/lib/kube_api.py) on
loopback, which only the execution environment (this process's network namespace) reaches; its controllers run the
engine Deployment and its scheduler places the pods among the fleet's nodes plus an extra GPU node
(``h20-gpu-01``) that the inventory does not know and that did not stage the revision (it sorts first, so a pod
without the staged-node pin would land there). The readiness probe (delegated to the EE) goes to an AIBrix gateway
stand-in on loopback (tests/lib/aibrix_oracle.py's route table over the API's objects and Ready pods).

The revision (tests/lib/stage_synth.py) is really staged over SSH from the fleet's shared directory onto node2's
NVMe directory. The nodes have no GPU: preflight runs with the switches a site without GPUs in CI uses
(preflight_require_gpu false, preflight_min_gpus 0, no RDMA, no engine Python on the node) and reports what it
found (no GPU), it does not pretend to see one; the kernel-cache fingerprint is computed from the image's declared
versions (kernel_cache_gather false, as inventories/example-h20 does on the Kubernetes path), so no engine runs on
the node.
"""
from __future__ import annotations

import json
import os
import socket

import pytest

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib import kube_api
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.lib import netns
from ansible_collections.llmops.serving.tests.lib import stage_synth

MODEL = "tiny-fleet"
SERVED = "tiny-fleet-vllm"
NAMESPACE = "llm-serving"
STAGED_NODE, UNSTAGED_NODE = "h20-gpu-02", "h20-gpu-01"
GPU_LABELS = {"nvidia.com/gpu.present": "true"}
GPU_NODE = {"cpu": "190", "memory": "2000Gi", "nvidia.com/gpu": "8", "pods": "110"}
DEPLOY_PLAYS = ("Preflight", "Demo model on the shared filesystem", "Stage the model to node-local NVMe",
                "Kernel caches keyed by a version fingerprint")
# the Kubernetes steps of roles/engine/tasks/kubernetes.yml: apply, wait, probe
K8S_TASKS = ("Apply the objects (Service, ReferenceGrant, HTTPRoute, PodDisruptionBudget, then the workload)",
             "Wait for Ready pods and an Accepted/ResolvedRefs route", "Prove one correct answer through the given URL")


@pytest.fixture(scope="module")
def fleet():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    with netns.Fleet(2) as f:
        src = os.path.join(f.shared, "models")
        stage_synth.write_checkpoint(os.path.join(src, MODEL, "r1"), 256 * 1024, shards=2)
        stage_synth.write_checkpoint(os.path.join(src, MODEL, "r2"), 256 * 1024, shards=2, seed=2)
        yield f


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    return awx.build_collection(str(tmp_path_factory.mktemp("collection")))


def _nodes(fleet):
    """The cluster's nodes: the fleet's hosts by k8s_node_name (node1 is the tainted control plane), plus an extra
    GPU node the inventory does not stage on."""
    return [ks.node(fleet.nodes[0].name, labels={"node-role.kubernetes.io/control-plane": ""},
                    taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
                    allocatable={"cpu": "8", "memory": "32Gi", "pods": "110"}),
            ks.node(UNSTAGED_NODE, labels=GPU_LABELS, allocatable=GPU_NODE),
            ks.node(STAGED_NODE, labels=GPU_LABELS, allocatable=GPU_NODE)]


def _has_dir(fleet):
    gpu = fleet.nodes[1]

    def has_dir(node, path):
        # node2's NVMe is its own directory of the shared test filesystem; the extra node has nothing staged
        return node == STAGED_NODE and path.startswith(gpu.nvme + os.sep) and os.path.isdir(path)
    return has_dir


def _inventory(fleet, path, gateway_url, **site):
    api, gpu = fleet.nodes[0], fleet.nodes[1]
    doc_vars = {
        "engine_platform": "kubernetes", "engine_name": "vllm", "engine_namespace": NAMESPACE,
        "engine_served_model_name": SERVED, "engine_image": "vllm/vllm-openai:v0.11.0@sha256:" + "a" * 64,
        "engine_k8s_node_selector": GPU_LABELS, "engine_k8s_probe_period": 1, "engine_startup_timeout": 120,
        "engine_k8s_wait_timeout": 120, "engine_k8s_schedule_timeout": 60, "engine_k8s_route_condition_timeout": 30,
        "engine_k8s_probe_url": gateway_url, "engine_k8s_timeline_dir": os.path.join(fleet.root, "timelines"),
        # a site without GPUs in CI: the hardware checks report, they do not require
        "preflight_require_gpu": False, "preflight_min_gpus": 0, "preflight_require_rdma": False,
        "preflight_engine_python": "",
        # the Kubernetes path of inventories/example-h20: the fingerprint from the image's declared versions
        "kernel_cache_enabled": True, "kernel_cache_gather": False, "kernel_cache_engine_version": "0.11.0",
        "kernel_cache_versions": {"torch": "2.8.0", "triton": "3.4.0", "cuda": "12.8"},
        "kernel_cache_gpu_name": "NVIDIA H20", "kernel_cache_compute_capability": "9.0",
        "kernel_cache_driver_version": "570.133.20", "kernel_cache_parallel": {"tp": 8}, "kernel_cache_moe_check": False,
        # no engine on the node to fill the caches with: verify and restore only (the engine's first start fills them)
        "kernel_cache_prebuild": False,
        "model_stage_src_root": os.path.join(fleet.shared, "models"),
        "model_stage_fleet_slots_dir": os.path.join(fleet.shared, ".slots"), "model_stage_fleet_read_streams": 4,
        "model_stage_min_free_bytes": 0, "model_stage_textfile_dir": "", "model_stage_poll_interval": 1}
    doc_vars.update(site)
    hosts = {}
    for node in (api, gpu):
        hosts[node.name] = dict(fleet.hostvars(node), model_stage_dest_root=os.path.join(node.nvme, "models"),
                                model_stage_progress_dir=os.path.join(node.dir, "progress"),
                                kernel_cache_root=os.path.join(node.nvme, "kernel-cache"),
                                preflight_paths=[node.nvme])
    hosts[gpu.name]["k8s_node_name"] = STAGED_NODE
    doc = {"all": {"vars": doc_vars, "children": {
        "k8s_api": {"hosts": {api.name: hosts[api.name]}},
        "gpu_nodes": {"children": {"colocated": {"hosts": {gpu.name: hosts[gpu.name]}}}}}}}
    os.makedirs(path)
    with open(os.path.join(path, "hosts.yml"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def _results(job):
    kinds = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_item_on_ok")
    return [dict(e["event_data"], event=e["event"]) for e in job.events if e.get("event") in kinds]


def _delegated(data):
    return (data.get("res") or {}).get("_ansible_delegated_vars", {}).get("ansible_host")


@pytest.fixture(scope="module")
def deployed(fleet, collection, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy")
    token = "k8s-" + os.urandom(8).hex()
    with kube_api.KubeAPI(token, _nodes(fleet), NAMESPACE, has_dir=_has_dir(fleet)) as api, \
            kube_api.Gateway(api, "FP8_OK") as gw:
        ctl = awx.Controller(str(tmp / "jobs"), collections=collection,
                             settings={"llmops_awx_inventory_path": _inventory(fleet, str(tmp / "site"), gw.url)},
                             credentials={"llmops Kubernetes": {"host": api.url, "bearer_token": token}},
                             task_env=fleet.ansible_env({}))
        job = ctl.launch("llmops deploy", answers={"stage_model_name": MODEL, "stage_model_revision": "r1"})
        yield dict(job=job, api=api, gw=gw, token=token, pods=api.pods(), ctl=ctl)


def test_the_deploy_job_stages_on_the_gpu_node_and_serves_from_the_ee(fleet, deployed):
    job, api, gw, token = deployed["job"], deployed["api"], deployed["gw"], deployed["token"]
    api_host, gpu = fleet.nodes[0], fleet.nodes[1]
    refused = [(r["method"], r["path"], r["status"]) for r in api.requests if r["status"] >= 400]
    assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), (job.summary(), refused)
    assert "-l gpu_nodes:k8s_api" in job.cmdline

    results = _results(job)
    # preflight, stage and kernel caches: on the GPU node, over SSH to its address, never delegated elsewhere
    node_side = [r for r in results if r.get("play") in DEPLOY_PLAYS]
    assert {r["play"] for r in node_side} >= {"Preflight", "Stage the model to node-local NVMe",
                                              "Kernel caches keyed by a version fingerprint"}
    assert {(r["host"], r.get("remote_addr") or r["host"]) for r in node_side} == {(gpu.name, gpu.name)}
    assert all(_delegated(r) in (None, gpu.address) for r in node_side), \
        sorted({(r["task"], _delegated(r)) for r in node_side if _delegated(r) not in (None, gpu.address)})
    ran = {r["task"] for r in node_side if r.get("event") != "runner_on_skipped" and "skip_reason" not in r.get("res", {})}
    assert {"Gather GPU, disk, RDMA and engine runtime facts", "Compute the kernel-cache fingerprint"} <= ran, sorted(ran)
    # the k8s_api host ran nothing over SSH: no task had it as its host
    assert api_host.name not in {r["host"] for r in results}
    # the Kubernetes tasks ran once each, in the EE: the wait and the probe say so in their results (delegated to
    # localhost over the local connection); the apply's result is censored (no_log): the API's record below shows it
    k8s = {}
    for r in results:
        if r.get("task") in K8S_TASKS and "censored" not in r.get("res", {}):
            k8s.setdefault(r["task"], []).append((r["res"].get("_ansible_delegated_vars") or {}).get("ansible_connection"))
    assert k8s == {K8S_TASKS[1]: ["local"], K8S_TASKS[2]: ["local"]}, k8s

    # the revision was really staged on node2's NVMe, and only there, by a module that ran in node2's session (the
    # completion marker names the host the copy ran on: node2's own hostname, not the EE's)
    staged = os.path.join(gpu.nvme, "models", MODEL, "r1")
    assert os.path.isfile(os.path.join(staged, "config.json"))
    with open(os.path.join(staged, ".llmops-staged.json"), encoding="utf-8") as f:
        assert json.load(f)["host"] == gpu.name != socket.gethostname()
    assert not os.path.exists(os.path.join(api_host.nvme, "models"))

    # every Kubernetes request: from the EE (the API listens on loopback only), with the credential's token
    assert api.requests and {(r["client"], r["authorization"]) for r in api.requests} == {("127.0.0.1", "Bearer " + token)}
    created = sorted((r["path"].rsplit("/", 1)[-1]) for r in api.writes() if r["method"] == "POST")
    assert created == ["deployments", "httproutes", "referencegrants", "services"], api.writes()
    assert not any(r["dry_run"] for r in api.writes())
    assert any(r["path"] == "/api/v1/namespaces/%s/pods" % NAMESPACE and r["method"] == "GET" for r in api.requests)

    # the pods: placed only on the node that staged the revision, although an unstaged GPU node exists and sorts first
    pods = deployed["pods"]
    assert pods and {p["spec"]["nodeName"] for p in pods} == {STAGED_NODE}
    assert all(p["metadata"]["labels"].get("pod-template-hash") for p in pods)
    spec = pods[0]["spec"]
    nodes = _nodes(fleet)
    assert ks.reasons(("pod", pods[0]["metadata"]["labels"], NAMESPACE, spec), nodes[1], nodes) == [
        "node(s) didn't match Pod's node affinity/selector"]
    host_paths = [v["hostPath"]["path"] for v in spec["volumes"] if v.get("hostPath")]
    # the staged revision, and (a kernel-cache miss on this node) the per-start directory the first start compiles
    # into, published after its first correct answer (roles/kernel_cache "On Kubernetes")
    assert host_paths[0] == staged, host_paths
    assert all("/kernel-cache/" in p and "/.run/" in p for p in host_paths[1:]), host_paths

    # the readiness probe ran in the EE too: the gateway (on loopback) saw it, and the chat answer took the route
    assert {addr for addr, _m, _p, _r, _s in gw.seen} == {"127.0.0.1"}
    assert ("POST", "/v1/chat/completions", SERVED + "-router", 200) in [s[1:] for s in gw.seen], gw.seen
    assert job.artifacts["llmops_served_model_name"] == SERVED

    # the token is in no job event and not in the output
    assert token not in json.dumps(job.events) and token not in job.stdout


def test_a_revision_staged_on_fewer_nodes_than_replicas_fails_before_anything_is_applied(
        fleet, collection, deployed, tmp_path):
    """engine_replicas 2 with the revision staged on one colocated node: the job fails in the engine play, naming the
    hosts and the fix, and the cluster never sees a request (the engine objects are never built)."""
    token = "k8s-" + os.urandom(8).hex()
    with kube_api.KubeAPI(token, _nodes(fleet), NAMESPACE, has_dir=_has_dir(fleet)) as api:
        ctl = awx.Controller(str(tmp_path / "jobs"), collections=collection,
                             settings={"llmops_awx_inventory_path": _inventory(fleet, str(tmp_path / "site"),
                                                                               "http://127.0.0.1:9", engine_replicas=2)},
                             credentials={"llmops Kubernetes": {"host": api.url, "bearer_token": token}},
                             task_env=fleet.ansible_env({}))
        # the revision is staged (the deploy job above): only the engine step, as an SRE re-runs it
        job = ctl.launch("llmops deploy", answers={"stage_model_name": MODEL, "stage_model_revision": "r1",
                                                   "kernel_cache_enabled": "false"},
                         prompts={"job_tags": "engine"})
    assert job.status == "failed", job.summary()
    failed = [e["event_data"] for e in job.failed_events]
    assert [f["task"] for f in failed] == ["Refuse a revision staged on fewer nodes than pods"], job.summary()
    msg = failed[0]["res"]["msg"]
    assert "engine_replicas 2 needs 2 node(s)" in msg and "staged on %s" % fleet.nodes[1].name in msg, msg
    assert "Stage it on more hosts of colocated" in msg
    assert api.writes() == [] and api.requests == []
    assert token not in json.dumps(job.events)


def test_a_check_job_changes_nothing_and_says_what_it_skipped(fleet, deployed):
    """AWX "Check" (--check) of the deploy template for a revision not staged anywhere yet, on the fleet that serves
    r1: nothing is copied, no object is written (the apply is the API server's dry run: dryRun=All, recorded apart),
    the pods stay as they are, no cold start is measured from the old pods, and the output says what it skipped."""
    api, ctl, gpu = deployed["api"], deployed["ctl"], fleet.nodes[1]
    before = len(api.requests)
    pods = sorted(p["metadata"]["name"] for p in api.pods())
    job = ctl.launch("llmops deploy", answers={"stage_model_name": MODEL, "stage_model_revision": "r2"},
                     prompts={"job_type": "check"})
    assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), job.summary()
    assert job.cmdline.startswith("--check ")
    requests = api.requests[before:]
    assert [(r["method"], r["path"]) for r in requests if r["method"] != "GET" and not r["dry_run"]] == []
    # the apply ran, as the API server's dry run (kubernetes.core patches with dryRun=All in check mode), the new
    # revision's Deployment among it
    dry = [(r["method"], r["path"]) for r in requests if r["dry_run"]]
    assert {m for m, _p in dry} == {"PATCH"}, dry
    assert ("PATCH", "/apis/apps/v1/namespaces/%s/deployments/%s" % (NAMESPACE, SERVED)) in dry
    assert deployed["token"] not in json.dumps(job.events)
    assert sorted(p["metadata"]["name"] for p in api.pods()) == pods
    assert not os.path.exists(os.path.join(gpu.nvme, "models", MODEL, "r2"))
    said = " ".join(job.stdout.split())  # the callback wraps long messages
    for skipped in ("is not staged on %s yet (a real run stages it first)" % gpu.name,
                    "so there is no config.json to fingerprint",
                    "nothing was rolled out (the objects were only dry-run), so there is no cold-start timeline"):
        assert skipped in said, (skipped, said[-6000:])
    assert "first correct response" not in said
