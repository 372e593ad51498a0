"""The AWX objects of awx/: surveys AWX accepts, answers it refuses, and the private data dir it writes.

The rules are AWX's own (ansible/awx, restated in tests/lib/awx_harness.py):
- saving a survey: awx/api/views/__init__.py JobTemplateSurveySpec._validate_spec_data (types:
  awx/main/constants.py SURVEY_TYPE_MAPPING);
- launching: awx/main/models/mixins.py SurveyJobTemplateMixin._survey_element_validation,
  _accept_or_ignore_variables and _update_unified_job_kwargs (precedence);
- env/extravars: awx/main/tasks/jobs.py RunJob.build_extra_vars_file with awx/main/utils/safe_yaml.py safe_dump;
- env/cmdline: RunJob.build_args; the inventory script: awx/main/models/inventory.py Inventory.get_script_data;
- the Kubernetes credential: awx/main/models/credential/injectors.py kubernetes_bearer_token.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

ROOT = awx.ROOT
OBJECTS = awx.load_controller()
TEMPLATES = OBJECTS["controller_templates"]
WORKFLOWS = OBJECTS["controller_workflows"]
SURVEYED = [t for t in TEMPLATES + WORKFLOWS if t.get("survey_enabled")]


def _ids(objs):
    return [o["name"] for o in objs]


def _question(template, variable):
    return next(e for e in template["survey_spec"]["spec"] if e["variable"] == variable)


# ---- the objects as AWX would store them ------------------------------------------------------------------------

def test_the_data_model_holds_every_kind_the_controller_needs():
    assert {"controller_organizations", "controller_credentials", "controller_projects", "controller_inventories",
            "controller_inventory_sources", "controller_execution_environments", "controller_templates",
            "controller_workflows"} <= set(OBJECTS)
    assert {"controller_credential_types", "controller_notifications"} <= set(OBJECTS)
    assert sorted(t["playbook"] for t in TEMPLATES) == ["playbooks/benchmark.yml", "playbooks/diagnose.yml",
                                                        "playbooks/pd_deploy.yml", "playbooks/site.yml", "playbooks/stage.yml",
                                                        "playbooks/upgrade.yml", "playbooks/verify_transport.yml"]


@pytest.mark.parametrize("answers, targets", [
    ({"benchmark_a_url": "http://10.0.0.5:8000", "benchmark_a_model": "glm"},
     [{"name": "a", "url": "http://10.0.0.5:8000", "model": "glm"}]),
    ({"benchmark_a_url": "http://e:8000", "benchmark_a_model": "glm", "benchmark_a_name": "colocated",
      "benchmark_b_url": "http://pd:8000", "benchmark_b_model": "", "benchmark_b_name": "pd"},
     [{"name": "colocated", "url": "http://e:8000", "model": "glm"}, {"name": "pd", "url": "http://pd:8000", "model": "glm"}]),
], ids=["one-target", "a-b-same-model"])
def test_the_benchmark_survey_scalars_become_the_role_s_target_list(answers, targets):
    """A survey answers scalars; the role's contract is benchmark_targets (a list of {name, url, model}): the
    template's extra_vars expression joins them, with B only when its URL is answered and B's model defaulting to A's."""
    import ast
    import jinja2
    bench = awx.by_name(TEMPLATES, "llmops benchmark")
    expr = str(bench["extra_vars"]["benchmark_targets"])
    extra = awx.job_extra_vars(bench, answers)
    rendered = jinja2.Environment().from_string(expr).render(**{k: v for k, v in extra.items() if k.startswith("benchmark_")})
    assert ast.literal_eval(rendered.strip()) == targets


def test_no_template_lets_a_launcher_set_arbitrary_extra_vars():
    """AWX strips ansible_* variables only from ad hoc commands (AdHocCommandSerializer.validate_extra_vars), not
    from job launches: a template that asks for variables lets its launcher set connection variables that run in the
    execution environment holding the credentials. Surveys ask for what a launch may change."""
    assert [t["name"] for t in TEMPLATES + WORKFLOWS if t.get("ask_variables_on_launch")] == []
    bench = awx.by_name(TEMPLATES, "llmops benchmark")
    data = {"benchmark_a_url": "http://e:8000", "benchmark_a_model": "glm", "benchmark_tokenizer": "/t",
            "ansible_ssh_common_args": "-o ProxyCommand=sh"}
    accepted, ignored = awx.accept_or_ignore_variables(bench, data)[:2]
    assert "ansible_ssh_common_args" in ignored and "ansible_ssh_common_args" not in accepted


def test_a_benchmark_launch_leaves_the_site_s_benchmark_values_alone():
    """The ladder, seeds, length pairs and the round sizes are the inventory's: a launch answering only the required
    questions adds none of them as extra vars (which would rank above the site's inventory)."""
    bench = awx.by_name(TEMPLATES, "llmops benchmark")
    extra = awx.job_extra_vars(bench, {"benchmark_a_url": "http://e:8000", "benchmark_a_model": "glm",
                                       "benchmark_tokenizer": "/t"})
    site = ("benchmark_concurrency", "benchmark_seeds", "benchmark_lengths", "benchmark_requests_per_round",
            "benchmark_warmup_rounds", "benchmark_time_budget", "benchmark_out_dir")
    assert [k for k in site if k in extra] == []


@pytest.mark.parametrize("template", SURVEYED, ids=_ids(SURVEYED))
def test_awx_saves_every_survey(template):
    assert awx.validate_spec(template["survey_spec"]) == []


@pytest.mark.parametrize("template", SURVEYED, ids=_ids(SURVEYED))
def test_every_survey_default_survives_launch_validation(template):
    """AWX silently drops a default that fails its own question (``_update_unified_job_kwargs``)."""
    with_default = {e["variable"]: e["default"] for e in template["survey_spec"]["spec"] if "default" in e}
    extra = awx.job_extra_vars(template, {})
    assert {k: extra.get(k) for k in with_default} == with_default
    for element in template["survey_spec"]["spec"]:
        if element["type"] == "integer":
            assert isinstance(element["min"], int) and isinstance(element["max"], int), element["variable"]
        if element["type"] == "password":
            assert "default" not in element, "no secret default in the repository: " + element["variable"]


def test_the_surveys_use_awx_types_for_engine_sizes_and_tokens():
    deploy = awx.by_name(TEMPLATES, "llmops deploy")
    engine = _question(deploy, "engine_name")
    # the inventory's engine_name unless answered: no default (a default would be an extra var above the site's)
    assert (engine["type"], engine["choices"], "default" in engine, engine["required"]) == (
        "multiplechoice", ["vllm", "sglang"], False, False)
    tp = _question(deploy, "engine_tp_size")
    assert (tp["type"], tp["min"], tp["max"], "default" in tp) == ("integer", 1, 8, False)
    stage = awx.by_name(TEMPLATES, "llmops stage model")
    assert _question(stage, "model_stage_read_streams")["type"] == "integer"
    token = _question(awx.by_name(TEMPLATES, "llmops diagnose"), "diagnose_gateway_token")
    assert token["type"] == "password"


@pytest.mark.parametrize("template", [t for t in TEMPLATES if t.get("survey_enabled")],
                         ids=_ids([t for t in TEMPLATES if t.get("survey_enabled")]))
def test_every_survey_variable_is_read_by_the_playbook_it_feeds(template):
    """A question nobody reads is a knob that does nothing: each variable is used by the playbook, its roles or the
    template's own extra_vars."""
    roles = glob.glob(os.path.join(ROOT, "roles", "*", "**", "*.yml"), recursive=True)
    files = [os.path.join(ROOT, template["playbook"])] + roles
    text = "\n".join(open(f, encoding="utf-8").read() for f in files) + yaml.safe_dump(template.get("extra_vars") or {})
    unread = [e["variable"] for e in template["survey_spec"]["spec"] if not re.search(r"\b%s\b" % e["variable"], text)]
    assert unread == []


def test_templates_and_workflow_reference_objects_that_exist():
    names = {kind: {o["name"] for o in OBJECTS[kind]} for kind in OBJECTS if kind != "controller_roles"}
    for t in TEMPLATES:
        assert os.path.isfile(os.path.join(ROOT, t["playbook"])), t["playbook"]
        assert t["inventory"] in names["controller_inventories"]
        assert t["project"] in names["controller_projects"]
        assert t["execution_environment"] in names["controller_execution_environments"]
        assert set(t["credentials"]) <= names["controller_credentials"]
        assert t["organization"] in names["controller_organizations"]
    assert len(names["controller_templates"]) == len(TEMPLATES)
    wf = awx.by_name(WORKFLOWS, "llmops stage, deploy, verify")  # the upgrade's: tests/unit/test_awx_workflow.py
    nodes = {n["identifier"]: n for n in wf["workflow_nodes"]}
    assert len(nodes) == len(wf["workflow_nodes"])
    edges = {i: [c["identifier"] for k in ("success_nodes", "failure_nodes", "always_nodes")
                 for c in n.get("related", {}).get(k, [])] for i, n in nodes.items()}
    assert all(c in nodes for cs in edges.values() for c in cs)
    assert {n["unified_job_template"]["name"] for n in nodes.values()
            if n["unified_job_template"]["type"] == "job_template"} <= names["controller_templates"]
    approvals = [n for n in nodes.values() if n["unified_job_template"]["type"] == "workflow_approval"]
    assert all(n["unified_job_template"].get("timeout", 0) > 0 for n in approvals)  # never waits forever
    # stage -> approval -> deploy -> deploy P/D pair -> verify on success, a failed deploy is diagnosed
    assert [c["identifier"] for c in nodes["stage"]["related"]["success_nodes"]] == ["approve deploy"]
    assert [c["identifier"] for c in nodes["approve deploy"]["related"]["success_nodes"]] == ["deploy"]
    assert [c["identifier"] for c in nodes["deploy"]["related"]["success_nodes"]] == ["deploy P/D pair"]
    assert [c["identifier"] for c in nodes["deploy P/D pair"]["related"]["success_nodes"]] == ["verify"]
    assert [c["identifier"] for c in nodes["deploy"]["related"]["failure_nodes"]] == ["diagnose"]
    roots = set(nodes) - {c for cs in edges.values() for c in cs}
    assert roots == {"stage"}


def _site_variables():
    """Every variable a site inventory of this repository sets (group_vars and host vars, both inventories)."""
    names = set()
    for inv in ("inventories/example-h20", "inventories/local"):
        imported = awx.import_inventory(ROOT, inv)
        for key, group in imported.items():
            if key != "_meta":
                names.update((group.get("vars") or {}).keys())
        for hv in imported.get("_meta", {}).get("hostvars", {}).values():
            names.update(hv)
    return names


def test_a_question_a_site_sets_in_its_inventory_has_no_default():
    """Survey answers, defaults included, are extra vars: a default would override the site's inventory value on
    every launch from the form. Questions for such variables have no default and are not required."""
    site = _site_variables()
    assert {"engine_name", "model_stage_read_streams", "kernel_cache_enabled"} <= site  # the check sees the inventories
    offenders = [(t["name"], e["variable"]) for t in SURVEYED for e in t["survey_spec"]["spec"]
                 if e["variable"] in site and ("default" in e or e["required"])]
    assert offenders == []


def test_the_deploy_timeout_leaves_room_for_staging_caches_and_the_startup_window():
    deploy = awx.by_name(TEMPLATES, "llmops deploy")
    with open(os.path.join(ROOT, "roles", "kernel_cache", "defaults", "main.yml"), encoding="utf-8") as f:
        cache = int(yaml.safe_load(f)["kernel_cache_warmup_timeout"])
    startup = _question(deploy, "engine_startup_timeout")["max"]
    pull = 900  # roles/engine/defaults/main/kubernetes.yml: engine_k8s_wait_timeout = startup + 900
    assert deploy["timeout"] >= STAGE["timeout"] + cache + startup + pull
    verify = awx.by_name(TEMPLATES, "llmops verify transport")
    with open(os.path.join(ROOT, "inventories", "example-h20", "group_vars", "all", "pd_disagg.yml"), encoding="utf-8") as f:
        assert verify["timeout"] > int(yaml.safe_load(f)["pd_disagg_startup_timeout"])


def test_user_and_become_come_from_the_inventory_alone():
    machine = awx.by_name(OBJECTS["controller_credentials"], "llmops GPU nodes")
    assert machine["credential_type"] == "Machine" and set(machine["inputs"]) == {"ssh_key_data"}
    for t in TEMPLATES:
        assert not {"become_enabled"} & set(t), t["name"]
    assert "ansible_user" in _site_variables()


def test_the_custom_credential_types_mark_their_secrets_and_inject_them():
    types = {t["name"]: t for t in OBJECTS["controller_credential_types"]}
    hf, gw = types["llmops Hugging Face token"], types["llmops gateway token"]
    for t, field, env, var in ((hf, "hf_token", "HF_TOKEN", "llmops_hf_token"),
                               (gw, "gateway_token", "LLMOPS_GATEWAY_TOKEN", "llmops_gateway_token")):
        (f,) = t["inputs"]["fields"]
        assert (f["id"], f["type"], f["secret"]) == (field, "string", True)
        assert t["injectors"] == {"env": {env: "{{ %s }}" % field}, "extra_vars": {var: "{{ %s }}" % field}}
    # each injected variable is read where the credential is attached
    diagnose, bench = awx.by_name(TEMPLATES, "llmops diagnose"), awx.by_name(TEMPLATES, "llmops benchmark")
    assert "llmops gateway token" in diagnose["credentials"] and "llmops_gateway_token" in diagnose["extra_vars"]["diagnose_probe_headers"]
    assert "llmops Hugging Face token" in bench["credentials"] and "llmops_hf_token" in bench["extra_vars"]["benchmark_client_env"]


@pytest.mark.parametrize("answers, injected, expected", [
    ({}, {"llmops_gateway_token": "cred"}, {"Authorization": "Bearer cred"}),
    ({"diagnose_gateway_token": "survey"}, {"llmops_gateway_token": "cred"}, {"Authorization": "Bearer survey"}),
    ({}, {"llmops_gateway_token": ""}, {}),
    ({}, {}, {}),
], ids=["credential", "survey-wins", "empty-credential", "none"])
def test_the_gateway_token_reaches_the_probe_header(answers, injected, expected):
    import ast
    import jinja2
    diagnose = awx.by_name(TEMPLATES, "llmops diagnose")
    expr = str(diagnose["extra_vars"]["diagnose_probe_headers"])
    rendered = jinja2.Environment().from_string(expr).render(**dict(injected, **answers))
    assert ast.literal_eval(rendered.strip()) == expected


# ---- what AWX refuses --------------------------------------------------------------------------------------------

STAGE = awx.by_name(TEMPLATES, "llmops stage model")


def _launch_errors(template, answers):
    with pytest.raises(awx.SurveyError) as e:
        awx.accept_or_ignore_variables(template, answers)
    return e.value.errors


def test_a_missing_required_answer_is_refused():
    bench = awx.by_name(TEMPLATES, "llmops benchmark")
    answers = {"benchmark_a_model": "glm", "benchmark_tokenizer": "/t", "benchmark_requests_per_round": 64,
               "benchmark_warmup_rounds": 1, "benchmark_time_budget": 0}
    assert _launch_errors(bench, answers) == ["'benchmark_a_url' value missing"]


@pytest.mark.parametrize("value, error", [
    (0, "'model_stage_read_streams' value 0 is too small (must be at least 1)."),
    (65, "'model_stage_read_streams' value 65 is too large (must be no more than 64)."),
    ("4", "Value 4 for 'model_stage_read_streams' expected to be an integer."),
    (True, "Value True for 'model_stage_read_streams' expected to be an integer."),
])
def test_an_integer_answer_out_of_range_or_of_another_type_is_refused(value, error):
    answers = dict(awx.ui_answers(STAGE["survey_spec"]), model_stage_read_streams=value)
    assert _launch_errors(STAGE, answers) == [error]


def test_a_choice_outside_the_list_is_refused():
    deploy = awx.by_name(TEMPLATES, "llmops deploy")
    assert _launch_errors(deploy, {"engine_name": "tgi", "kernel_cache_enabled": "true"}) == [
        "Value tgi for 'engine_name' expected to be one of ['vllm', 'sglang']."]


def test_a_refused_password_answer_is_not_repeated():
    diagnose = awx.by_name(TEMPLATES, "llmops diagnose")
    secret = "s3cr3t-" + "x" * 5000
    errors = _launch_errors(diagnose, dict(awx.ui_answers(diagnose["survey_spec"]), diagnose_gateway_token=secret))
    assert errors == ["'diagnose_gateway_token' value $encrypted$ is too large (must be no more than 4096)."]
    assert "s3cr3t" not in " ".join(errors)


def test_a_variable_the_survey_does_not_ask_for_is_ignored():
    accepted, ignored, errors = awx.accept_or_ignore_variables(
        STAGE, dict(awx.ui_answers(STAGE["survey_spec"]), engine_port=1))
    assert "engine_port" not in accepted and ignored == {"engine_port": 1} and errors == []


@pytest.mark.parametrize("mutate, error", [
    (lambda s: s["spec"].append(dict(s["spec"][0])), "'variable' 'stage_model_name' duplicated in survey question 5."),
    (lambda s: s["spec"][2].update(default="fast"), "Default choice must be answered from the choices listed."),
    (lambda s: s["spec"][3].update(max=""), "The max limit in survey question 3 expected to be integer."),
    (lambda s: s["spec"][3].update(default="4"), "Default value in survey question 3 expected to be integer."),
    (lambda s: s["spec"][2].update(type="select"),
     "'select' in survey question 2 is not one of 'text, textarea, password, multiplechoice, multiselect, integer, "
     "float' allowed question types."),
    (lambda s: s["spec"][0].pop("required"), "'required' missing from survey question 0"),
])
def test_awx_refuses_to_save_a_broken_survey(mutate, error):
    import copy

    spec = copy.deepcopy(STAGE["survey_spec"])
    mutate(spec)
    assert awx.validate_spec(spec) == [error]


# ---- precedence, !unsafe, cmdline, inventory, credential -----------------------------------------------------------

def _template(**kw):
    t = {"name": "t", "survey_enabled": True, "extra_vars": {"a": "jt", "b": "jt", "c": "jt", "t": "{{ 6 * 7 }}"},
         "survey_spec": {"name": "s", "description": "", "spec": [
             {"question_name": "b", "type": "text", "variable": "b", "required": False, "default": "survey"},
             {"question_name": "c", "type": "text", "variable": "c", "required": False, "default": "survey"},
             {"question_name": "n", "type": "integer", "variable": "n", "required": False, "min": 1, "max": 3,
              "default": 9},
             {"question_name": "p", "type": "password", "variable": "p", "required": False}]}}
    t.update(kw)
    return t


def test_precedence_is_template_then_valid_survey_defaults_then_answers():
    extra = awx.job_extra_vars(_template(), {"c": "answer", "p": "$encrypted$"})
    # n's default 9 is outside 1..3: dropped, as AWX does; "$encrypted$" means "keep the stored password"
    assert extra == {"a": "jt", "b": "survey", "c": "answer", "t": "{{ 6 * 7 }}"}


def _ansible_reads(extravars_text, tmp_path, expr):
    path = tmp_path / "extravars"
    path.write_text(extravars_text)
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    bindir = os.path.dirname(sys.executable)
    proc = subprocess.run([os.path.join(bindir, "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
                           "ansible.builtin.debug", "-a", "msg={{ %s }}" % expr, "-e", "@%s" % path],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
                                   ANSIBLE_LOAD_CALLBACK_PLUGINS="0", ANSIBLE_CONFIG=str(cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_extravars_mark_answers_unsafe_and_keep_template_jinja(tmp_path):
    template = _template()
    extra = awx.job_extra_vars(template, {"c": "{{ 6 * 7 }}"})
    text = awx.safe_dump(extra, template["extra_vars"])
    assert "!unsafe 'c': !unsafe '{{ 6 * 7 }}'" in text
    assert "t: '{{ 6 * 7 }}'" in text.splitlines()  # the template's own value: trusted
    out = _ansible_reads(text, tmp_path, "[c, t]")
    # the answer stays text; the template's own value is evaluated
    assert re.search(r'"msg": \[\s*"\{\{ 6 \* 7 \}\}",\s*42\s*\]', out), out


def test_cmdline_follows_the_job_fields():
    args = awx.build_args({"job_type": "check", "forks": 64, "limit": "gpu-a", "job_tags": "engine", "verbosity": 2,
                           "become_enabled": True, "diff_mode": True, "skip_tags": "kernel_cache"})
    assert args == ["--check", "-u", "root", "--become", "--diff", "--forks=64", "-l", "gpu-a", "-vv", "-t",
                    "engine", "--skip-tags=kernel_cache"]
    assert awx.build_args({"job_type": "run"}) == ["-u", "root"]


def test_the_inventory_script_is_the_imported_project_inventory():
    imported = awx.import_inventory(ROOT, "inventories/local")
    data = awx.script_data(imported, 7)
    # the one host plays every group the playbooks target
    assert data["all"]["hosts"] == [] and sorted(data["gpu_nodes"]["children"]) == ["colocated", "decode", "prefill"]
    for group in ("colocated", "prefill", "decode", "k8s_api", "bench_clients"):
        assert data[group]["hosts"] == ["localhost"], group
    hv = data["_meta"]["hostvars"]["localhost"]
    assert hv["ansible_connection"] == "local"
    assert (hv["remote_tower_enabled"], hv["remote_host_enabled"]) == ("true", "true")
    # group_vars/all of the inventory directory, unevaluated (AWX stores what ansible-inventory --export prints)
    assert data["all"]["vars"]["llmops_shared_root"] == "{{ llmops_root }}/shared"


def test_the_kubernetes_credential_becomes_k8s_auth_environment(tmp_path):
    (tmp_path / "env").mkdir()
    env = awx.kubernetes_env({"host": "https://k8s.example:6443", "bearer_token": "tok", "verify_ssl": True,
                              "ssl_ca_cert": "-----BEGIN CERTIFICATE-----\n"}, str(tmp_path))
    assert env["K8S_AUTH_HOST"] == "https://k8s.example:6443" and env["K8S_AUTH_API_KEY"] == "tok"
    assert env["K8S_AUTH_VERIFY_SSL"] == "True"
    assert open(env["K8S_AUTH_SSL_CA_CERT"]).read().startswith("-----BEGIN CERTIFICATE-----")
    assert oct(os.stat(env["K8S_AUTH_SSL_CA_CERT"]).st_mode & 0o777) == "0o600"
    assert awx.kubernetes_env({"host": "h", "bearer_token": "t"}, str(tmp_path))["K8S_AUTH_VERIFY_SSL"] == "False"


def _configure(tmp_path, *args):
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    bindir = os.path.dirname(sys.executable)
    # a controller address where nothing listens: any task that reached the API would fail on it
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1", CONTROLLER_HOST="http://127.0.0.1:9")
    return subprocess.run([os.path.join(bindir, "ansible-playbook"), "-i", "localhost,",
                           os.path.join(ROOT, "playbooks", "awx_configure.yml")] + list(args),
                          capture_output=True, text=True, timeout=120, check=False, env=env)


def test_awx_configure_names_missing_inputs_before_it_touches_the_controller(tmp_path):
    proc = _configure(tmp_path, "-e", "llmops_awx_scm_url=https://git.example/serving.git")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "set llmops_awx_scm_username, llmops_awx_scm_token," in out and "llmops_awx_registry_password" in out
    assert "llmops_awx_scm_url," not in out  # given
    assert "TASK [Organization]" not in out


def test_awx_configure_names_a_missing_awx_directory(tmp_path):
    args = ["-e", "llmops_awx_config_dir=%s" % tmp_path]
    for var in ("llmops_awx_scm_url", "llmops_awx_scm_username", "llmops_awx_scm_token", "llmops_awx_ssh_username",
                "llmops_awx_ssh_private_key", "llmops_awx_k8s_host", "llmops_awx_k8s_token", "llmops_awx_k8s_read_token",
                "llmops_awx_k8s_ca_cert",
                "llmops_awx_ee_image", "llmops_awx_registry_host", "llmops_awx_registry_username",
                "llmops_awx_registry_password"):
        args += ["-e", "%s=x" % var]
    proc = _configure(tmp_path, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "llmops_awx_config_dir=%s has no controller_templates.yml" % tmp_path in out
    assert "TASK [Organization]" not in out


def test_no_launch_needs_galaxy():
    """Air-gapped: no project of awx/ has an organization with a Galaxy credential, so no project update (nor a
    launch that triggers one) installs requirements.yml from Galaxy; the jobs' collections are the EE's."""
    orgs = {o["name"]: o for o in OBJECTS["controller_organizations"]}
    for project in OBJECTS["controller_projects"]:
        assert not awx.project_update_installs_collections(orgs[project["organization"]]), project["name"]
    # what the EE must then carry: every collection the job templates' playbooks call, but awx.awx (for
    # playbooks/awx_configure.yml only, which no template runs)
    assert "playbooks/awx_configure.yml" not in [t["playbook"] for t in TEMPLATES]
    text = "\n".join(open(os.path.join(ROOT, t["playbook"]), encoding="utf-8").read() for t in TEMPLATES)
    assert "awx.awx." not in text


def test_the_workflow_imports_the_inventory_once_not_per_node():
    """Each node launch of the workflow, seconds apart, would import the inventory again (and block the next
    node's job while it runs) without a cache timeout; with the source's, one import serves the run."""
    (source,) = OBJECTS["controller_inventory_sources"]
    imports, since = 0, None
    for gap in [0] + [30] * (len(WORKFLOWS[0]["workflow_nodes"]) - 1):
        since = None if since is None and imports == 0 else since + gap
        if awx.source_needs_update_on_launch(source, since):
            imports, since = imports + 1, 0
    assert imports == 1
