"""The release artifact and the changelog.

The artifact is built by the Makefile's own ``install`` recipe (``ansible-galaxy collection build`` from
galaxy.yml, then ``ansible-galaxy collection install``) into a temporary BUILD directory, so that what is
checked here is what ``make install`` / ``make demo`` install and what Galaxy would publish.
``build_ignore`` semantics: https://docs.ansible.com/ansible/latest/dev_guide/developing_collections_distributing.html
The changelog is antsibull-changelog's: https://github.com/ansible-community/antsibull-changelog/blob/main/docs/changelogs.md
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import subprocess
import sys
import tarfile

import shutil

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

# What users run, and nothing else, at the top of the artifact.
TOP_LEVEL = {"MANIFEST.json", "FILES.json", "README.md", "LICENSE", "CHANGELOG.md", "changelogs", "meta",
             "playbooks", "plugins", "roles"}
# Directories whose every file ships (where they exist in the source tree).
RUNTIME_DIRS = ("plugins", "roles", "playbooks", "meta")
NEVER = ("tests/*", "extensions/*", "benchmarks/*", "docs/*", "inventories/*", ".ci/*", "Makefile", "conftest.py",
         "ansible.cfg", "pytest.ini", "requirements*", "*.png", "*/__pycache__/*", "*.pyc", ".*",
         "changelogs/fragments/*", "changelogs/config.yaml", "galaxy.yml")


def _run(cmd, **kw):
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_NOCOLOR="1")
    env.update(kw.pop("env", {}))
    return subprocess.run(cmd, cwd=kw.pop("cwd", ROOT), env=env, capture_output=True, text=True, timeout=300,
                          check=False, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``make install`` into a temporary BUILD (``-o venv``: the virtual environment is the one running this)."""
    build = tmp_path_factory.mktemp("build")
    proc = _run(["make", "-s", "-o", "venv", "install", "BUILD=%s" % build])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    tarballs = glob.glob(str(build / "dist" / "llmops-serving-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    with tarfile.open(tarballs[0]) as tar:
        members = {m.name.rstrip("/"): m for m in tar.getmembers()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    return {"build": build, "tarball": tarballs[0], "members": members, "manifest": manifest,
            "collections": str(build / "collections")}


def _runtime_files():
    """Tracked files users run, as they exist in the working tree now."""
    out = _run(["git", "ls-files", "-z", "--"] + list(RUNTIME_DIRS)).stdout
    return sorted(p for p in out.split("\0") if p and os.path.isfile(os.path.join(ROOT, p)))


def test_artifact_holds_only_what_users_run(installed):
    names = installed["members"]
    assert {n.split("/", 1)[0] for n in names} == TOP_LEVEL
    leaked = sorted(n for n in names if any(fnmatch.fnmatch(n, pat) for pat in NEVER))
    assert leaked == []
    assert [n for n in names if n.startswith("changelogs/")] == ["changelogs/changelog.yaml"]
    # well under the 2 MB of the artifact that shipped tests, benchmark plots and fixtures
    assert os.path.getsize(installed["tarball"]) < 1024 * 1024


def test_artifact_holds_everything_users_run(installed):
    names = installed["members"]
    missing = [p for p in _runtime_files() + ["README.md", "LICENSE", "CHANGELOG.md", "changelogs/changelog.yaml"]
               if p not in names]
    assert missing == []
    with open(os.path.join(ROOT, "galaxy.yml")) as f:
        galaxy = yaml.safe_load(f)
    info = installed["manifest"]["collection_info"]
    assert [info[k] for k in ("namespace", "name", "version")] == [galaxy[k] for k in ("namespace", "name", "version")]
    assert info["dependencies"] == galaxy["dependencies"]


def test_make_install_gives_a_collection_that_runs(installed):
    coll = os.path.join(installed["collections"], "ansible_collections", "llmops", "serving")
    assert sorted(os.listdir(coll)) == sorted(TOP_LEVEL)
    cfg = installed["build"] / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = {"ANSIBLE_COLLECTIONS_PATH": installed["collections"], "ANSIBLE_CONFIG": str(cfg)}
    # the installed playbooks resolve the installed roles and modules
    proc = _run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "--syntax-check",
                 "llmops.serving.site", "llmops.serving.verify_transport", "llmops.serving.stop"],
                env=env, cwd=str(installed["build"]))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def _changelog(*args):
    return _run([os.path.join(BIN, "antsibull-changelog")] + list(args))


def test_changelog_fragments_lint():
    proc = _changelog("lint")
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")
    proc = _changelog("lint-changelog-yaml", "changelogs/changelog.yaml")
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")
    # ansible-test sanity (changelog) accepts only .yml / .yaml fragments and .keep
    for name in os.listdir(os.path.join(ROOT, "changelogs", "fragments")):
        assert name == ".keep" or os.path.splitext(name)[1] in (".yml", ".yaml"), name


def test_changelog_md_is_generated_from_changelog_yaml(tmp_path):
    out = tmp_path / "CHANGELOG.md"
    proc = _changelog("generate", "--output", str(out), "--output-format", "md")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        assert f.read() == out.read_text(), "CHANGELOG.md differs: run antsibull-changelog generate"


# ---- one release: the collection that runs a job is the release of its playbooks -------------------------------

from ansible_collections.llmops.serving.plugins.module_utils.common import _release  # noqa: E402
from ansible_collections.llmops.serving.tests.lib import awx_harness  # noqa: E402

TEMPLATE_PLAYBOOKS = sorted({t["playbook"] for t in awx_harness.load_controller()["controller_templates"]})


def _galaxy(directory, version, name="serving"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "galaxy.yml").write_text("namespace: llmops\nname: %s\nversion: %s\n" % (name, version))
    return directory


def _manifest(directory, version):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "MANIFEST.json").write_text(json.dumps(
        {"collection_info": {"namespace": "llmops", "name": "serving", "version": version}}))
    return directory


def test_the_running_collection_is_found_next_to_its_own_files():
    """In a source tree, the module_utils file sits in the collection whose galaxy.yml names this repository."""
    assert os.path.realpath(_release.running_collection_dir()) == os.path.realpath(ROOT)
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as f:
        version = yaml.safe_load(f)["version"]
    assert _release.read_release(ROOT, "x") == {"collection": "llmops.serving", "version": version,
                                                "file": os.path.join(ROOT, "galaxy.yml")}


def test_a_matching_release_passes_and_manifest_wins_over_galaxy(tmp_path):
    # an installed collection (MANIFEST.json) running the playbooks of a checkout (galaxy.yml) of the same version
    ee = _manifest(tmp_path / "ee", "1.4.0")
    (ee / "galaxy.yml").write_text("namespace: llmops\nname: serving\nversion: 9.9.9\n")  # MANIFEST.json is read first
    project = _galaxy(tmp_path / "project", "1.4.0")
    result = _release.compare(str(project), str(ee))
    assert (result["collection_version"], result["playbooks_version"]) == ("1.4.0", "1.4.0")
    assert result["collection_file"] == str(ee / "MANIFEST.json")
    assert result["playbooks_file"] == str(project / "galaxy.yml")


@pytest.mark.parametrize("project_version,name", [("1.5.0", "serving"), ("1.4.0", "other")])
def test_a_mismatch_fails_naming_both_releases_and_the_fix(tmp_path, project_version, name):
    ee = _manifest(tmp_path / "ee", "1.4.0")
    project = _galaxy(tmp_path / "project", project_version, name)
    with pytest.raises(_release.ReleaseError) as e:
        _release.compare(str(project), str(ee))
    assert e.value.reason == "mismatch" and e.value.file == str(ee / "MANIFEST.json")
    msg = str(e.value)
    assert "llmops.%s %s" % (name, project_version) in msg and "llmops.serving 1.4.0" in msg
    assert "rebuild the execution environment from this commit" in msg
    assert "sync the project to the release the execution environment carries (llmops.serving 1.4.0)" in msg


def test_a_missing_manifest_fails_naming_the_directory(tmp_path):
    ee = _manifest(tmp_path / "ee", "1.4.0")
    (tmp_path / "bare").mkdir()
    with pytest.raises(_release.ReleaseError) as e:
        _release.compare(str(tmp_path / "bare"), str(ee))
    assert e.value.reason == "missing" and e.value.file == str(tmp_path / "bare" / "MANIFEST.json")
    assert "playbook_release_dir: %s holds neither MANIFEST.json nor galaxy.yml" % (tmp_path / "bare") in str(e.value)
    with pytest.raises(_release.ReleaseError) as e:
        _release.compare(str(ee), str(tmp_path / "bare"))
    assert e.value.reason == "missing" and str(e.value).startswith("the running collection: ")


def test_an_unreadable_or_incomplete_release_file_is_refused_without_quoting_it(tmp_path):
    ee = _manifest(tmp_path / "ee", "1.4.0")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "MANIFEST.json").write_text('{"collection_info": {"version": "secret-ish"')
    with pytest.raises(_release.ReleaseError) as e:
        _release.compare(str(bad), str(ee))
    assert e.value.reason == "unreadable" and "secret-ish" not in str(e.value)
    (bad / "MANIFEST.json").write_text(json.dumps({"collection_info": {"namespace": "llmops", "version": 1.4}}))
    with pytest.raises(_release.ReleaseError) as e:
        _release.compare(str(bad), str(ee))
    assert e.value.reason == "invalid" and "no namespace, name and version" in str(e.value)
    (bad / "MANIFEST.json").unlink()
    os.mkfifo(str(bad / "galaxy.yml"))  # a FIFO in its place is refused, not waited on
    with pytest.raises(_release.ReleaseError) as e:
        _release.compare(str(bad), str(ee))
    assert e.value.reason == "unreadable"


@pytest.mark.parametrize("playbook", TEMPLATE_PLAYBOOKS)
def test_every_template_playbook_checks_the_release_before_anything_else(playbook):
    with open(os.path.join(ROOT, playbook), encoding="utf-8") as f:
        plays = yaml.safe_load(f)
    first = plays[0].get("pre_tasks", [{}])[0]
    assert first.get("ansible.builtin.import_tasks") == "tasks/release_check.yml", playbook
    with open(os.path.join(ROOT, "playbooks", "tasks", "release_check.yml"), encoding="utf-8") as f:
        (task,) = yaml.safe_load(f)
    assert task["llmops.serving.release_check"] == {"playbook_release_dir": "{{ playbook_dir }}/.."}
    assert task["run_once"] is True and "always" in task["tags"]


def test_a_job_whose_project_is_another_release_fails_at_its_first_task(tmp_path):
    """The task file through the action plugin, the collection being this source tree (galaxy.yml): the same
    playbook passes next to a galaxy.yml of this version and fails, before its next task, next to another."""
    collections = tmp_path / "collections"
    (collections / "ansible_collections" / "llmops").mkdir(parents=True)
    os.symlink(ROOT, str(collections / "ansible_collections" / "llmops" / "serving"))
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as f:
        version = yaml.safe_load(f)["version"]
    book = tmp_path / "project" / "playbooks"
    (book / "tasks").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "playbooks", "tasks", "release_check.yml"), str(book / "tasks"))
    (book / "job.yml").write_text("- hosts: localhost\n  gather_facts: false\n  pre_tasks:\n"
                                  "    - ansible.builtin.import_tasks: tasks/release_check.yml\n"
                                  "  tasks:\n    - ansible.builtin.debug: {msg: reached}\n")
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = {"ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_CONFIG": str(cfg)}
    results = {}
    for label, v in (("same", version), ("other", version + "-next")):
        _galaxy(tmp_path / "project", v)
        # a job that selects other tags still runs the check (tags: always)
        results[label] = _run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                               "--tags", "none-of-these", str(book / "job.yml")], env=env, cwd=str(tmp_path))
    assert results["same"].returncode == 0, results["same"].stdout[-3000:]
    assert "ok=1 " in results["same"].stdout, results["same"].stdout[-3000:]  # the check ran; the rest is untagged
    other = results["other"]
    assert other.returncode == 2, other.stdout[-3000:]
    assert "the playbooks are llmops.serving %s-next" % version in other.stdout
    assert "rebuild the execution environment from this commit" in other.stdout
    assert "failed=1" in other.stdout and "ok=0" in other.stdout
