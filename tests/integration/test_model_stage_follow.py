"""The model_stage role follows its background copy in a flat loop (llmops.serving.model_stage_follow).

A task file that includes itself once per poll raises RecursionError after about 300 polls (each
include nests the strategy's task iteration once more), which is ~50 min at the default 10 s and less
than a 700 GiB copy under a fleet cap takes. These tests run ansible-playbook for real against a job
that outlasts 400 polls, and against real copies through the role, on the working tree (a private
collections path points at it, nothing is installed).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from llmops_testlib import ROOT, ansible_env, recap
from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

PLAYBOOK = os.path.join(ROOT, "tests", "integration", "playbooks", "stage_follow.yml")
ROLE_PLAYBOOK = os.path.join(ROOT, "tests", "integration", "playbooks", "argspec_role.yml")
POLLS = 400
LINE = re.compile(r"^\[localhost\] fake@rev: (.*)$", re.M)

# A stand-in for the copy: rewrites its progress file (atomically, like model_stage) until told to stop.
FAKE_JOB = r'''
import json, os, sys, time
progress, stop, mode = sys.argv[1:4]
time.sleep(0.3)  # the first polls find only the earlier run's progress file
total, i, deadline = 1 << 40, 0, time.monotonic() + 300
while not os.path.exists(stop) and time.monotonic() < deadline:
    i += 1
    rec = {"state": "copying", "bytes_done": i * (1 << 28), "bytes_total": total, "files_done": i // 50,
           "files_total": 141, "rate_bytes_per_second": 2.5e9, "eta_seconds": 400.0 - i / 10.0,
           "message": "NOT-FOR-THE-LOG hf_0123456789"}
    with open(progress + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(progress + ".tmp", progress)
    time.sleep(0.003)
if mode == "fail":
    sys.stderr.write("copy failed: the dest disk went read-only\n")
    sys.exit(3)
print("copied")
'''


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """ANSIBLE_COLLECTIONS_PATH holding llmops.serving as a link to this working tree."""
    tree = tmp_path_factory.mktemp("follow-coll")
    os.makedirs(str(tree / "ansible_collections" / "llmops"))
    os.symlink(ROOT, str(tree / "ansible_collections" / "llmops" / "serving"))
    return str(tree)


def _env(tmp_path, collections):
    return ansible_env(tmp_path, 18009, ANSIBLE_COLLECTIONS_PATH=collections,
                       ANSIBLE_ASYNC_DIR=str(tmp_path / "async"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))


def _playbook(playbook, extra):
    return [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), playbook, "-i", "localhost,",
            "-c", "local", "-e", json.dumps(dict(extra, ansible_python_interpreter=sys.executable))]


def _fake_job(tmp_path, mode):
    script = tmp_path / "fake_job.py"
    script.write_text(FAKE_JOB)
    progress = tmp_path / "progress.json"
    # what a finished earlier run leaves behind: never shown as this run's progress
    progress.write_text(json.dumps({"state": "done", "bytes_done": 7, "bytes_total": 7, "rate_bytes_per_second": 1,
                                    "eta_seconds": 0}))
    stop = tmp_path / "stop"
    return [sys.executable, str(script), str(progress), str(stop), mode], str(progress), stop


def _follow(tmp_path, collections, mode, stop_after, **extra):
    """Run the follow playbook; create the stop file once ``stop_after`` progress lines were printed."""
    argv, progress, stop = _fake_job(tmp_path, mode)
    if stop_after == 0:
        stop.write_text("")
    cmd = _playbook(PLAYBOOK, dict({"follow_job_argv": argv, "follow_progress_file": progress,
                                    "follow_poll_interval": 0.001}, **extra))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path, collections), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(240, proc.kill)
    timer.start()
    out, lines = [], 0
    try:
        for line in proc.stdout:
            out.append(line)
            if line.startswith("[localhost] fake@rev: "):
                lines += 1
                if lines == stop_after:
                    stop.write_text("")
        proc.wait()
    finally:
        timer.cancel()
    return proc.returncode, "".join(out)


def test_job_outlasting_400_polls_is_followed_flat_with_progress_each_poll(tmp_path, collections):
    rc, out = _follow(tmp_path, collections, "ok", POLLS)
    assert rc == 0, out[-3000:]
    assert "RecursionError" not in out and "recursion" not in out.lower()
    progress = LINE.findall(out)
    assert len(progress) >= POLLS
    # every poll line shows bytes, rate and ETA, read afresh: the byte counts keep moving
    copying = [p for p in progress if p.startswith("copying: ")]
    assert len(copying) >= POLLS - 150
    assert all(re.search(r"/ 1\.0 TiB \(\d+\.\d%\), \d+/141 files, 2\.3 GiB/s, ETA \d", p) for p in copying), copying[:3]
    assert len(set(copying)) > 50
    # the earlier run's "done" file is never passed off as this run's progress; only numbers are printed
    assert not [p for p in progress if p.startswith("done")]
    assert progress[0].startswith("waiting for the job to report progress")
    assert "NOT-FOR-THE-LOG" not in out
    result = re.search(r"FOLLOW-RESULT polls=(\d+) rc=(\d+) stdout=(\w+)", out)
    assert result, out[-2000:]
    assert int(result.group(1)) >= POLLS and result.group(2, 3) == ("0", "copied")
    assert recap(out)["failed"] == 0
    assert os.listdir(str(tmp_path / "async")) == [], "the job's status file is removed once read"


def test_failed_job_fails_the_task_with_its_result(tmp_path, collections):
    rc, out = _follow(tmp_path, collections, "fail", 0)
    assert rc == 2, out[-3000:]
    assert "fatal: [localhost]" in out
    assert "non-zero return code" in out and "rc: 3" in out
    assert "the dest disk went read-only" in out
    assert "FOLLOW-RESULT" not in out
    assert recap(out)["failed"] == 1


def test_job_that_never_reports_is_given_up_after_timeout(tmp_path, collections):
    # a wrapper killed on the target never writes a result: the follow is bounded, the job left alone
    try:
        rc, out = _follow(tmp_path, collections, "ok", None, follow_timeout=1, follow_poll_interval=0.05)
    finally:
        (tmp_path / "stop").write_text("")
    assert rc == 2, out[-3000:]
    assert "did not finish within timeout (1 s); it may still be running on the target" in out
    assert 5 <= len(LINE.findall(out)) <= 40
    assert recap(out)["failed"] == 1


def _role(tmp_path, collections, models, **extra):
    shared = tmp_path / "shared"
    role_vars = dict({
        "role_name": "llmops.serving.model_stage",
        "model_stage_src_root": str(shared), "model_stage_dest_root": str(tmp_path / "nvme"),
        "model_stage_models": models, "model_stage_verify": "size", "model_stage_fsync": False,
        "model_stage_progress_dir": str(tmp_path / "progress"), "model_stage_poll_interval": 1,
        "model_stage_fleet_slots_dir": str(shared / ".slots"), "model_stage_fleet_read_streams": 2,
        "model_stage_textfile_dir": str(tmp_path), "model_stage_keep_revisions": 0,
    }, **extra)
    proc = subprocess.run(_playbook(ROLE_PLAYBOOK, role_vars), cwd=ROOT, env=_env(tmp_path, collections),
                          capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_role_follows_a_real_copy_and_records_its_result(tmp_path, collections):
    _stage_synth.write_checkpoint(str(tmp_path / "shared" / "tiny" / "r1"), 1 << 20, shards=2)
    rc, out = _role(tmp_path, collections, [{"name": "tiny", "revision": "r1"}])
    assert rc == 0, out[-3000:]
    assert "TASK [llmops.serving.model_stage : Follow the copy of tiny@r1]" in out
    assert os.path.isfile(str(tmp_path / "nvme" / "tiny" / "r1" / ".llmops-staged.json"))
    # the follow task hands the copy's own result to model_stage_results (the metrics are rendered from it)
    prom = (tmp_path / "llmops_model_stage.prom").read_text()
    size = sum(os.path.getsize(str(p)) for p in (tmp_path / "shared" / "tiny" / "r1").iterdir())
    assert 'llmops_model_stage_bytes{model="tiny",revision="r1",verify="size"} %d' % size in prom
    assert recap(out)["failed"] == 0


def test_role_fails_with_the_copy_message_when_the_copy_fails(tmp_path, collections):
    os.makedirs(str(tmp_path / "shared" / "tiny"))
    rc, out = _role(tmp_path, collections, [{"name": "tiny", "revision": "missing"}])
    assert rc == 2, out[-3000:]
    task = out[out.index("TASK [llmops.serving.model_stage : Follow the copy of tiny@missing]"):out.index("PLAY RECAP")]
    assert "fatal: [localhost]: FAILED!" in task, task
    assert "Module failed: src: %s is not a directory; point src at the revision directory" % (
        tmp_path / "shared" / "tiny" / "missing") in task
    assert recap(out)["failed"] == 1
