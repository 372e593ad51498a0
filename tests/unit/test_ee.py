"""The execution environment definition: ansible-builder turns it into a build context offline, and what it
installs is what the collections need at run time, nothing from the test tooling.

ansible-builder v3 definition format: https://ansible.readthedocs.io/projects/builder/en/latest/definition/
(``dependencies.ansible_core`` / ``ansible_runner`` / ``galaxy`` / ``python`` / ``system``,
``additional_build_files``, ``additional_build_steps``, ``build_arg_defaults``, ``options``);
collection metadata it introspects: https://ansible.readthedocs.io/projects/builder/en/latest/collection_metadata/
"""
from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness

ROOT = awx_harness.ROOT
BIN = os.path.dirname(sys.executable)
# Python packages the EE may install: the collections' run-time needs (kubernetes.core's requirements.txt and
# llmops.serving's meta/ee-requirements.txt).
RUNTIME = {"kubernetes", "jsonschema", "matplotlib", "numpy", "safetensors", "tokenizers", "requests-oauthlib",
           "jsonpatch"}


def _load(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return yaml.safe_load(f)


def _names(lines):
    """Distribution names of requirement lines (comments and markers dropped), lower case."""
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return out


def _builder(*args, cwd):
    return subprocess.run([os.path.join(BIN, "ansible-builder")] + list(args), cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


@pytest.fixture(scope="module")
def ee_tree(tmp_path_factory):
    """A copy of the EE definition and its files, with the two collection tarballs `make ee` prepares."""
    tree = tmp_path_factory.mktemp("ee")
    for rel in ("execution-environment.yml", "bindep.txt", "meta/ee-requirements.txt"):
        os.makedirs(tree / os.path.dirname(rel), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), tree / rel)
    awx_harness.ee_collections(str(tree / ".build" / "ee" / "collections"))
    os.makedirs(tree / ".build" / "ee" / "wheels")
    return tree


def test_definition_pins_the_tested_core_and_runner_and_installs_local_tarballs():
    ee = _load("execution-environment.yml")
    assert ee["version"] == 3
    deps = ee["dependencies"]
    # pinned to exactly what the tests run with
    assert deps["ansible_core"]["package_pip"] == "ansible-core==%s" % importlib.metadata.version("ansible-core")
    assert deps["ansible_runner"]["package_pip"] == "ansible-runner==%s" % importlib.metadata.version("ansible-runner")
    assert [c["type"] for c in deps["galaxy"]["collections"]] == ["file", "file"]
    assert sorted(os.path.basename(c["name"]) for c in deps["galaxy"]["collections"]) == [
        "kubernetes-core.tar.gz", "llmops-serving.tar.gz"]
    assert deps["system"] == "bindep.txt" and deps["python"] == "meta/ee-requirements.txt"
    # a local base image (debootstrap + docker import), not a registry pull
    assert ee["images"]["base_image"]["name"].startswith("localhost/")


def test_builder_create_succeeds_offline(ee_tree):
    proc = _builder("create", "-f", "execution-environment.yml", "-c", "context", "--output-filename", "Containerfile",
                    cwd=str(ee_tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    containerfile = (ee_tree / "context" / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="localhost/llmops-ee-base:bookworm"' in containerfile
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==%s ansible-runner==%s"' % (
        importlib.metadata.version("ansible-core"), importlib.metadata.version("ansible-runner")) in containerfile
    assert 'ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS="--offline"' in containerfile
    assert "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/output/local-wheels" in containerfile
    build = ee_tree / "context" / "_build"
    assert sorted(os.listdir(build / "collections")) == ["kubernetes-core.tar.gz", "llmops-serving.tar.gz"]
    galaxy = yaml.safe_load((build / "requirements.yml").read_text())
    # each name resolves inside the galaxy stage's WORKDIR (/build, the context's _build)
    assert all((build / c["name"]).is_file() for c in galaxy["collections"])


def test_introspection_lists_runtime_packages_only(ee_tree, tmp_path):
    cols = tmp_path / "cols"
    tarballs = sorted(glob.glob(str(ee_tree / ".build" / "ee" / "collections" / "*.tar.gz")))
    # --force: the collections already installed where the test environment looks count as "nothing to do"
    proc = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", "--no-deps",
                           "--force", "-p", str(cols)] + tarballs, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _builder("introspect", "--sanitize", "--user-pip", "meta/ee-requirements.txt", "--user-bindep",
                    "bindep.txt", str(cols), cwd=str(ee_tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = yaml.safe_load(proc.stdout.split("---", 1)[1])
    names = set(_names(data["python"]))
    with open(os.path.join(ROOT, "requirements-test.txt"), encoding="utf-8") as f:
        test_only = set(_names(f)) - RUNTIME
    assert names & test_only == set()
    assert names == RUNTIME
    # both collections were introspected (their own metadata, not only the user file)
    assert any("from collection kubernetes.core" in line for line in data["python"])
    assert any("from collection llmops.serving" in line for line in data["python"])


def test_every_ee_requirement_is_imported_by_a_plugin():
    with open(os.path.join(ROOT, "meta", "ee-requirements.txt"), encoding="utf-8") as f:
        names = _names(f)
    sources = []
    for path in glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            sources.append(f.read())
    unused = [n for n in names
              if not any(re.search(r"^\s*(import|from)\s+%s\b" % re.escape(n.replace("-", "_")), s, re.M) for s in sources)]
    assert names and unused == []


def test_bindep_names_packages_for_the_debian_base_and_rpm():
    with open(os.path.join(ROOT, "bindep.txt"), encoding="utf-8") as f:
        entries = [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]
    dpkg = [e.split()[0] for e in entries if "platform:dpkg" in e]
    rpm = [e.split()[0] for e in entries if "platform:rpm" in e]
    assert {"git", "openssh-client"} <= set(dpkg)
    assert {"git", "openssh-clients"} <= set(rpm)


def test_definition_installs_nothing_from_a_package_repository():
    """The base carries the system packages (awx/ee/build.sh debootstraps what bindep.txt names for dpkg):
    the build's package manager is a no-op, so no RUN step needs an apt/dnf repository."""
    ee = _load("execution-environment.yml")
    assert ee["options"]["package_manager_path"] == "/usr/bin/true"
    with open(os.path.join(ROOT, "awx", "ee", "build.sh"), encoding="utf-8") as f:
        script = f.read()
    assert "platform:dpkg" in script and "bindep.txt" in script and "--variant=minbase" in script


def test_job_summary_reads_status_events_failures_and_artifacts(tmp_path):
    """`make ee` judges the job from what ansible-runner process wrote, as AWX does: status, rc, failed events
    (an ignored failure does not count) and the set_stats artifacts of playbook_on_stats."""
    import json

    sys.path.insert(0, os.path.join(ROOT, "awx", "ee"))
    try:
        import job_summary
    finally:
        sys.path.pop(0)
    art = tmp_path / "artifacts"
    (art / "job_events").mkdir(parents=True)
    (art / "status").write_text("successful\n")
    (art / "rc").write_text("0")
    events = [("playbook_on_start", {}), ("runner_on_ok", {}), ("runner_on_failed", {"ignore_errors": True}),
              ("playbook_on_stats", {"artifact_data": {"llmops_staged_revision": "r1"}})]
    for n, (event, data) in enumerate(events, 1):
        (art / "job_events" / ("%d-x.json" % n)).write_text(json.dumps({"event": event, "event_data": data}))
    assert job_summary.summary(str(art)) == 'successful 0 4 0 {"llmops_staged_revision":"r1"}'
    (art / "job_events" / "5-x.json").write_text(json.dumps({"event": "runner_on_failed", "event_data": {}}))
    (art / "status").write_text("failed")
    (art / "rc").unlink()
    assert job_summary.summary(str(art)).split()[:4] == ["failed", "missing", "5", "1"]
