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
    heads = [_run(["git", "rev-parse", "HEAD"]).stdout.strip()]
    proc = _run(["make", "-s", "-o", "venv", "install", "BUILD=%s" % build])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    heads.append(_run(["git", "rev-parse", "HEAD"]).stdout.strip())
    tarballs = glob.glob(str(build / "dist" / "llmops-serving-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    with tarfile.open(tarballs[0]) as tar:
        members = {m.name.rstrip("/"): m for m in tar.getmembers()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    return {"build": build, "tarball": tarballs[0], "members": members, "manifest": manifest,
            "collections": str(build / "collections"), "heads": heads}


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
    # the playbooks' revision is AWX's awx_project_revision in a job (the job's project copy has no .git), and an
    # AWX job that cannot tell stops
    assert task["llmops.serving.release_check"] == {"playbook_release_dir": "{{ playbook_dir }}/..",
                                                    "playbook_revision": "{{ awx_project_revision | default(omit) }}",
                                                    "require_identity": "{{ awx_job_id is defined }}"}
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


# ---- one build: the commit the artifact was built from is the playbooks' revision -------------------------------
# galaxy.yml said 0.1.0 from the first commit on (git log -S'version: 0.1.0' -- galaxy.yml), so comparing versions let
# an execution environment built from any commit run beside any later project. The build identity is the commit
# awx/ee/build_artifact.py writes into the built tree; the playbooks' revision is AWX's awx_project_revision
# (ansible/awx awx/main/models/jobs.py Job.awx_meta_vars: self.project.scm_revision) or the checkout's HEAD.

import hashlib  # noqa: E402
import re  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

BUILDER = os.path.join(ROOT, "awx", "ee", "build_artifact.py")
X, Y = "1" * 40, "2" * 40


def _git(repo, *args):
    proc = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                           "-c", "commit.gpgsign=false"] + list(args), capture_output=True, text=True, check=False,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _artifact(directory, identity=None, files=None, listed=True, version="0.1.0"):
    """An installed artifact as ansible-galaxy lays it out: MANIFEST.json, FILES.json (sha256 of every file) and,
    when ``identity`` is given, meta/build_identity.json (listed in FILES.json unless ``listed`` is false)."""
    _manifest(directory, version)
    files = dict(files or {})
    if identity is not None:
        files[_release.BUILD_IDENTITY_FILE] = json.dumps(identity)
    entries = []
    for name, text in sorted(files.items()):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if listed or name != _release.BUILD_IDENTITY_FILE:
            entries.append({"name": name, "ftype": "file", "chksum_type": "sha256",
                            "chksum_sha256": hashlib.sha256(text.encode()).hexdigest(), "format": 1})
    (directory / "FILES.json").write_text(json.dumps({"files": entries, "format": 1}))
    return directory


def _ident(commit, dirty=False):
    return {"format": 1, "commit": commit, "dirty": dirty, "version": "0.1.0"}


def test_another_commit_of_the_same_version_fails_naming_both_commits_and_the_fix(tmp_path):
    ee = _artifact(tmp_path / "ee", _ident(X))
    project = _galaxy(tmp_path / "project", "0.1.0")
    assert _release.compare(str(project), str(ee))["collection_version"] == "0.1.0"  # the version check passes
    out = _release.check_identity(str(project), str(ee), Y)
    assert (out["verdict"], out["reason"]) == ("mismatch", "commit_mismatch")
    assert "built from commit %s but the playbooks are commit %s" % (X, Y) in out["why"]
    assert "rebuild the execution environment from the playbooks' commit %s" % Y in out["why"]
    assert "pin the project's scm_branch to the build's commit %s" % X in out["why"]
    assert (out["build_commit"], out["playbooks_revision"], out["playbooks_revision_source"]) == (X, Y, "playbook_revision")


def test_the_same_commit_passes(tmp_path):
    ee = _artifact(tmp_path / "ee", _ident(X))
    out = _release.check_identity(str(_galaxy(tmp_path / "project", "0.1.0")), str(ee), X.upper())
    assert (out["verdict"], out["reason"]) == ("ok", "same_commit")


@pytest.mark.parametrize("case,reason", [
    ("no identity", "no_build_identity"),
    ("source tree", "source_tree"),
    ("added after the build", "identity_not_in_artifact"),
    ("no commit", "invalid_build_identity"),
    ("not from git", "build_not_from_git"),
    ("no playbooks revision", "no_playbook_revision"),
    ("bad playbooks revision", "invalid_playbook_revision"),
])
def test_when_it_cannot_tell_it_says_why(tmp_path, case, reason):
    ee, revision = tmp_path / "ee", X
    if case == "no identity":
        _artifact(ee)
    elif case == "source tree":
        _galaxy(ee, "0.1.0")
    elif case == "added after the build":
        _artifact(ee, _ident(X), listed=False)
    elif case == "no commit":
        _artifact(ee, {"format": 1, "commit": "main", "dirty": False})
    elif case == "not from git":
        _artifact(ee, {"format": 1, "commit": None, "dirty": None, "why": "not built from a git checkout (x)"})
    else:
        _artifact(ee, _ident(X))
        revision = None if case == "no playbooks revision" else "HEAD~1"
    out = _release.check_identity(str(_galaxy(tmp_path / "project", "0.1.0")), str(ee), revision)
    assert (out["verdict"], out["reason"]) == ("unknown", reason)
    assert out["why"]


def test_a_build_from_uncommitted_changes_passes_only_with_the_playbooks_files(tmp_path):
    files = {"roles/engine/tasks/main.yml": "- debug: {}\n", "playbooks/site.yml": "---\n"}
    ee = _artifact(tmp_path / "ee", _ident(X, dirty=True), files)
    project = _galaxy(tmp_path / "project", "0.1.0")
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    assert _release.check_identity(str(project), str(ee), X)["reason"] == "same_files"
    (project / "roles" / "engine" / "tasks" / "main.yml").write_text("- fail: {}\n")
    (project / "roles" / "engine" / "tasks" / "new.yml").write_text("---\n")
    out = _release.check_identity(str(project), str(ee), X)
    assert (out["verdict"], out["reason"]) == ("mismatch", "files_differ")
    assert "roles/engine/tasks/main.yml, roles/engine/tasks/new.yml" in out["why"]
    # another commit with uncommitted changes is another build, whatever the files
    assert _release.check_identity(str(project), str(ee), Y)["reason"] == "commit_mismatch"


def test_the_playbooks_revision_is_read_from_the_checkout_root_only(tmp_path):
    repo = _galaxy(tmp_path / "repo", "0.1.0")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert _release.playbook_revision(str(repo))["commit"] == head  # a loose ref
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert _release.playbook_revision(str(repo))["commit"] == head  # packed-refs
    _git(repo, "checkout", "-q", "--detach")
    assert _release.playbook_revision(str(repo))["commit"] == head  # a detached HEAD
    _git(repo, "checkout", "-q", "main")
    _git(repo, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "other")
    assert _release.playbook_revision(str(tmp_path / "wt"))["commit"] == head  # .git is a gitdir: file
    # the given revision wins; a directory inside a checkout is not the checkout
    assert _release.playbook_revision(str(repo), Y)["commit"] == Y
    (repo / "playbooks").mkdir()
    got = _release.playbook_revision(str(repo / "playbooks"))
    assert (got["commit"], got["unknown"]) == (None, "no_playbook_revision")
    # a hostile HEAD is a reason, not a crash
    (repo / ".git" / "HEAD").write_text("ref: ../../etc/passwd\n")
    assert _release.playbook_revision(str(repo))["unknown"] == "no_playbook_revision"


def _mini_collection(repo):
    """A git repository holding a tiny collection ansible-galaxy can build (version 0.1.0 at every commit)."""
    repo.mkdir()
    (repo / "galaxy.yml").write_text("namespace: llmops\nname: serving\nversion: 0.1.0\nreadme: README.md\n"
                                     "authors: [t]\n")
    (repo / "README.md").write_text("x\n")
    (repo / "roles" / "r" / "tasks").mkdir(parents=True)
    (repo / "roles" / "r" / "tasks" / "main.yml").write_text("---\n- ansible.builtin.debug: {msg: v1}\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    return _git(repo, "rev-parse", "HEAD")


def _build_and_install(repo, out):
    tarball = _run([sys.executable, BUILDER, "--source", str(repo), "--galaxy", os.path.join(BIN, "ansible-galaxy"),
                    "--output-path", str(out / "dist")])
    assert tarball.returncode == 0, tarball.stdout + tarball.stderr
    with tarfile.open(tarball.stdout.strip()) as tar:
        tar.extractall(str(out / "installed"), filter="data")
    return out / "installed"


def test_playbooks_many_commits_newer_than_the_build_fail_though_the_version_is_the_same(tmp_path):
    """The artifact built (by the build recipe) at the first commit, the playbooks 100 commits later: the version
    check alone passes, the build identity fails naming both commits."""
    repo = tmp_path / "repo"
    first = _mini_collection(repo)
    installed = _build_and_install(repo, tmp_path)
    identity = json.loads((installed / "meta" / "build_identity.json").read_text())
    assert identity == {"format": 1, "commit": first, "dirty": False, "version": "0.1.0"}
    for n in range(99):
        _git(repo, "commit", "-q", "--allow-empty", "-m", "c%d" % n)
    (repo / "roles" / "r" / "tasks" / "main.yml").write_text("---\n- ansible.builtin.debug: {msg: v2}\n")
    _git(repo, "commit", "-q", "-am", "the hundredth")
    head = _git(repo, "rev-parse", "HEAD")
    assert _git(repo, "rev-list", "--count", "%s..HEAD" % first) == "100"
    assert _release.compare(str(repo), str(installed))["playbooks_version"] == "0.1.0"  # what passed before
    out = _release.check_identity(str(repo), str(installed))
    assert (out["verdict"], out["reason"], out["playbooks_revision_source"]) == ("mismatch", "commit_mismatch", "git HEAD")
    assert first in out["why"] and head in out["why"]
    # the build of the same commit passes; a build with uncommitted changes records them
    assert _release.check_identity(str(repo), str(_build_and_install(repo, tmp_path / "again")))["verdict"] == "ok"
    (repo / "README.md").write_text("y\n")
    dirty = json.loads((_build_and_install(repo, tmp_path / "dirty") / "meta" / "build_identity.json").read_text())
    assert (dirty["commit"], dirty["dirty"]) == (head, True)


def test_the_build_recipe_never_writes_into_the_checkout(tmp_path):
    repo = tmp_path / "repo"
    _mini_collection(repo)
    _build_and_install(repo, tmp_path)
    assert not (repo / "meta").exists()
    assert _git(repo, "status", "--porcelain") == ""


# -- through the task file every AWX job template's playbook imports ---------------------------------------------

@pytest.fixture(scope="module")
def built_here(tmp_path_factory):
    """This working tree's artifact, built by the recipe and installed where a job finds its collections."""
    work = tmp_path_factory.mktemp("built")
    proc = _run([sys.executable, BUILDER, "--galaxy", os.path.join(BIN, "ansible-galaxy"), "--output-path",
                 str(work / "dist")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", "--no-deps", "--force",
                 "-p", str(work / "collections"), proc.stdout.strip()])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(work / "collections" / "ansible_collections" / "llmops" / "serving" / "meta" / "build_identity.json") as f:
        return {"collections": str(work / "collections"), "identity": json.load(f)}


@pytest.mark.parametrize("extra,rc,expect", [
    # an AWX job whose project is another commit than the EE's artifact
    ({"awx_job_id": 7, "awx_project_revision": Y}, 2, "the playbooks are commit %s" % Y),
    # an AWX job whose revision is not known: it stops and says it cannot tell
    ({"awx_job_id": 7}, 2, "cannot tell whether llmops.serving"),
    # outside AWX, not knowing warns and the job goes on
    ({}, 0, "require_identity is off: the job goes on"),
])
def test_a_job_runs_only_the_build_of_its_project(tmp_path, built_here, extra, rc, expect):
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as f:
        version = yaml.safe_load(f)["version"]
    project = _galaxy(tmp_path / "project", version)  # a project copy as AWX makes it: no .git
    book = project / "playbooks"
    (book / "tasks").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "playbooks", "tasks", "release_check.yml"), str(book / "tasks"))
    (book / "job.yml").write_text("- hosts: localhost\n  gather_facts: false\n  pre_tasks:\n"
                                  "    - ansible.builtin.import_tasks: tasks/release_check.yml\n"
                                  "  tasks:\n    - ansible.builtin.debug: {msg: reached}\n")
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    proc = _run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", "@%s" % (tmp_path / "extra.json"),
                 str(book / "job.yml")], env={"ANSIBLE_COLLECTIONS_PATH": built_here["collections"],
                                              "ANSIBLE_CONFIG": str(cfg)}, cwd=str(tmp_path))
    out = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode == rc, out[-3000:]
    assert expect in out, out[-3000:]
    if rc:
        assert "reached" not in out  # it stopped at the check, before the next task
    if "awx_project_revision" in extra:
        assert built_here["identity"]["commit"] in out and "pin the project's scm_branch" in out


# -- cannot bypass ---------------------------------------------------------------------------------------------

#: The only places that run ``ansible-galaxy collection build``: the recipe, and the repack of kubernetes.core (another
#: collection) for the EE's tests.
BUILD_OWNERS = {("awx/ee/build_artifact.py", "build"), ("tests/lib/awx_harness.py", "repack_collection")}


def _runs_build(node):
    """Whether ``node`` holds a list literal that runs ``... collection build``."""
    import ast
    for sub in ast.walk(node):
        if isinstance(sub, ast.List):
            words = [e.value for e in sub.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if any(a == "collection" and b == "build" for a, b in zip(words, words[1:])):
                return True
    return False


def _python_builds(rel):
    """``(file, function)`` of every function of ``rel`` that runs ``... collection build`` (``<module>`` for
    top-level code)."""
    import ast
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        tree = ast.parse(f.read(), rel)
    found = {(rel, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and _runs_build(n)}
    top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return found | ({(rel, "<module>")} if any(_runs_build(n) for n in top) else set())


def test_every_artifact_is_built_by_the_one_recipe():
    files = _run(["git", "ls-files", "-co", "--exclude-standard"]).stdout.split()
    builds = set()
    for rel in files:
        if rel.endswith(".py") and os.path.isfile(os.path.join(ROOT, rel)):
            builds |= _python_builds(rel)
        elif rel == "Makefile" or rel.endswith(".sh") or rel.startswith(".ci/"):
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                for line in f:
                    if re.search(r"ansible-galaxy\"?\s+collection\s+build", line.split("#", 1)[0]):
                        builds.add((rel, "shell"))
    assert builds == BUILD_OWNERS, "build the artifact with awx/ee/build_artifact.py: %s" % sorted(builds - BUILD_OWNERS)
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        assert "awx/ee/build_artifact.py" in f.read()
    with open(os.path.join(ROOT, "awx", "ee", "build.sh"), encoding="utf-8") as f:
        assert '"$ROOT/awx/ee/build_artifact.py"' in f.read()


def test_build_ignore_keeps_the_identity_and_git_never_holds_it():
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as f:
        ignore = yaml.safe_load(f)["build_ignore"]
    # ansible-galaxy matches build_ignore with fnmatch against the path and the name (ansible-core,
    # lib/ansible/galaxy/collection/__init__.py _build_files_manifest_walk)
    name = _release.BUILD_IDENTITY_FILE
    assert not [p for p in ignore if fnmatch.fnmatch(name, p) or fnmatch.fnmatch(os.path.basename(name), p)
                or fnmatch.fnmatch("meta", p)]
    assert _run(["git", "check-ignore", "-q", name]).returncode == 0
    assert _run(["git", "ls-files", "--error-unmatch", name]).returncode != 0


def test_the_artifact_make_install_builds_records_its_commit(installed):
    assert "meta/build_identity.json" in installed["members"]
    with tarfile.open(installed["tarball"]) as tar:
        identity = json.load(tar.extractfile("meta/build_identity.json"))
        listed = {e["name"]: e.get("chksum_sha256") for e in json.load(tar.extractfile("FILES.json"))["files"]}
        data = tar.extractfile("meta/build_identity.json").read()
    assert identity["commit"] in installed["heads"]  # HEAD when it was built (before or after a concurrent commit)
    assert isinstance(identity["dirty"], bool) and identity["version"] == installed["manifest"]["collection_info"]["version"]
    assert listed["meta/build_identity.json"] == hashlib.sha256(data).hexdigest()


def test_only_the_release_module_reads_release_or_git_files():
    """No other plugin file reads MANIFEST.json, galaxy.yml, the build identity or .git: one reader decides."""
    import ast
    owner = os.path.join("plugins", "module_utils", "common", "_release.py")
    words = ("MANIFEST.json", "galaxy.yml", "build_identity.json", "packed-refs", "rev-parse")
    bad = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "plugins")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fname in filenames:
            rel = os.path.relpath(os.path.join(dirpath, fname), ROOT)
            if not fname.endswith(".py") or rel == owner or rel.startswith(os.path.join("plugins", "modules")):
                continue  # modules' DOCUMENTATION may name the files
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                tree = ast.parse(f.read(), rel)
            docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                          if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                          and isinstance(n.body[0], ast.Expr)}
            bad += ["%s:%d" % (rel, n.lineno) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                    and (any(w in n.value for w in words) or n.value == ".git")]
    assert bad == []


# -- the verdict, over every combination ------------------------------------------------------------------------

_COMMITS = st.one_of(st.none(), st.sampled_from([X, Y, "3" * 64]))
_SIDE_UNKNOWN = st.one_of(st.none(), st.sampled_from(["no_build_identity", "source_tree", "no_playbook_revision"]))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(build_commit=_COMMITS, build_unknown=_SIDE_UNKNOWN, dirty=st.one_of(st.none(), st.booleans()),
       playbooks_commit=_COMMITS, playbooks_unknown=_SIDE_UNKNOWN,
       differing=st.one_of(st.none(), st.lists(st.sampled_from(["roles/a.yml", "plugins/b.py"]), max_size=2)))
def test_the_verdict_is_ok_iff_both_are_known_and_the_same_build(build_commit, build_unknown, dirty, playbooks_commit,
                                                                 playbooks_unknown, differing):
    build = {"commit": build_commit, "dirty": dirty, "unknown": build_unknown, "why": "b"}
    playbooks = {"commit": playbooks_commit, "unknown": playbooks_unknown, "why": "p"}
    out = _release.judge(build, playbooks, differing)
    known = bool(build_commit and not build_unknown and playbooks_commit and not playbooks_unknown)
    same = known and build_commit == playbooks_commit and (not dirty or differing == [])
    assert (out["verdict"] == "ok") == same
    if not known:
        assert out["verdict"] == "unknown" and out["reason"]
    elif build_commit != playbooks_commit:
        assert out["verdict"] == "mismatch" and build_commit in out["why"] and playbooks_commit in out["why"]
    elif dirty and differing is None:
        assert (out["verdict"], out["reason"]) == ("unknown", "dirty_build")
    elif dirty and differing:
        assert out["verdict"] == "mismatch" and differing[0] in out["why"]
