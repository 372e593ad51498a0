"""playbooks/awx_configure.yml creates the upgrade workflow on a stand-in AWX API v2 (tests/lib/awx_api.py), with its
approval node by default and without it on request, and a rerun changes nothing.

The workflow ``llmops upgrade`` (awx/controller_workflows.yml) runs one phase of playbooks/upgrade.yml per node:
stage -> cache -> canary -> approval -> roll -> soak, each failure of canary, roll or soak diagnosed on its failure
edge. ``llmops_awx_upgrade_approval: false`` makes the approval node absent: the configure playbook deletes it (its
edges go with it, as AWX deletes a node's edges with the node) and bypasses it, so the canary opens the roll
directly. How each workflow ends is tests/unit/test_awx_workflow.py's; this file checks what reaches the controller.
"""
from __future__ import annotations

import json

import pytest
from test_awx_configure_api import INPUTS, TOKEN, _configure, _recap_changed

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib.awx_api import StandInAWX

OBJECTS = awx.load_controller()
WF = awx.by_name(OBJECTS["controller_workflows"], "llmops upgrade")
PHASES = {"upgrade stage": "stage", "upgrade cache": "cache", "upgrade canary": "canary", "upgrade roll": "roll",
          "upgrade soak": "soak"}


@pytest.fixture(scope="module")
def api():
    with StandInAWX() as server:
        server.handle("POST", "/api/v2/instance_groups/", {}, {"name": "gpu-runners"})
        yield server


@pytest.fixture(scope="module")
def applied(api):
    return _configure(api)


@pytest.fixture(scope="module")
def without_approval(api, applied):
    return _configure(api, "-e", json.dumps({"llmops_awx_upgrade_approval": False}))


@pytest.fixture(scope="module")
def without_approval_again(api, without_approval):
    return _configure(api, "-e", "llmops_awx_upgrade_approval=false")


@pytest.fixture(scope="module")
def with_approval_again(api, without_approval_again):
    return _configure(api)


def _nodes(api):
    """{identifier: node} of the upgrade workflow's nodes on the controller."""
    wf_id = api.find("workflow_job_templates", WF["name"])["id"]
    return {o["identifier"]: o for o in api.objects["workflow_job_template_nodes"].values()
            if o["workflow_job_template"] == wf_id}


def _edges(api, node, kind):
    """The identifiers a node's edges of ``kind`` lead to (a set on the controller: sorted)."""
    ids = api.associations.get(("workflow_job_template_nodes", node["id"], kind), [])
    return sorted(api.objects["workflow_job_template_nodes"][i]["identifier"] for i in ids)


def _assert_the_upgrade_chain(api, approval):
    nodes = _nodes(api)
    want = ["upgrade stage", "upgrade cache", "upgrade canary", "upgrade roll", "upgrade soak", "diagnose canary",
            "diagnose roll", "diagnose soak"] + (["approve upgrade"] if approval else [])
    assert sorted(nodes) == sorted(want)
    upgrade = api.find("job_templates", "llmops upgrade phase")["id"]
    for ident, phase in PHASES.items():
        assert nodes[ident]["unified_job_template"] == upgrade, ident
        assert nodes[ident]["extra_data"] == {"upgrade_phase": phase}, ident
    assert _edges(api, nodes["upgrade stage"], "success_nodes") == ["upgrade cache"]
    assert _edges(api, nodes["upgrade cache"], "success_nodes") == ["upgrade canary"]
    assert _edges(api, nodes["upgrade canary"], "success_nodes") == (["approve upgrade"] if approval else ["upgrade roll"])
    assert not any(n.get("all_parents_must_converge") for n in nodes.values())
    assert _edges(api, nodes["upgrade roll"], "success_nodes") == ["upgrade soak"]
    for phase in ("canary", "roll", "soak"):
        assert _edges(api, nodes["upgrade " + phase], "failure_nodes") == ["diagnose " + phase]
        assert nodes["diagnose " + phase]["extra_data"] == {"diagnose_fail_after": "llmops upgrade (%s)" % phase}
    if approval:
        assert _edges(api, nodes["approve upgrade"], "success_nodes") == ["upgrade roll"]
        assert _edges(api, nodes["approve upgrade"], "failure_nodes") == []
        template = api.objects["workflow_approval_templates"][nodes["approve upgrade"]["unified_job_template"]]
        assert (template["name"], template["timeout"]) == ("llmops approve the upgrade roll", 86400)


def test_a_run_creates_the_upgrade_workflow_with_its_approval_template_survey_and_roles(api, applied):
    rc, out, requests = applied
    assert rc == 0, out[-4000:]
    assert {r["authorization"] for r in requests} == {"Bearer " + TOKEN}
    _assert_the_upgrade_chain(api, approval=True)
    body = api.created("workflow_job_templates")[WF["name"]]
    assert (body["limit"], body["ask_limit_on_launch"]) == ("colocated:prefill:decode", True)
    assert api.associated("workflow_job_templates", WF["name"], "notification_templates_error") == \
        INPUTS["llmops_awx_notify_error"]
    assert api.associated("workflow_job_templates", WF["name"], "notification_templates_approvals") == \
        INPUTS["llmops_awx_notify_error"]
    assert [q["variable"] for q in api.survey("workflow_job_templates", WF["name"])["spec"]] == [
        "upgrade_model_name", "upgrade_model_revision"]
    jt = api.created("job_templates")["llmops upgrade phase"]
    assert jt["ask_variables_on_launch"] is False and jt["playbook"] == "playbooks/upgrade.yml"
    assert [q["variable"] for q in api.survey("job_templates", "llmops upgrade phase")["spec"]] == [
        "upgrade_model_name", "upgrade_model_revision", "upgrade_phase"]
    # release managers launch the workflow (and the template alone) and answer its approval; operators only see it
    managers, operators = ["llmops release managers"], ["llmops operators"]
    assert api.holders("workflow_job_templates", WF["name"], "execute") == managers
    assert api.holders("workflow_job_templates", WF["name"], "approval") == managers
    assert api.holders("workflow_job_templates", WF["name"], "read") == operators
    assert api.holders("job_templates", "llmops upgrade phase", "execute") == managers


def test_without_the_approval_the_node_and_its_edges_go_and_the_canary_opens_the_roll(api, without_approval):
    rc, out, requests = without_approval
    assert rc == 0, out[-4000:]
    deleted = [r["path"] for r in requests if r["method"] == "DELETE"]
    assert len(deleted) == 1 and "/workflow_job_template_nodes/" in deleted[0], deleted
    _assert_the_upgrade_chain(api, approval=False)
    # the other workflow keeps its approval
    assert "approve deploy" in {o["identifier"] for o in api.objects["workflow_job_template_nodes"].values()}


def test_a_rerun_without_the_approval_changes_nothing(without_approval_again):
    rc, out, requests = without_approval_again
    assert rc == 0, out[-4000:]
    assert [(r["method"], r["path"]) for r in requests if r["method"] != "GET"] == []
    assert _recap_changed(out) == 0, out[-3000:]


def test_the_approval_comes_back_when_asked_again(api, with_approval_again):
    rc, out, _requests = with_approval_again
    assert rc == 0, out[-4000:]
    _assert_the_upgrade_chain(api, approval=True)
