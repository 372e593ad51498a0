"""Run the job templates of awx/ the way AWX runs them: ansible-runner on an AWX-shaped private data dir.

AWX itself cannot run here, so this module restates what AWX does between "Launch" and ansible-runner, from
AWX's source (ansible/awx, devel, Oct 2024; paths below), and then calls ``ansible_runner.run()`` exactly as
AWX's task does:

* survey spec validation at save time: ``awx/api/views/__init__.py`` ``JobTemplateSurveySpec._validate_spec_data``
  (types from ``awx/main/constants.py`` ``SURVEY_TYPE_MAPPING``);
* survey answer validation at launch: ``awx/main/models/mixins.py`` ``SurveyJobTemplateMixin``
  ``_survey_element_validation`` and ``_accept_or_ignore_variables`` (an API launch blocks on survey errors; a
  variable the survey does not ask for is ignored unless ``ask_variables_on_launch``);
* extra-vars precedence: ``SurveyJobTemplateMixin._update_unified_job_kwargs`` (template extra_vars, then the
  survey defaults that pass their own question's validation, then the launch answers);
* ``awx_*`` / ``tower_*`` variables: ``awx/main/models/unified_jobs.py`` and ``awx/main/models/jobs.py``
  ``awx_meta_vars`` (prefixes from ``awx/main/constants.py`` ``JOB_VARIABLE_PREFIXES``);
* ``env/extravars``: ``awx/main/tasks/jobs.py`` ``RunJob.build_extra_vars_file`` with
  ``awx/main/utils/safe_yaml.py`` ``safe_dump``: every string is ``!unsafe`` except top-level keys equal to the
  template's own extra_vars (``ALLOW_JINJA_IN_EXTRA_VARS = 'template'``, the default in ``awx/settings/defaults.py``);
* ``env/cmdline``: ``RunJob.build_args`` (``--check`` for a check job, ``-u``, ``--forks``, ``-l``, ``-t``, ...);
* ``env/settings``: ``BaseTask.run`` (``job_timeout``, ``suppress_ansible_output``, ``suppress_output_file``);
* environment: ``BaseTask.build_env`` / ``RunJob.build_env`` (``JOB_ID``, ``INVENTORY_ID``, ``PROJECT_REVISION``,
  ``ANSIBLE_COLLECTIONS_PATH`` starting with ``requirements_collections``, ...) and the Kubernetes credential's
  ``K8S_AUTH_*`` (``awx/main/models/credential/injectors.py`` ``kubernetes_bearer_token``), and a custom credential
  type's injectors (``CredentialType.inject_credential``: env, and extra_vars as an ``-e @env/tmp...`` file);
* the inventory: an inventory source imports the project's inventory with ``ansible-inventory --list --export``
  (``RunInventoryUpdate.build_args``) and a job gets it back as a script (``BaseTask.write_inventory_file``,
  ``Inventory.get_script_data(hostvars=True, towervars=True)`` in ``awx/main/models/inventory.py``);
* artifacts: the ``artifact_data`` of the ``playbook_on_stats`` event (``set_stats``), ``awx/main/tasks/callback.py``;
* workflows: ``awx/main/models/workflow.py`` ``WorkflowJobNode.get_job_kwargs`` (a node's extra_data and the
  workflow's limit pass the template's prompts; ancestor artifacts become the next job's extra vars; the workflow's
  own extra vars rank above them; survey errors of a node's template are only logged), and which node runs next,
  which never runs and the workflow job's own status and notifications: ``WorkflowDAG`` of
  ``awx/main/scheduler/dag_workflow.py`` (``bfs_nodes_to_run``, ``mark_dnr_nodes``, ``is_workflow_done``,
  ``has_workflow_failed``) as ``awx/main/scheduler/task_manager.py`` applies it.

What differs, on purpose: no container (ansible-runner runs ansible-playbook of the test virtual environment, whose
``bin`` is put first on PATH), the collection built from this working tree is installed into
``requirements_collections/`` (standing in for the execution environment's copy: a project sync of awx/ installs
nothing there, its organization having no Galaxy credential, ``project_update_installs_collections``), and
error messages never repeat a password answer.
"""
from __future__ import annotations

import atexit
import copy
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AWX_DIR = os.path.join(ROOT, "awx")
BIN = os.path.dirname(sys.executable)

# awx/main/constants.py
SURVEY_TYPE_MAPPING = {"text": str, "textarea": str, "password": str, "multiplechoice": str, "multiselect": str,
                       "integer": int, "float": (float, int)}
JOB_VARIABLE_PREFIXES = ("awx", "tower")
# awx/settings/defaults.py: the ANSIBLE_* settings every job's environment gets, and MAX_EVENT_RES_DATA.
ANSIBLE_SETTINGS = {"ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_PARAMIKO_RECORD_HOST_KEYS": "False",
                    "ANSIBLE_FORCE_COLOR": "True", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True"}
MAX_EVENT_RES_DATA = 700000
# Events AWX counts as a failed host result.
FAILED_EVENTS = ("runner_on_failed", "runner_on_unreachable", "runner_item_on_failed", "runner_on_async_failed")

_JOB_IDS = itertools.count(4201)

#: AWX runs a job in ``/tmp/awx_<job id>_<random>`` (``AWX_ISOLATION_BASE_PATH``; awx/main/tasks/jobs.py
#: ``build_private_data_dir``) and ssh keeps its control sockets in that directory's ``cp/``. A Unix socket path holds
#: at most 107 bytes (``sun_path``), so a job directory deep in a test's tmp path cannot hold them ("unix_listener:
#: path ... too long for Unix domain socket"). The jobs here keep their private data dir under the test's workdir and
#: their control sockets in a directory as short as AWX's, removed when this process exits.
CONTROL_PATH_BASE = "/tmp"


def control_path_dir(job_id):
    """A short, private directory for a job's ssh control sockets (``ANSIBLE_SSH_CONTROL_PATH_DIR``)."""
    path = tempfile.mkdtemp(prefix="awx_%d_cp_" % job_id, dir=CONTROL_PATH_BASE)
    atexit.register(shutil.rmtree, path, True)
    return path


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class SurveyError(ValueError):
    """A launch AWX refuses (HTTP 400 ``variables_needed_to_start``), or a survey spec it refuses to save."""

    def __init__(self, errors):
        super().__init__("; ".join(errors))
        self.errors = list(errors)


# ---- controller objects ------------------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """YAML with Ansible's ``!unsafe`` (a plain string here: the value AWX stores)."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def load_controller(awx_dir=AWX_DIR):
    """{controller_<kind>: [objects]} from every ``controller_*.yml`` in awx_dir."""
    data = {}
    for name in sorted(os.listdir(awx_dir)):
        if name.startswith("controller_") and name.endswith(".yml"):
            with open(os.path.join(awx_dir, name), encoding="utf-8") as f:
                for key, value in (yaml.load(f, Loader=_Loader) or {}).items():  # nosec: the loader is SafeLoader's
                    if key in data:
                        raise ValueError("%s is defined twice (second time in %s)" % (key, name))
                    data[key] = value
    return data


def by_name(objects, name):
    for obj in objects:
        if obj.get("name") == name:
            return obj
    raise KeyError("no object named %r (have: %s)" % (name, ", ".join(o.get("name", "?") for o in objects)))


# ---- surveys (AWX's rules) ------------------------------------------------------------------------------------

def _choices(element):
    choices = copy.copy(element.get("choices", []))
    if isinstance(choices, str):
        choices = [c for c in choices.splitlines() if c.strip() != ""]
    return choices


def validate_spec(spec):
    """Errors AWX returns when this survey spec is saved (``JobTemplateSurveySpec._validate_spec_data``)."""
    errors = []
    if not isinstance(spec, dict):
        return ["survey spec is not a JSON object"]
    for field, expect, label in (("name", str, "string"), ("description", str, "string"), ("spec", list, "list of items")):
        if field not in spec:
            errors.append("Field '%s' is missing from survey spec." % field)
        elif not isinstance(spec[field], expect):
            errors.append("Expected %s for field '%s', received %s type." % (label, field, type(spec[field]).__name__))
    if isinstance(spec.get("spec"), list) and not spec["spec"]:
        errors.append("'spec' doesn't contain any items.")
    if errors:
        return errors
    variables = set()
    for idx, item in enumerate(spec["spec"]):
        if not isinstance(item, dict):
            return errors + ["Survey question %d is not a json object." % idx]
        for field in ("type", "question_name", "variable", "required"):
            if field not in item:
                return errors + ["'%s' missing from survey question %d" % (field, idx)]
            expect, label = (bool, "boolean") if field == "required" else (str, "string")
            if not isinstance(item[field], expect):
                return errors + ["'%s' in survey question %d expected to be %s." % (field, idx, label)]
        if item["variable"] in variables:
            return errors + ["'variable' '%s' duplicated in survey question %d." % (item["variable"], idx)]
        variables.add(item["variable"])
        qtype = item["type"]
        if qtype not in SURVEY_TYPE_MAPPING:
            return errors + ["'%s' in survey question %d is not one of '%s' allowed question types."
                             % (qtype, idx, ", ".join(SURVEY_TYPE_MAPPING))]
        if "default" in item and item["default"] != "" and not isinstance(item["default"], SURVEY_TYPE_MAPPING[qtype]):
            label = qtype if qtype in ("integer", "float") else "string"
            return errors + ["Default value in survey question %d expected to be %s." % (idx, label)]
        for key in ("min", "max"):
            if key in item and item[key] is not None and not isinstance(item[key], int):
                return errors + ["The %s limit in survey question %d expected to be integer." % (key, idx)]
        if qtype in ("multiselect", "multiplechoice"):
            if "choices" not in item:
                return errors + ["Survey question %d of type %s must specify choices." % (idx, qtype)]
            if "default" in item:
                default = item["default"]
                defaults = [c for c in default.splitlines() if c.strip() != ""] if isinstance(default, str) else default
                if qtype == "multiplechoice" and len(defaults) > 1:
                    return errors + ["Multiple Choice (Single Select) can only have one default value."]
                if any(d not in item["choices"] for d in defaults):
                    return errors + ["Default choice must be answered from the choices listed."]
        if isinstance(item.get("default"), str) and item["default"].startswith("$encrypted$") and qtype != "password":
            return errors + ["$encrypted$ is a reserved keyword for password question defaults, survey question %d is "
                             "type %s." % (idx, qtype)]
    return errors


def _shown(element, value):
    return "$encrypted$" if element["type"] == "password" else value


def validate_element(element, data, validate_required=True):
    """Errors for one question and the launch data (``SurveyJobTemplateMixin._survey_element_validation``)."""
    errors = []
    var = element["variable"]
    if element["type"] == "password" and data.get(var) == "$encrypted$":
        if element.get("default") is None and element["required"] and validate_required:
            errors.append("'%s' value missing" % var)
        return errors
    if var not in data and element["required"]:
        if validate_required:
            errors.append("'%s' value missing" % var)
    elif element["type"] in ("textarea", "text", "password"):
        if var in data:
            value = data[var]
            if not isinstance(value, str):
                return ["Value %s for '%s' expected to be a string." % (_shown(element, value), var)]
            if element.get("min") not in ("", None) and len(value) < int(element["min"]):
                errors.append("'%s' value %s is too small (length is %s must be at least %s)."
                              % (var, _shown(element, value), len(value), element["min"]))
            if element.get("max") not in ("", None) and len(value) > int(element["max"]):
                errors.append("'%s' value %s is too large (must be no more than %s)."
                              % (var, _shown(element, value), element["max"]))
    elif element["type"] == "integer":
        if var in data:
            value = data[var]
            if isinstance(value, bool) or not isinstance(value, int):  # AWX: type(value) != int, so bool is refused
                return ["Value %s for '%s' expected to be an integer." % (value, var)]
            if element.get("min") not in ("", None) and value < int(element["min"]):
                errors.append("'%s' value %s is too small (must be at least %s)." % (var, value, element["min"]))
            if element.get("max") not in ("", None) and value > int(element["max"]):
                errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, element["max"]))
    elif element["type"] == "float":
        if var in data:
            value = data[var]
            if isinstance(value, bool) or not isinstance(value, (float, int)):  # AWX: type(value) not in (float, int)
                return ["Value %s for '%s' expected to be a numeric type." % (value, var)]
            if element.get("min") not in ("", None) and value < float(element["min"]):
                errors.append("'%s' value %s is too small (must be at least %s)." % (var, value, element["min"]))
            if element.get("max") not in ("", None) and value > float(element["max"]):
                errors.append("'%s' value %s is too large (must be no more than %s)." % (var, value, element["max"]))
    elif element["type"] == "multiselect":
        if var in data:
            if not isinstance(data[var], list):
                errors.append("'%s' value is expected to be a list." % var)
            else:
                errors.extend("Value %s for '%s' expected to be one of %s." % (v, var, _choices(element))
                              for v in data[var] if v not in _choices(element))
    elif element["type"] == "multiplechoice":
        if var in data and data[var] not in _choices(element):
            errors.append("Value %s for '%s' expected to be one of %s." % (data[var], var, _choices(element)))
    return errors


def accept_or_ignore_variables(template, data, blocking=True):
    """(accepted, ignored, errors) of launch extra vars (``_accept_or_ignore_variables``, API launch rules).

    ``blocking``: an API launch refuses survey errors (raises SurveyError); a workflow node only logs them.
    """
    extra = dict(data)
    accepted, ignored, errors = {}, {}, []
    spec = template.get("survey_spec") or {}
    if template.get("survey_enabled") and spec:
        for element in spec.get("spec", []):
            key = element.get("variable")
            element_errors = validate_element(element, data)
            if element_errors:
                errors += element_errors
                if key in extra:
                    ignored[key] = extra.pop(key)
            elif key in extra:
                accepted[key] = extra.pop(key)
    if template.get("ask_variables_on_launch"):
        accepted.update(extra)
        extra = {}
    for key in set(extra) & set(template.get("extra_vars") or {}):
        if template["extra_vars"][key] == extra[key]:
            extra.pop(key)
    ignored.update(extra)  # "not allowed on launch": ignored, not blocking, for a manual launch
    if errors and blocking:
        raise SurveyError(errors)
    return accepted, ignored, errors


def job_extra_vars(template, runtime_extra_vars):
    """The job's extra vars: template extra_vars < valid survey defaults < answers (``_update_unified_job_kwargs``)."""
    extra_vars = copy.deepcopy(template.get("extra_vars") or {})
    runtime = dict(runtime_extra_vars)
    defaults = {}
    spec = template.get("survey_spec") or {}
    if template.get("survey_enabled") and "spec" in spec:
        for element in spec["spec"]:
            default, key = element.get("default"), element.get("variable")
            if element.get("type") == "password" and runtime.get(key) == "$encrypted$":
                runtime.pop(key)
            if default is not None and not validate_element(element, {key: default}):
                defaults[key] = default
    extra_vars.update(defaults)
    extra_vars.update(runtime)
    return extra_vars


def ui_answers(spec):
    """What the launch form sends untouched: each question's default, where it has a non-empty one."""
    return {e["variable"]: e["default"] for e in (spec or {}).get("spec", []) if e.get("default") not in (None, "")}


# ---- env/extravars -------------------------------------------------------------------------------------------

class _UnsafeDumper(yaml.SafeDumper):
    """awx/main/utils/safe_yaml.py SafeStringDumper: every string (keys too) as ``!unsafe``."""

    def represent_data(self, data):
        if isinstance(data, str):
            return self.represent_scalar("!unsafe", data)
        return super().represent_data(data)


def safe_dump(extra_vars, safe_dict=None):
    """awx/main/utils/safe_yaml.py safe_dump: top-level keys equal to ``safe_dict`` stay plain, the rest ``!unsafe``."""
    safe_dict = safe_dict or {}
    out = []
    for key, value in extra_vars.items():
        dumper = yaml.SafeDumper if key in safe_dict and safe_dict.get(key) == value else _UnsafeDumper
        out.append(yaml.dump_all([{key: value}], None, Dumper=dumper, default_flow_style=False))
    return "".join(out)


# ---- env/cmdline ---------------------------------------------------------------------------------------------

def build_args(job):
    """ansible-playbook arguments from the job's fields (``RunJob.build_args``, no machine credential inputs)."""
    args = []
    if job.get("job_type") == "check":
        args.append("--check")
    args.extend(["-u", job.get("ssh_username") or "root"])
    if job.get("become_enabled"):
        args.append("--become")
    if job.get("diff_mode"):
        args.append("--diff")
    if job.get("forks"):
        args.append("--forks=%d" % job["forks"])
    if job.get("force_handlers"):
        args.append("--force-handlers")
    if job.get("limit"):
        args.extend(["-l", job["limit"]])
    if job.get("verbosity"):
        args.append("-%s" % ("v" * min(5, job["verbosity"])))
    if job.get("job_tags"):
        args.extend(["-t", job["job_tags"]])
    if job.get("skip_tags"):
        args.append("--skip-tags=%s" % job["skip_tags"])
    if job.get("start_at_task"):
        args.append("--start-at-task=%s" % job["start_at_task"])
    return args


def args2cmdline(*args):
    """ansible_runner.utils.args2cmdline, as AWX writes env/cmdline."""
    import ansible_runner.utils  # pylint: disable=import-outside-toplevel

    return ansible_runner.utils.args2cmdline(*args)


# ---- project, collection, inventory --------------------------------------------------------------------------

def _git(*args):
    return subprocess.run(["git"] + list(args), cwd=ROOT, capture_output=True, text=True, check=True).stdout


def copy_project(dest):
    """The project as a sync leaves it: the repository's files (tracked and not ignored), nothing built; a symbolic
    link stays a link, as a git clone leaves it (inventories/example-h20-awx links example-h20's files)."""
    for rel in _git("ls-files", "-co", "--exclude-standard", "-z").split("\0"):
        src = os.path.join(ROOT, rel)
        if rel and os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            os.symlink(os.readlink(src), os.path.join(dest, rel))
        elif rel and os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return _git("rev-parse", "HEAD").strip()


def build_collection(workdir):
    """Build this working tree's collection artifact and install it (no dependencies) under workdir/collections.

    Returns the install root (holding ``ansible_collections/llmops/serving``); each job copies it into its own
    ``requirements_collections/``.
    """
    dist, dest = os.path.join(workdir, "dist"), os.path.join(workdir, "collections")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    # the artifact's one recipe (awx/ee/build_artifact.py): it records the commit the release check compares
    for cmd in ([sys.executable, os.path.join(AWX_DIR, "ee", "build_artifact.py"), "--galaxy",
                 os.path.join(BIN, "ansible-galaxy"), "--output-path", dist],):
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=300)
        if proc.returncode:
            raise RuntimeError("ansible-galaxy collection build failed: %s" % (proc.stdout + proc.stderr)[-2000:])
    tarballs = [os.path.join(dist, n) for n in os.listdir(dist) if n.endswith(".tar.gz")]
    proc = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", "--no-deps",
                           "--force", "-p", dest] + tarballs, cwd=workdir, env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    if proc.returncode:
        raise RuntimeError("ansible-galaxy collection install failed: %s" % (proc.stdout + proc.stderr)[-2000:])
    return dest


def import_inventory(project_dir, source_path):
    """What an SCM inventory source stores: ``ansible-inventory -i <source_path> --list --export`` in the project."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", source_path, "--list", "--export"],
                          cwd=project_dir, env=env, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode:
        raise RuntimeError("ansible-inventory failed: %s" % proc.stderr[-2000:])
    return json.loads(proc.stdout)


def script_data(imported, inventory_id):
    """``Inventory.get_script_data(hostvars=True, towervars=True)`` of an imported inventory."""
    hostvars = imported.get("_meta", {}).get("hostvars", {})
    groups = {k: v for k, v in imported.items() if k not in ("_meta", "all", "ungrouped")}
    data = {"all": {}}
    if imported.get("all", {}).get("vars"):
        data["all"]["vars"] = imported["all"]["vars"]
    grouped = set()
    for name, group in groups.items():
        info = {k: group[k] for k in ("hosts", "children", "vars") if group.get(k)}
        grouped.update(group.get("hosts", []))
        if info:
            data[name] = info
    hosts = sorted(set(hostvars) | set(imported.get("ungrouped", {}).get("hosts", [])) | grouped)
    data["all"]["hosts"] = [h for h in hosts if h not in grouped]
    if groups:
        data["all"]["children"] = sorted(groups)
    data["_meta"] = {"hostvars": {}}
    for host_id, host in enumerate(hosts, start=inventory_id * 100):
        hv = dict(hostvars.get(host, {}))
        for prefix in ("host", "tower"):
            hv["remote_%s_enabled" % prefix] = "true"
            hv["remote_%s_id" % prefix] = host_id
        data["_meta"]["hostvars"][host] = hv
    return data


def project_update_installs_collections(organization, collections_enabled_setting=True):
    """Whether a project update of a project of ``organization`` installs requirements.yml from Galaxy:
    ``RunProjectUpdate.build_extra_vars_file`` (awx/main/tasks/jobs.py) passes ``collections_enabled =
    galaxy_creds_are_defined and settings.AWX_COLLECTIONS_ENABLED`` (the setting defaults to True) to
    ``project_update.yml``, whose install tasks run only when it is true."""
    return bool(organization.get("galaxy_credentials")) and collections_enabled_setting


def source_needs_update_on_launch(source, seconds_since_last_update):
    """Whether a launch on an inventory first runs this source's import (``InventorySource.needs_update_on_launch``,
    awx/main/models/inventory.py): ``update_on_launch`` and never run, or the last run at least
    ``update_cache_timeout`` seconds ago (default 0: every launch)."""
    if not source.get("update_on_launch"):
        return False
    return seconds_since_last_update is None or seconds_since_last_update >= (source.get("update_cache_timeout") or 0)


def effective_slice_count(template, inventory_hosts, prompts=None):
    """How many slice jobs a launch of ``template`` makes (``JobTemplate.get_effective_slice_ct``,
    awx/main/models/jobs.py): the template's ``job_slice_count`` (or the launch's, where it asks for one), at most
    the number of hosts of the WHOLE inventory - not of the limit."""
    count = template.get("job_slice_count") or 1
    if template.get("ask_job_slice_count_on_launch") and "job_slice_count" in (prompts or {}):
        count = prompts["job_slice_count"]
    return min(count, len(inventory_hosts)) if inventory_hosts else count


def slice_hosts(inventory_hosts, slice_number, slice_count):
    """The hosts of slice ``slice_number`` of ``slice_count`` (1-based): ``Inventory.get_script_data`` orders the
    inventory's enabled hosts by name and takes ``hosts[slice_number - 1::slice_count]``. Every slice job still gets
    the template's limit (``-l``), so a slice whose hosts the limit does not name has nothing to target, and
    ansible-playbook fails it ("--limit leaves us with no hosts to target"), failing the whole sliced job."""
    hosts = sorted(inventory_hosts)
    return hosts[slice_number - 1::slice_count] if slice_count > 1 else hosts


def limit_hosts(imported, limit):
    """Hosts an ``-l`` of group and host names joined by ``:`` or ``,`` names in an imported inventory
    (``import_inventory``); other pattern forms (``&``, ``!``, ranges, regexes) are refused, not guessed."""
    groups = {k: v for k, v in imported.items() if k != "_meta"}

    def members(name, seen=()):
        group = groups.get(name)
        if group is None:
            return {name} if name in imported.get("_meta", {}).get("hostvars", {}) else set()
        out = set(group.get("hosts", []))
        for child in group.get("children", []):
            if child not in seen:
                out |= members(child, seen + (name,))
        return out

    names = [p for p in re.split(r"[:,]", limit) if p]
    bad = [p for p in names if not re.match(r"^[A-Za-z0-9_.-]+$", p)]
    if bad:
        raise ValueError("limit_hosts reads group and host names only, not %s" % bad)
    return set().union(*(members(p) for p in names)) if names else set()


def write_inventory_script(private_data_dir, data):
    """inventory/hosts as ``BaseTask.write_inventory_file`` writes it (an executable printing the JSON)."""
    path = os.path.join(private_data_dir, "inventory", "hosts")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("#! /usr/bin/env python3\n# -*- coding: utf-8 -*-\nprint(%r)\n" % json.dumps(data))
    os.chmod(path, 0o700)
    return path


def kubernetes_env(inputs, private_data_dir):
    """Environment of an "OpenShift or Kubernetes API Bearer Token" credential (injectors.kubernetes_bearer_token)."""
    env = {"K8S_AUTH_HOST": inputs.get("host", ""), "K8S_AUTH_API_KEY": inputs.get("bearer_token", "")}
    if inputs.get("verify_ssl") and "ssl_ca_cert" in inputs:
        path = os.path.join(private_data_dir, "env", "k8s-ca.crt")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(inputs["ssl_ca_cert"])
        env.update(K8S_AUTH_VERIFY_SSL="True", K8S_AUTH_SSL_CA_CERT=path)
    else:
        env["K8S_AUTH_VERIFY_SSL"] = "False"
    return env


def custom_injection(credential_type, inputs):
    """(env, extra_vars) a credential of a custom type injects (``CredentialType.inject_credential`` in
    ``awx/main/models/credential/__init__.py``): each injector template rendered in a sandbox with the inputs."""
    import jinja2.sandbox  # pylint: disable=import-outside-toplevel

    sandbox = jinja2.sandbox.ImmutableSandboxedEnvironment()
    injectors = credential_type.get("injectors") or {}
    env = {k: sandbox.from_string(t).render(**inputs) for k, t in (injectors.get("env") or {}).items()}
    extra_vars = {k: sandbox.from_string(t).render(**inputs) for k, t in (injectors.get("extra_vars") or {}).items()}
    return env, extra_vars


def write_custom_extra_vars(private_data_dir, extra_vars):
    """The ``-e @file`` of a custom credential's extra_vars: env/tmp*, every string ``!unsafe`` (``safe_dump``)."""
    import tempfile  # pylint: disable=import-outside-toplevel

    handle, path = tempfile.mkstemp(dir=os.path.join(private_data_dir, "env"))
    with os.fdopen(handle, "w", encoding="utf-8") as f:
        f.write(safe_dump(extra_vars))
    os.chmod(path, 0o400)
    return path


# ---- the job ---------------------------------------------------------------------------------------------------

class Job:
    """One finished job: status, rc, events, artifacts and the private data dir it ran from."""

    def __init__(self, job_id, template, private_data_dir, extra_vars, cmdline, env):
        self.id = job_id
        self.template = template
        self.private_data_dir = private_data_dir
        self.extra_vars = extra_vars
        self.cmdline = cmdline
        self.env = env
        self.events = []
        self.statuses = []
        self.status = None
        self.rc = None
        self.ignored = {}
        self.elapsed = None  # seconds ansible-runner ran (AWX's UnifiedJob.elapsed: started to finished)

    @property
    def failed_events(self):
        return [e for e in self.events if e.get("event") in FAILED_EVENTS
                and not e.get("event_data", {}).get("ignore_errors")]

    @property
    def artifacts(self):
        """``set_stats`` data of the run (what AWX stores as the job's artifacts)."""
        for event in reversed(self.events):
            if event.get("event") == "playbook_on_stats":
                return event.get("event_data", {}).get("artifact_data") or {}
        return {}

    @property
    def stdout(self):
        return _ANSI.sub("", "\n".join(e.get("stdout", "") for e in self.events if e.get("stdout")))

    def summary(self, limit=4000):
        """The end of the output and every failed result's message, for assertion messages."""
        failed = ["%s: %s" % (e.get("event_data", {}).get("task"), e.get("event_data", {}).get("res", {}).get("msg"))
                  for e in self.failed_events]
        return "status=%s rc=%s\nfailed: %s\n%s" % (self.status, self.rc, failed, self.stdout[-limit:])


class Controller:
    """The objects of awx/ plus what a controller adds: ids, an imported inventory, a synced project."""

    def __init__(self, workdir, task_env=None, awx_dir=AWX_DIR, collections=None, credentials=None, settings=None):
        self.workdir = workdir
        self.objects = load_controller(awx_dir)
        # values of the llmops_awx_* variables playbooks/awx_configure.yml was given (it has no default for the
        # inventory path; the tests' controller imports inventories/local, whose one host is in every group)
        self.settings = {"llmops_awx_inventory_path": "inventories/local", "llmops_awx_instance_groups": [],
                         "llmops_awx_notify_error": [], "llmops_awx_notify_success": []}  # the playbook's defaults
        self.settings.update(settings or {})
        self.task_env = dict(task_env or {})  # the AWX_TASK_ENV setting: extra environment of every job
        self.collections = collections
        self.credential_inputs = dict(credentials or {})  # name -> inputs, for the credentials a job should get
        self.ids = {}

    def id_of(self, kind, name):
        return self.ids.setdefault((kind, name), 10 + len(self.ids))

    def template(self, name):
        return by_name(self.objects["controller_templates"], name)

    def workflow(self, name):
        """Workflow ``name`` as awx_configure.yml leaves it on the controller with ``self.settings`` (``render_workflow``)."""
        return render_workflow(by_name(self.objects["controller_workflows"], name), self.settings)

    # -- launch ------------------------------------------------------------------------------------------------
    def launch(self, name, answers=None, extra_vars=None, prompts=None, workflow=None, blocking=True, **run_kw):
        """Launch job template ``name`` and run it to the end (``run=False``: only write its private data dir).

        answers: survey answers (None: the launch form's defaults, ``ui_answers``); extra_vars: further launch
        variables (ignored unless the template asks for variables, as AWX does); prompts: launch-time fields such
        as ``job_type`` / ``limit`` (the template must ask for them); workflow: (workflow job, node extra vars) when
        a workflow node launches it. Raises SurveyError where AWX answers 400.
        """
        template = self.template(name)
        data = dict(ui_answers(template.get("survey_spec")) if answers is None else answers)
        data.update(extra_vars or {})
        accepted, ignored = accept_or_ignore_variables(template, data, blocking=blocking)[:2]
        runtime = dict(accepted)
        if workflow is not None:
            runtime.update(workflow[1])
        job = dict(template)
        for field, value in (prompts or {}).items():
            ask = {"job_type": "ask_job_type_on_launch", "limit": "ask_limit_on_launch",
                   "job_tags": "ask_tags_on_launch"}.get(field)
            if not ask or not template.get(ask):
                raise SurveyError(["%s is not prompted on launch by %r" % (field, name)])
            job[field] = value
        job_id = next(_JOB_IDS)
        extra = job_extra_vars(template, runtime)
        extra.update(self.meta_vars(job_id, template, workflow[0] if workflow else None))
        result = self._run(job_id, job, extra, **run_kw)
        result.ignored = ignored
        return result

    def meta_vars(self, job_id, template, workflow_job):
        """``awx_meta_vars`` of a job launched by user admin (id 1) or by a workflow job."""
        inventory = template["inventory"]
        r = {}
        for p in JOB_VARIABLE_PREFIXES:
            r.update({"%s_job_id" % p: job_id, "%s_job_launch_type" % p: "workflow" if workflow_job else "manual",
                      "%s_inventory_id" % p: self.id_of("inventory", inventory), "%s_inventory_name" % p: inventory,
                      "%s_project_revision" % p: self.revision, "%s_project_scm_branch" % p: "main",
                      "%s_job_template_id" % p: self.id_of("job_template", template["name"]),
                      "%s_job_template_name" % p: template["name"], "%s_execution_node" % p: "localhost"})
            if workflow_job:
                r.update({"%s_workflow_job_id" % p: workflow_job["id"], "%s_workflow_job_name" % p: workflow_job["name"],
                          "%s_workflow_job_launch_type" % p: "manual"})
            r.update({"%s_user_id" % p: 1, "%s_user_name" % p: "admin", "%s_user_email" % p: "",
                      "%s_user_first_name" % p: "", "%s_user_last_name" % p: ""})
        return r

    def render(self, value):
        """A templated setting of awx/ (``{{ llmops_awx_... }}``) with the values awx_configure.yml was given."""
        import jinja2  # pylint: disable=import-outside-toplevel

        return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(value).render(self.settings)

    @property
    def revision(self):
        return _git("rev-parse", "HEAD").strip()

    def _run(self, job_id, job, extra_vars, timeout=None, run=True, container_root=None):
        """Write the private data dir of a job and run it with ansible_runner.run().

        container_root: the path the private data dir has inside an execution environment (AWX: /runner); the
        environment then names container paths and is also written to env/envvars, for ``ansible-runner transmit``
        (which sends the directory, not keyword arguments) to a worker in the image.
        """
        import ansible_runner  # pylint: disable=import-outside-toplevel

        pdd = os.path.join(self.workdir, "job_%d" % job_id)
        croot = container_root or pdd
        os.makedirs(os.path.join(pdd, "env"))
        os.makedirs(os.path.join(pdd, "cp"), 0o700)
        revision = copy_project(os.path.join(pdd, "project"))
        req = os.path.join(pdd, "requirements_collections")
        if self.collections:
            shutil.copytree(self.collections, req, symlinks=True)
        else:
            os.makedirs(req)

        # inventory: the source's import of the project's inventory directory, as a script
        source = [s for s in self.objects.get("controller_inventory_sources", []) if s["inventory"] == job["inventory"]]
        source_path = self.render(source[0]["source_path"])
        inventory_id = self.id_of("inventory", job["inventory"])
        imported = import_inventory(os.path.join(pdd, "project"), source_path)
        inventory = write_inventory_script(pdd, script_data(imported, inventory_id))

        # env/extravars, env/cmdline, env/settings
        with open(os.path.join(pdd, "env", "extravars"), "w", encoding="utf-8") as f:
            f.write(safe_dump(extra_vars, job.get("extra_vars") or {}))
        cmdline = args2cmdline(*build_args(job))
        with open(os.path.join(pdd, "env", "cmdline"), "w", encoding="utf-8") as f:
            f.write(cmdline)
        settings = {"job_timeout": timeout if timeout is not None else job.get("timeout", 0),
                    "suppress_ansible_output": True, "suppress_output_file": True}
        with open(os.path.join(pdd, "env", "settings"), "w", encoding="utf-8") as f:
            json.dump(settings, f)

        # environment (BaseTask.build_env + RunJob.build_env), then the credentials' injectors
        env = dict(ANSIBLE_SETTINGS)
        env.update(self.task_env)
        env.update({"AWX_PRIVATE_DATA_DIR": croot, "JOB_ID": str(job_id), "INVENTORY_ID": str(inventory_id),
                    "PROJECT_REVISION": revision, "ANSIBLE_RETRY_FILES_ENABLED": "False",
                    "MAX_EVENT_RES": str(MAX_EVENT_RES_DATA), "AWX_HOST": "https://awx.invalid",
                    "ANSIBLE_SSH_CONTROL_PATH_DIR": os.path.join(croot, "cp") if container_root else control_path_dir(job_id),
                    # the project's ansible.cfg, as ansible finds it from the job's working directory (the project)
                    # in an execution environment, whatever ANSIBLE_CONFIG the test process has
                    "ANSIBLE_CONFIG": os.path.join(croot, "project", "ansible.cfg")})
        if not container_root:
            env["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
        for env_key, folder, default in (("ANSIBLE_COLLECTIONS_PATHS", "requirements_collections", "~/.ansible/collections:/usr/share/ansible/collections"),
                                         ("ANSIBLE_ROLES_PATH", "requirements_roles", "~/.ansible/roles:/usr/share/ansible/roles:/etc/ansible/roles"),
                                         ("ANSIBLE_COLLECTIONS_PATH", "requirements_collections", "~/.ansible/collections:/usr/share/ansible/collections")):
            env[env_key] = os.pathsep.join([os.path.join(croot, folder)] + default.split(":"))
        custom_types = {t["name"]: t for t in self.objects.get("controller_credential_types", [])}
        for cred in job.get("credentials", []):
            obj = by_name(self.objects["controller_credentials"], cred)
            if cred in self.credential_inputs and obj["credential_type"] == "OpenShift or Kubernetes API Bearer Token":
                env.update(kubernetes_env(self.credential_inputs[cred], pdd))
            elif cred in self.credential_inputs and obj["credential_type"] in custom_types:
                cred_env, cred_vars = custom_injection(custom_types[obj["credential_type"]], self.credential_inputs[cred])
                env.update(cred_env)
                if cred_vars:
                    path = write_custom_extra_vars(pdd, cred_vars)
                    cmdline += " " + args2cmdline("-e", "@" + os.path.join(croot, "env", os.path.basename(path)))
                    with open(os.path.join(pdd, "env", "cmdline"), "w", encoding="utf-8") as f:
                        f.write(cmdline)

        result = Job(job_id, job, pdd, extra_vars, cmdline, env)
        if container_root:
            with open(os.path.join(pdd, "env", "envvars"), "w", encoding="utf-8") as f:
                json.dump(env, f)
        if not run:
            return result

        def event_handler(event):
            result.events.append(event)
            return True

        def status_handler(status, runner_config=None):  # pylint: disable=unused-argument
            result.statuses.append(status.get("status"))

        started = time.monotonic()
        runner = ansible_runner.run(private_data_dir=pdd, ident=str(job_id), playbook=job["playbook"],
                                    inventory=inventory, envvars=env, suppress_env_files=True, fact_cache_type="",
                                    event_handler=event_handler, status_handler=status_handler, quiet=True)
        result.status, result.rc = runner.status, runner.rc
        result.elapsed = time.monotonic() - started
        return result

    # -- workflows -----------------------------------------------------------------------------------------------
    def run_workflow(self, name, answers=None, node_prompts=None, node_run_kw=None, approvals=None, limit=None):
        """Run workflow ``name`` as AWX's workflow manager does (``drive_workflow``); returns its WorkflowJob.

        node_prompts: {identifier: prompts} (e.g. job_type check); node_run_kw: {identifier: launch keywords};
        approvals: {identifier: decision} for the approval nodes, a decision being approve, deny or timeout, or a
        callable ``decide(identifier, jobs)`` that answers when the node starts waiting (its parent finished), given
        the jobs that ran so far in their order ({identifier: job}), so that a test answers as a release manager
        does, after looking at what the earlier nodes left; limit: the workflow's limit on launch (the workflow must
        ask for it).

        Each node's job (``WorkflowJobNode.get_job_kwargs``): the node's prompts, then the workflow job's (a limit
        only where the template asks for one), pass the template's ``_accept_or_ignore_job_kwargs`` (the node's
        ``extra_data`` only where the template's survey asks for the variable or it asks for variables; errors are
        logged, not blocking); ancestor artifacts rank above them, the workflow job's extra vars above all.
        """
        wfjt = self.workflow(name)
        data = dict(ui_answers(wfjt.get("survey_spec")) if answers is None else answers)
        accepted = accept_or_ignore_variables(wfjt, data, blocking=True)[0]
        wj_vars = job_extra_vars(wfjt, accepted)
        if limit is not None and not wfjt.get("ask_limit_on_launch"):
            raise SurveyError(["limit is not prompted on launch by %r" % name])
        wj_limit = wfjt.get("limit") if limit is None else limit
        workflow_job = {"id": next(_JOB_IDS), "name": name}
        dag = WorkflowDAG(wfjt["workflow_nodes"])
        ancestor_artifacts = {}
        jobs = {}

        def run_node(ident, node):
            ujt = node["unified_job_template"]
            aa = node_ancestor_artifacts(dag, ident, jobs, ancestor_artifacts)
            if ujt.get("type") == "workflow_approval":
                if ident not in (approvals or {}):
                    raise KeyError("approval node %r needs a decision (approvals={%r: 'approve'})" % (ident, ident))
                decision = approvals[ident]
                jobs[ident] = Approval(decision(ident, dict(jobs)) if callable(decision) else decision)
                return jobs[ident]
            template = self.template(ujt["name"])
            node_vars = node_runtime_vars(template, node, aa, wj_vars)
            prompts = dict((node_prompts or {}).get(ident) or {})
            if wj_limit and template.get("ask_limit_on_launch"):
                prompts["limit"] = wj_limit
            jobs[ident] = self.launch(ujt["name"], answers={}, prompts=prompts, workflow=(workflow_job, node_vars),
                                      blocking=False, **(node_run_kw or {}).get(ident, {}))
            return jobs[ident]

        return drive_workflow(wfjt, run_node, dag=dag)


# ---- workflows (AWX's rules) -----------------------------------------------------------------------------------

#: A node's job ended in one of these: its failure and always edges are followed (``bfs_nodes_to_run``).
FAILED_STATUSES = ("failed", "error", "canceled")
FINISHED_STATUSES = ("successful",) + FAILED_STATUSES
EDGES = ("success_nodes", "failure_nodes", "always_nodes")


class WorkflowDAG:
    """The decisions of AWX's workflow manager over one workflow job, restated from ``WorkflowDAG`` in
    ``awx/main/scheduler/dag_workflow.py`` (ansible/awx devel; the task manager's ``process_finished_workflow_jobs``
    in ``awx/main/scheduler/task_manager.py`` calls them):

    * ``bfs_nodes_to_run``: from the roots, a node with a finished job opens its ``failure_nodes`` + ``always_nodes``
      (failed, error, canceled) or its ``success_nodes`` + ``always_nodes`` (successful); a node without a job and not
      ``do_not_run`` runs once every parent that may still run has finished (``_are_relevant_parents_finished``), and
      a node with ``all_parents_must_converge`` only when each parent ended on an edge that leads to it
      (``_all_parents_met_convergence_criteria``: successful - a success or always edge, failed - a failure or always
      edge);
    * ``mark_dnr_nodes``: in topological order, a node no parent can still reach is marked ``do_not_run``
      (``_should_mark_node_dnr``; for a convergence node, any parent ``do_not_run`` or a criterion unmet);
    * ``is_workflow_done``: every node has a finished job or is ``do_not_run``;
    * ``has_workflow_failed``: the workflow job is **failed** only when some node's job failed (failed, canceled,
      error) and that node has **no** failure and no always edge ("No error handling path for workflow job
      node(s)"). A failed node with a failure or always child counts as handled, whatever that child then does:
      the workflow's status is the status of the ends of its paths. The task manager then sends the workflow's
      ``succeeded`` notifications when the status is successful, else ``failed``
      (``workflow_job.send_notification_templates('succeeded' if workflow_job.status == 'successful' else 'failed')``).

    Nodes are the awx.awx ``workflow_nodes`` of ``awx/controller_workflows.yml`` (identifier, unified_job_template,
    related.success_nodes / failure_nodes / always_nodes, all_parents_must_converge). A node whose template is
    missing (``unified_job_template`` None: deleted) is not modelled: the data names every template.
    """

    def __init__(self, workflow_nodes):
        self.nodes = {n["identifier"]: n for n in workflow_nodes}
        if len(self.nodes) != len(workflow_nodes):
            raise ValueError("two workflow nodes share an identifier")
        self.children = {i: {kind: [c["identifier"] for c in (n.get("related") or {}).get(kind, [])] for kind in EDGES}
                         for i, n in self.nodes.items()}
        self.parents = {i: [] for i in self.nodes}  # [(parent, edge kind)]
        for ident, edges in self.children.items():
            for kind, kids in edges.items():
                for kid in kids:
                    self.parents[kid].append((ident, kind))
        self.status = {}  # identifier -> the status its job ended in
        self.do_not_run = set()

    def _order(self):
        """Topological order (``SimpleDAG.sort_nodes_topological``); a cycle is refused, as AWX refuses to save it."""
        order, seen, pending = [], set(), [i for i in self.nodes if not self.parents[i]]
        while pending:
            ident = pending.pop(0)
            order.append(ident)
            seen.add(ident)
            for kid in sorted({k for kids in self.children[ident].values() for k in kids}):
                if kid not in seen and all(p in seen for p, _kind in self.parents[kid]) and kid not in pending:
                    pending.append(kid)
        if len(order) != len(self.nodes):
            raise ValueError("the workflow's edges form a cycle")
        return order

    def _opened_by(self, parent):
        """Children of a finished parent its status opens."""
        status = self.status[parent]
        kinds = ("failure_nodes", "always_nodes") if status in FAILED_STATUSES else ("success_nodes", "always_nodes")
        return [k for kind in kinds for k in self.children[parent][kind]]

    def _relevant_parents_finished(self, ident):
        return all(p in self.do_not_run or self.status.get(p) in FINISHED_STATUSES for p, _kind in self.parents[ident])

    def _convergence_met(self, ident):
        for parent, kind in self.parents[ident]:
            status = self.status.get(parent)
            if status in ("successful", "failed"):
                want = "success_nodes" if status == "successful" else "failure_nodes"
                if not any(p == parent and k in (want, "always_nodes") for p, k in self.parents[ident]):
                    return False
        return True

    def bfs_nodes_to_run(self):
        found, visited = [], set()
        queue = [i for i in self.nodes if not self.parents[i]]
        for ident in queue:
            if ident in visited:
                continue
            visited.add(ident)
            if ident in self.do_not_run:
                continue
            if ident in self.status:
                if self.status[ident] in FINISHED_STATUSES:
                    queue.extend(self._opened_by(ident))
            elif self._relevant_parents_finished(ident):
                converge = self.nodes[ident].get("all_parents_must_converge")
                if not converge or self._convergence_met(ident):
                    found.append(ident)
        return found

    def mark_dnr_nodes(self):
        marked = []
        for ident in self._order():
            parents = self.parents[ident]
            if ident in self.do_not_run or ident in self.status or not parents:
                continue
            if self.nodes[ident].get("all_parents_must_converge"):
                if any(p in self.do_not_run for p, _kind in parents) or not self._convergence_met(ident):
                    self.do_not_run.add(ident)
                    marked.append(ident)
                continue
            live = [p for p, _kind in parents if p not in self.do_not_run]
            if any(p not in self.status for p in live):
                continue  # a parent may still run: not decided
            if not any(ident in self._opened_by(p) for p in live):
                self.do_not_run.add(ident)
                marked.append(ident)
        return marked

    def is_workflow_done(self):
        return all(i in self.do_not_run or self.status.get(i) in FINISHED_STATUSES for i in self.nodes)

    def has_workflow_failed(self):
        """(failed, reason): a failed node with neither a failure nor an always child fails the workflow."""
        unhandled = ["(%s,%s)" % (i, s) for i, s in self.status.items() if s in FAILED_STATUSES
                     and not self.children[i]["failure_nodes"] and not self.children[i]["always_nodes"]]
        if unhandled:
            return True, "No error handling path for workflow job node(s) [%s]." % ",".join(unhandled)
        return False, None


def render_workflow(wfjt, settings):
    """Workflow ``wfjt`` of awx/ as ``playbooks/awx_configure.yml`` leaves it on a controller given ``settings`` (its
    ``llmops_awx_*`` variables): every ``{{ ... }}`` of the workflow evaluated with them (Jinja's native types), the
    nodes whose ``state`` is ``absent`` left out with their own edges (the "Workflow nodes" task deletes them, and AWX
    deletes a node's edges with the node), and each edge to an absent node bypassing it: it leads to that node's
    success children instead (the "Workflow edges" task). An edge to a node the workflow does not have is refused, as
    awx.awx's lookup of it by identifier fails; so is an absent node whose success child is absent too (the task
    bypasses one node). A workflow holds no ``!unsafe`` value (AWX's own Jinja): every template in it is the
    configure playbook's."""
    import jinja2.nativetypes  # pylint: disable=import-outside-toplevel

    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)

    def render(value):
        if isinstance(value, str) and "{{" in value:
            return env.from_string(value).render(settings)
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        if isinstance(value, list):
            return [render(v) for v in value]
        return value

    out = render(copy.deepcopy(wfjt))
    for node in out.get("workflow_nodes", []):
        if node.get("state", "present") not in ("present", "absent"):
            raise ValueError("node %r: state %r is neither present nor absent" % (node["identifier"], node["state"]))
    bypass = {n["identifier"]: [c["identifier"] for c in (n.get("related") or {}).get("success_nodes", [])]
              for n in out.get("workflow_nodes", []) if n.get("state") == "absent"}
    for ident, kids in bypass.items():
        if set(kids) & set(bypass):
            raise ValueError("node %r is absent and so is its success child %s" % (ident, sorted(set(kids) & set(bypass))))
    nodes = [n for n in out.get("workflow_nodes", []) if n["identifier"] not in bypass]
    known = {n["identifier"] for n in nodes}
    for node in nodes:
        related = node.get("related") or {}
        for kind in EDGES:
            if kind in related:
                idents = [c["identifier"] for c in related[kind]]
                idents = [i for i in idents if i not in bypass] + [k for i in idents if i in bypass for k in bypass[i]]
                related[kind] = [{"identifier": i} for i in idents]
                unknown = [i for i in idents if i not in known]
                if unknown:
                    raise ValueError("node %r: %s names %s, which the workflow does not have" % (
                        node["identifier"], kind, ", ".join(unknown)))
    out["workflow_nodes"] = nodes
    return out


def node_ancestor_artifacts(dag, ident, jobs, kept):
    """The ancestor artifacts of node ``ident`` (``WorkflowJobNode.get_job_kwargs``): each parent's own kept ancestor
    artifacts, then its job's artifacts, in parent order; kept in ``kept`` for the node's children. Every node keeps
    them, an approval node too, so a stage node's artifacts pass through an approval to the deploy after it."""
    aa = {}
    for parent, _kind in dag.parents[ident]:
        aa.update(kept.get(parent, {}))
        aa.update(getattr(jobs.get(parent), "artifacts", None) or {})
    kept[ident] = aa
    return aa


def node_runtime_vars(template, node, ancestor_artifacts, workflow_vars):
    """The launch extra vars a workflow node gives its job template (``WorkflowJobNode.get_job_kwargs``).

    The node's ``extra_data`` is a prompt: the template's ``_accept_or_ignore_job_kwargs`` keeps only what its survey
    asks for (and passes) or everything when it asks for variables, and only logs the rest. Ancestor artifacts
    (``_ansible_no_log`` aside) rank above it, the workflow job's extra vars above all (they bypass the template's
    prompts: "WFJT extra_vars ignored JobTemplate.ask_variables_on_launch"). The job's extra vars are then
    ``job_extra_vars(template, <this>)``.
    """
    runtime = accept_or_ignore_variables(template, node.get("extra_data") or {}, blocking=False)[0]
    runtime.update({k: v for k, v in (ancestor_artifacts or {}).items() if k != "_ansible_no_log"})
    runtime.update(workflow_vars or {})
    return runtime


class WorkflowJob(dict):
    """A finished workflow job: {identifier: job} of the nodes that ran, and the workflow's own outcome.

    status: successful or failed (``has_workflow_failed``); reason: AWX's job explanation when failed; notified: the
    notification templates the workflow sent (its ``notification_templates_success`` or ``_error``); not_run: the
    nodes marked do_not_run.
    """

    status = None
    reason = None
    notified = ()
    not_run = ()


def drive_workflow(wfjt, run_node, dag=None):
    """Run workflow template ``wfjt`` to its end the way AWX's task manager does; returns a WorkflowJob.

    run_node(identifier, node) -> a finished job (anything with ``status``): launches the node's template. Each pass
    marks do_not_run nodes, stops when the workflow is done, and otherwise spawns every node ``bfs_nodes_to_run``
    returns (AWX runs them at once; here one after the other, in that order).
    """
    dag = dag or WorkflowDAG(wfjt["workflow_nodes"])
    jobs = WorkflowJob()
    while True:
        dag.mark_dnr_nodes()
        if dag.is_workflow_done():
            break
        ready = dag.bfs_nodes_to_run()
        if not ready:
            raise RuntimeError("workflow %r is stuck: no node can run and it is not done" % wfjt["name"])
        for ident in ready:
            job = run_node(ident, dag.nodes[ident])
            jobs[ident] = job
            dag.status[ident] = job.status if job.status in FINISHED_STATUSES else "error"
    failed, jobs.reason = dag.has_workflow_failed()
    jobs.status = "failed" if failed else "successful"
    jobs.not_run = sorted(dag.do_not_run)
    jobs.notified = tuple(wfjt.get("notification_templates_error" if failed else "notification_templates_success") or ())
    return jobs


class Approval:
    """A workflow approval node's outcome (``awx/main/models/workflow.py`` ``WorkflowApproval``): approve -
    successful; deny, or no answer within ``timeout`` - failed (``deny``, ``timed_out``)."""

    def __init__(self, decision):
        if decision not in ("approve", "deny", "timeout"):
            raise ValueError("an approval is approved, denied or times out, not %r" % (decision,))
        self.decision = decision
        self.status = "successful" if decision == "approve" else "failed"
        self.artifacts = {}


# ---- execution environment inputs ------------------------------------------------------------------------------

SITE_COLLECTIONS = os.path.join(os.path.dirname(os.path.dirname(yaml.__file__)), "ansible_collections")


def repack_collection(installed_dir, out_dir):
    """An artifact tarball of an installed collection (e.g. kubernetes.core from the ansible package).

    The ansible package strips docs and tests from its collections but keeps their FILES.json, so the installed
    tree cannot be tarred as it is; it is rebuilt with ``ansible-galaxy collection build`` from a galaxy.yml made
    of its MANIFEST.json (same namespace, name, version, dependencies).
    """
    with open(os.path.join(installed_dir, "MANIFEST.json"), encoding="utf-8") as f:
        info = json.load(f)["collection_info"]
    work = os.path.join(out_dir, ".repack-%s-%s" % (info["namespace"], info["name"]))
    shutil.rmtree(work, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "MANIFEST.json", "FILES.json")
    shutil.copytree(installed_dir, work, ignore=skip)
    galaxy = {k: v for k, v in info.items() if v not in ("", [], None) or k == "dependencies"}
    if not galaxy.get("license"):
        galaxy.pop("license", None)
    with open(os.path.join(work, "galaxy.yml"), "w", encoding="utf-8") as f:
        yaml.safe_dump(galaxy, f)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                           out_dir, work], capture_output=True, text=True, check=False, timeout=300, env=env)
    shutil.rmtree(work, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError("ansible-galaxy collection build failed: %s" % (proc.stdout + proc.stderr)[-2000:])
    return os.path.join(out_dir, "%s-%s-%s.tar.gz" % (info["namespace"], info["name"], info["version"]))


def ee_collections(dest):
    """The two local tarballs execution-environment.yml installs: dest/llmops-serving.tar.gz, kubernetes-core.tar.gz."""
    os.makedirs(dest, exist_ok=True)
    dist = os.path.join(dest, ".dist")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([sys.executable, os.path.join(AWX_DIR, "ee", "build_artifact.py"), "--galaxy",
                           os.path.join(BIN, "ansible-galaxy"), "--output-path", dist],
                          capture_output=True, text=True, check=False, timeout=300, env=env)
    if proc.returncode:
        raise RuntimeError("ansible-galaxy collection build failed: %s" % (proc.stdout + proc.stderr)[-2000:])
    built = [os.path.join(dist, n) for n in os.listdir(dist) if n.startswith("llmops-serving-")]
    shutil.move(built[0], os.path.join(dest, "llmops-serving.tar.gz"))
    kc = repack_collection(os.path.join(SITE_COLLECTIONS, "kubernetes", "core"), dist)
    shutil.move(kc, os.path.join(dest, "kubernetes-core.tar.gz"))
    shutil.rmtree(dist, ignore_errors=True)
    return sorted(os.path.join(dest, n) for n in os.listdir(dest))


def _main(argv):
    """The `make ee` steps.

    ee-collections DEST                         the two collection tarballs of execution-environment.yml
    prepare WORKDIR TEMPLATE [ANSWERS_JSON]     a job's private data dir with /runner paths (no collection copied:
                                                the image has it); prints the directory, then the playbook
    """
    if len(argv) == 2 and argv[0] == "ee-collections":
        print("\n".join(ee_collections(argv[1])))
        return 0
    if len(argv) in (3, 4) and argv[0] == "prepare":
        os.makedirs(argv[1], exist_ok=True)
        ctl = Controller(argv[1], task_env={"LLMOPS_ROOT": "/runner/llmops"})
        job = ctl.launch(argv[2], answers=json.loads(argv[3]) if len(argv) == 4 else None, run=False,
                         container_root="/runner")
        print(job.private_data_dir)
        print(job.template["playbook"])
        return 0
    sys.stderr.write(_main.__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
