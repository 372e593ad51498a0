"""playbooks/upgrade.yml one phase per run (``upgrade_phase``), as the AWX workflow ``llmops upgrade`` runs it.

Run on inventories/local against a stand-in engine: a ``sleep`` process started by ``engine_process`` with a serving
record written by ``serving_record``, exactly what the engine role leaves after A answered correctly. The phases
that never start an engine are run for real: an unknown phase is refused by the role's argument spec before any task,
the stage phase stages B with A pinned while A's process keeps running and exports A as the artifact
``llmops_upgrade_from``, and a phase that could not roll back is refused before anything changes. The switch itself
(canary, roll) and the soak need a real engine: tests/integration/test_upgrade_local.py runs that path with
``upgrade_phase`` left at ``all``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.tests.lib import stage_synth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))))
BIN = os.path.dirname(sys.executable)
B = {"name": "m", "revision": "b"}


def _env(root):
    return dict(os.environ, LLMOPS_ROOT=str(root), ANSIBLE_NOCOLOR="1", ANSIBLE_SHOW_CUSTOM_STATS="1",
                ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="default",
                ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"))


def _play(root, playbook, extra, *args, inventory=None):
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", inventory or os.path.join(ROOT, "inventories", "local"),
           playbook, "-e", json.dumps(dict(extra, ansible_python_interpreter=sys.executable))] + list(args)
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(root), capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _upgrade(root, phase, *args, **extra):
    return _play(root, os.path.join(ROOT, "playbooks", "upgrade.yml"), dict(extra, upgrade_model=B, upgrade_phase=phase),
                 *args)


def _engine(root, serving):
    """The stand-in engine: a running process and the serving record of revision ``serving`` of model m."""
    os.makedirs(os.path.join(root, "nvme", "models", "m", serving), exist_ok=True)
    book = os.path.join(root, "engine.yml")
    with open(book, "w", encoding="utf-8") as f:
        f.write("""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - llmops.serving.engine_process: {name: engine, run_dir: "%(run)s", state: "{{ want }}", command: [sleep, "600"]}
      register: proc
    - llmops.serving.serving_record: {run_dir: "%(run)s", name: engine, model_path: "%(path)s", spec_hash: "{{ proc.spec_hash }}",
                                      state: present}
      when: want == 'started'
    - ansible.builtin.debug: {msg: "pid={{ proc.pid | default('-') }}"}
""" % {"run": os.path.join(root, "run"), "path": os.path.join(root, "nvme", "models", "m", serving)})
    return book


@pytest.fixture
def engine(tmp_path):
    """A running A (m@a) with its record; the pid; stopped afterwards."""
    book = _engine(tmp_path, "a")
    rc, out = _play(tmp_path, book, {"want": "started"}, inventory="localhost,")
    assert rc == 0, out[-3000:]
    assert _pid_in(out).isdigit(), out[-3000:]
    yield book, _pid_in(out)
    _play(tmp_path, book, {"want": "stopped"}, inventory="localhost,")


def _pid_in(out):
    return re.search(r"pid=(\d+|-)", out).group(1)


def _pid(tmp_path, book):
    rc, out = _play(tmp_path, book, {"want": "status"}, inventory="localhost,")
    assert rc == 0, out[-3000:]
    return _pid_in(out)


def test_an_unknown_phase_is_refused_by_name_before_any_task(tmp_path):
    rc, out = _upgrade(tmp_path, "canery")
    assert rc != 0
    assert "value of upgrade_phase must be one of: all, stage, cache, canary, roll, soak, got: canery" in out
    assert "Read the engine that serves now" not in out and "Upgrade the local engine" not in out


def test_the_stage_phase_stages_b_with_a_pinned_and_exports_a_while_a_keeps_running(tmp_path, engine):
    book, pid = engine
    stage_synth.write_checkpoint(str(tmp_path / "shared" / "models" / "m" / "b"), 4 * 1024 * 1024, shards=2)
    rc, out = _upgrade(tmp_path, "stage")
    assert rc == 0, out[-4000:]
    assert os.path.isfile(tmp_path / "nvme" / "models" / "m" / "b" / "model-00002-of-00002.safetensors")
    assert os.path.isdir(tmp_path / "nvme" / "models" / "m" / "a")
    assert _pid(tmp_path, book) == pid  # A was never touched
    stats = " ".join(out.split("CUSTOM STATS")[1].split())
    assert "llmops_upgrade_from: localhost: model: m model_path: %s revision: a" % (
        tmp_path / "nvme" / "models" / "m" / "a") in stats
    # nothing but the stage: no kernel cache, no switch
    assert "TASK [llmops.serving.engine : Start" not in out and "Serve B" not in out


def test_a_phase_that_could_not_roll_back_is_refused_before_anything_changes(tmp_path):
    """The host already serves B and no llmops_upgrade_from names its A: the soak (and a roll) would have nowhere
    to return to on a failure, so it is refused; the engine keeps running."""
    book = _engine(tmp_path, "b")
    rc, out = _play(tmp_path, book, {"want": "started"}, inventory="localhost,")
    assert rc == 0, out[-3000:]
    try:
        pid = _pid(tmp_path, book)
        assert pid.isdigit()
        for phase in ("soak", "roll"):
            rc, out = _upgrade(tmp_path, phase)
            assert rc != 0
            msg = " ".join(out.split())
            assert ("upgrade (phase %s): localhost has no revision A to roll back to: the engine serves m@b already "
                    "and llmops_upgrade_from" % phase) in msg, out[-3000:]
            assert "Serve B" not in out and "Soak" not in out
            assert _pid(tmp_path, book) == pid
        # given the stage phase's artifact, the same soak gets past the refusal (a Check job: no engine is started)
        a = {"localhost": {"model": "m", "revision": "a", "model_path": str(tmp_path / "nvme" / "models" / "m" / "a")}}
        rc, out = _upgrade(tmp_path, "soak", "--check", llmops_upgrade_from=a)
        assert rc == 0, out[-3000:]
        assert "phase soak of the upgrade to m@b on localhost (A: m@a): B keeps running" in " ".join(out.split())
        assert _pid(tmp_path, book) == pid
    finally:
        _play(tmp_path, book, {"want": "stopped"}, inventory="localhost,")


def test_a_phase_with_nothing_serving_is_refused_before_anything_changes(tmp_path):
    rc, out = _upgrade(tmp_path, "canary")
    assert rc != 0
    assert "upgrade (phase canary): the engine engine under %s is absent" % (tmp_path / "run") in " ".join(out.split())
    assert "Stage B" not in out and "Serve B" not in out
