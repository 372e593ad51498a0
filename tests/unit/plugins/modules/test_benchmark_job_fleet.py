"""The benchmark Job runs on the fleet: its pod lands only on a node whose local disk holds the tokenizer
(the nodes that staged the revision), tolerates those GPU nodes' taints, and ``apply`` ends a round as soon as
the Job is Complete or Failed.

Placement is judged by tests/lib/kube_scheduler.py (kube-scheduler's NodeAffinity and TaintToleration filters and
the kubelet's hostPath type check, restated from kubernetes v1.33.0); Job conditions by
kubernetes staging/src/k8s.io/api/batch/v1/types.go (v1.33.0, ``JobConditionType``: Suspended, Complete, Failed,
FailureTarget, SuccessCriteriaMet) and pkg/controller/job/job_controller.go (a finished Job has condition
Complete or Failed with status "True"; FailureTarget and SuccessCriteriaMet come first, before the pods are gone).
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import posixpath

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs, _bench_job, _bench_outdir
from ansible_collections.llmops.serving.plugins.modules import benchmark_job, benchmark_plan
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.lib import role_tasks as rt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
TOKENIZER_HOST = "/mnt/nvme/models"
REVISION = TOKENIZER_HOST + "/tiny/rev1"


def _fleet():
    """Four tainted GPU nodes, two of which staged the revision, and an untainted CPU node without it."""
    cpu = {"cpu": "64", "memory": "256Gi"}
    nodes = [ks.node("gpu-%d" % i, taints=[GPU_TAINT], allocatable=cpu, dirs=[REVISION] if i in (2, 3) else [])
             for i in range(1, 5)]
    return nodes + [ks.node("cpu-1", allocatable=cpu)]


@pytest.fixture
def plan_dir(tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    target = {"name": "colocated", "url": "http://engine.llm:8000", "model": "tiny", "headers": {}}
    rounds = [{"index": i, "kind": "measure", "target": "colocated", "concurrency": c, "input_len": 16,
               "output_len": 4, "num_prompts": 8, "seed": 1, "rep": 0} for i, c in ((1, 1), (2, 4))]
    with open(str(out / "plan.json"), "w") as f:
        json.dump({"schema": _bench_outdir.PLAN_SCHEMA, "targets": [target], "rounds": rounds, "started_at": 1.0,
                   "protocol": {}, "tokenizer": "/models/tiny/rev1"}, f)
    return out


def _args(out, **kw):
    a = {"out_dir": str(out), "namespace": "llm", "image": "vllm/vllm-openai:v0.26.0",
         "tokenizer_host_path": REVISION, "tokenizer_mount": "/models/tiny/rev1"}
    a.update(kw)
    return a


def test_every_job_pod_lands_on_a_node_that_staged_the_tokenizer(run_module, plan_dir):
    res = run_module(benchmark_job, _args(plan_dir, nodes=["gpu-3", "gpu-2"], tolerations=TOLERATIONS))
    assert not res.get("failed"), res
    for job in res["objects"]:
        pod = ks.pods_of([job])[0]
        assert sorted(ks.feasible(pod, _fleet())) == ["gpu-2", "gpu-3"]
        spec = job["spec"]["template"]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        # pinned by node name, one name per term (kube/_k8s_engine.pin_to_nodes)
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
                         for n in ("gpu-2", "gpu-3")]
        assert spec["tolerations"] == TOLERATIONS
    placed = ks.schedule(res["objects"], _fleet())
    assert [(n, errs) for _o, n, errs in placed] == [("gpu-2", []), ("gpu-2", [])]


def test_without_the_staged_nodes_a_job_can_land_where_the_tokenizer_is_missing(run_module, plan_dir):
    """What the affinity prevents: an unpinned Job is feasible on the CPU node, where the hostPath mount fails."""
    res = run_module(benchmark_job, _args(plan_dir))
    pod = ks.pods_of([res["objects"][0]])[0]
    fleet = _fleet()
    assert ks.feasible(pod, fleet) == ["cpu-1"]  # untolerated GPU taints leave only the node without the tokenizer
    assert ks.mount_errors(pod[3], fleet[-1]) == ["hostPath type check failed: %s is not a directory" % REVISION]


@pytest.mark.parametrize("args, words", [
    ({"image": ""}, "image: empty; set benchmark_k8s_image"),
    ({"nodes": ["gpu 2"]}, "nodes: 'gpu 2' is not a node name"),
    ({"tolerations": [{"operator": "Exists"}]}, "tolerations[0]: operator Exists without a key"),
])
def test_bad_placement_inputs_are_refused_naming_the_option(run_module, plan_dir, tmp_path, args, words):
    res = run_module(benchmark_job, _args(plan_dir, render_dir=str(tmp_path / "jobs"), **args))
    assert res["failed"] and words in res["msg"], res
    assert not (tmp_path / "jobs").exists()


def test_the_role_defaults_take_the_engines_image_tolerations_and_staged_nodes():
    with open(os.path.join(ROOT, "roles", "benchmark", "defaults", "main.yml")) as f:
        defaults = yaml.safe_load(f)
    assert defaults["benchmark_k8s_image"] == "{{ engine_image | default('') }}"
    assert defaults["benchmark_k8s_tolerations"] == "{{ engine_k8s_tolerations | default([]) }}"
    with open(os.path.join(ROOT, "roles", "benchmark", "tasks", "kubernetes.yml")) as f:
        tasks = yaml.safe_load(f)
    find = next(t for t in tasks if "include_role" in str(t) and "staged_nodes" in str(t))
    assert find["ansible.builtin.include_role"] == {"name": "llmops.serving.engine", "tasks_from": "staged_nodes"}
    render = next(t for t in tasks if "llmops.serving.benchmark_job" in t)["llmops.serving.benchmark_job"]
    assert render["nodes"] == "{{ engine_staged_nodes }}" and render["tolerations"] == "{{ benchmark_k8s_tolerations }}"


# ---- apply: wait for Complete or Failed -------------------------------------------------------------------- #

def _wait_task():
    with open(os.path.join(ROOT, "roles", "benchmark", "tasks", "job_round.yml")) as f:
        tasks = yaml.safe_load(f)
    return next(t for t in tasks if "kubernetes.core.k8s_info" in t and "until" in t)


def _done(resources):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    expr = env.compile_expression(_wait_task()["until"].strip())
    return expr(benchmark_job_state={"resources": resources})


def _job(*conditions):
    status = {"active": 1} if not conditions else {"conditions": [
        {"type": t, "status": s, "reason": r} for t, s, r in conditions]}
    return {"metadata": {"name": "bench-001-colocated"}, "status": status}


@pytest.mark.parametrize("resources, finished", [
    ([], False),  # not created yet (or deleted)
    ([{"metadata": {"name": "x"}}], False),  # no status yet
    ([_job()], False),  # running
    ([_job(("FailureTarget", "True", "BackoffLimitExceeded"))], False),  # pods still terminating
    ([_job(("SuccessCriteriaMet", "True", "CompletionsReached"))], False),
    ([_job(("FailureTarget", "True", "BackoffLimitExceeded"), ("Failed", "True", "BackoffLimitExceeded"))], True),
    ([_job(("Failed", "True", "DeadlineExceeded"))], True),
    ([_job(("SuccessCriteriaMet", "True", "CompletionsReached"), ("Complete", "True", "CompletionsReached"))], True),
    ([_job(("Suspended", "True", "JobSuspended"))], False),
    ([_job(("Complete", "False", ""))], False),
])
def test_the_wait_ends_when_the_job_is_complete_or_failed(resources, finished):
    assert _done(resources) is finished


def test_the_wait_covers_the_jobs_deadline_and_a_failed_job_does_not_fail_the_play():
    task = _wait_task()
    assert task["failed_when"] is False and task["delay"] == "{{ [benchmark_k8s_job_poll | int, 1] | max }}"
    env = jinja2.Environment()
    retries = int(env.from_string(task["retries"]).render(benchmark_k8s_job_timeout=3600, benchmark_k8s_job_poll=10))
    assert retries * 10 >= 3600  # the Job's activeDeadlineSeconds (the same timeout) marks it Failed in time


@pytest.mark.parametrize("engine, image, refused", [
    ("sglang", "lmsysorg/sglang:v0.5.16", True),  # the default: the engine's image, which has no vllm
    ("sglang", "vllm/vllm-openai:v0.26.0", False),  # a vLLM image set for the client
    ("vllm", "vllm/vllm-openai:v0.26.0", False),
])
def test_an_sglang_engine_image_is_refused_as_the_client_image(engine, image, refused):
    with open(os.path.join(ROOT, "roles", "benchmark", "tasks", "kubernetes.yml")) as f:
        tasks = yaml.safe_load(f)
    check = next(t for t in tasks if "SGLang" in t["name"])["ansible.builtin.assert"]
    ok = jinja2.Environment().compile_expression(check["that"])(
        engine_name=engine, engine_image="lmsysorg/sglang:v0.5.16" if engine == "sglang" else image,
        benchmark_k8s_image=image)
    assert ok is not refused


# ---- the role's own tasks with the example fleet's inventory (render / apply with the defaults) ------------ #

EXAMPLE = "inventories/example-h20"


def _example(name):
    with open(os.path.join(ROOT, EXAMPLE, name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def _filters(variables):
    """The filters the role's defaults use, as Ansible resolves them: ansible-core's own (``relpath``, ``trim``)
    and the collection's (``plugins/filter/*.py`` under ``llmops.serving.``)."""
    variables.env.filters["relpath"] = CoreFilters().filters()["relpath"]
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "filter", "*.py"))):
        mod = importlib.import_module("ansible_collections.llmops.serving.plugins.filter."
                                      + os.path.splitext(os.path.basename(path))[0])
        for name, f in mod.FilterModule().filters().items():
            variables.env.filters["llmops.serving." + name] = f
    return variables


def _playbook_tokenizer():
    """benchmark_tokenizer as playbooks/benchmark.yml sets it without one: tasks/model_revision.yml's
    llmops_model_path (the staged revision on the node), from the example inventory's site_models."""
    with open(os.path.join(ROOT, "playbooks", "tasks", "model_revision.yml"), encoding="utf-8") as f:
        name = next(t for t in yaml.safe_load(f) if "llmops_model_path" in str(t.get("ansible.builtin.set_fact")))
    with open(os.path.join(ROOT, "playbooks", "benchmark.yml"), encoding="utf-8") as f:
        play = yaml.safe_load(f)[0]
    use = next(t for t in play["pre_tasks"] if t.get("name") == "Use the served revision as the tokenizer")
    v = rt.RoleVars("benchmark", {}, extra_vars_files=[EXAMPLE + "/group_vars/all/main.yml"])
    selected = v.template(name["vars"]["llmops_selected_models"])
    path = v.template(name["ansible.builtin.set_fact"]["llmops_model_path"],
                      dict(llmops_selected_models=selected)).strip()
    return v.template(use["ansible.builtin.set_fact"]["benchmark_tokenizer"], dict(llmops_model_path=path))


def _example_role_vars(tmp_path, mode="render", **extra):
    overrides = dict(benchmark_mode=mode, benchmark_out_dir=str(tmp_path / "bench"),
                     benchmark_client_host="bench-01", benchmark_tokenizer=_playbook_tokenizer(),
                     benchmark_targets=[{"name": "colocated", "url": "http://aibrix-eg.aibrix-system:80",
                                         "model": "glm-5.2-fp8-vllm"}],
                     # what the staged-nodes step (engine tasks_from staged_nodes) leaves for the render task
                     engine_staged_nodes=["h20-gpu-01"])
    overrides.update(extra)
    return _filters(rt.RoleVars("benchmark", overrides, extra_vars_files=[EXAMPLE + "/group_vars/all/main.yml"]))


def _replay(run_module, tmp_path, variables):
    """The role's plan, its staged-nodes lookup path and its render, as kubernetes.yml runs them."""
    plan = variables.template(rt.task("benchmark", "llmops.serving.benchmark_plan", "kubernetes.yml")[
        "llmops.serving.benchmark_plan"])
    res = run_module(benchmark_plan, plan)
    assert not res.get("failed"), res.get("msg")
    staged = variables.template(rt.task("benchmark", "ansible.builtin.include_role", "kubernetes.yml")["vars"])
    args = variables.template(rt.task("benchmark", "llmops.serving.benchmark_job", "kubernetes.yml")[
        "llmops.serving.benchmark_job"])
    return staged, args, run_module(benchmark_job, args)


@pytest.mark.parametrize("mode", ["render", "apply"])
def test_the_example_fleet_renders_its_benchmark_jobs_with_the_defaults(run_module, tmp_path, mode):
    """Review m4: with no benchmark_tokenizer the play passes the node's path; the staged-nodes lookup looked for
    /mnt/nvme/models/../mnt/nvme/models/<name>/<revision> and the Jobs went to namespace llm."""
    site = _example("group_vars/all/main.yml")
    revision = "%s/%s/%s" % (site["model_stage_dest_root"], site["site_models"][0]["name"],
                             site["site_models"][0]["revision"])
    in_pod = "/models/%s/%s" % (site["site_models"][0]["name"], site["site_models"][0]["revision"])
    staged, args, res = _replay(run_module, tmp_path, _example_role_vars(tmp_path, mode))
    # the staged-nodes lookup stats model_stage's marker in the node's revision directory
    assert staged["engine_staged_path"] == revision
    assert not res.get("failed"), res.get("msg")
    fleet = [ks.node("h20-gpu-01", allocatable={"cpu": "64", "memory": "256Gi"}, dirs=[revision],
                     taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                             {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}]),
             ks.node("cpu-01", allocatable={"cpu": "64", "memory": "256Gi"})]
    for job in res["objects"]:
        assert job["metadata"]["namespace"] == site["engine_namespace"] == "llm-serving"
        spec = job["spec"]["template"]["spec"]
        assert spec["volumes"][0]["hostPath"]["path"] == site["model_stage_dest_root"]
        mount = spec["containers"][0]["volumeMounts"][0]["mountPath"]
        client = spec["containers"][0]["args"]
        tokenizer = client[client.index("--tokenizer") + 1]
        assert tokenizer == in_pod
        # the client's path, read through the mount, is the staged revision on the node
        assert posixpath.join(site["model_stage_dest_root"], posixpath.relpath(tokenizer, mount)) == revision
    assert [(n, errs) for _o, n, errs in ks.schedule(res["objects"][:1], fleet)] == [("h20-gpu-01", [])]
    assert "header_secret" not in args and args["header_secret_key"] == "headers"


def test_the_pod_path_given_as_benchmark_tokenizer_renders_the_same_jobs(run_module, tmp_path):
    site = _example("group_vars/all/main.yml")
    model = site["site_models"][0]
    _s, _a, host = _replay(run_module, tmp_path / "host", _example_role_vars(tmp_path / "host"))
    staged, _a, pod = _replay(run_module, tmp_path / "pod", _example_role_vars(
        tmp_path / "pod", benchmark_tokenizer="/models/%s/%s" % (model["name"], model["revision"])))
    assert staged["engine_staged_path"] == "%s/%s/%s" % (site["model_stage_dest_root"], model["name"],
                                                         model["revision"])
    assert [o["spec"] for o in host["objects"]] == [o["spec"] for o in pod["objects"]]


def test_the_header_secret_of_the_defaults_reaches_the_jobs(run_module, tmp_path):
    variables = _example_role_vars(tmp_path, benchmark_k8s_header_secret="bench-headers",
                                   benchmark_targets=[{"name": "gw", "url": "http://aibrix-eg.aibrix-system:80",
                                                       "model": "glm-5.2-fp8-vllm",
                                                       "headers": {"Authorization": "Bearer gw-credential-1"}}])
    _s, args, res = _replay(run_module, tmp_path, variables)
    assert args["header_secret"] == "bench-headers" and args["header_secret_key"] == "headers"
    assert not res.get("failed"), res.get("msg")
    env = res["objects"][0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"secretKeyRef": {"name": "bench-headers", "key": "headers"}} in [e.get("valueFrom") for e in env]
    assert "gw-credential-1" not in json.dumps(res)


def test_a_tokenizer_the_job_cannot_read_is_refused_naming_benchmark_tokenizer(run_module, tmp_path):
    variables = _example_role_vars(tmp_path, benchmark_tokenizer="/srv/tokenizers/glm")
    with pytest.raises(Exception, match="benchmark_tokenizer: /srv/tokenizers/glm is neither under"):
        variables.get("benchmark_k8s_staged_path")
    plan = variables.template(rt.task("benchmark", "llmops.serving.benchmark_plan", "kubernetes.yml")[
        "llmops.serving.benchmark_plan"])
    assert not run_module(benchmark_plan, plan).get("failed")
    res = run_module(benchmark_job, dict(out_dir=plan["out_dir"], namespace="llm-serving", image="vllm/vllm-openai",
                                         tokenizer_host_path="/mnt/nvme/models", tokenizer_mount="/models",
                                         render_dir=str(tmp_path / "jobs")))
    assert res["failed"] and res["reason"] == "tokenizer_path" and "benchmark_tokenizer" in res["msg"], res
    assert "benchmark_k8s_tokenizer_host_path" in res["msg"] and not (tmp_path / "jobs").exists()


_SEGMENT = st.text(alphabet="abcXYZ09_-", min_size=1, max_size=6)


@given(rel=st.lists(_SEGMENT, min_size=1, max_size=4), host=st.sampled_from(["/mnt/nvme/models", "/data/m"]),
       mount=st.sampled_from(["/models", "/tok/mnt"]))
def test_tokenizer_paths_the_node_and_the_pod_path_name_one_directory(rel, host, mount):
    """Given on the node or in the pod, the same directory: the pod path is the node path read through the mount."""
    tail = "/".join(rel)
    on_node = posixpath.join(host, tail)
    want = {"host": on_node, "pod": posixpath.join(mount, tail)}
    assert _bench_job.tokenizer_paths(on_node, host, mount) == want
    assert _bench_job.tokenizer_paths(posixpath.join(mount, tail), host, mount) == want


@given(path=st.lists(st.sampled_from(["mnt", "nvme", "models", "..", ".", "x"]), min_size=0, max_size=6))
def test_tokenizer_paths_never_leave_the_mount(path):
    """Whatever the path (``..`` included), the client reads under the mount and the node path is under the root,
    or the path is refused naming the variable to fix."""
    try:
        out = _bench_job.tokenizer_paths("/" + "/".join(path), "/mnt/nvme/models", "/models")
    except _bench_inputs.BenchError as e:
        assert e.reason == "tokenizer_path" and str(e).startswith("benchmark_tokenizer:")
        return
    assert (out["pod"] + "/").startswith("/models/") and (out["host"] + "/").startswith("/mnt/nvme/models/")


def test_a_mount_inside_the_host_root_that_makes_a_path_mean_two_directories_is_refused():
    with pytest.raises(_bench_inputs.BenchError) as e:
        _bench_job.tokenizer_paths("/srv-nvme/nvme/models/glm/r1", "/srv-nvme/nvme", "/srv-nvme")
    assert e.value.reason == "tokenizer_path" and e.value.field == "benchmark_k8s_tokenizer_mount"


def _jinja_path_arithmetic():
    """``file:line`` of every role or playbook YAML line that computes a path with Ansible's path filters
    (``relpath``, ``dirname`` of a tokenizer); the benchmark's node and pod paths come from
    ``llmops.serving.bench_tokenizer_paths`` (``_bench_job.tokenizer_paths``), the rule benchmark_job renders with."""
    bad = []
    for pattern in ("roles/**/*.yml", "playbooks/**/*.yml", "playbooks/*.yml"):
        for path in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    if "relpath(" in line or ("tokenizer" in line and "dirname" in line):
                        bad.append("%s:%d" % (os.path.relpath(path, ROOT), i))
    return bad


def test_no_role_computes_the_tokenizer_paths_in_jinja():
    """Review m4: benchmark_k8s_staged_path was ``<host_path>/<tokenizer | relpath(mount)>``, which turned a node
    path into /mnt/nvme/models/../mnt/nvme/models/...; the one rule is the filter over _bench_job.tokenizer_paths."""
    assert _jinja_path_arithmetic() == []
    with open(os.path.join(ROOT, "roles", "benchmark", "defaults", "main.yml"), encoding="utf-8") as f:
        staged = yaml.safe_load(f)["benchmark_k8s_staged_path"]
    assert "llmops.serving.bench_tokenizer_paths(" in staged
