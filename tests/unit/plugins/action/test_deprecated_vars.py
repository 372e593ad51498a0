"""deprecated_vars through ansible-playbook: a renamed variable the play still sets is an Ansible deprecation
warning naming its replacement; one that is not set says nothing; values are never shown."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
BIN = os.path.dirname(sys.executable)
RENAMED = [{"old": "old_timeout", "new": "new_request_timeout", "meaning": "the HTTPRoute request timeout"},
           {"old": "old_dir", "new": "new_render_dir", "meaning": "where the manifests go"}]


def play(tmp_path, play_vars, extra=None, renamed=None, check=False):
    """Run one deprecated_vars task; returns (rc, whitespace-normalised output, registered result or None)."""
    result = tmp_path / "result.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False, "vars": play_vars,
        "tasks": [{"name": "Check renames", "llmops.serving.deprecated_vars": {"renamed": renamed or RENAMED},
                   "register": "r"},
                  {"name": "Save", "check_mode": False, "ansible.builtin.copy": {
                      "dest": str(result), "mode": "0644", "content": "{{ r | to_json }}"}}]}]))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    env.pop("ANSIBLE_CONFIG", None)
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", str(playbook),
           "-e", "ansible_python_interpreter=" + sys.executable]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120, check=False)
    out = " ".join((proc.stdout + proc.stderr).split())
    return proc.returncode, out, json.loads(result.read_text()) if result.exists() else None


def test_an_old_name_still_set_is_a_deprecation_warning_naming_the_new_one(tmp_path):
    rc, out, r = play(tmp_path, {"old_timeout": "s3cr3t-900s"})
    assert rc == 0, out[-3000:]
    assert ("[DEPRECATION WARNING]: old_timeout is renamed new_request_timeout (the HTTPRoute request timeout); "
            "its value is used while new_request_timeout is unset. Rename it. This feature will be removed from "
            "collection 'llmops.serving' version 1.0.0.") in out
    assert "old_dir is renamed" not in out  # the unset one is not reported
    assert "s3cr3t" not in out  # names only, never values
    assert r["deprecated"] == ["old_timeout"] and r["changed"] is False


def test_every_place_a_variable_can_be_set_counts_and_a_null_value_too(tmp_path):
    """An extra var (-e) and a play var with the value null are both set: each is reported, in the role's order,
    in check mode too."""
    rc, out, r = play(tmp_path, {"old_dir": None}, extra={"old_timeout": 5}, check=True)
    assert rc == 0, out[-3000:]
    assert r["deprecated"] == ["old_timeout", "old_dir"]
    assert out.count("[DEPRECATION WARNING]:") == 2
    assert "[DEPRECATION WARNING]: old_dir is renamed new_render_dir" in out


def test_nothing_set_says_nothing(tmp_path):
    rc, out, r = play(tmp_path, {"new_request_timeout": "900s"})
    assert rc == 0, out[-3000:]
    assert "DEPRECATION" not in out and r["deprecated"] == []


def test_a_rename_without_its_new_name_is_refused_naming_the_field(tmp_path):
    rc, out, r = play(tmp_path, {"old_timeout": 1}, renamed=[{"old": "old_timeout", "meaning": "x"}])
    assert rc != 0 and r is None
    assert "missing required arguments: new found in renamed" in out
