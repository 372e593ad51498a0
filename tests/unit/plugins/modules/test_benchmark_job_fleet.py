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

import json
import os

import jinja2
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_outdir
from ansible_collections.llmops.serving.plugins.modules import benchmark_job
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks

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
