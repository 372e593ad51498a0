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

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

# What users run, and nothing else, at the top of the artifact.
TOP_LEVEL = {"MANIFEST.json", "FILES.json", "README.md", "LICENSE", "CHANGELOG.md", "changelogs", "meta",
             "playbooks", "plugins", "roles"}
# Directories whose every file ships (where they exist in the source tree).
RUNTIME_DIRS = ("plugins", "roles", "playbooks", "meta")
NEVER = ("tests/*", "molecule/*", "benchmarks/*", "docs/*", "inventories/*", ".ci/*", "Makefile", "conftest.py",
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
