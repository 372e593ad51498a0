"""The AWX workflow "llmops upgrade" run node by node, as AWX runs it, on a fleet of network namespaces whose two GPU
nodes serve the demo model with real vLLM CPU engines.

The fleet (tests/lib/netns.py) has two hosts in ``colocated``, node1 and node2, each a network namespace with its own
sshd, hostname, "NVMe" directory and engine (``engine_platform: local``, listening on the node's own loopback). The
job template ``llmops deploy`` (playbooks/site.yml) stages revision A (the demo model, seed 0) from the fleet's shared
directory onto both nodes and serves it. Then the workflow (awx/controller_workflows.yml) runs through
tests/lib/awx_harness.py ``Controller.run_workflow``, which does what AWX does between the nodes
(awx/main/models/workflow.py ``WorkflowJobNode.get_job_kwargs``; awx/main/scheduler/dag_workflow.py ``WorkflowDAG``):
each node launches its template ``llmops upgrade phase`` with its ``extra_data`` ``upgrade_phase`` (the template's
survey asks for it), the workflow survey's answers (``upgrade_model_name``, ``upgrade_model_revision``) and the stage
node's artifact ``llmops_upgrade_from`` reach every later node (all written ``!unsafe`` into ``env/extravars``), and
the approval node is answered by the test, after it looked at what the canary left. The workflow's status is AWX's
rule (``WorkflowDAG.has_workflow_failed``): failed only when a failed node has neither a failure nor an always edge.

Cases, in this order on the same fleet:

* (b) B the engine cannot load (a config.json whose context is shorter than the engine's ``--max-model-len``, as
  tests/integration/test_upgrade_local.py builds it: transformers loads it, vLLM refuses it at start): the canary
  fails and restores A on node1, its failure edge runs ``diagnose canary``, which fails naming the phase; no approval
  is asked, the roll never runs, the workflow is failed; node1 serves A again (a new process), node2 was never touched.
* (a) a good B (the demo model, seed 1): every node successful in order, the approval answered after node1 serves B
  and node2 still A; the workflow is successful and both nodes serve B.

What serves is read from each node itself: the engine's process and command line (its run directory) and its greedy
answers, asked inside the node's namespace, equal to transformers' own greedy generation on the revision that should
serve (computed here, not by the role).

Engine settings (the inventory's): eager mode, the engine core and its worker in the API server's process, soak 1 s
and no kernel cache, so that an engine start costs the interpreter's imports only. What the upgrade does between
the starts does not depend on them.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from llmops_testlib import EAGER_ENGINE

from ansible_collections.llmops.serving.plugins.module_utils.engine import _demo_model
from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference
from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib import netns

WORKFLOW = "llmops upgrade"
MODEL = "tiny-llama"
#: the engine's port on each node's own loopback (a namespace of its own; no other test uses it)
PORT = 18561
PROMPTS = ["The model is staged", "Prefill computes the prompt"]
MAX_TOKENS = 16
PHASES = ["upgrade stage", "upgrade cache", "upgrade canary", "approve upgrade", "upgrade roll", "upgrade soak"]
DIAGNOSES = ["diagnose canary", "diagnose roll", "diagnose soak"]

_REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason="network namespaces unavailable: %s" % _REASON)

#: greedy completions of PROMPTS from the engine on the node's loopback, run inside the node's namespace
PROBE = r"""
import json, sys, urllib.request
out = []
for prompt in json.loads(sys.argv[2]):
    body = {"model": sys.argv[3], "prompt": prompt, "max_tokens": int(sys.argv[4]), "temperature": 0,
            "return_token_ids": True}
    req = urllib.request.Request(sys.argv[1] + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out.append(json.load(r)["choices"][0]["token_ids"])
print(json.dumps(out))
"""

TIMES = {}


@pytest.fixture(scope="module")
def fleet():
    with netns.Fleet(2) as f:
        yield f


@pytest.fixture(scope="module")
def revisions(fleet):
    """A (seed 0), B (seed 1) and a B the engine cannot load, on the shared filesystem; {label: (revision, src)}."""
    root = os.path.join(fleet.shared, "models")
    a = _demo_model.generate_model(root, name=MODEL, seed=0)
    b = _demo_model.generate_model(root, name=MODEL, seed=1)
    short = os.path.join(root, MODEL, "short-context")
    shutil.copytree(a["path"], short)
    with open(os.path.join(short, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["max_position_embeddings"] = 64  # the engine runs --max-model-len 512 (the inventory below)
    with open(os.path.join(short, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    os.remove(os.path.join(short, "SHA256SUMS"))  # the edited config.json is this revision's own file now
    assert a["revision"] != b["revision"]
    return {"A": (a["revision"], a["path"]), "B": (b["revision"], b["path"]), "short": ("short-context", short)}


#: the engine module's reference script (transformers' greedy generate) run once per request, in one interpreter
BOTH = r"""
import io, json, sys
script = sys.argv[1]
for req in json.loads(sys.stdin.read()):
    sys.stdin = io.StringIO(json.dumps(req))
    exec(compile(script, "<reference>", "exec"), {"__name__": "__main__"})
"""


class _References:
    """transformers' greedy token ids of PROMPTS on A's and B's files on the shared filesystem (what each revision
    must answer), computed here, beside the deploy, and waited for when first read."""

    def __init__(self, revisions):
        reqs = [{"model_path": revisions[label][1], "prompts": PROMPTS, "max_new_tokens": MAX_TOKENS,
                 "dtype": "float32"} for label in ("A", "B")]
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._future = self._pool.submit(subprocess.run, [sys.executable, "-c", BOTH, _reference.SCRIPT],
                                         input=json.dumps(reqs), capture_output=True, text=True, timeout=900,
                                         check=False)
        self._tokens = None

    def __getitem__(self, label):
        if self._tokens is None:
            proc = self._future.result()
            self._pool.shutdown()
            docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            assert proc.returncode == 0 and len(docs) == 2, proc.stderr[-2000:]
            self._tokens = {label: [r["token_ids"] for r in doc["references"]] for label, doc in zip("AB", docs)}
            assert self._tokens["A"] != self._tokens["B"], "A and B answer alike: no answer could tell them apart"
        return self._tokens[label]


@pytest.fixture(scope="module")
def references(revisions):
    return _References(revisions)


def _site(fleet, path):
    """The site inventory: node1 and node2 in colocated (gpu_nodes), each its own llmops directories."""
    site = {
        "engine_name": "vllm", "engine_platform": "local", "engine_served_model_name": MODEL, "engine_tp_size": 1,
        "engine_port": PORT, "engine_startup_timeout": 600, "engine_local_max_model_len": 512,
        **EAGER_ENGINE,
        "engine_env": {"VLLM_USE_AOT_COMPILE": "0"}, "engine_extra_args": [],
        "kernel_cache_enabled": False, "upgrade_soak_seconds": 1,
        # a site without GPUs in CI: the hardware checks report, they do not require
        "preflight_require_gpu": False, "preflight_min_gpus": 0, "preflight_require_rdma": False,
        "preflight_engine_python": "",
        "model_stage_src_root": os.path.join(fleet.shared, "models"),
        "model_stage_fleet_slots_dir": os.path.join(fleet.shared, ".slots"), "model_stage_fleet_read_streams": 4,
        "model_stage_min_free_bytes": 0, "model_stage_textfile_dir": "", "model_stage_poll_interval": 1}
    hosts = {}
    for node in fleet.nodes:
        hosts[node.name] = dict(fleet.hostvars(node), model_stage_dest_root=os.path.join(node.nvme, "models"),
                                model_stage_progress_dir=os.path.join(node.dir, "progress"),
                                engine_local_run_dir=os.path.join(node.dir, "run"), preflight_paths=[node.nvme])
    doc = {"all": {"vars": site, "children": {"gpu_nodes": {"children": {"colocated": {"hosts": hosts}}}}}}
    os.makedirs(path)
    with open(os.path.join(path, "hosts.yml"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


@pytest.fixture(scope="module")
def controller(fleet, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("awx-upgrade")
    collection = awx.build_collection(str(tmp / "collection"))
    return awx.Controller(str(tmp / "jobs"), collections=collection,
                          settings={"llmops_awx_inventory_path": _site(fleet, str(tmp / "site"))},
                          task_env=fleet.ansible_env({}))


def _served(fleet, node):
    """(pid, model directory, recorded revision) of the engine that runs on ``node`` now."""
    run = os.path.join(node.dir, "run")
    with open(os.path.join(run, "engine", "spec.json"), encoding="utf-8") as f:
        command = json.load(f)["command"]
    with open(os.path.join(run, "engine", "state.json"), encoding="utf-8") as f:
        pid = json.load(f).get("pid")
    with open(os.path.join(run, "engine.serving.json"), encoding="utf-8") as f:
        revision = json.load(f)["revision"]
    return pid, command[command.index("--model") + 1], revision


def _answers(fleet, node):
    """The greedy token ids the engine of ``node`` answers, asked from inside the node's namespace."""
    proc = fleet.exec(node, [sys.executable, "-c", PROBE, "http://127.0.0.1:%d" % PORT, json.dumps(PROMPTS), MODEL,
                             str(MAX_TOKENS)], check=False, timeout=180)
    assert proc.returncode == 0, "%s: the engine did not answer: %s" % (node.name, proc.stderr[-2000:])
    return json.loads(proc.stdout)


def _assert_serves(fleet, node, label, revisions, references):
    """``node`` serves revision ``label``: its engine loads the staged copy, its record names it, and its greedy
    answers equal transformers' on that revision's files."""
    revision = revisions[label][0]
    pid, path, recorded = _served(fleet, node)
    assert (path, recorded) == (os.path.join(node.nvme, "models", MODEL, revision), revision), (node.name, label)
    assert _answers(fleet, node) == references[label], "%s does not answer as %s" % (node.name, label)
    return pid


def _statuses(run):
    return [(ident, job.status) for ident, job in run.items()]


def _timeline(run):
    """Each node's status and the seconds its job ran (an approval: none)."""
    return ", ".join("%s %s%s" % (ident, job.status, " %.0f s" % job.elapsed if getattr(job, "elapsed", None) else "")
                     for ident, job in run.items())


def _summary(run):
    return "\n".join("%s: %s" % (ident, job.summary(1500) if hasattr(job, "summary") else job.status)
                     for ident, job in run.items())


def _extravars(job):
    with open(os.path.join(job.private_data_dir, "env", "extravars"), encoding="utf-8") as f:
        return f.read()


def _failed_msgs(job):
    return [(e["event_data"]["host"], e["event_data"]["task"], e["event_data"]["res"].get("msg"))
            for e in job.failed_events]


@pytest.fixture(scope="module")
def deployed(fleet, revisions, references, controller):
    """The deploy template serves A on both nodes: {node name: pid}."""
    started = time.monotonic()
    job = controller.launch("llmops deploy", answers={"stage_model_name": MODEL,
                                                      "stage_model_revision": revisions["A"][0]})
    TIMES["deploy A"] = time.monotonic() - started
    assert (job.status, job.failed_events) == ("successful", []), job.summary()
    return {n.name: _assert_serves(fleet, n, "A", revisions, references) for n in fleet.nodes}


@pytest.fixture(scope="module")
def canary_failed(fleet, controller, revisions, deployed):
    """(b): the workflow to the B the engine cannot load."""
    asked = []

    def decide(ident, jobs):
        asked.append(list(jobs))
        return "deny"

    started = time.monotonic()
    run = controller.run_workflow(WORKFLOW, answers={"upgrade_model_name": MODEL,
                                                     "upgrade_model_revision": revisions["short"][0]},
                                  approvals={"approve upgrade": decide})
    TIMES["(b) canary fails"] = time.monotonic() - started
    return run, asked


@pytest.fixture(scope="module")
def upgraded(fleet, controller, revisions, references, canary_failed):
    """(a): the workflow to a good B; the approval is answered once the canary host serves B and the other A."""
    seen = {}

    def decide(ident, jobs):
        seen["ran"] = list(jobs)
        seen["canary"] = _assert_serves(fleet, fleet.nodes[0], "B", revisions, references)
        seen["other"] = _assert_serves(fleet, fleet.nodes[1], "A", revisions, references)
        return "approve"

    started = time.monotonic()
    run = controller.run_workflow(WORKFLOW, answers={"upgrade_model_name": MODEL,
                                                     "upgrade_model_revision": revisions["B"][0]},
                                  approvals={"approve upgrade": decide})
    TIMES["(a) good upgrade"] = time.monotonic() - started
    return run, seen


def test_a_canary_that_fails_restores_a_there_and_ends_the_workflow_failed_after_its_diagnosis(
        fleet, revisions, references, deployed, canary_failed):
    run, asked = canary_failed
    canary, other = fleet.nodes
    assert _statuses(run) == [("upgrade stage", "successful"), ("upgrade cache", "successful"),
                              ("upgrade canary", "failed"), ("diagnose canary", "failed")], _summary(run)
    print("(b) node by node: %s" % _timeline(run))
    # AWX's rule (awx/main/scheduler/dag_workflow.py WorkflowDAG.has_workflow_failed, restated by the harness's
    # WorkflowDAG): the canary's failure is handled by its failure edge; the diagnosis, failed with no failure edge
    # of its own, fails the workflow (and sends the error notifications, never the success ones)
    assert run.status == "failed"
    assert run.reason == "No error handling path for workflow job node(s) [(diagnose canary,failed)]."
    assert run.not_run == sorted(["approve upgrade", "upgrade roll", "upgrade soak", "diagnose roll", "diagnose soak"])
    assert asked == [], "the approval was asked after a failed canary"

    # every node ran its own phase, with the workflow's answers and, after stage, the stage node's A of each host
    stage = run["upgrade stage"]
    a_rev = revisions["A"][0]
    assert stage.artifacts["llmops_upgrade_from"] == {
        n.name: {"model": MODEL, "revision": a_rev, "model_path": os.path.join(n.nvme, "models", MODEL, a_rev)}
        for n in fleet.nodes}
    for ident in ("upgrade stage", "upgrade cache", "upgrade canary"):
        job = run[ident]
        assert job.extra_vars["upgrade_phase"] == ident.split()[1]
        assert (job.extra_vars["upgrade_model_name"], job.extra_vars["upgrade_model_revision"]) == (MODEL, "short-context")
        assert ("llmops_upgrade_from" in job.extra_vars) is (ident != "upgrade stage")
        text = _extravars(job)
        assert "!unsafe 'upgrade_phase': !unsafe '%s'" % ident.split()[1] in text
        assert "!unsafe 'upgrade_model_revision': !unsafe 'short-context'" in text
        assert "-l colocated" in job.cmdline
    assert run["upgrade canary"].extra_vars["llmops_upgrade_from"] == stage.artifacts["llmops_upgrade_from"]
    assert "!unsafe 'model_path': !unsafe '%s'" % os.path.join(canary.nvme, "models", MODEL, a_rev) in _extravars(
        run["upgrade canary"])

    # the canary's job: only node1 switched, failed on B, and said that A serves again
    failed = _failed_msgs(run["upgrade canary"])
    assert {h for h, _t, _m in failed} == {canary.name}, failed
    assert failed[-1][1] == "Fail with B's diagnosis, saying that A serves", failed
    msg = " ".join(failed[-1][2].split())
    assert msg.startswith("upgrade to %s@short-context failed in phase canary:" % MODEL), msg
    assert "Rolled back: %s@%s serves again" % (MODEL, a_rev) in msg, msg

    # the diagnosis ran on the failure path and failed naming the phase
    diagnosis = run["diagnose canary"]
    assert diagnosis.extra_vars["diagnose_fail_after"] == "llmops upgrade (canary)"
    said = " ".join(diagnosis.stdout.split())
    assert "llmops upgrade (canary) failed; this diagnosis ran on its failure path" in said, diagnosis.summary()

    # node1 serves A again, a process started after B's; node2 was never touched
    assert _assert_serves(fleet, canary, "A", revisions, references) != deployed[canary.name]
    assert _assert_serves(fleet, other, "A", revisions, references) == deployed[other.name]


def test_a_good_upgrade_runs_every_phase_and_ends_with_both_nodes_serving_b(
        fleet, revisions, references, deployed, upgraded):
    run, seen = upgraded
    canary, other = fleet.nodes
    assert _statuses(run) == [(ident, "successful") for ident in PHASES], _summary(run)
    # the same rule (WorkflowDAG.has_workflow_failed): no node failed, so the workflow is successful
    assert run.status == "successful" and run.reason is None
    assert run.not_run == DIAGNOSES
    print("(a) node by node: %s" % _timeline(run))
    # the approval was answered after the canary: node1 on B, node2 still on A (its pid of the deploy)
    assert seen["ran"] == PHASES[:3]
    assert seen["other"] == deployed[other.name]
    for ident in ("upgrade roll", "upgrade soak"):
        assert run[ident].extra_vars["upgrade_phase"] == ident.split()[1]
        assert run[ident].extra_vars["llmops_upgrade_from"] == run["upgrade stage"].artifacts["llmops_upgrade_from"]
    # the stage node read A from the serving records (node1's is A's again after the rollback of (b))
    assert {h: a["revision"] for h, a in run["upgrade stage"].artifacts["llmops_upgrade_from"].items()} == {
        n.name: revisions["A"][0] for n in fleet.nodes}
    # both serve B; node1 kept the canary's process through the roll and the soak
    assert _assert_serves(fleet, canary, "B", revisions, references) == seen["canary"]
    assert _assert_serves(fleet, other, "B", revisions, references) != deployed[other.name]
    print("wall times (s): %s" % json.dumps({k: round(v, 1) for k, v in TIMES.items()}))
