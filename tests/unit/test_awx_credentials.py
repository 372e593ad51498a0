"""Each job template of awx/ carries exactly the credentials its playbook reads, and the diagnosis never writes.

AWX injects every credential attached to a template into each of its jobs (awx/main/tasks/jobs.py
RunJob.build_env / build_args, awx/main/models/credential/__init__.py CredentialType.inject_credential): a
Kubernetes token on a template whose playbook never calls the cluster is a token any of its launchers' jobs hold
for nothing, and a write token on the diagnose template (allow_simultaneous, launched by operators) can change the
cluster. The map below is read from the playbooks themselves, not restated: every task a template's playbook can
reach (plays, pre_tasks, tasks, roles, blocks and their rescues, include_role / import_role with tasks_from,
include_tasks / import_tasks), its module, and the variables it reads, with the fleet's platform choices (a
Kubernetes fleet: engine_platform, pd_disagg_platform, diagnose_platform kubernetes) deciding the ``when:`` that
name them; any other condition counts as "may run".

Credential kinds (awx/controller_credentials.yml, controller_credential_types.yml):

* Machine: a play targets inventory hosts (SSH);
* OpenShift or Kubernetes API Bearer Token: a task calls the cluster (kubernetes.core.*, and the collection's
  k8s_engine_wait and engine_diagnose, the two modules that import the Kubernetes client). Write - a
  kubernetes.core.k8s task (state present/absent, apply) - needs the write identity (llmops Kubernetes); reads only
  need the read-only one (llmops Kubernetes read-only, the llmops-read Role of plugins/module_utils/kube/_k8s_rbac.py);
* the custom types: the template's extra_vars or a reachable task reads a variable or environment variable their
  injectors set.
"""
from __future__ import annotations

import glob
import os
import re

import jinja2
import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

ROOT = awx.ROOT
OBJECTS = awx.load_controller()
TEMPLATES = OBJECTS["controller_templates"]
CREDENTIALS = {c["name"]: c for c in OBJECTS["controller_credentials"]}
K8S_TYPE = "OpenShift or Kubernetes API Bearer Token"
WRITE_K8S, READ_K8S = "llmops Kubernetes", "llmops Kubernetes read-only"
#: the platform choices of a Kubernetes fleet (inventories/example-h20): what decides the platform branches
FLEET = {"engine_platform": "kubernetes", "pd_disagg_platform": "kubernetes", "diagnose_platform": "kubernetes",
         # the benchmark role's default (roles/benchmark/defaults/main.yml); the template neither sets nor asks it
         "benchmark_mode": "local"}
#: modules that call the Kubernetes API: kubernetes.core's and the two of the collection that import its client
K8S_MODULES = re.compile(r"^(kubernetes\.core\.\w+|llmops\.serving\.(k8s_engine_wait|engine_diagnose))$")
K8S_WRITES = {"kubernetes.core.k8s", "kubernetes.core.k8s_scale", "kubernetes.core.k8s_drain", "kubernetes.core.k8s_exec",
              "kubernetes.core.k8s_cp", "kubernetes.core.k8s_rollback", "kubernetes.core.helm", "kubernetes.core.k8s_json_patch"}
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "ansible.builtin.include_tasks",
            "ansible.builtin.import_tasks")
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined)


def _may_run(when):
    """False only when a condition provably fails with the fleet's platform values."""
    for cond in when if isinstance(when, list) else [when]:
        if isinstance(cond, bool):
            if not cond:
                return False
            continue
        try:
            if not _ENV.from_string("{{ %s }}" % cond).render(FLEET) in ("True", "true"):
                return False
        except jinja2.TemplateError:
            continue  # names something else: may run
    return True


def _load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or []


def _paths(path):
    """A task file path, templated with the fleet's values; every file it may name where they do not decide it."""
    if "{{" not in path:
        return [path]
    try:
        return [_ENV.from_string(path).render(FLEET)]
    except jinja2.TemplateError:
        return sorted(glob.glob(re.sub(r"\{\{.*?\}\}", "*", path)))


def _role_tasks(name, tasks_from="main"):
    role = name.split(".")[-1]
    return os.path.join(ROOT, "roles", role, "tasks", tasks_from if tasks_from.endswith(".yml") else tasks_from + ".yml")


class Reach:
    """Every task a playbook can reach on a Kubernetes fleet: (file, task) pairs."""

    def __init__(self):
        self.tasks = []
        self.files = []

    def file(self, path):
        for one in _paths(path):
            if one not in self.files:
                self.files.append(one)
                self.tasks_of(_load(one), os.path.dirname(one))

    def tasks_of(self, tasks, here):
        for task in tasks or []:
            if not _may_run(task.get("when", True)):
                continue
            self.tasks.append(task)
            for key in ("block", "rescue", "always"):
                self.tasks_of(task.get(key), here)
            for inc in INCLUDES:
                if inc not in task:
                    continue
                args = task[inc]
                if inc.endswith("_role"):
                    self.file(_role_tasks(args["name"], args.get("tasks_from", "main")))
                else:
                    target = args if isinstance(args, str) else args.get("file")
                    self.file(os.path.normpath(os.path.join(here, target)))

    def playbook(self, path):
        self.files.append(path)
        for play in _load(path):
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                self.tasks_of(play.get(key), os.path.dirname(path))
            for role in play.get("roles") or []:
                role = {"role": role} if isinstance(role, str) else role
                if _may_run(role.get("when", True)):
                    self.file(_role_tasks(role.get("role") or role.get("name")))
        return self

    def modules(self):
        return [(k, t[k]) for t in self.tasks for k in t if "." in k and k not in INCLUDES]

    def text(self):
        return "\n".join(open(p, encoding="utf-8").read() for p in self.files)


def _injected_names():
    """credential name -> the variables and environment variables its custom type injects."""
    types = {t["name"]: t for t in OBJECTS["controller_credential_types"]}
    out = {}
    for cred in CREDENTIALS.values():
        inj = (types.get(cred["credential_type"]) or {}).get("injectors")
        if inj:
            out[cred["name"]] = set(inj.get("extra_vars", {})) | set(inj.get("env", {}))
    return out


def needed_credentials(template):
    """The credentials the template's playbook reads, from the playbook (see the module docstring)."""
    reach = Reach().playbook(os.path.join(ROOT, template["playbook"]))
    needed = set()
    if any(p.get("hosts") not in ("localhost", None) for p in _load(os.path.join(ROOT, template["playbook"]))):
        needed |= {n for n, c in CREDENTIALS.items() if c["credential_type"] == "Machine"}
    k8s = [(m, a) for m, a in reach.modules() if K8S_MODULES.match(m)]
    writes = [m for m, a in k8s if m in K8S_WRITES]
    if writes:
        needed.add(WRITE_K8S)
    elif k8s:
        needed.add(READ_K8S)
    text = reach.text() + "\n" + yaml.safe_dump(template.get("extra_vars") or {})
    for cred, names in _injected_names().items():
        if any(re.search(r"\b%s\b" % re.escape(n), text) for n in names):
            needed.add(cred)
    return needed, k8s


#: A known gap, kept visible (strict: it fails the day the template is fixed, so the mark goes with it): on a
#: Kubernetes fleet playbooks/upgrade.yml applies B with kubernetes.core.k8s on llmops_k8s_delegate_to, but the
#: upgrade template carries no Kubernetes credential (nor llmops_k8s_delegate_to: localhost), so its calls use the
#: k8s_api host's kubeconfig over SSH.
KNOWN_GAPS = {"llmops upgrade phase": "the upgrade template lacks the write Kubernetes credential (upgrade.yml applies)"}


def _param(template):
    gap = KNOWN_GAPS.get(template["name"])
    marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
    return pytest.param(template, id=template["name"], marks=marks)


@pytest.mark.parametrize("template", [_param(t) for t in TEMPLATES])
def test_each_template_carries_exactly_the_credentials_its_playbook_reads(template):
    needed, k8s = needed_credentials(template)
    assert set(template.get("credentials") or []) == needed, (template["playbook"], sorted({m for m, a in k8s}))


def test_the_map_sees_the_cluster_calls_where_they_are():
    """The map is not blind: the deploy and the P/D deploy apply (write), the diagnosis only reads, verify transport
    and staging never reach the cluster on a Kubernetes fleet."""
    by_name = {t["name"]: t for t in TEMPLATES}
    deploy, dk8s = needed_credentials(by_name["llmops deploy"])
    pd, pk8s = needed_credentials(by_name["llmops deploy P/D pair"])
    diag, gk8s = needed_credentials(by_name["llmops diagnose"])
    verify, vk8s = needed_credentials(by_name["llmops verify transport"])
    assert "kubernetes.core.k8s" in {m for m, a in dk8s} and WRITE_K8S in deploy
    assert "kubernetes.core.k8s" in {m for m, a in pk8s} and WRITE_K8S in pd
    assert {m for m, a in gk8s} == {"llmops.serving.engine_diagnose"} and READ_K8S in diag and WRITE_K8S not in diag
    assert vk8s == [] and verify == {"llmops GPU nodes"}
    assert needed_credentials(by_name["llmops stage model"]) == ({"llmops GPU nodes"}, [])


def test_the_write_token_is_only_on_templates_that_change_the_cluster_and_the_read_one_only_on_diagnose():
    holders = {c: sorted(t["name"] for t in TEMPLATES if c in (t.get("credentials") or [])) for c in (WRITE_K8S, READ_K8S)}
    assert holders[READ_K8S] == ["llmops diagnose"]
    for name in holders[WRITE_K8S]:
        template = [t for t in TEMPLATES if t["name"] == name][0]
        assert [m for m, a in needed_credentials(template)[1] if m in K8S_WRITES], name
    same = {k: v for k, v in CREDENTIALS[READ_K8S]["inputs"].items() if k != "bearer_token"}
    assert same == {k: v for k, v in CREDENTIALS[WRITE_K8S]["inputs"].items() if k != "bearer_token"}
    assert CREDENTIALS[READ_K8S]["credential_type"] == K8S_TYPE
    assert CREDENTIALS[READ_K8S]["inputs"]["bearer_token"] == "{{ llmops_awx_literal.llmops_awx_k8s_read_token }}"


def test_no_task_the_diagnose_playbook_can_reach_writes_to_the_cluster():
    """Every branch, whatever the platform (no condition is evaluated here): no kubernetes.core write, no apply, and
    every cluster call is one of the read-only modules whose requests the llmops-read Role allows
    (tests/unit/plugins/module_utils/kube/test_k8s_rbac.py records them)."""
    saved = dict(FLEET)
    FLEET.clear()  # nothing is known: every branch may run
    try:
        template = [t for t in TEMPLATES if t["name"] == "llmops diagnose"][0]
        reach = Reach().playbook(os.path.join(ROOT, template["playbook"]))
    finally:
        FLEET.update(saved)
    modules = reach.modules()
    assert modules, "the walk found no task"
    calls = {m for m, a in modules if K8S_MODULES.match(m)}
    assert calls == {"llmops.serving.engine_diagnose"}
    assert not [m for m, a in modules if m in K8S_WRITES or m.startswith("kubernetes.core.")]
    for m, a in modules:
        assert not (isinstance(a, dict) and (a.get("apply") or a.get("state") in ("present", "absent"))), m
