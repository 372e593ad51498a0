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

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml
import hypothesis
from hypothesis import strategies as st

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

ROOT = awx.ROOT
OBJECTS = awx.load_controller()
WORKFLOWS = OBJECTS["controller_workflows"]
HEALTHY = os.path.join(ROOT, "tests", "unit", "fixtures", "diagnose", "healthy_vllm.yaml")
ERROR, SUCCESS = ["llmops pager"], ["llmops chat"]
UPGRADE = "llmops upgrade"
#: the upgrade workflow's phases, in the order a good run runs them (approval on)
UPGRADE_RUN = ["upgrade stage", "upgrade cache", "upgrade canary", "approve upgrade", "upgrade roll", "upgrade soak"]
#: awx_configure.yml's values of the approval switch: None - not given (the default, on)
APPROVAL_SETTINGS = [None, True, False, "false", "no", "0", "maybe"]


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


def configured(wfjt, **settings):
    """``wfjt`` as awx_configure.yml leaves it on the controller with the notification templates ERROR / SUCCESS and
    ``settings`` (``awx_harness.render_workflow``)."""
    assert wfjt["notification_templates_error"] == "{{ llmops_awx_notify_error }}"
    assert wfjt["notification_templates_success"] == "{{ llmops_awx_notify_success }}"
    given = {k: v for k, v in settings.items() if v is not None}
    return awx.render_workflow(wfjt, dict(given, llmops_awx_notify_error=ERROR, llmops_awx_notify_success=SUCCESS))


def drive(tmp_path, wfjt, statuses, approvals=None, settings=None, answers=None):
    """Run ``wfjt`` (configured with ``settings``): job template nodes end as ``statuses`` says (default successful),
    approval nodes as ``approvals`` says (default approve), and ``llmops diagnose`` really runs with the variables its
    node gives it. ``answers``: the workflow survey's."""
    wfjt = configured(wfjt, **(settings or {}))
    wj_vars = awx.job_extra_vars(wfjt, answers or {})

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


def _settings_of(wf):
    """The configure settings each workflow is tried with: the upgrade's approval on (default) and off."""
    if wf["name"] == UPGRADE:
        return [{}, {"llmops_awx_upgrade_approval": False}]
    return [{}]


def failure_cases():
    """(workflow, settings, failing node, statuses, approvals) for every node of every workflow that can fail,
    reached the way it runs (a node on a failure edge runs after its parent failed), with each of its settings."""
    cases = []
    for raw in WORKFLOWS:
        for settings in _settings_of(raw):
            wf = configured(raw, **settings)
            tag = "-".join("%s=%s" % kv for kv in settings.items())
            for node in wf["workflow_nodes"]:
                ident = node["identifier"]
                statuses = _reached_by(wf, ident)
                if node["unified_job_template"]["type"] == "workflow_approval":
                    for decision in ("deny", "timeout"):
                        cases.append(pytest.param(raw, settings, ident, statuses, {ident: decision},
                                                  id="%s-%s-%s%s" % (wf["name"], ident, decision, tag)))
                else:
                    cases.append(pytest.param(raw, settings, ident, dict(statuses, **{ident: "failed"}), {},
                                              id="%s-%s%s" % (wf["name"], ident, tag)))
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


@pytest.mark.parametrize(("wf", "settings", "failing", "statuses", "approvals"), failure_cases())
def test_every_failure_path_of_every_workflow_ends_the_workflow_failed(tmp_path, wf, settings, failing, statuses,
                                                                       approvals):
    run = drive(tmp_path, wf, statuses, approvals, settings)
    assert failing in run, (failing, sorted(run), run.not_run)
    assert run[failing].status == "failed"
    assert run.status == "failed", (failing, {i: j.status for i, j in run.items()})
    assert run.notified == tuple(ERROR)


def _on_failure_paths(wf):
    """Nodes that only a failure edge leads to (the diagnoses), and everything below them."""
    dag = awx.WorkflowDAG(wf["workflow_nodes"])
    found = {k for edges in dag.children.values() for k in edges["failure_nodes"]}
    pending = list(found)
    while pending:
        for kids in dag.children[pending.pop()].values():
            pending.extend(k for k in kids if k not in found)
            found.update(kids)
    return found


@pytest.mark.parametrize(("wf", "settings"), [pytest.param(w, s, id=w["name"] + "".join("-%s=%s" % kv for kv in s.items()))
                                              for w in WORKFLOWS for s in _settings_of(w)])
def test_a_workflow_whose_steps_all_succeed_ends_successful_and_never_diagnoses(tmp_path, wf, settings):
    run = drive(tmp_path, wf, {}, settings=settings)
    assert run.status == "successful" and run.notified == tuple(SUCCESS)
    nodes = {n["identifier"] for n in configured(wf, **settings)["workflow_nodes"]}
    diagnoses = _on_failure_paths(configured(wf, **settings))
    assert diagnoses and not diagnoses & set(run)
    assert set(run) == nodes - diagnoses and sorted(run.not_run) == sorted(diagnoses)


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
    the deploy behind the approval (and the P/D deploy and the verify after it, with the P/D deploy's endpoints)."""
    dag = awx.WorkflowDAG(configured(awx.by_name(WORKFLOWS, "llmops stage, deploy, verify"))["workflow_nodes"])
    stage = Finished("successful")
    stage.artifacts = {"site_models": [{"name": "m", "revision": "r"}]}
    pd = Finished("successful")
    pd.artifacts = {"llmops_pd_decode_metrics_url": "http://10.244.2.7:8000/metrics"}
    jobs, kept = {"stage": stage, "deploy P/D pair": pd}, {}
    for ident in ("stage", "approve deploy", "deploy", "deploy P/D pair"):
        awx.node_ancestor_artifacts(dag, ident, jobs, kept)
        jobs.setdefault(ident, awx.Approval("approve") if ident == "approve deploy" else Finished("successful"))
    assert kept["deploy"] == {"site_models": [{"name": "m", "revision": "r"}]}
    assert kept["deploy P/D pair"] == kept["deploy"]
    assert awx.node_ancestor_artifacts(dag, "verify", jobs, kept) == dict(kept["deploy"], **pd.artifacts)


def test_the_pair_verify_measures_is_deployed_by_the_workflow_and_its_failure_ends_the_workflow_failed(tmp_path):
    """On a Kubernetes fleet nothing else deploys the P/D pair: a node of the llmops deploy P/D pair template
    (playbooks/pd_deploy.yml, the write credential) runs after the engine's deploy and before verify. It has no
    failure edge (its own failed wait already diagnosed the role that is not serving), so by AWX's rule its failure
    ends the workflow failed with the error notifications, and verify never runs."""
    (wf,) = [w for w in WORKFLOWS if w["name"] == "llmops stage, deploy, verify"]
    dag = awx.WorkflowDAG(configured(wf)["workflow_nodes"])
    assert dag.parents["deploy P/D pair"] == [("deploy", "success_nodes")]
    assert dag.parents["verify"] == [("deploy P/D pair", "success_nodes")]
    (node,) = [n for n in wf["workflow_nodes"] if n["identifier"] == "deploy P/D pair"]
    template = awx.by_name(OBJECTS["controller_templates"], node["unified_job_template"]["name"])
    assert template["playbook"] == "playbooks/pd_deploy.yml" and "llmops Kubernetes" in template["credentials"]
    assert template["extra_vars"]["pd_disagg_k8s_mode"] == "apply"
    run = drive(tmp_path, wf, {"deploy P/D pair": "failed"})
    assert list(run) == ["stage", "approve deploy", "deploy", "deploy P/D pair"]
    assert run.status == "failed" and run.notified == tuple(ERROR)
    assert run.reason == "No error handling path for workflow job node(s) [(deploy P/D pair,failed)]."
    assert sorted(run.not_run) == ["diagnose", "verify"]


# ---- the upgrade workflow: one phase of playbooks/upgrade.yml per node ----------------------------------------------

ANSWERS = {"upgrade_model_name": "tiny-llama", "upgrade_model_revision": "b"}
DIAGNOSES = ["diagnose canary", "diagnose roll", "diagnose soak"]


def _upgrade(tmp_path, statuses, approvals=None, **settings):
    return drive(tmp_path, awx.by_name(WORKFLOWS, UPGRADE), statuses, approvals, settings, answers=ANSWERS)


def _failed_after(run, phase):
    """The workflow failed on the diagnosis of ``phase``'s failure path, which ran for real and named the phase."""
    diagnosis = run["diagnose " + phase]
    assert diagnosis.status == "failed", diagnosis.stdout[-3000:]
    assert "llmops upgrade (%s) failed; this diagnosis ran on its failure path (verdict healthy" % phase in diagnosis.stdout
    assert run.status == "failed" and run.notified == tuple(ERROR)
    assert run.reason == "No error handling path for workflow job node(s) [(diagnose %s,failed)]." % phase


def test_a_good_upgrade_runs_every_phase_in_order_with_the_approval_and_ends_successful(tmp_path):
    run = _upgrade(tmp_path, {})
    assert list(run) == UPGRADE_RUN
    assert run.status == "successful" and run.notified == tuple(SUCCESS)
    assert run.not_run == DIAGNOSES


def test_a_failed_canary_ends_the_upgrade_failed_before_the_approval(tmp_path):
    run = _upgrade(tmp_path, {"upgrade canary": "failed"})
    assert list(run) == ["upgrade stage", "upgrade cache", "upgrade canary", "diagnose canary"]
    _failed_after(run, "canary")
    assert {"approve upgrade", "upgrade roll", "upgrade soak"} <= set(run.not_run)


@pytest.mark.parametrize("decision", ["deny", "timeout"])
def test_a_denied_or_unanswered_approval_ends_the_upgrade_failed_and_never_rolls(tmp_path, decision):
    run = _upgrade(tmp_path, {}, {"approve upgrade": decision})
    assert list(run) == UPGRADE_RUN[:4]
    assert run["approve upgrade"].status == "failed"
    assert run.status == "failed" and run.notified == tuple(ERROR)
    assert run.reason == "No error handling path for workflow job node(s) [(approve upgrade,failed)]."
    assert sorted(run.not_run) == sorted(["upgrade roll", "upgrade soak"] + DIAGNOSES)


def test_a_roll_that_fails_after_the_canary_ends_the_upgrade_failed_and_never_soaks(tmp_path):
    run = _upgrade(tmp_path, {"upgrade roll": "failed"})
    assert list(run) == UPGRADE_RUN[:5] + ["diagnose roll"]
    _failed_after(run, "roll")
    assert "upgrade soak" in run.not_run and "diagnose canary" not in run


def test_without_the_approval_the_canary_opens_the_roll_and_every_failure_still_ends_failed(tmp_path):
    good = _upgrade(tmp_path, {}, llmops_awx_upgrade_approval=False)
    assert list(good) == [i for i in UPGRADE_RUN if i != "approve upgrade"]
    assert good.status == "successful" and good.notified == tuple(SUCCESS)
    canary = _upgrade(tmp_path, {"upgrade canary": "failed"}, llmops_awx_upgrade_approval=False)
    assert "upgrade roll" in canary.not_run
    _failed_after(canary, "canary")


@pytest.mark.parametrize("value", APPROVAL_SETTINGS, ids=[repr(v) for v in APPROVAL_SETTINGS])
def test_only_an_explicit_false_removes_the_approval(value):
    """Off for false, no, 0 (as the configure playbook receives them from -e); any other value, a typo too, keeps
    the approval before the roll."""
    wf = configured(awx.by_name(WORKFLOWS, UPGRADE), llmops_awx_upgrade_approval=value)
    nodes = {n["identifier"]: n for n in wf["workflow_nodes"]}
    canary_opens = [c["identifier"] for c in nodes["upgrade canary"]["related"]["success_nodes"]]
    if value in (False, "false", "no", "0"):
        # the absent approval is bypassed: the canary opens the roll
        assert "approve upgrade" not in nodes and canary_opens == ["upgrade roll"]
    else:
        assert nodes["approve upgrade"]["unified_job_template"]["type"] == "workflow_approval"
        assert canary_opens == ["approve upgrade"]
        assert [c["identifier"] for c in nodes["approve upgrade"]["related"]["success_nodes"]] == ["upgrade roll"]
    # one parent per node: nothing converges (see the next test)
    assert [n["identifier"] for n in wf["workflow_nodes"] if n.get("all_parents_must_converge")] == []


def test_each_upgrade_node_runs_its_own_phase_with_the_revision_and_the_stage_artifact():
    """Each node's upgrade_phase arrives (the upgrade survey asks for it), the workflow's answers reach every node,
    and the stage node's artifact llmops_upgrade_from (A of each host) reaches every later phase, through the
    approval too. A launcher of the workflow cannot set the phase: its survey does not ask for it."""
    wf = configured(awx.by_name(WORKFLOWS, UPGRADE))
    template = awx.by_name(OBJECTS["controller_templates"], UPGRADE + " phase")
    assert not template.get("ask_variables_on_launch") and not wf.get("ask_variables_on_launch")
    accepted, ignored = awx.accept_or_ignore_variables(wf, dict(ANSWERS, upgrade_phase="all"))[:2]
    assert "upgrade_phase" not in accepted and "upgrade_phase" in str(ignored)
    wj_vars = awx.job_extra_vars(wf, accepted)
    dag = awx.WorkflowDAG(wf["workflow_nodes"])
    a = {"gpu-01": {"model": "tiny-llama", "revision": "a", "model_path": "/nvme/models/tiny-llama/a"}}
    jobs, kept, got = {}, {}, {}

    def run_node(ident, node):
        aa = awx.node_ancestor_artifacts(dag, ident, jobs, kept)
        if node["unified_job_template"]["type"] == "workflow_approval":
            jobs[ident] = awx.Approval("approve")
        else:
            got[ident] = awx.job_extra_vars(template, awx.node_runtime_vars(template, node, aa, wj_vars))
            jobs[ident] = Finished("successful")
            if ident == "upgrade stage":
                b = {"name": "tiny-llama", "revision": "b"}
                jobs[ident].artifacts = {"llmops_upgrade_from": a, "llmops_upgrade_model": b}
        return jobs[ident]

    assert awx.drive_workflow(wf, run_node, dag=dag).status == "successful"
    assert {i: v["upgrade_phase"] for i, v in got.items()} == {
        "upgrade stage": "stage", "upgrade cache": "cache", "upgrade canary": "canary", "upgrade roll": "roll",
        "upgrade soak": "soak"}
    for ident, extra in got.items():
        assert (extra["upgrade_model_name"], extra["upgrade_model_revision"]) == ("tiny-llama", "b"), ident
        # the template's own extra var builds upgrade_model from the answers in the job (AWX evaluates it there)
        assert extra["upgrade_model"] == template["extra_vars"]["upgrade_model"], ident
        assert ("llmops_upgrade_from" in extra) is (ident != "upgrade stage"), ident
        if ident != "upgrade stage":
            assert extra["llmops_upgrade_from"] == a, ident


def test_no_job_template_shares_its_name_with_a_workflow():
    """A workflow node names its template, and awx.awx looks it up by name among the unified job templates: a job
    template and a workflow of one name make the lookup ambiguous (the stand-in controller then answers with both).
    The upgrade's job template is therefore ``llmops upgrade phase``, its workflow ``llmops upgrade``."""
    names = [t["name"] for t in OBJECTS["controller_templates"] + WORKFLOWS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert {UPGRADE, UPGRADE + " phase"} <= set(names)


EXPLICIT_FALSE = ("false", "no", "off", "0")
SWITCH_VALUES = st.one_of(st.booleans(), st.integers(-2, 2), st.text(),
                          st.sampled_from(["false", "False", "NO", "off", "0", "true", "yes", "flase", "", " false"]))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(value=SWITCH_VALUES, data=st.data())
def test_whatever_the_switch_says_and_however_the_nodes_end_the_roll_needs_the_canary_and_the_approval(value, data):
    """Property: the approval is absent exactly for an explicit false and no node converges; the workflow ends
    (never stuck), failed exactly when some node failed, errored or was canceled; the roll never runs unless the
    canary succeeded and, where the approval is there, it was approved."""
    wf = configured(awx.by_name(WORKFLOWS, UPGRADE), llmops_awx_upgrade_approval=value)
    nodes = {n["identifier"]: n for n in wf["workflow_nodes"]}
    present = "approve upgrade" in nodes
    assert present is (str(value).lower() not in EXPLICIT_FALSE)
    assert not any(n.get("all_parents_must_converge") for n in nodes.values())
    outcome = {}

    def run_node(ident, node):
        if node["unified_job_template"]["type"] == "workflow_approval":
            job = awx.Approval(data.draw(st.sampled_from(["approve", "deny", "timeout"]), label=ident))
        elif node["unified_job_template"]["name"] == "llmops diagnose":
            job = Finished("failed")  # diagnose_fail_after: it fails after its verdict, whatever the verdict
        else:
            job = Finished(data.draw(st.sampled_from(["successful", "failed", "error", "canceled"]), label=ident))
        outcome[ident] = job.status
        return job

    run = awx.drive_workflow(wf, run_node)
    failed = any(s != "successful" for s in outcome.values())
    assert run.status == ("failed" if failed else "successful"), outcome
    assert run.notified == tuple(ERROR if failed else SUCCESS)
    if "upgrade roll" in run:
        assert outcome["upgrade canary"] == "successful"
        assert not present or outcome["approve upgrade"] == "successful"


@pytest.mark.parametrize("approval", [True, False])
@pytest.mark.parametrize("status", ["error", "canceled"])
def test_an_errored_or_canceled_canary_ends_the_workflow_instead_of_leaving_it_running(status, approval):
    """A converging node is never marked do-not-run after a parent ended in error or was canceled (AWX weighs only
    successful and failed parents for convergence), so a roll converging on the canary would leave the workflow
    running for ever; awx.awx could not turn the convergence off again either (it sends only truthy fields). The
    absent approval is bypassed instead, and the roll keeps one parent."""
    wf = configured(awx.by_name(WORKFLOWS, UPGRADE), llmops_awx_upgrade_approval=approval)
    statuses = {"upgrade canary": status, "diagnose canary": "failed"}
    run = awx.drive_workflow(wf, lambda ident, node: Finished(statuses.get(ident, "successful")))
    assert run.status == "failed" and "upgrade roll" in run.not_run
    # the design this replaces: the canary opening the roll beside the approval, the roll converging on both
    converging = copy.deepcopy(awx.by_name(WORKFLOWS, UPGRADE))
    nodes = {n["identifier"]: n for n in converging["workflow_nodes"]}
    nodes["upgrade canary"]["related"]["success_nodes"].append({"identifier": "upgrade roll"})
    nodes["upgrade roll"]["all_parents_must_converge"] = True
    stuck = configured(converging, llmops_awx_upgrade_approval=False)
    with pytest.raises(RuntimeError, match="is stuck"):
        awx.drive_workflow(stuck, lambda ident, node: Finished(statuses.get(ident, "successful")))
