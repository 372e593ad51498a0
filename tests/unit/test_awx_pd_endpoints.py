"""The workflow's verify node measures the P/D pair its P/D deploy node deployed, at the addresses it deployed.

* The endpoints come from what was deployed: roles/pd_disagg's own tasks, replayed offline as
  tests/unit/test_pd_apply_replay.py does (the objects ``pd_manifests`` renders, applied to the cluster model of
  tests/lib/kube_controllers.py, waited for by ``k8s_engine_wait`` with the role's arguments), then the role's
  "Name the endpoints" task templated over that wait's results: each role's /metrics is its current pod's address.
* Those endpoints reach verify as AWX hands them on (``set_stats`` artifacts of playbooks/pd_deploy.yml, a node's
  ancestor artifacts as its extra vars: tests/lib/awx_harness.py ``node_ancestor_artifacts``/``node_runtime_vars``,
  restating ``WorkflowJobNode.get_job_kwargs``), and playbooks/verify_transport.yml reads them: a stand-in /metrics
  server on this host's non-loopback address records the reads of a Check job.
* On Kubernetes, without those URLs or with loopback ones, verify refuses before it reads or sends anything.
"""
from __future__ import annotations

import fcntl
import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import threading

import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib import role_tasks as rt

from test_pd_apply_replay import _pods, deployed, fleet, poll, render, role_vars

ROOT = awx.ROOT
OBJECTS = awx.load_controller()
WORKFLOW = awx.by_name(OBJECTS["controller_workflows"], "llmops stage, deploy, verify")
ENDPOINTS_TASK = "Name the endpoints the deployed pair serves at"
GATEWAY = "http://aibrix-gateway.example"


def _endpoints(variables, rendered, results):
    """The role's endpoints task, templated as Ansible would run it after the wait (its task vars, then its args)."""
    task = rt.task("pd_disagg", "ansible.builtin.set_fact", "kubernetes.yml", name=ENDPOINTS_TASK)
    scope = dict(pd_disagg_rendered=rendered,
                 pd_disagg_rollout={"results": [dict(r, item=item) for item, r in results.items()]})
    for name in ("pd_disagg_prefill_pods", "pd_disagg_decode_pods", "pd_disagg_prefill_ip", "pd_disagg_decode_ip"):
        scope[name] = variables.template(task["vars"][name], scope)
    return variables.template(task["ansible.builtin.set_fact"], scope)["pd_disagg_endpoints"], task


@pytest.mark.parametrize("workload", ["deployments", "stormservice"])
def test_the_endpoints_are_the_deployed_pods_and_the_url_the_deploy_proved(run_module, tmp_path, workload):
    variables = role_vars(workload, "rdma", pd_disagg_k8s_probe_url=GATEWAY, pd_disagg_engine_port=8100)
    rendered = render(run_module, tmp_path, variables)
    results, objects = poll(run_module, variables, rendered, deployed(variables, rendered, fleet()))
    assert all(r["state"] == "ready" for r in results.values())
    endpoints, task = _endpoints(variables, rendered, results)
    ips = {role: [o["status"]["podIP"] for o in _pods(objects, role)] for role in ("prefill", "decode")}
    assert all(len(v) == 1 and v[0] for v in ips.values()), ips
    assert endpoints["decode_metrics_url"] == "http://%s:8100/metrics" % ips["decode"][0]
    assert endpoints["prefill_metrics_url"] == "http://%s:8100/metrics" % ips["prefill"][0]
    assert [p["ip"] for p in endpoints["decode_pods"]] == ips["decode"]
    assert endpoints["router_url"] == GATEWAY and endpoints["namespace"] == variables.get("pd_disagg_namespace")
    if workload == "deployments":
        front = (variables.get("pd_disagg_namespace"), rendered["service_name"], variables.get("pd_disagg_proxy_port"))
        assert endpoints["front_service"] == "%s/%s:%s" % front
    else:
        assert endpoints["front_service"] == ""
    # only after a real apply of a present pair: render and check mode deployed nothing to measure
    assert "pd_disagg_k8s_effective_mode == 'apply'" in task["when"] and "not ansible_check_mode" in task["when"]


def test_an_ipv6_pod_address_is_bracketed(run_module, tmp_path):
    variables = role_vars("deployments", "tcp")
    rendered = render(run_module, tmp_path, variables)
    results = {"prefill": {"revision": {"pod_addresses": [{"name": "p-0", "ip": "fd00::7"}]}},
               "decode": {"revision": {"pod_addresses": [{"name": "d-0", "ip": None}, {"name": "d-1", "ip": "fd00::8"}]}}}
    endpoints = _endpoints(variables, rendered, results)[0]
    port = variables.get("pd_disagg_engine_port")
    assert endpoints["prefill_metrics_url"] == "http://[fd00::7]:%s/metrics" % port
    assert endpoints["decode_metrics_url"] == "http://[fd00::8]:%s/metrics" % port
    assert endpoints["router_url"] == ""  # no probe URL: nothing proved an answer, verify refuses


# ---- verify transport, as the workflow's verify node runs it -------------------------------------------------------

def _local_address():
    """An IPv4 address of this host that is not loopback (where a node of the cluster would reach a pod)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
            addr = socket.inet_ntoa(packed[20:24])
            if not addr.startswith("127."):
                return addr
    return None


class _Metrics(http.server.BaseHTTPRequestHandler):
    seen = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append(self.path)
        body = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def metrics():
    addr = _local_address()
    if addr is None:
        pytest.skip("no non-loopback IPv4 address on this host")
    server = http.server.ThreadingHTTPServer((addr, 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://%s:%d" % (addr, server.server_address[1]), _Metrics.seen
    server.shutdown()


def _verify(tmp_path, extra_vars, check=False):
    """playbooks/verify_transport.yml with the extra vars its job gets, on a Kubernetes pair (two local hosts)."""
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {
        "vars": {"pd_disagg_platform": "kubernetes", "pd_disagg_model_name": "glm-pd",
                 "pd_verify_sysfs_root": str(tmp_path / "sys"), "llmops_root": str(tmp_path / "root")},
        "children": {"prefill": {"hosts": {"pf-1": local}}, "decode": {"hosts": {"dc-1": local}}}}}))
    (tmp_path / "sys").mkdir(exist_ok=True)
    ev = tmp_path / ("ev-%d.json" % len(list(tmp_path.glob("ev-*.json"))))
    ev.write_text(json.dumps({k: v for k, v in extra_vars.items() if not k.startswith(("awx_", "tower_"))}))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"))
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
           os.path.join(ROOT, "playbooks", "verify_transport.yml"), "-e", "@%s" % ev] + (["--check"] if check else [])
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def _verify_vars(artifacts):
    """The extra vars the workflow's verify job gets when the P/D deploy node exported ``artifacts``."""
    dag = awx.WorkflowDAG(WORKFLOW["workflow_nodes"])
    jobs, kept = {}, {}
    for ident in ("stage", "approve deploy", "deploy", "deploy P/D pair"):
        awx.node_ancestor_artifacts(dag, ident, jobs, kept)
        job = awx.Approval("approve") if ident == "approve deploy" else awx.Job(0, {}, "", {}, "", {})
        job.status = "successful"
        if ident == "deploy P/D pair":
            job.events = [{"event": "playbook_on_stats", "event_data": {"artifact_data": artifacts}}]
        jobs[ident] = job
    template = awx.by_name(OBJECTS["controller_templates"], "llmops verify transport")
    (node,) = [n for n in WORKFLOW["workflow_nodes"] if n["identifier"] == "verify"]
    runtime = awx.node_runtime_vars(template, node, awx.node_ancestor_artifacts(dag, "verify", jobs, kept), {})
    return awx.job_extra_vars(template, runtime)


def _exported(endpoints):
    """The artifacts playbooks/pd_deploy.yml exports from the role's endpoints (its set_stats task, templated)."""
    with open(os.path.join(ROOT, "playbooks", "pd_deploy.yml"), encoding="utf-8") as f:
        (play,) = yaml.safe_load(f)
    (task,) = [t for t in play["tasks"] if "ansible.builtin.set_stats" in t]
    return rt.RoleVars("pd_disagg", {"pd_disagg_endpoints": endpoints}).template(task["ansible.builtin.set_stats"]["data"])


def test_verify_reads_the_pair_at_the_endpoints_the_p_d_deploy_exported(tmp_path, metrics):
    """A Check job of verify (job_type check: no load is sent) on a Kubernetes pair reads each engine's counters at
    the URLs the P/D deploy exported, on every P/D host, and refuses nothing."""
    url, seen = metrics
    endpoints = {"router_url": url + "/router", "decode_metrics_url": url + "/decode/metrics",
                 "prefill_metrics_url": url + "/prefill/metrics"}
    artifacts = _exported(endpoints)
    assert artifacts["llmops_pd_decode_metrics_url"] == url + "/decode/metrics"
    extra = _verify_vars(artifacts)
    assert extra["llmops_pd_router_url"] == url + "/router"
    del seen[:]
    rc, out = _verify(tmp_path, extra, check=True)
    assert rc == 0, out[-3000:]
    assert "Refuse to measure a Kubernetes pair" in out and "not set" not in out
    assert seen.count("/decode/metrics") >= 2 and seen.count("/prefill/metrics") >= 2, seen  # pf-1 and dc-1


def test_verify_refuses_a_kubernetes_pair_without_urls_or_at_loopback_before_anything_is_read(tmp_path, metrics):
    url, seen = metrics
    del seen[:]
    # no P/D deploy artifact for the router, the inventory's metrics URL still the local pair's loopback default
    rc, out = _verify(tmp_path, {"pd_verify_decode_metrics_url": "http://127.0.0.1:18101/metrics",
                                 "llmops_pd_prefill_metrics_url": url + "/prefill/metrics"})
    assert rc != 0, out[-3000:]
    assert ("pd_disagg_platform is kubernetes: not set: pd_verify_router_url (or the artifact llmops_pd_router_url). "
            "at a loopback address: pd_verify_decode_metrics_url (or the artifact llmops_pd_decode_metrics_url) = "
            "http://127.0.0.1:18101/metrics.") in out
    assert "Run the P/D deploy first (playbooks/pd_deploy.yml" in out
    assert "Snapshot every RDMA port" not in out and seen == []
    # every loopback spelling, each URL named with its value
    bad = {"llmops_pd_router_url": "http://localhost:8000", "llmops_pd_decode_metrics_url": "http://[::1]:8000/metrics",
           "llmops_pd_prefill_metrics_url": "http://0.0.0.0:9/metrics"}
    rc, out = _verify(tmp_path, bad)
    assert rc != 0, out[-3000:]
    assert ("at a loopback address: pd_verify_router_url (or the artifact llmops_pd_router_url) = http://localhost:8000, "
            "pd_verify_decode_metrics_url (or the artifact llmops_pd_decode_metrics_url) = http://[::1]:8000/metrics, "
            "pd_verify_prefill_metrics_url (or the artifact llmops_pd_prefill_metrics_url) = http://0.0.0.0:9/metrics.") in out
    assert "not set" not in out
    assert seen == []
