"""Which hosts each AWX job template reaches, listed by ansible-playbook itself on the example fleet inventory.

Every play names inventory groups (never ``all``); every job template and the workflow carry a limit; ansible-playbook
``--list-hosts -l <the template's limit>`` on ``inventories/example-h20`` names, per play, the hosts a job would run
on. The Kubernetes API host takes no staging or deploy step, the benchmark and transport jobs run on hosts of the
fleet (never the execution environment's localhost), and diagnose runs once per engine.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

ROOT = awx.ROOT
EXAMPLE = os.path.join(ROOT, "inventories", "example-h20")
OBJECTS = awx.load_controller()
TEMPLATES = OBJECTS["controller_templates"]
GPU = ["h20-gpu-01", "h20-gpu-02", "h20-gpu-03"]

# per template: [(play name, hosts)] as the job runs them with the template's own limit
EXPECTED = {
    "llmops stage model": [("Demo model on the shared filesystem", GPU), ("Stage the model to node-local NVMe", GPU)],
    "llmops deploy": [("Preflight", GPU), ("Demo model on the shared filesystem", GPU),
                      ("Stage the model to node-local NVMe", GPU), ("Kernel caches keyed by a version fingerprint", GPU),
                      ("Engine", ["h20-gpu-01"]), ("Export the engine endpoint", ["h20-gpu-01"])],
    "llmops deploy P/D pair": [("Deploy the prefill/decode pair", ["h20-gpu-02", "h20-gpu-03"])],
    "llmops verify transport": [("Start the local P/D pair", ["h20-gpu-02", "h20-gpu-03"]),
                                ("Prove which transport carried the KV cache", ["h20-gpu-02", "h20-gpu-03"]),
                                ("Export the transport verdict", ["h20-gpu-02", "h20-gpu-03"])],
    "llmops diagnose": [("Diagnose the Kubernetes engine", ["k8s-api-01"]),
                        ("Diagnose the local engine of each colocated node", ["h20-gpu-01"])],
    "llmops benchmark": [("Serving benchmark", ["bench-01"]), ("Export the benchmark report", ["bench-01"])],
    "llmops upgrade phase": [("Upgrade the serving revision", ["h20-gpu-01"]),
                             ("Publish B's kernel cache compiled at its first start", ["h20-gpu-01"])],
}


PLAYBOOKS = ("playbooks/site.yml", "playbooks/stage.yml", "playbooks/verify_transport.yml", "playbooks/diagnose.yml",
             "playbooks/benchmark.yml", "playbooks/upgrade.yml", "playbooks/pd_deploy.yml")


@functools.lru_cache(maxsize=None)
def _list_all(limit, inventory):
    """{playbook: [(play name, sorted hosts)]} of every playbook from one ``ansible-playbook --list-hosts`` run."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory, "--list-hosts"]
    cmd += (["-l", limit] if limit else []) + [os.path.join(ROOT, p) for p in PLAYBOOKS]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    books, plays, current = {}, None, None
    for line in proc.stdout.splitlines():
        m = re.match(r"^playbook: (.*)$", line)
        if m:
            plays = books.setdefault(os.path.relpath(m.group(1), ROOT), [])
            continue
        m = re.match(r"\s+play #\d+ \((.*?)\): (.*?)\tTAGS:", line)
        if m:
            current = (m.group(2).strip(), [])
            plays.append(current)
        elif current is not None and re.match(r"^      \S+$", line):
            current[1].append(line.strip())
    return {book: [(name, sorted(hosts)) for name, hosts in p] for book, p in books.items()}


def list_hosts(playbook, limit=None, inventory=EXAMPLE):
    """[(play name, sorted hosts)] of one playbook, as ``ansible-playbook --list-hosts [-l limit]`` lists them."""
    return _list_all(limit, inventory)[playbook]


@pytest.mark.parametrize("template", TEMPLATES, ids=[t["name"] for t in TEMPLATES])
def test_each_template_runs_its_plays_on_the_hosts_its_limit_names(template):
    assert template.get("limit"), "%s has no limit" % template["name"]
    # diagnose's limit is already once per engine; a workflow's limit reaches only templates that ask for one, so a
    # narrowed workflow still diagnoses (and its failure path still ends failed: tests/unit/test_awx_workflow.py)
    assert template.get("ask_limit_on_launch") is (template["name"] != "llmops diagnose")
    assert list_hosts(template["playbook"], template["limit"]) == EXPECTED[template["name"]]


def test_no_staging_or_deploy_step_reaches_the_kubernetes_api_host():
    """Without any limit too: the plays name groups, so k8s-api-01 and the client never stage or run an engine."""
    for playbook in ("playbooks/site.yml", "playbooks/stage.yml"):
        for name, hosts in list_hosts(playbook):
            assert "k8s-api-01" not in hosts and "bench-01" not in hosts, (playbook, name, hosts)


def test_the_workflow_limit_keeps_every_node_on_its_hosts():
    """The workflow's limit replaces the limit of each node whose template asks for one (the others keep their
    own): every node still reaches exactly its own template's hosts."""
    for wf in OBJECTS["controller_workflows"]:
        assert wf["ask_limit_on_launch"] is True
        for node in wf["workflow_nodes"]:
            if node["unified_job_template"]["type"] == "workflow_approval":
                continue  # an approval runs nothing on any host
            template = awx.by_name(TEMPLATES, node["unified_job_template"]["name"])
            limit = wf["limit"] if template["ask_limit_on_launch"] else template["limit"]
            assert list_hosts(template["playbook"], limit) == EXPECTED[template["name"]], node["identifier"]


def test_a_narrowed_workflow_still_diagnoses_the_engine():
    """A workflow launched on one GPU node that runs no engine: the diagnose node keeps its own limit."""
    diagnose = awx.by_name(TEMPLATES, "llmops diagnose")
    assert not diagnose["ask_limit_on_launch"]
    assert list_hosts("playbooks/diagnose.yml", diagnose["limit"]) == EXPECTED["llmops diagnose"]
    assert list_hosts("playbooks/diagnose.yml", "h20-gpu-02") == [("Diagnose the Kubernetes engine", []),
                                                                  ("Diagnose the local engine of each colocated node", [])]


def test_a_narrower_limit_on_launch_narrows_the_plays():
    plays = list_hosts("playbooks/stage.yml", "h20-gpu-02")
    assert plays == [("Demo model on the shared filesystem", ["h20-gpu-02"]),
                     ("Stage the model to node-local NVMe", ["h20-gpu-02"])]


def test_the_local_inventory_puts_its_one_host_in_every_group():
    for playbook in ("playbooks/site.yml", "playbooks/verify_transport.yml", "playbooks/diagnose.yml",
                     "playbooks/benchmark.yml", "playbooks/stage.yml"):
        plays = list_hosts(playbook, inventory=os.path.join(ROOT, "inventories", "local"))
        assert plays and all(hosts == ["localhost"] for _name, hosts in plays), (playbook, plays)


def test_no_play_targets_all_or_a_bare_localhost():
    """awx_configure.yml talks to the controller from the machine that runs it: the one play on localhost."""
    for path in sorted(glob.glob(os.path.join(ROOT, "playbooks", "*.yml"))):
        with open(path, encoding="utf-8") as f:
            plays = yaml.safe_load(f)
        for play in plays:
            if "import_playbook" in play or "ansible.builtin.import_playbook" in play:
                continue
            hosts = str(play["hosts"])
            assert hosts != "all" and "localhost" not in hosts or path.endswith("awx_configure.yml"), (path, play["name"])


def test_templates_that_reach_the_cluster_run_kubernetes_calls_in_the_execution_environment():
    """The Kubernetes credential is injected into the EE (K8S_AUTH_*): its templates set the one switch."""
    for template in TEMPLATES:
        if "llmops Kubernetes" in template["credentials"] or template["name"] == "llmops benchmark":
            assert (template.get("extra_vars") or {}).get("llmops_k8s_delegate_to") == "localhost", template["name"]
    roles = glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))
    text = "\n".join(open(p, encoding="utf-8").read() for p in roles)
    # every delegation to the API host goes through the switch
    assert "delegate_to: \"{{ engine_k8s_delegate_to }}\"" not in text
    for role in ("engine", "pd_disagg", "diagnose", "benchmark"):
        role_text = "\n".join(open(p, encoding="utf-8").read() for p in roles if "/roles/%s/" % role in p)
        assert "llmops_k8s_delegate_to | default(groups['k8s_api']" in role_text, role


def _diagnose_delegation(*extra):
    """{task name: (host, delegated ansible_host)} of diagnose.yml's Kubernetes read on the example fleet.

    Every host is reached with the local connection (nothing is contacted over SSH); no cluster answers, so the read
    fails where it ran, and the JSON callback says where that was (``_ansible_delegated_vars``)."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", KUBECONFIG=os.devnull)
    for key in [k for k in env if k.startswith("K8S_AUTH_")]:
        env.pop(key)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", EXAMPLE,
           os.path.join(ROOT, "playbooks", "diagnose.yml"), "-e", "ansible_connection=local",
           "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "diagnose_name=glm-5-2-fp8-vllm",
           "-e", "diagnose_fail_on_error=false"] + list(extra)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(proc.stdout)
    out = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith("Read the evidence and name the cause"):
                for host, result in task["hosts"].items():
                    out[host] = ((result.get("_ansible_delegated_vars") or {}).get("ansible_host"),
                                 result.get("skipped", False), result.get("msg", ""))
    return out


def test_kubernetes_calls_follow_the_one_switch():
    """Outside AWX the cluster is read on the first k8s_api host; the AWX templates' llmops_k8s_delegate_to:
    localhost reads it in the execution environment (where AWX injects K8S_AUTH_*), once per engine."""
    default = _diagnose_delegation()
    # once: the Kubernetes engine is read from the k8s_api host alone (the colocated play reads local engines only)
    assert [h for h, r in default.items() if not r[1]] == ["k8s-api-01"]
    assert default["k8s-api-01"][0] == "10.0.0.10"  # the k8s_api host's address: delegated there
    awx_like = _diagnose_delegation("-e", "llmops_k8s_delegate_to=localhost")
    assert awx_like["k8s-api-01"][:2] == ("localhost", False)
    # with no cluster to read, the failure names the credential the EE would have had
    assert "K8S_AUTH_HOST" in awx_like["k8s-api-01"][2]
    # a site's own diagnose_delegate_to (a bastion) does not take the read out of the EE under AWX: the bastion has
    # no credential there
    site_bastion = _diagnose_delegation("-e", "diagnose_delegate_to=bench-01")
    assert site_bastion["k8s-api-01"][:2] == ("10.0.0.20", False)  # outside AWX the site decides
    awx_over_site = _diagnose_delegation("-e", "diagnose_delegate_to=bench-01", "-e", "llmops_k8s_delegate_to=localhost")
    assert awx_over_site["k8s-api-01"][:2] == ("localhost", False)


@functools.lru_cache(maxsize=None)
def _imported(inventory=EXAMPLE):
    return awx.import_inventory(ROOT, inventory)


def test_the_slicing_model_reproduces_the_empty_slice_of_four_slices_over_the_example_fleet():
    """AWX slices the whole inventory by name, not the limit: with 4 slices of example-h20's 5 hosts, slice 1 holds
    bench-01 and k8s-api-01, which the stage limit gpu_nodes does not name (the failure seen on the controller)."""
    imported = _imported()
    hosts = set(imported["_meta"]["hostvars"])
    stage = dict(awx.by_name(TEMPLATES, "llmops stage model"), job_slice_count=4)
    count = awx.effective_slice_count(stage, hosts)
    assert count == 4
    assert awx.slice_hosts(hosts, 1, count) == ["bench-01", "k8s-api-01"]
    assert not set(awx.slice_hosts(hosts, 1, count)) & awx.limit_hosts(imported, "gpu_nodes")
    with pytest.raises(ValueError, match="group and host names only"):
        awx.limit_hosts(imported, "gpu_nodes:&rack1")


@pytest.mark.parametrize("template", TEMPLATES, ids=[t["name"] for t in TEMPLATES])
def test_no_slice_of_any_template_is_left_without_a_host_of_its_limit(template):
    """Every slice job of every template, on the example fleet, with the template's limit and the workflow's (and
    a launch-time slice count where the template asks for one), has a host to target."""
    imported = _imported()
    hosts = set(imported["_meta"]["hostvars"])
    limits = [template["limit"]] + ([wf["limit"] for wf in OBJECTS["controller_workflows"]]
                                    if template.get("ask_limit_on_launch") else [])
    prompted = [{}] + ([{"job_slice_count": n} for n in range(2, len(hosts) + 1)]
                       if template.get("ask_job_slice_count_on_launch") else [])
    for prompts in prompted:
        count = awx.effective_slice_count(template, hosts, prompts)
        for limit in limits:
            for number in range(1, count + 1):
                part = set(awx.slice_hosts(hosts, number, count)) & awx.limit_hosts(imported, limit)
                assert part, "slice %d/%d of %r has no host of the limit %r" % (number, count, template["name"], limit)


def _engine_kubernetes_first_task(tmp_path, **extra):
    """The first task of the engine role's Kubernetes path on the local inventory; (rc, output)."""
    book = tmp_path / "render.yml"
    book.write_text(yaml.safe_dump([{"name": "Engine on Kubernetes", "hosts": "colocated", "gather_facts": False,
                                     "tasks": [{"ansible.builtin.include_role": {"name": "llmops.serving.engine",
                                                                                 "tasks_from": "kubernetes.yml"}}]}]))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"))
    ev = dict({"engine_platform": "kubernetes", "engine_image": "vllm/vllm-openai:v0.26.0", "engine_namespace": "llm"},
              **extra)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i",
           os.path.join(ROOT, "inventories", "local"), str(book), "-e", json.dumps(ev)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_render_mode_is_refused_in_an_awx_job_and_allowed_from_a_checkout(tmp_path):
    """Under AWX the render runs in the job's execution environment (llmops_k8s_delegate_to: localhost), which AWX
    throws away: the job would succeed having applied nothing. Outside AWX, render writes where it runs."""
    awx_job = {"engine_k8s_mode": "render", "awx_job_id": 4242, "llmops_k8s_delegate_to": "localhost"}
    rc, out = _engine_kubernetes_first_task(tmp_path, **awx_job)
    assert rc != 0 and "engine_k8s_mode is render in AWX job 4242" in " ".join(out.split()), out[-3000:]
    assert "which AWX throws away when the job ends" in " ".join(out.split())
    for allowed in ({"engine_k8s_mode": "render"}, dict(awx_job, engine_k8s_mode="apply")):
        rc, out = _engine_kubernetes_first_task(tmp_path, **allowed)
        assert "engine_k8s_mode is render in AWX job" not in out, allowed
        first = out.split("Refuse render mode where the rendered manifests would be thrown away", 1)[1]
        assert re.match(r"[^\n]*\*+\nok: \[localhost\]", first), (allowed, first[:500])


def test_the_awx_variant_of_the_example_fleet_is_the_example_fleet_that_applies():
    """inventories/example-h20-awx, imported as an AWX inventory source imports it, holds exactly example-h20's
    hosts, groups and variables, but engine_k8s_mode: apply (render is refused in an AWX job)."""
    example, variant = _imported(), _imported(os.path.join(ROOT, "inventories", "example-h20-awx"))
    groups = ("_meta", "all")
    assert {k: v for k, v in variant.items() if k not in groups} == {k: v for k, v in example.items() if k not in groups}
    assert variant["all"]["children"] == example["all"]["children"]
    assert example["all"]["vars"]["engine_k8s_mode"] == "render"
    assert variant["all"]["vars"] == dict(example["all"]["vars"], engine_k8s_mode="apply")
    assert variant["_meta"]["hostvars"] == example["_meta"]["hostvars"]


def test_verify_refuses_a_kubernetes_pair_without_its_urls(tmp_path):
    """The pd_verify_* URLs default to the local pair's loopback ports: on a Kubernetes pair (the example fleet's
    platform, where no template sets them) the verify play refuses before any snapshot or load, naming them."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"))
    base = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i",
            os.path.join(ROOT, "inventories", "local"), os.path.join(ROOT, "playbooks", "verify_transport.yml"),
            "--tags", "verify", "-e", "pd_disagg_platform=kubernetes"]
    proc = subprocess.run(base + ["-e", "pd_verify_router_url=http://gw.example"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-3000:]
    assert ("pd_disagg_platform is kubernetes: not set: pd_verify_decode_metrics_url (or the artifact "
            "llmops_pd_decode_metrics_url), pd_verify_prefill_metrics_url (or the artifact llmops_pd_prefill_metrics_url).") in out
    assert "Snapshot every RDMA port" not in out
    tpl = awx.by_name(TEMPLATES, "llmops verify transport")
    assert tpl["credentials"] == ["llmops GPU nodes"] and "llmops_k8s_delegate_to" not in (tpl.get("extra_vars") or {})
