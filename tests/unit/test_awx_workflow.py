"""How each AWX workflow of awx/ ends: every failure path ends the workflow failed, with its error notifications.

AWX decides a workflow job's status with ``WorkflowDAG.has_workflow_failed`` (awx/main/scheduler/dag_workflow.py):
the workflow fails only when a failed node has neither a failure nor an always edge; a failed node with a failure
edge counts as handled whatever its child then does. ``tests/lib/awx_harness.py`` restates that rule
(``WorkflowDAG``, ``drive_workflow``); the first tests pin the restatement on small graphs, the rest run every
failure path of every workflow of ``awx/controller_workflows.yml`` through it. The diagnosis on the deploy's failure
edge is not assumed: it is ``playbooks/diagnose.yml`` run for real with the variables the node hands its template,
on a recorded healthy engine (the case where a diagnosis finds nothing wrong).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

ROOT = awx.ROOT
OBJECTS = awx.load_controller()
WORKFLOWS = OBJECTS["controller_workflows"]
HEALTHY = os.path.join(ROOT, "tests", "unit", "fixtures", "diagnose", "healthy_vllm.yaml")
ERROR, SUCCESS = ["llmops pager"], ["llmops chat"]


class Finished:
    """A job that ended with ``status`` (a node whose playbook these tests do not run)."""

    def __init__(self, status):
        self.status = status
        self.artifacts = {}


def _node(ident, success=(), failure=(), always=(), converge=False):
    related = {k: [{"identifier": c} for c in v] for k, v in
               (("success_nodes", success), ("failure_nodes", failure), ("always_nodes", always)) if v}
    return {"identifier": ident, "unified_job_template": {"name": ident, "type": "job_template"}, "related": related,
            "all_parents_must_converge": converge}


def _drive(nodes, statuses):
    wfjt = {"name": "graph", "workflow_nodes": nodes, "notification_templates_error": ERROR,
            "notification_templates_success": SUCCESS}
    return awx.drive_workflow(wfjt, lambda ident, node: Finished(statuses.get(ident, "successful")))


# ---- the restatement of AWX's rule ---------------------------------------------------------------------------------

def test_a_failed_node_with_a_failure_edge_is_handled_whatever_its_child_does():
    """dag_workflow.py: a failed node with a failure child does not fail the workflow; its failed child does."""
    nodes = [_node("a", success=["b"], failure=["c"]), _node("b"), _node("c")]
    handled = _drive(nodes, {"a": "failed"})
    assert (handled.status, sorted(handled), handled.not_run, handled.notified) == (
        "successful", ["a", "c"], ["b"], tuple(SUCCESS))
    unhandled = _drive(nodes, {"a": "failed", "c": "failed"})
    assert unhandled.status == "failed" and unhandled.notified == tuple(ERROR)
    assert unhandled.reason == "No error handling path for workflow job node(s) [(c,failed)]."


def test_an_always_edge_also_handles_a_failure_and_error_and_canceled_count_as_failed():
    nodes = [_node("a", always=["b"]), _node("b")]
    assert _drive(nodes, {"a": "failed"}).status == "successful"
    for status in ("error", "canceled"):
        alone = _drive([_node("a")], {"a": status})
        assert alone.status == "failed" and "(a,%s)" % status in alone.reason


def test_nodes_no_parent_can_reach_are_marked_do_not_run_and_a_convergence_node_waits_for_its_criteria():
    # b succeeds, c fails: d (ALL convergence, success edges from both) never runs; e (ANY) runs from b
    nodes = [_node("a", success=["b", "c"]), _node("b", success=["d", "e"]), _node("c", success=["d", "e"]),
             _node("d", converge=True), _node("e")]
    run = _drive(nodes, {"c": "failed"})
    assert sorted(run) == ["a", "b", "c", "e"] and run.not_run == ["d"]
    assert run.status == "failed" and "(c,failed)" in run.reason


def test_an_approval_is_successful_when_approved_and_failed_when_denied_or_timed_out():
    assert [awx.Approval(d).status for d in ("approve", "deny", "timeout")] == ["successful", "failed", "failed"]
    with pytest.raises(ValueError, match="approved, denied or times out"):
        awx.Approval("maybe")


# ---- the workflows of awx/ -------------------------------------------------------------------------------------

def _run_diagnose(tmp_path, extra_vars):
    """playbooks/diagnose.yml as the diagnose job runs it, on the recorded healthy vLLM engine; its status."""
    with open(HEALTHY, encoding="utf-8") as f:
        fx = yaml.safe_load(f)
    ev = {k: v for k, v in extra_vars.items() if not k.startswith(("awx_", "tower_")) and k != "diagnose_probe_headers"}
    ev.update(diagnose_platform="kubernetes", diagnose_name=fx["name"], diagnose_namespace=fx["namespace"],
              diagnose_served_model_name=fx["served_model_name"], diagnose_objects=fx["objects"],
              diagnose_logs=fx.get("logs") or {})
    path = tmp_path / ("diagnose-%d.json" % len(list(tmp_path.iterdir())))
    path.write_text(json.dumps(ev))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i",
                           os.path.join(ROOT, "inventories", "local"), os.path.join(ROOT, "playbooks", "diagnose.yml"),
                           "-e", "@%s" % path, "-e", "ansible_python_interpreter=%s" % sys.executable],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "Show the diagnosis" in proc.stdout and "healthy: Deployment" in proc.stdout, proc.stdout[-3000:]
    job = Finished("successful" if proc.returncode == 0 else "failed")
    job.stdout = proc.stdout
    return job


def drive(tmp_path, wfjt, statuses, approvals=None):
    """Run ``wfjt``: job template nodes end as ``statuses`` says (default successful), approval nodes as
    ``approvals`` says (default approve), and ``llmops diagnose`` really runs with the variables its node gives it."""
    assert wfjt["notification_templates_error"] == "{{ llmops_awx_notify_error }}"
    assert wfjt["notification_templates_success"] == "{{ llmops_awx_notify_success }}"
    wfjt = dict(wfjt, notification_templates_error=ERROR, notification_templates_success=SUCCESS)
    wj_vars = awx.job_extra_vars(wfjt, {})

    def run_node(ident, node):
        ujt = node["unified_job_template"]
        if ujt["type"] == "workflow_approval":
            return awx.Approval((approvals or {}).get(ident, "approve"))
        template = awx.by_name(OBJECTS["controller_templates"], ujt["name"])
        if ujt["name"] == "llmops diagnose" and ident not in statuses:
            runtime = awx.node_runtime_vars(template, node, {}, wj_vars)
            return _run_diagnose(tmp_path, awx.job_extra_vars(template, runtime))
        return Finished(statuses.get(ident, "successful"))

    return awx.drive_workflow(wfjt, run_node)


def _reached_by(wf, ident):
    """{node: failed} of the ancestors that must fail for ``ident`` to run (it hangs below their failure edges)."""
    dag = awx.WorkflowDAG(wf["workflow_nodes"])
    must_fail = {}
    while dag.parents[ident]:
        parent, kind = dag.parents[ident][0]
        if kind == "failure_nodes":
            must_fail[parent] = "failed"
        ident = parent
    return must_fail


def failure_cases():
    """(workflow, failing node, statuses, approvals) for every node of every workflow that can fail, reached the way
    it runs (a node on a failure edge runs after its parent failed)."""
    cases = []
    for wf in WORKFLOWS:
        for node in wf["workflow_nodes"]:
            ident = node["identifier"]
            statuses = _reached_by(wf, ident)
            if node["unified_job_template"]["type"] == "workflow_approval":
                for decision in ("deny", "timeout"):
                    cases.append(pytest.param(wf, ident, statuses, {ident: decision},
                                              id="%s-%s-%s" % (wf["name"], ident, decision)))
            else:
                cases.append(pytest.param(wf, ident, dict(statuses, **{ident: "failed"}), {},
                                          id="%s-%s" % (wf["name"], ident)))
    return cases


def test_a_failed_deploy_with_a_healthy_diagnosis_ends_the_workflow_failed(tmp_path):
    """The diagnosis finds nothing wrong (the deploy failed before touching the engine): the workflow still fails,
    sends the error notifications, not the success ones, and verify never runs."""
    (wf,) = [w for w in WORKFLOWS if any(n["identifier"] == "deploy" for n in w["workflow_nodes"])]
    run = drive(tmp_path, wf, {"deploy": "failed"})
    assert run["diagnose"].status == "failed", run["diagnose"].stdout[-3000:]
    assert "llmops deploy failed; this diagnosis ran on its failure path (verdict healthy" in run["diagnose"].stdout
    assert run.status == "failed" and run.notified == tuple(ERROR)
    assert "verify" not in run and "verify" in run.not_run
    assert run.reason == "No error handling path for workflow job node(s) [(diagnose,failed)]."


@pytest.mark.parametrize(("wf", "failing", "statuses", "approvals"), failure_cases())
def test_every_failure_path_of_every_workflow_ends_the_workflow_failed(tmp_path, wf, failing, statuses, approvals):
    run = drive(tmp_path, wf, statuses, approvals)
    assert failing in run, (failing, sorted(run), run.not_run)
    assert run[failing].status == "failed"
    assert run.status == "failed", (failing, {i: j.status for i, j in run.items()})
    assert run.notified == tuple(ERROR)


@pytest.mark.parametrize("wf", WORKFLOWS, ids=[w["name"] for w in WORKFLOWS])
def test_a_workflow_whose_steps_all_succeed_ends_successful_and_never_diagnoses(tmp_path, wf):
    run = drive(tmp_path, wf, {})
    assert run.status == "successful" and run.notified == tuple(SUCCESS)
    assert "diagnose" not in run and "verify" in run


def test_the_diagnosis_alone_keeps_its_verdict(tmp_path):
    """Launched by itself (no diagnose_fail_after), a healthy verdict is a successful job."""
    template = awx.by_name(OBJECTS["controller_templates"], "llmops diagnose")
    assert _run_diagnose(tmp_path, awx.job_extra_vars(template, {})).status == "successful"


def test_a_node_extra_data_reaches_its_job_only_through_the_template_prompts():
    """AWX keeps a node's extra_data only where the template's survey asks for the variable (or it asks for
    variables): the diagnose node's diagnose_fail_after arrives because the diagnose survey asks for it."""
    template = awx.by_name(OBJECTS["controller_templates"], "llmops diagnose")
    assert not template.get("ask_variables_on_launch")
    node = {"extra_data": {"diagnose_fail_after": "llmops deploy", "diagnose_delegate_to": "elsewhere"}}
    got = awx.node_runtime_vars(template, node, {}, {})
    assert got == {"diagnose_fail_after": "llmops deploy"}
    for wf in WORKFLOWS:
        for node in wf["workflow_nodes"]:
            if node.get("extra_data"):
                tpl = awx.by_name(OBJECTS["controller_templates"], node["unified_job_template"]["name"])
                assert awx.node_runtime_vars(tpl, node, {}, {}) == node["extra_data"], node["identifier"]


def test_artifacts_pass_through_an_approval_to_the_next_node():
    """AWX keeps ancestor artifacts on every node it spawns, an approval's too: the stage node's site_models reach
    the deploy behind the approval (and the verify after it)."""
    (wf,) = WORKFLOWS
    dag = awx.WorkflowDAG(wf["workflow_nodes"])
    stage = Finished("successful")
    stage.artifacts = {"site_models": [{"name": "m", "revision": "r"}]}
    jobs, kept = {"stage": stage}, {}
    for ident in ("stage", "approve deploy", "deploy"):
        awx.node_ancestor_artifacts(dag, ident, jobs, kept)
        jobs.setdefault(ident, awx.Approval("approve") if ident == "approve deploy" else Finished("successful"))
    assert kept["deploy"] == {"site_models": [{"name": "m", "revision": "r"}]}
    assert awx.node_ancestor_artifacts(dag, "verify", jobs, kept) == kept["deploy"]
