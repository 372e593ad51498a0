"""playbooks/awx_configure.yml against a stand-in AWX API v2 on loopback (tests/lib/awx_api.py) that records every body.

What the data of awx/ says is what the controller gets: each object's every key arrives, as a field of the create
request, an association (credentials, galaxy credentials, instance groups, notification templates, workflow edges) or
the survey spec. Check mode against an empty controller says what a real run would create and changes nothing; check
mode after a real run compares every object and writes nothing. The inventory source path has no default.

The requests restated are those of awx.awx 24.6.1 (ansible/awx, tag 24.6.1,
awx_collection/plugins/module_utils/controller_api.py; see tests/lib/awx_api.py).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx
from ansible_collections.llmops.serving.tests.lib.awx_api import StandInAWX

ROOT = awx.ROOT
OBJECTS = awx.load_controller()
TOKEN = "tok-" + os.urandom(6).hex()
# Secrets a controller must store as written: Jinja's comment and expression openers, and text that would be an
# expression (x{{ 6*7 }}y was stored as x42y, a password holding {# failed the run halfway and printed itself).
JINJA_SECRETS = {"llmops_awx_scm_token": "scm{#" + os.urandom(4).hex(), "llmops_awx_k8s_token": "x{{ 6*7 }}y",
                 "llmops_awx_registry_password": "reg{%" + os.urandom(4).hex() + "%}",
                 "llmops_awx_gateway_token": "gw{{" + os.urandom(4).hex()}
SECRETS = dict({"llmops_awx_ssh_private_key": "key-" + os.urandom(6).hex(),
                "llmops_awx_k8s_read_token": "k8r-" + os.urandom(6).hex(),
                "llmops_awx_hf_token": "hf-" + os.urandom(6).hex()}, **JINJA_SECRETS)
INPUTS = dict(SECRETS, llmops_awx_scm_url="https://git.example/llmops/serving.git", llmops_awx_scm_username="deploy",
              llmops_awx_k8s_host="https://k8s.example:6443", llmops_awx_k8s_ca_cert="-----BEGIN CERTIFICATE-----\n",
              llmops_awx_ee_image="registry.example/llmops/serving-ee:0.1.0", llmops_awx_registry_host="registry.example",
              llmops_awx_registry_username="puller", llmops_awx_inventory_path="inventories/example-h20",
              llmops_awx_scm_branch="0123456789abcdef0123456789abcdef01234567",
              llmops_awx_instance_groups=["gpu-runners"],
              llmops_awx_notification_templates=[{"name": "llmops on-call", "organization": "LLMOps",
                                                  "notification_type": "webhook",
                                                  "notification_configuration": {"url": "https://hooks.example/x",
                                                                                 "headers": {}, "http_method": "POST"}}],
              llmops_awx_notify_error=["llmops on-call"], llmops_awx_notify_success=[])
ENDPOINTS = {"controller_organizations": "organizations", "controller_credential_types": "credential_types",
             "controller_credentials": "credentials", "controller_execution_environments": "execution_environments",
             "controller_projects": "projects", "controller_inventories": "inventories",
             "controller_inventory_sources": "inventory_sources", "controller_templates": "job_templates",
             "controller_workflows": "workflow_job_templates", "controller_teams": "teams"}
# keys that name another object: the field carries its id (endpoint of that object)
REFERENCES = {"organization": "organizations", "inventory": "inventories", "project": "projects",
              "source_project": "projects", "execution_environment": "execution_environments",
              "default_environment": "execution_environments", "credential": "credentials",
              "credential_type": "credential_types"}
ASSOCIATED = ("credentials", "galaxy_credentials", "instance_groups", "notification_templates_error",
              "notification_templates_success", "notification_templates_started", "notification_templates_approvals")
MODULE_ONLY = {"wait"}  # awx.awx.project: wait for the sync; not a field of the object


def _configure(api, *args, inputs=None):
    env = dict(os.environ, CONTROLLER_HOST=api.url, CONTROLLER_OAUTH_TOKEN=TOKEN, ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.pop("CONTROLLER_USERNAME", None)
    env.pop("CONTROLLER_PASSWORD", None)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
           os.path.join(ROOT, "playbooks", "awx_configure.yml"), "-e", json.dumps(INPUTS if inputs is None else inputs)]
    start = len(api.requests)
    proc = subprocess.run(cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    return proc.returncode, proc.stdout + proc.stderr, api.requests[start:]


def _expected(value):
    """A value of awx/ as awx_configure.yml sends it: ``{{ llmops_awx_* }}`` given; other Jinja stays (AWX's)."""
    if isinstance(value, str):
        m = re.match(r"^\{\{ (?:llmops_awx_literal\.)?(llmops_awx_\w+) \}\}$", value)
        if m:
            return INPUTS[m.group(1)]
        m = re.match(r"^\{\{ (llmops_awx_\w+) \| default\((llmops_awx_\w+)\) \}\}$", value)
        return (INPUTS[m.group(1)] if m.group(1) in INPUTS else INPUTS[m.group(2)]) if m else value
    if isinstance(value, dict):
        return {k: _expected(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expected(v) for v in value]
    return value


@pytest.fixture(scope="module")
def api():
    with StandInAWX() as server:
        # an instance group the site already has (a container group would be the same field)
        server.handle("POST", "/api/v2/instance_groups/", {}, {"name": "gpu-runners"})
        yield server


@pytest.fixture(scope="module")
def checked_empty(api):
    return _configure(api, "--check")


@pytest.fixture(scope="module")
def failed_import(api, checked_empty):
    """The first real run, against a controller whose inventory imports fail (an import of a broken inventory):
    it creates what comes before the import and fails there."""
    api.fail_inventory_updates = True
    try:
        return _configure(api)
    finally:
        api.fail_inventory_updates = False


@pytest.fixture(scope="module")
def applied(api, failed_import):
    """The run after the failed one, the import fixed: it creates the rest and imports once again."""
    return _configure(api)


# A secret rotated at the site: the next run without llmops_awx_update_secrets cannot tell it from the stored one
ROTATED = dict(INPUTS, llmops_awx_k8s_token="k8s-" + os.urandom(6).hex())


@pytest.fixture(scope="module")
def rerun(api, applied):
    return _configure(api, inputs=ROTATED)


@pytest.fixture(scope="module")
def checked_after(api, rerun):
    return _configure(api, "--check")


def test_check_mode_on_an_empty_controller_says_what_it_would_create_and_writes_nothing(checked_empty):
    rc, out, requests = checked_empty
    assert rc == 0, out[-4000:]
    assert [r for r in requests if r["method"] != "GET"] == []
    msg = " ".join(out.split())
    assert 'check mode: the controller has none of organizations "LLMOps", credential_types "llmops Hugging Face token"' in msg
    assert ('workflow_job_templates "llmops stage, deploy, verify", workflow_job_templates "llmops upgrade", '
            'teams "llmops operators"') in msg
    assert 'teams "llmops release managers"; a real run creates them' in msg
    assert "TASK [Organization]" not in out


def test_a_run_sends_every_key_of_every_object(api, applied):
    rc, out, dummy_requests = applied
    assert rc == 0, out[-4000:]
    requests = api.requests  # the objects before the import were created by the run that failed there
    assert {r["authorization"] for r in requests} == {"Bearer " + TOKEN}
    checked, wrong = 0, []
    for kind, endpoint in ENDPOINTS.items():
        created = api.created(endpoint)
        for obj in OBJECTS[kind]:
            body = created[obj["name"]]
            for key, value in obj.items():
                want = _expected(value)
                if key in MODULE_ONLY or key == "workflow_nodes":  # the nodes: test_the_workflow_nodes_and_edges_arrive
                    continue
                if key in ASSOCIATED:
                    got, want = sorted(api.associated(endpoint, obj["name"], key)), sorted(want)
                elif key == "survey_spec":
                    got = api.survey(endpoint, obj["name"])
                elif key in REFERENCES:
                    want = api.find(REFERENCES[key], want)["id"]
                    got = body.get(key)
                    if key == "organization" and key not in body:
                        # a field of the parent only: awx.awx looks the parent up within the organization
                        # (inventory_source.py: the inventory by name and organization)
                        got = want if any(r["query"].get("organization") == str(want) for r in requests) else None
                elif key == "extra_vars":
                    got = json.loads(body[key]) if key in body else None  # AWX stores extra_vars as JSON text
                else:
                    got = body.get(key, "<not sent>")
                if got != want:
                    wrong.append((endpoint, obj["name"], key, got, want))
                checked += 1
    assert wrong == []
    assert checked > 150
    # what the issue found missing before: limits, ask_variables_on_launch, slicing, the switch in extra_vars
    jt = api.created("job_templates")
    assert jt["llmops benchmark"]["ask_variables_on_launch"] is False
    assert jt["llmops stage model"]["job_slice_count"] == 1 and jt["llmops stage model"]["allow_simultaneous"] is True
    # no Galaxy on any launch path: the organization has no Galaxy credential
    assert api.associated("organizations", "LLMOps", "galaxy_credentials") == []
    assert jt["llmops deploy"]["limit"] == "gpu_nodes:k8s_api"
    assert json.loads(jt["llmops deploy"]["extra_vars"])["llmops_k8s_delegate_to"] == "localhost"
    assert api.associated("job_templates", "llmops deploy", "instance_groups") == ["gpu-runners"]
    assert api.associated("job_templates", "llmops deploy", "notification_templates_error") == ["llmops on-call"]
    assert api.created("notification_templates")["llmops on-call"]["notification_type"] == "webhook"
    # the inventory source reads the site's inventory, not the EE's localhost
    assert api.created("inventory_sources")["llmops fleet from project"]["source_path"] == "inventories/example-h20"


def test_the_diagnose_template_holds_the_read_only_cluster_credential_and_only_appliers_the_write_one(api, applied):
    """The read-only token (llmops_awx_k8s_read_token, the llmops-read identity) is its own credential on the
    controller, attached to the diagnose template instead of the write one; the write one is only on the templates
    that apply (deploy, deploy P/D pair)."""
    rc, out, dummy_requests = applied
    assert rc == 0, out[-4000:]
    creds = api.created("credentials")
    assert creds["llmops Kubernetes read-only"]["inputs"]["bearer_token"] == SECRETS["llmops_awx_k8s_read_token"]
    assert creds["llmops Kubernetes"]["inputs"]["bearer_token"] != SECRETS["llmops_awx_k8s_read_token"]
    assert creds["llmops Kubernetes read-only"]["inputs"]["host"] == INPUTS["llmops_awx_k8s_host"]
    assert sorted(api.associated("job_templates", "llmops diagnose", "credentials")) == [
        "llmops GPU nodes", "llmops Kubernetes read-only", "llmops gateway token"]
    holders = {name for name in api.created("job_templates")
               if "llmops Kubernetes" in api.associated("job_templates", name, "credentials")}
    assert holders == {"llmops deploy", "llmops deploy P/D pair", "llmops upgrade phase"}
    assert SECRETS["llmops_awx_k8s_read_token"] not in out


def test_the_custom_credential_types_arrive_with_awx_s_own_templates_unevaluated(api, applied):
    types = api.created("credential_types")
    assert types["llmops gateway token"]["injectors"] == {"env": {"LLMOPS_GATEWAY_TOKEN": "{{ gateway_token }}"},
                                                          "extra_vars": {"llmops_gateway_token": "{{ gateway_token }}"}}
    assert types["llmops Hugging Face token"]["inputs"]["fields"][0]["secret"] is True
    creds = api.created("credentials")
    assert creds["llmops gateway token"]["inputs"] == {"gateway_token": SECRETS["llmops_awx_gateway_token"]}
    assert creds["llmops gateway token"]["credential_type"] == api.find("credential_types", "llmops gateway token")["id"]
    # the Machine credential holds the key only: user and become are the inventory's
    assert creds["llmops GPU nodes"]["inputs"] == {"ssh_key_data": SECRETS["llmops_awx_ssh_private_key"]}


def test_the_workflow_nodes_and_edges_arrive(api, applied):
    wf = OBJECTS["controller_workflows"][0]
    wf_id = api.find("workflow_job_templates", wf["name"])["id"]
    nodes = {i: b for i, b in api.created("workflow_job_template_nodes").items() if b["workflow_job_template"] == wf_id}
    assert sorted(nodes) == sorted(n["identifier"] for n in wf["workflow_nodes"])
    for node in wf["workflow_nodes"]:
        node_obj = next(o for o in api.objects["workflow_job_template_nodes"].values()
                        if o["identifier"] == node["identifier"])
        ujt = node["unified_job_template"]
        if ujt["type"] == "workflow_approval":
            # created through the node's create_approval_template/, with its timeout
            approval = api.objects["workflow_approval_templates"][node_obj["unified_job_template"]]
            assert (approval["name"], approval["timeout"]) == (ujt["name"], ujt["timeout"])
        else:
            jt = api.find("job_templates", ujt["name"])
            assert nodes[node["identifier"]]["unified_job_template"] == jt["id"]
        # a node's extra_data arrives as the node's own field (the failure path's diagnose_fail_after)
        assert nodes[node["identifier"]].get("extra_data") == node.get("extra_data"), node["identifier"]
        for edge in ("success_nodes", "failure_nodes"):
            want = [c["identifier"] for c in node.get("related", {}).get(edge, [])]
            node_obj = next(o for o in api.objects["workflow_job_template_nodes"].values()
                            if o["identifier"] == node["identifier"])
            got = [api.objects["workflow_job_template_nodes"][i]["identifier"]
                   for i in api.associations.get(("workflow_job_template_nodes", node_obj["id"], edge), [])]
            assert got == want, (node["identifier"], edge)
    body = api.created("workflow_job_templates")[wf["name"]]
    assert (body["limit"], body["ask_limit_on_launch"]) == ("gpu_nodes:k8s_api:bench_clients", True)


def test_the_teams_get_their_roles(api, applied):
    """awx/controller_roles.yml arrives as role grants (/api/v2/roles/<id>/teams/): operators execute stage and
    diagnose only, release managers everything, the workflow and its approval included."""
    managers, operators = ["llmops release managers"], ["llmops operators"]
    for name in ("llmops stage model", "llmops diagnose"):
        assert api.holders("job_templates", name, "execute") == sorted(managers + operators), name
    for name in ("llmops deploy", "llmops verify transport", "llmops benchmark"):
        assert api.holders("job_templates", name, "execute") == managers, name
        assert api.holders("job_templates", name, "admin") == [], name
    workflow = OBJECTS["controller_workflows"][0]["name"]
    assert api.holders("workflow_job_templates", workflow, "execute") == managers
    assert api.holders("workflow_job_templates", workflow, "approval") == managers
    assert api.holders("workflow_job_templates", workflow, "read") == operators


def test_no_secret_reaches_the_output(failed_import, applied, rerun, checked_after):
    for _rc, out, _requests in (failed_import, applied, rerun, checked_after):
        assert not [name for name, value in SECRETS.items() if value in out]


def test_check_mode_after_a_run_compares_every_object_and_writes_nothing(checked_after):
    rc, out, requests = checked_after
    assert rc == 0, out[-4000:]
    assert [r for r in requests if r["method"] != "GET"] == []
    for name in ("llmops stage model", "llmops deploy", "llmops verify transport", "llmops diagnose", "llmops benchmark",
                 "llmops.serving", "llmops fleet", "LLMOps", "llmops operators", "llmops release managers",
                 "approval on ['llmops stage, deploy, verify']"):
        assert "ok: [localhost] => (item=%s)" % name in out, name
    # the nodes, the approval node's template included, compare equal (workflow_job_template_node.py)
    assert "ok: [localhost] => (item=llmops stage, deploy, verify: approve deploy)" in out
    assert re.search(r"localhost +: ok=\d+ +changed=0 ", out), out[-2000:]


def _recap_changed(out):
    return int(re.search(r"localhost +: ok=\d+ +changed=(\d+) ", out).group(1))


def test_a_second_run_changes_nothing(rerun):
    """Rerunnable: the same inputs against the same controller write nothing and report changed=0, a secret rotated
    since among them (AWX never returns a secret, so it cannot be told from the stored one: awx.awx sends secrets
    only when another field of the credential changed, update_secrets false). Before, the credentials re-sent their
    secrets (awx.awx's update_secrets defaults to true: controller_api.py objects_could_be_different treats every
    $encrypted$ value as changed), the inventory was imported on every run, and the workflow patched its approval
    template (workflow_job_template.py create_workflow_nodes compares it with the node's identifier): changed=3,
    8 writes."""
    rc, out, requests = rerun
    assert rc == 0, out[-4000:]
    assert [(r["method"], r["path"]) for r in requests if r["method"] != "GET"] == []
    assert _recap_changed(out) == 0, out[-3000:]
    assert "TASK [Import the hosts and group_vars from the project]" in out
    assert "skipping: [localhost] => (item=llmops fleet from project)" in out
    assert ROTATED["llmops_awx_k8s_token"] not in out


def test_secrets_are_rotated_on_request(api, rerun, checked_after):
    """A new secret reaches the controller with llmops_awx_update_secrets=true (the run before, without it, changed
    nothing: test_a_second_run_changes_nothing). On the controller the runs above configured (after the check that
    compares it with the original inputs)."""
    assert rerun[0] == 0 and checked_after[0] == 0
    rc, out, requests = _configure(api, "-e", "llmops_awx_update_secrets=true", inputs=ROTATED)
    assert rc == 0, out[-3000:]
    patched = {r["path"]: r["body"] for r in requests if r["method"] == "PATCH"}
    k8s = api.find("credentials", "llmops Kubernetes")
    assert patched[k8s["url"]]["inputs"]["bearer_token"] == ROTATED["llmops_awx_k8s_token"]
    assert len(patched) == len(OBJECTS["controller_credentials"])
    assert ROTATED["llmops_awx_k8s_token"] not in out


def test_a_failed_import_is_retried_by_the_next_run(api, failed_import, applied, rerun):
    """The import runs when the source's last update did not succeed, though nothing changed, and then no more."""
    rc, out, dummy_requests = failed_import
    assert rc != 0 and "TASK [Import the hosts and group_vars from the project]" in out, out[-3000:]
    assert "TASK [Job templates and their surveys]" not in out
    rc, out, requests = applied
    assert rc == 0, out[-3000:]
    imports = [r for r in requests if r["method"] == "POST" and r["path"].endswith("/update/")]
    assert len(imports) == 1 and api.find("inventory_sources", "llmops fleet from project")["status"] == "successful"
    assert not [r for r in requests if r["method"] == "POST" and r["path"] == "/api/v2/inventory_sources/"]
    rc, out, requests = rerun  # and then no more: test_a_second_run_changes_nothing
    assert rc == 0 and not [r for r in requests if r["path"].endswith("/update/")], out[-3000:]


def test_a_project_branch_that_is_not_a_commit_is_refused(api):
    """The project follows llmops_awx_scm_branch; anything but the commit the EE was built from makes every job's
    release check fail (commit_mismatch) after the next push, so a branch is refused before any request."""
    rc, out, requests = _configure(api, inputs=dict(INPUTS, llmops_awx_scm_branch="main"))
    assert rc == 2, out[-3000:]
    msg = " ".join(out.split())
    assert "llmops_awx_scm_branch=main is not a commit" in msg and "llmops_awx_allow_unpinned_scm_branch=true" in msg
    assert requests == [] and "TASK [Organization]" not in out


def test_a_branch_is_followed_on_request_with_a_warning():
    with StandInAWX() as server:
        rc, out, dummy_requests = _configure(server, "--check", "-e", "llmops_awx_allow_unpinned_scm_branch=true",
                                             inputs=dict(INPUTS, llmops_awx_scm_branch="main"))
    assert rc == 0, out[-3000:]
    assert "llmops_awx_scm_branch=main is not a commit (llmops_awx_allow_unpinned_scm_branch=true)" in " ".join(out.split())


def test_the_inventory_source_path_is_required(api):
    inputs = {k: v for k, v in INPUTS.items() if k != "llmops_awx_inventory_path"}
    rc, out, requests = _configure(api, inputs=inputs)
    assert rc == 2, out[-3000:]
    assert "set llmops_awx_inventory_path" in out
    assert requests == [] and "TASK [Organization]" not in out


def test_secret_inputs_reach_the_controller_literally_and_are_never_shown(api, failed_import, applied):
    """The runs' secrets hold Jinja openers (JINJA_SECRETS): stored as written (by the first real run, the one that
    failed at the import), never in any run's output."""
    out = failed_import[1] + applied[1]
    assert "TASK [Credentials]" in failed_import[1], failed_import[1][-3000:]
    creds = api.created("credentials")
    assert creds["llmops source control"]["inputs"]["password"] == JINJA_SECRETS["llmops_awx_scm_token"]
    assert creds["llmops Kubernetes"]["inputs"]["bearer_token"] == "x{{ 6*7 }}y"
    assert creds["llmops EE registry"]["inputs"]["password"] == JINJA_SECRETS["llmops_awx_registry_password"]
    assert creds["llmops gateway token"]["inputs"] == {"gateway_token": JINJA_SECRETS["llmops_awx_gateway_token"]}
    assert not [k for k, v in JINJA_SECRETS.items() if v in out], "a secret reached the output"


def test_a_secret_given_as_a_reference_is_refused_before_anything_changes():
    with StandInAWX() as server:
        rc, out, requests = _configure(server, inputs=dict(INPUTS, llmops_awx_k8s_token="{{ vault_k8s_token }}",
                                                           vault_k8s_token="k8s-" + os.urandom(6).hex()))
    assert rc == 2, out[-3000:]
    assert "llmops_awx_k8s_token: the value is a reference to another variable" in " ".join(out.split())
    assert [r for r in requests if r["method"] != "GET"] == [] and "TASK [Organization]" not in out


def test_every_secret_input_of_awx_is_read_literally():
    """awx/controller_credentials.yml reads each secret input through llmops_awx_literal (the lookup that keeps it
    from being evaluated), and every secret variable the playbook lists is one it reads there."""
    import yaml

    with open(os.path.join(ROOT, "playbooks", "awx_configure.yml"), encoding="utf-8") as f:
        play = yaml.safe_load(f)[0]
    secret_vars = set(play["vars"]["llmops_awx_secret_vars"])
    assert set(SECRETS) <= secret_vars
    for cred in OBJECTS["controller_credentials"]:
        for key, value in cred.get("inputs", {}).items():
            names = set(re.findall(r"\b(llmops_awx_\w+)\b", str(value))) - {"llmops_awx_literal"}
            if names & secret_vars or re.search(r"token|password|key|secret", key):
                assert str(value).startswith("{{ llmops_awx_literal."), (cred["name"], key, value)


AWX_MODULES = os.path.join(awx.SITE_COLLECTIONS, "awx", "awx", "plugins", "modules")
# awx.awx modules that start a job on the controller: "changed" whatever the job finds
LAUNCHERS = {"inventory_source_update", "project_update", "job_launch", "workflow_launch", "ad_hoc_command"}


def test_no_task_of_awx_configure_reports_a_change_on_every_run():
    """Each way a task of awx_configure.yml reported "changed" with nothing to change goes through its one switch:
    every task of a module with update_secrets passes llmops_awx_update_secrets (controller_api.py
    objects_could_be_different, tests/property/test_awx_configure_properties.py); every task that launches a job on
    the controller runs only under a condition; no task hands workflow_nodes to awx.awx.workflow_job_template (its
    create_workflow_nodes compares an approval node's template with the node's fields, changed on every run)."""
    import yaml

    with open(os.path.join(ROOT, "playbooks", "awx_configure.yml"), encoding="utf-8") as f:
        play = yaml.safe_load(f)[0]
    tasks = play["pre_tasks"] + play["tasks"]
    seen = set()
    for task in tasks:
        for key, args in task.items():
            if not key.startswith("awx.awx."):
                continue
            module = key.split(".")[-1]
            seen.add(module)
            with open(os.path.join(AWX_MODULES, module + ".py"), encoding="utf-8") as f:
                takes_secrets = "update_secrets=dict(" in f.read()
            if takes_secrets:
                assert "llmops_awx_update_secrets" in str(args.get("update_secrets")), task["name"]
            if module in LAUNCHERS:
                assert task.get("when"), task["name"]
            if module == "workflow_job_template":
                assert "workflow_nodes" not in args, task["name"]
    assert {"credential", "inventory_source_update", "workflow_job_template", "workflow_job_template_node"} <= seen
