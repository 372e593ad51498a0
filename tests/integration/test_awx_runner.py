"""Each job template of awx/ run the way AWX runs it: ansible-runner on an AWX-shaped private data dir.

tests/lib/awx_harness.py builds what AWX's task builds for a job (env/extravars with the template's extra_vars,
the survey answers and the awx_* variables, every answer !unsafe; env/cmdline from the template's fields;
env/settings; the project's inventory as an inventory script; the project copied; this working tree's collection
artifact in requirements_collections/) and calls ansible_runner.run() as awx/main/tasks/jobs.py does. A workflow
passes each job's set_stats artifacts to the next node as extra vars (awx/main/models/workflow.py
WorkflowJobNode.get_job_kwargs).

The stage template runs for real with its survey defaults on inventories/local (the generated tiny model, a
real copy). Every template also runs as an AWX "Check" job (job_type: check, --check): deploy and verify transport
only that way here (for real they start three vLLM CPU engines, several minutes on this machine), each from the
inventory and extra vars alone, deploy also with job tags that pick one play.
"""
from __future__ import annotations

import glob
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from ansible_collections.llmops.serving.tests.lib import awx_harness as awx

WORKFLOW = "llmops stage, deploy, verify"


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    work = tmp_path_factory.mktemp("awx")
    root = work / "llmops"
    root.mkdir()
    collections = awx.build_collection(str(work / "collection"))
    jobs = work / "jobs"
    jobs.mkdir()
    # AWX_TASK_ENV: where the local demo writes, and a port no other test uses
    port = os.environ.get("LLMOPS_AWX_TEST_PORT", "18031")
    ctl = awx.Controller(str(jobs), task_env={"LLMOPS_ROOT": str(root), "LLMOPS_ENGINE_PORT": port},
                         collections=collections)
    ctl.llmops_root = str(root)
    return ctl


@pytest.fixture(scope="module")
def staged(controller):
    """The stage job template launched with the survey's defaults (what the launch form sends untouched)."""
    return controller.launch("llmops stage model")


def _extravars(job):
    with open(os.path.join(job.private_data_dir, "env", "extravars"), encoding="utf-8") as f:
        return f.read()


def _assert_ok(job):
    assert (job.status, job.rc, job.failed_events) == ("successful", 0, []), job.summary()


def _copy_revision(controller, staged, name, revision):
    """A second revision on the shared filesystem: the staged demo model's files under another name."""
    src = os.path.join(controller.llmops_root, "shared", "models", staged.artifacts["llmops_staged_model"],
                       staged.artifacts["llmops_staged_revision"])
    dest = os.path.join(controller.llmops_root, "shared", "models", name, revision)
    if not os.path.isdir(dest):
        shutil.copytree(src, dest)
    return dest


def test_stage_template_runs_with_its_survey_defaults(controller, staged):
    _assert_ok(staged)
    art = staged.artifacts
    assert art["llmops_staged_model"] == "tiny-llama"
    assert art["llmops_staged_path"] == os.path.join(controller.llmops_root, "nvme", "models", "tiny-llama",
                                                     art["llmops_staged_revision"])
    assert os.path.isfile(os.path.join(art["llmops_staged_path"], "config.json"))
    assert art["site_models"] == [{"name": "tiny-llama", "revision": art["llmops_staged_revision"]}]
    # what AWX wrote: answers !unsafe (the empty model name too, which ansible-core reads as null), AWX's variables
    text = _extravars(staged)
    assert "!unsafe 'stage_model_name': !unsafe ''" in text
    # no default for what the inventory sets: the site's model_stage_read_streams stays in place
    assert "model_stage_read_streams" not in text
    assert "!unsafe 'awx_job_id': %d" % staged.id in text and "!unsafe 'tower_job_id': %d" % staged.id in text
    assert "!unsafe 'awx_job_template_name': !unsafe 'llmops stage model'" in text
    # the template's limit: the plays name groups, the job is held to the GPU nodes
    assert staged.cmdline == "-u root --forks=64 -l gpu_nodes"
    assert staged.env["JOB_ID"] == str(staged.id)
    first_path = staged.env["ANSIBLE_COLLECTIONS_PATH"].split(":")[0]
    assert first_path == os.path.join(staged.private_data_dir, "requirements_collections")
    # the roles ran from the installed artifact, not from the working tree
    role_tasks = [e["event_data"]["task_path"] for e in staged.events if e.get("event") == "playbook_on_task_start"
                  and "/roles/" in (e["event_data"].get("task_path") or "")]
    installed = os.path.join(staged.private_data_dir, "requirements_collections", "ansible_collections", "llmops",
                             "serving", "roles", "")
    assert role_tasks and [p for p in role_tasks if not p.startswith(installed)] == []


def test_refused_launches_run_nothing(controller):
    before = sorted(os.listdir(controller.workdir))
    answers = awx.ui_answers(controller.template("llmops stage model")["survey_spec"])
    with pytest.raises(awx.SurveyError) as e:
        bench = controller.template("llmops benchmark")["survey_spec"]
        controller.launch("llmops benchmark", answers=dict(awx.ui_answers(bench), benchmark_a_model="m",
                                                           benchmark_tokenizer="/t"))
    assert e.value.errors == ["'benchmark_a_url' value missing"]
    with pytest.raises(awx.SurveyError) as e:
        controller.launch("llmops stage model", answers=dict(answers, model_stage_read_streams=65))
    assert e.value.errors == ["'model_stage_read_streams' value 65 is too large (must be no more than 64)."]
    assert sorted(os.listdir(controller.workdir)) == before


def test_an_answer_holding_jinja_reaches_the_playbook_as_text(controller, staged):
    name, revision = "{{ 6 * 7 }}", "{{ lookup('ansible.builtin.env', 'HOME') }}"
    _copy_revision(controller, staged, name, revision)
    job = controller.launch("llmops stage model", answers=dict(
        awx.ui_answers(controller.template("llmops stage model")["survey_spec"]),
        stage_model_name=name, stage_model_revision=revision))
    _assert_ok(job)
    assert (job.artifacts["llmops_staged_model"], job.artifacts["llmops_staged_revision"]) == (name, revision)
    assert os.path.isfile(os.path.join(controller.llmops_root, "nvme", "models", name, revision, "config.json"))
    assert not os.path.exists(os.path.join(controller.llmops_root, "nvme", "models", "42"))


@pytest.fixture(scope="module")
def workflow_jobs(controller, staged):
    """The workflow launched with a revision other than the inventory's demo model; deploy, the P/D pair's deploy and
    verify as Check jobs."""
    _copy_revision(controller, staged, "served-by-workflow", "r2")
    return controller.run_workflow(
        WORKFLOW, answers={"stage_model_name": "served-by-workflow", "stage_model_revision": "r2", "engine_name": "vllm"},
        node_prompts={"deploy": {"job_type": "check"}, "deploy P/D pair": {"job_type": "check"},
                      "verify": {"job_type": "check"}},
        approvals={"approve deploy": "approve"})


def test_the_workflow_hands_the_stage_artifacts_to_the_deploy_node(workflow_jobs):
    stage, deploy = workflow_jobs["stage"], workflow_jobs["deploy"]
    _assert_ok(stage)
    assert stage.artifacts["site_models"] == [{"name": "served-by-workflow", "revision": "r2"}]
    # the stage artifacts are the deploy job's extra vars (untrusted, like every value not set on the template)
    text = _extravars(deploy)
    assert "!unsafe 'llmops_staged_path': !unsafe '%s'" % stage.artifacts["llmops_staged_path"] in text
    assert "!unsafe 'awx_workflow_job_name': !unsafe '%s'" % WORKFLOW in text
    assert "!unsafe 'awx_job_launch_type': !unsafe 'workflow'" in text
    assert deploy.cmdline.startswith("--check ")
    # ... and site.yml staged what the stage node staged (site_models), not the inventory's demo model
    tasks = [e["event_data"].get("task", "") for e in deploy.events if e.get("event") == "playbook_on_task_start"]
    assert any("served-by-workflow@r2" in t for t in tasks), tasks
    assert not any("tiny-llama@" in t for t in tasks), tasks


def test_the_workflow_runs_deploy_and_verify_as_check_jobs(controller, workflow_jobs):
    jobs = workflow_jobs
    assert list(jobs) == ["stage", "approve deploy", "deploy", "deploy P/D pair", "verify"], "\n".join(
        "%s: %s" % (k, j.summary(800) if hasattr(j, "summary") else j.status) for k, j in jobs.items())
    assert jobs["approve deploy"].status == "successful"  # approved: the deploy ran
    for ident, job in jobs.items():
        if ident != "approve deploy":
            _assert_ok(job)
    # every step succeeded: the workflow job is successful, its success notifications fire, diagnose never ran
    assert (jobs.status, jobs.not_run) == ("successful", ["diagnose"])
    deploy, verify = jobs["deploy"], jobs["verify"]
    assert deploy.artifacts["llmops_engine_url"].startswith("http://127.0.0.1:")
    assert deploy.artifacts["llmops_engine_name"] == "vllm"
    # check mode started nothing and said why it waited for no answer
    assert "check mode: engine_process would start engine (nothing was started)" in deploy.stdout
    assert not os.path.exists(os.path.join(controller.llmops_root, "run", "engine", "state.json"))
    # the verify node received both ancestors' artifacts
    text = _extravars(verify)
    assert "llmops_staged_revision" in text and "!unsafe 'llmops_engine_url'" in text
    verdict = verify.artifacts["llmops_transport_verdict"]
    assert verdict["measured"] is False and verdict["transport"] in ("rdma", "tcp")
    # the P/D pair would serve the revision the stage node staged, found from the inventory and extra vars alone
    staged = jobs["stage"].artifacts["llmops_staged_path"]
    assert staged.endswith(os.path.join("served-by-workflow", "r2")) and os.path.isdir(staged)
    assert "check mode: no load is sent (pd_load has no check mode)" in verify.stdout
    # the P/D deploy node ran as a check job too: it started no engine of the pair
    assert jobs["deploy P/D pair"].cmdline.startswith("--check ")
    assert not os.path.exists(os.path.join(controller.llmops_root, "run", "pd", "pd-decode", "state.json"))
    assert not os.path.exists(os.path.join(controller.llmops_root, "evidence"))


def _tasks(job):
    return [e["event_data"].get("task", "") for e in job.events if e.get("event") == "playbook_on_task_start"]


def test_the_stage_template_as_a_check_job_copies_nothing(controller, staged):
    _copy_revision(controller, staged, "checked-only", "c1")
    spec = controller.template("llmops stage model")["survey_spec"]
    job = controller.launch("llmops stage model", prompts={"job_type": "check"},
                            answers=dict(awx.ui_answers(spec), stage_model_name="checked-only", stage_model_revision="c1"))
    _assert_ok(job)
    assert job.cmdline.startswith("--check ")
    dest = os.path.join(controller.llmops_root, "nvme", "models", "checked-only", "c1")
    assert job.artifacts["llmops_staged_path"] == dest and job.artifacts["llmops_staged_revision"] == "c1"
    assert not os.path.exists(dest)


def test_the_deploy_template_runs_only_the_tagged_engine_step_as_a_check_job(controller, staged):
    """job tags on launch: the engine play (and the kernel-cache checkout it starts with) names the staged revision
    itself, with no stage play before it in the run."""
    job = controller.launch("llmops deploy", prompts={"job_type": "check", "job_tags": "engine"})
    _assert_ok(job)
    assert job.cmdline.startswith("--check ") and job.cmdline.endswith("-t engine")
    tasks = _tasks(job)
    assert "Serve the staged revision and wait for one correct answer" in tasks
    assert "Verify the cache directory before the engine starts" in tasks
    assert not {"Gather GPU, disk, RDMA and engine runtime facts", "Stage each model"} & set(tasks), tasks
    # the demo model's revision, computed in check mode by the engine play, is the one the stage job staged
    assert "engine_model_path=%s has no config.json" % staged.artifacts["llmops_staged_path"] not in job.stdout
    assert "check mode: engine_process would start engine (nothing was started)" in job.stdout
    assert job.artifacts["llmops_engine_url"] == "http://127.0.0.1:%s" % controller.task_env["LLMOPS_ENGINE_PORT"]
    assert not os.path.exists(os.path.join(controller.llmops_root, "run", "engine", "state.json"))


def test_the_diagnose_template_runs_as_a_check_job(controller):
    job = controller.launch("llmops diagnose", prompts={"job_type": "check"}, answers={"diagnose_fail_on_error": "false"})
    _assert_ok(job)
    assert job.cmdline.startswith("--check ")
    assert "not_running" in job.stdout


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A loopback OpenAI-style gateway that records the Authorization header of each request."""

    seen = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Gateway.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


def test_a_password_answer_becomes_a_header_and_never_reaches_the_output(controller):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = "tok-" + os.urandom(8).hex()
    try:
        job = controller.launch("llmops diagnose", answers={
            "diagnose_probe_gateway_url": "http://127.0.0.1:%d" % server.server_address[1],
            "diagnose_gateway_token": token, "diagnose_fail_on_error": "false"})
    finally:
        server.shutdown()
        server.server_close()
    _assert_ok(job)
    # the template's extra_vars (trusted Jinja) turned the !unsafe answer into the probe's header
    assert _Gateway.seen and set(_Gateway.seen) == {"Bearer " + token}
    assert token not in json.dumps(job.events)


def test_a_job_runs_through_the_streaming_route_awx_uses(controller, tmp_path):
    """``ansible-runner transmit | ansible-runner worker | ansible-runner process``: how AWX hands a job to an
    execution node (receptor). The worker is a local process here; ``make ee`` runs it inside the image."""
    worker_dir, out = tmp_path / "worker", tmp_path / "out"
    job = controller.launch("llmops diagnose", answers={"diagnose_fail_on_error": "false"}, run=False,
                            container_root=str(worker_dir))
    assert json.load(open(os.path.join(job.private_data_dir, "env", "envvars")))["AWX_PRIVATE_DATA_DIR"] == str(worker_dir)
    runner = os.path.join(os.path.dirname(sys.executable), "ansible-runner")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    transmit = subprocess.Popen([runner, "transmit", job.private_data_dir, "-p", job.template["playbook"]],
                                stdout=subprocess.PIPE, env=env)
    worker = subprocess.Popen([runner, "worker", "--private-data-dir", str(worker_dir)], stdin=transmit.stdout,
                              stdout=subprocess.PIPE, env=env)
    transmit.stdout.close()
    process = subprocess.run([runner, "process", str(out)], stdin=worker.stdout, capture_output=True, text=True,
                             env=env, timeout=600, check=False)
    worker.stdout.close()
    assert (transmit.wait(timeout=60), worker.wait(timeout=60), process.returncode) == (0, 0, 0), process.stderr[-2000:]
    assert (out / "artifacts" / "status").read_text() == "successful"
    assert (out / "artifacts" / "rc").read_text() == "0"
    events = [json.load(open(p)) for p in glob.glob(str(out / "artifacts" / "job_events" / "*.json"))]
    assert any(e["event"] == "playbook_on_stats" for e in events)
    assert [e for e in events if e["event"] in awx.FAILED_EVENTS and not e["event_data"].get("ignore_errors")] == []
