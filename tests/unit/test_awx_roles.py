"""Who may launch what: the teams and role assignments of awx/controller_roles.yml (least privilege).

AWX starts a job template or a workflow for a user in its ``execute_role`` (``JobTemplateAccess.can_start`` and
``WorkflowJobTemplateAccess.can_start``, awx/main/access.py); the approval node is answered by a user in the
workflow's ``approval_role``. Operators run what changes no serving engine (stage, diagnose); release managers deploy,
verify, benchmark and upgrade, launch the workflows and answer their approvals (the stage, deploy, verify workflow's
before the deploy, the upgrade's before the roll). The roles each kind offers are the stand-in
controller's (tests/lib/awx_api.py ``OBJECT_ROLES``), so an assignment AWX would refuse ("Resource ... has no role")
fails here first.
"""
from __future__ import annotations

import pytest

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib.awx_api import OBJECT_ROLES

OBJECTS = awx.load_controller()
TEMPLATES = {t["name"]: t for t in OBJECTS["controller_templates"]}
WORKFLOWS = {w["name"]: w for w in OBJECTS["controller_workflows"]}
KINDS = {"job_templates": ("job_templates", TEMPLATES), "workflows": ("workflow_job_templates", WORKFLOWS)}
ENGINE_CHANGING = {"llmops deploy", "llmops verify transport", "llmops benchmark", "llmops upgrade phase"}
#: per workflow, the node its approval stands before: what replaces the serving engine fleet-wide
APPROVED = {"llmops stage, deploy, verify": "deploy", "llmops upgrade": "upgrade roll"}


def grants():
    """{(team, role, kind, resource name)} of every assignment."""
    out = set()
    for entry in OBJECTS["controller_roles"]:
        for team in entry["teams"]:
            for key, (kind, _names) in KINDS.items():
                for name in entry.get(key, []):
                    out.add((team, entry["role"], kind, name))
    return out


def can(team, role, kind, name):
    return (team, role, kind, name) in grants()


def test_every_assignment_names_objects_and_roles_that_exist():
    teams = {t["name"] for t in OBJECTS["controller_teams"]}
    for entry in OBJECTS["controller_roles"]:
        assert set(entry) <= {"teams", "role", "job_templates", "workflows", "lookup_organization"}, entry
        assert set(entry["teams"]) <= teams, entry
        for key, (kind, names) in KINDS.items():
            for name in entry.get(key, []):
                assert name in names, (key, name)
                assert entry["role"] in OBJECT_ROLES[kind], "%s has no %s_role" % (name, entry["role"])


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_operators_execute_only_what_changes_no_serving_engine(template):
    operators = template in ("llmops stage model", "llmops diagnose")
    assert not (operators and template in ENGINE_CHANGING)
    assert can("llmops operators", "execute", "job_templates", template) is operators
    assert can("llmops release managers", "execute", "job_templates", template)


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_each_workflow_and_its_approval_belong_to_release_managers(name):
    """Operators see the workflow's jobs but can neither launch it nor answer its approval; release managers do both.
    The upgrade workflow replaces the serving engine: operators do not launch it, nor its template alone."""
    assert not can("llmops operators", "execute", "workflow_job_templates", name)
    assert not can("llmops operators", "approval", "workflow_job_templates", name)
    assert can("llmops operators", "read", "workflow_job_templates", name)
    assert can("llmops release managers", "execute", "workflow_job_templates", name)
    assert can("llmops release managers", "approval", "workflow_job_templates", name)
    # an approval node stands before what replaces the serving engine fleet-wide
    nodes = {n["identifier"]: n for n in WORKFLOWS[name]["workflow_nodes"]}
    approvals = [i for i, n in nodes.items() if n["unified_job_template"]["type"] == "workflow_approval"]
    assert approvals and all(any(c["identifier"] == APPROVED[name] for c in nodes[a]["related"]["success_nodes"])
                             for a in approvals)
    # every node that runs a template of ENGINE_CHANGING is one the operators could not launch alone either
    for node in nodes.values():
        ujt = node["unified_job_template"]
        if ujt["name"] in ENGINE_CHANGING:
            assert not can("llmops operators", "execute", "job_templates", ujt["name"]), node["identifier"]


def test_no_team_administers_anything():
    """admin on a template lets a member edit its playbook, credentials and extra vars: none is granted."""
    assert [g for g in grants() if g[1] == "admin"] == []
