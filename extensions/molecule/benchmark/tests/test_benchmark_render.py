"""benchmark (render): one valid Kubernetes Job per round of the plan, interleaving the two targets, each running
vllm bench serve against its target with the round's concurrency, lengths and seed, pinned to the node that holds
the tokenizer and mounting it read-only; nothing is measured (no report) because nothing ran."""
from __future__ import annotations

import json

import pytest

TARGETS = {"colocated": "http://glm-5-2-fp8.llm-serving.svc:8000", "pd": "http://aibrix-gateway.aibrix-system.svc"}
TOKENIZER = "/models/glm-5.2-fp8/3f2a9c1"


@pytest.fixture
def out(root):
    return root + "/benchmark"


@pytest.fixture
def plan(tree, out):
    return tree.json(out + "/plan.json")


@pytest.fixture
def jobs(tree, out):
    return tree.rendered(out + "/manifests")


def _args(job):
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    return container, {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}, args


def test_the_plan_interleaves_warmup_and_measured_rounds_over_both_targets(plan):
    rounds = plan["rounds"]
    assert plan["client"] == "kubernetes job" and plan["tokenizer"] == TOKENIZER
    assert [r["target"] for r in rounds] == ["colocated", "pd"] * 4
    assert [(r["concurrency"], r["kind"]) for r in rounds[::2]] == [
        (1, "warmup"), (1, "measure"), (4, "warmup"), (4, "measure")]
    assert all(r["num_prompts"] == 8 for r in rounds if r["kind"] == "measure")


def test_one_valid_job_per_round_with_that_rounds_client_arguments(jobs, plan, k8s_validate):
    assert len(jobs) == len(plan["rounds"]) == 8
    for (name, job), rnd in zip(jobs, plan["rounds"]):
        k8s_validate(job)
        assert job["kind"] == "Job" and job["metadata"]["namespace"] == "llm-bench"
        assert name.endswith("-job-%s.yaml" % job["metadata"]["name"])
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        container, opts, args = _args(job)
        assert container["image"] == "vllm/vllm-openai:v0.11.0"
        assert opts["--base-url"] == TARGETS[rnd["target"]]
        assert (int(opts["--max-concurrency"]), int(opts["--num-prompts"]), int(opts["--seed"])) == (
            rnd["concurrency"], rnd["num_prompts"], rnd["seed"])
        assert (int(opts["--random-input-len"]), int(opts["--random-output-len"])) == (128, 64)
        assert opts["--tokenizer"] == TOKENIZER and opts["--model"] == "glm-5.2-fp8"
        # the P/D target's routing header reaches the client through its environment (never its command line: the
        # one credential rule), the colocated one sends none
        assert "--header" not in opts, args
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        headers = json.loads(env.get("LLMOPS_BENCH_HEADERS") or "{}")
        assert (headers == {"routing-strategy": "pd"}) == (rnd["target"] == "pd"), env


def test_each_job_runs_on_the_tokenizer_node_with_the_tokenizer_mounted_read_only(jobs):
    for dummy, job in jobs:
        spec = job["spec"]["template"]["spec"]
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]
        (mount,) = spec["containers"][0]["volumeMounts"]
        (volume,) = spec["volumes"]
        assert mount == {"mountPath": "/models", "name": volume["name"], "readOnly": True}
        assert volume["hostPath"] == {"path": "/mnt/nvme/models", "type": "Directory"}
        assert job["spec"]["activeDeadlineSeconds"] == 3600


def test_render_measures_nothing(tree, out):
    """No round ran: no report, no round result, no client log; only the plan and the Jobs were written."""
    files = tree.files_below(out)
    assert "plan.json" in files and not tree.host.file(out + "/report.json").exists
    assert [f for f in files if f != "plan.json" and not f.startswith("manifests/")] == []
