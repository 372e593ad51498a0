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
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import awx_harness

ROOT = awx_harness.ROOT
BIN = os.path.dirname(sys.executable)
# Python packages the EE may install: the collections' run-time needs in the EE (kubernetes.core's requirements.txt
# and llmops.serving's meta/ee-requirements.txt). numpy, safetensors, tokenizers (demo_model, on the GPU nodes) and
# matplotlib (benchmark_report, on the benchmark client host) are the hosts' (meta/host-requirements.txt).
RUNTIME = {"kubernetes", "jsonschema", "requests-oauthlib", "jsonpatch"}
# What ansible-builder's builder and final stages install besides the collections' requirements (ansible-builder
# 3.2.0, src/ansible_builder/containerfile.py: ``pip install bindep pyyaml packaging``; ``dumb-init==1.2.5``).
BUILDER_EXTRAS = ("bindep", "pyyaml", "packaging", "dumb-init==1.2.5")
LOCK = os.path.join(ROOT, "meta", "ee-requirements.lock.txt")


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


def _stages(containerfile):
    """{stage name: [instruction lines]} of a Containerfile (continuation lines joined)."""
    stages, current = {}, None
    for line in containerfile.replace("\\\n", " ").splitlines():
        m = re.match(r"FROM \S+ AS (\w+)$", line.strip())
        if m:
            current = stages.setdefault(m.group(1), [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return stages


def _runs_pip(line):
    """A Containerfile step that runs pip: pip itself, or the builder scripts that call it (assemble,
    install-from-bindep; ansible-builder 3.2.0, src/ansible_builder/_target_scripts/)."""
    return line.startswith("RUN ") and bool(re.search(r"pip install|/assemble\b|install-from-bindep", line))


def _pip_steps_without_local_wheels(stages):
    """The pip steps of each stage that would look for an index, with Docker's scoping: a build argument (ARG)
    is set in its own stage only, from its line on; a file written in the base stage is in every stage FROM base
    until a step removes it."""
    conf_in_base = False
    bad = []
    for name, lines in stages.items():
        conf = conf_in_base if name != "base" else False
        args = False
        for line in lines:
            if line.startswith("RUN ") and "/etc/pip.conf" in line and "no-index" in line and "/output/local-wheels" in line:
                conf = True
            if line.startswith("RUN ") and "rm -f /etc/pip.conf" in line:
                conf = False
            if line == "ARG PIP_NO_INDEX=1":
                args = True
            if _runs_pip(line) and "rm -f /etc/pip.conf" not in line and not (conf or args):
                bad.append((name, line))
        if name == "base":
            conf_in_base = conf
    return bad


def test_the_pip_check_sees_docker_stage_scoping():
    """The old definition set PIP_NO_INDEX as a build argument of the builder stage after that stage's first pip
    install (ansible-builder 3.2.0, src/ansible_builder/containerfile.py: ``RUN $PYCMD -m pip install --no-cache-dir
    bindep pyyaml packaging`` precedes prepend_builder), and `make ee` failed there looking for an index."""
    old = {"base": ["ARG PIP_NO_INDEX=1", "RUN $PYCMD -m pip install --no-cache-dir $ANSIBLE_INSTALL_REFS"],
           "builder": ["RUN $PYCMD -m pip install --no-cache-dir bindep pyyaml packaging", "ARG PIP_NO_INDEX=1",
                       "RUN /output/scripts/assemble"]}
    assert _pip_steps_without_local_wheels(old) == [("builder", old["builder"][0])]
    conf = "RUN printf '[global]\\nno-index = true\\nfind-links = /output/local-wheels\\n' > /etc/pip.conf"
    new = {"base": [conf, "RUN $PYCMD -m pip install x"], "builder": ["RUN $PYCMD -m pip install bindep"],
           "final": ["RUN /output/scripts/install-from-bindep", "RUN rm -f /etc/pip.conf",
                     "RUN $PYCMD -m pip install --no-cache-dir 'dumb-init==1.2.5'"]}
    assert _pip_steps_without_local_wheels(new) == [("final", new["final"][2])]


def _builder(*args, cwd):
    return subprocess.run([os.path.join(BIN, "ansible-builder")] + list(args), cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


@pytest.fixture(scope="module")
def ee_tree(tmp_path_factory):
    """A copy of the EE definition and its files, with the two collection tarballs `make ee` prepares."""
    tree = tmp_path_factory.mktemp("ee")
    for rel in ("execution-environment.yml", "bindep.txt", "meta/ee-requirements.txt", "awx/ee/pkg-present"):
        os.makedirs(tree / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), tree / rel)
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
    # a base named by digest (pulled once, the same bytes on every build host), or the local debootstrap base,
    # which make ee builds on only with EE_UNPINNED_BASE=1 (test_make_ee_refuses_a_base_named_by_tag)
    base = ee["images"]["base_image"]["name"]
    assert re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", base) or base.startswith("localhost/"), base


def test_builder_create_succeeds_offline(ee_tree):
    proc = _builder("create", "-f", "execution-environment.yml", "-c", "context", "--output-filename", "Containerfile",
                    cwd=str(ee_tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    containerfile = (ee_tree / "context" / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="localhost/llmops-ee-base:bookworm"' in containerfile
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==%s ansible-runner==%s"' % (
        importlib.metadata.version("ansible-core"), importlib.metadata.version("ansible-runner")) in containerfile
    assert 'ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS="--offline"' in containerfile
    build = ee_tree / "context" / "_build"
    stages = _stages(containerfile)
    assert list(stages) == ["base", "galaxy", "builder", "final"]
    # No build-only setting reaches the image: the final stage starts from base, so neither may set one with ENV
    # (an ENV stays in the image; a job's pip in the EE would find no index). Every stage that runs pip gets them
    # as build arguments (in its RUN steps' environment, not in the image).
    for name in ("base", "final"):
        envs = [line for line in stages[name] if line.startswith("ENV ")]
        assert [e for e in envs if re.search(r"PIP_NO_INDEX|PIP_FIND_LINKS|local-wheels|/output|pip", e)] == [], name
    # Every step that runs pip, in every stage, finds the local wheels only (the build has --network=none: one
    # that looked for an index would fail the build), and the final stage drops the setting after its last one.
    assert _pip_steps_without_local_wheels(stages) == []
    final = stages["final"]
    last_pip = max(i for i, line in enumerate(final) if _runs_pip(line))
    (drop,) = [i for i, line in enumerate(final) if "rm -f /etc/pip.conf" in line]
    assert last_pip < drop < final.index("RUN rm -rf /output") < final.index("USER 1000")
    # the wheels and the bindep check live under /output, which the final stage removes before its USER line
    # the build's "package manager" is the presence check, shipped with the builder's scripts
    assert 'ARG PKGMGR="/output/scripts/pkg-present"' in containerfile
    assert os.access(str(build / "scripts" / "pkg-present"), os.X_OK)
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
    assert (dpkg, rpm) == (["openssh-client"], ["openssh-clients"])


def test_the_ee_carries_no_system_package_that_no_job_uses():
    """Only the SSH client: git served project syncs, which AWX runs in the control plane's EE, never the job's
    (ansible/awx, awx/main/tasks/jobs.py RunProjectUpdate; awx/main/tests: test_project_update_uses_control_plane_ee),
    and the release check reads a checkout's HEAD from its .git files, not with git (module_utils/common/_release.py);
    rsync served nothing (no task of roles/ or playbooks/ synchronizes), yet meta/ee-bindep.txt pushed it into every
    EE that includes the collection."""
    for rel in ("bindep.txt", os.path.join("meta", "ee-bindep.txt")):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            text = f.read()
        names = {line.split()[0] for line in (raw.split("#", 1)[0] for raw in text.splitlines()) if line.strip()}
        assert names <= {"openssh-client", "openssh-clients"}, (rel, names)
        assert "in the job's execution environment" not in " ".join(text.split()), rel
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")) + glob.glob(os.path.join(ROOT, "playbooks", "*.yml")):
        with open(path, encoding="utf-8") as f:
            assert not re.search(r"^\s*(ansible\.posix\.)?synchronize:|\brsync\b", f.read(), re.M), path


def _galaxy_version():
    return _load("galaxy.yml")["version"]


def test_bindep_packages_are_in_the_base_or_the_build_fails(tmp_path):
    """The build has no package repository: install-from-bindep's "package manager" (awx/ee/pkg-present) checks
    that each package bindep lists for the image is installed and fails naming the missing ones. Called the way
    ansible-builder's install-from-bindep calls it (ansible-builder 3.2.0, src/ansible_builder/_target_scripts/
    install-from-bindep: ``$PKGMGR install -y $PKGMGR_OPTS $PACKAGES``, then ``$PKGMGR clean all``)."""
    assert _load("execution-environment.yml")["options"]["package_manager_path"] == "/output/scripts/pkg-present"
    fake = tmp_path / "bin"
    fake.mkdir()
    # dpkg-query of a base that has git and openssh-client only
    (fake / "dpkg-query").write_text('#!/bin/sh\ncase "$4" in git|openssh-client) echo "install ok installed";;'
                                     ' *) echo "dpkg-query: no packages found" >&2; exit 1;; esac\n')
    (fake / "dpkg-query").chmod(0o755)
    script = os.path.join(ROOT, "awx", "ee", "pkg-present")
    env = dict(os.environ, PATH="%s:/usr/bin:/bin" % fake)

    def call(*args):
        return subprocess.run(["/bin/sh", script] + list(args), capture_output=True, text=True, env=env, timeout=30,
                              check=False)
    ok = call("install", "-y", "git", "openssh-client")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "pkg-present: every bindep package is installed: git openssh-client"
    bad = call("install", "-y", "git", "rsync", "openssh-client", "curl")
    assert bad.returncode == 1
    assert "bindep declares packages the base image lacks: rsync curl;" in bad.stderr
    assert "EE_REBUILD_BASE=1" in bad.stderr
    assert call("clean", "all").returncode == 0
    assert call("upgrade").returncode == 2


def _plan(tmp_path, runtimes, root=ROOT, args=("--plan",), **env):
    """``build.sh --plan`` with only the named fake runtimes on PATH (and the few tools the script reads with)."""
    fake = tmp_path / ("bin-" + "-".join(runtimes or ["none"]))
    fake.mkdir(parents=True)
    for tool in ("dirname", "sed", "awk", "head", "tr", "sort", "paste", "date", "cat", "git"):
        os.symlink(shutil.which(tool), str(fake / tool))
    for rt in runtimes:
        (fake / rt).write_text("#!/bin/sh\necho \"$0 $*\" >> %s/calls\n" % tmp_path)
        (fake / rt).chmod(0o755)
    proc = subprocess.run([shutil.which("bash"), os.path.join(str(root), "awx", "ee", "build.sh")] + list(args),
                          capture_output=True, text=True, timeout=30, check=False, env=dict(env, PATH=str(fake)))
    plan = dict(kv.split("=", 1) for kv in proc.stdout.split()) if proc.returncode == 0 else None
    return proc, plan


#: The files build.sh reads (its plan is made from them alone).
PLAN_FILES = ("galaxy.yml", "execution-environment.yml", "requirements.yml", "requirements-test.txt", "bindep.txt",
              "meta/ee-bindep.txt", "awx/ee/build.sh")


def _checkout(path):
    """A clean git checkout holding the files build.sh reads; returns (path, its commit)."""
    for rel in PLAN_FILES:
        os.makedirs(os.path.dirname(os.path.join(str(path), rel)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), os.path.join(str(path), rel))

    def git(*args):
        return subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                               "-c", "commit.gpgsign=false"] + list(args), capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    return path, git("rev-parse", "--short=12", "HEAD")


@pytest.mark.parametrize("runtimes,chosen,env", [
    (["docker"], "docker", {}),
    (["podman"], "podman", {}),
    (["podman", "docker"], "podman", {}),
    (["podman", "docker"], "docker", {"EE_RUNTIME": "docker"}),
])
def test_make_ee_picks_podman_or_docker(tmp_path, runtimes, chosen, env):
    proc, plan = _plan(tmp_path, runtimes, **env)
    assert proc.returncode == 0, proc.stderr
    assert plan["runtime"] == chosen
    assert not (tmp_path / "calls").exists(), "--plan runs no container command"


@pytest.mark.parametrize("runtimes,env,error", [
    ([], {}, "neither podman nor docker is on PATH"),
    (["docker"], {"EE_RUNTIME": "podman"}, "EE_RUNTIME=podman: podman is not on PATH"),
    (["docker"], {"EE_RUNTIME": "nerdctl"}, "EE_RUNTIME=nerdctl is not a runtime ansible-builder drives"),
    (["docker"], {"EE_PUSH": "registry.example/llmops/serving-ee"}, "EE_PUSH=registry.example/llmops/serving-ee has no tag"),
])
def test_make_ee_refuses_a_runtime_or_push_target_it_cannot_use(tmp_path, runtimes, env, error):
    proc, _plan_ = _plan(tmp_path, runtimes, **env)
    assert proc.returncode == 1 and error in proc.stderr, proc.stderr


def test_make_ee_tags_each_build_with_its_commit_and_pushes_where_asked(tmp_path):
    """One name per build: <version>-<commit> (the commit the artifact inside records, meta/build_identity.json), so
    that the EE object's `pull: missing` never runs an older build pushed under a reused name."""
    root, commit = _checkout(tmp_path / "repo")
    proc, plan = _plan(tmp_path, ["docker"], root=root)
    assert proc.returncode == 0, proc.stderr
    tag = "llmops-serving-ee:%s-%s" % (_galaxy_version(), commit)
    assert (plan["tag"], plan["commit"], plan["dirty"]) == (tag, commit, "0")
    # the definition names no fixed tag: one tag for every build was the stale-image path
    assert "tags" not in _load("execution-environment.yml")["options"]
    assert plan["push"] == "none"
    # the tools venv is the script's own (ansible-core / ansible-runner at the definition's pins), not .venv
    deps = _load("execution-environment.yml")["dependencies"]
    assert plan["tools"] == os.path.join(str(root), ".build", "ee", "tools")
    assert (plan["core"], plan["runner"]) == (deps["ansible_core"]["package_pip"], deps["ansible_runner"]["package_pip"])
    assert plan["builder"].startswith("ansible-builder")
    # when Galaxy does not answer, kubernetes.core comes from the ansible package of requirements-test.txt's range
    assert plan["kubernetes.core_fallback"] == "ansible>=12,<13"
    push = "registry.example:5000/llmops/ee:%s-%s" % (_galaxy_version(), commit)
    proc, plan = _plan(tmp_path / "x", ["docker"], root=root, EE_TAG="ee:test", EE_PUSH=push)
    assert (plan["tag"], plan["push"]) == ("ee:test", push), proc.stderr
    # a push tag without the commit (the old registry.example/llmops/serving-ee:0.1.0) is refused, naming the fix
    proc, plan = _plan(tmp_path / "y", ["docker"], root=root, EE_PUSH="registry.example/llmops/serving-ee:0.1.0")
    assert proc.returncode == 1 and "its tag does not name commit %s" % commit in proc.stderr, proc.stderr
    assert "push as registry.example/llmops/serving-ee:%s-%s" % (_galaxy_version(), commit) in proc.stderr
    # uncommitted changes: the local tag says so, and such a build is never pushed
    with open(os.path.join(str(root), "bindep.txt"), "a", encoding="utf-8") as f:
        f.write("# local change\n")
    proc, plan = _plan(tmp_path / "z", ["docker"], root=root)
    assert plan["tag"].endswith("-%s-dirty" % commit) and plan["dirty"] == "1", proc.stderr
    proc, plan = _plan(tmp_path / "w", ["docker"], root=root, EE_PUSH=push)
    assert proc.returncode == 1 and "the checkout has uncommitted changes" in proc.stderr, proc.stderr


def test_make_ee_refuses_a_tree_that_is_no_git_checkout(tmp_path):
    for rel in PLAN_FILES:
        os.makedirs(os.path.dirname(str(tmp_path / "tree" / rel)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), str(tmp_path / "tree" / rel))
    proc, plan = _plan(tmp_path, ["docker"], root=tmp_path / "tree", GIT_CEILING_DIRECTORIES=str(tmp_path))
    assert proc.returncode == 1 and "is not a git checkout" in proc.stderr, proc.stderr


def test_the_ee_object_never_serves_a_stale_build():
    """`pull: missing` is safe only because every build has its own tag; the image the EE object names comes from
    llmops_awx_ee_image, whose documented example names a commit."""
    (ee,) = _load("awx/controller_execution_environments.yml")["controller_execution_environments"]
    assert ee["pull"] in ("missing", "always")
    with open(os.path.join(ROOT, "docs", "awx.md"), encoding="utf-8") as f:
        docs = f.read()
    examples = re.findall(r"llmops_awx_ee_image=(\S+)", docs)
    assert examples and all(re.search(r":\d+\.\d+\.\d+-(<commit>|[0-9a-f]{12})", e) for e in examples), examples


def test_the_base_carries_every_system_package_bindep_declares_for_dpkg(tmp_path):
    """build.sh debootstraps exactly the platform:dpkg entries of bindep.txt and the collection's meta/ee-bindep.txt
    (the files ansible-builder's introspection combines), so pkg-present finds them all."""
    declared = set()
    for rel in ("bindep.txt", os.path.join("meta", "ee-bindep.txt")):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            declared |= {line.split()[0] for line in (raw.split("#", 1)[0] for raw in f) if "platform:dpkg" in line}
    proc, plan = _plan(tmp_path, ["docker"])
    assert proc.returncode == 0, proc.stderr
    assert set(plan["system"].split(",")) == declared and "openssh-client" in declared


def test_build_script_parses():
    for name in ("build.sh", "pkg-present"):
        proc = subprocess.run(["bash", "-n", os.path.join(ROOT, "awx", "ee", name)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr


def test_requirements_pin_exactly_what_the_ee_carries_and_the_tests_run(ee_tree):
    """A project sync installs requirements.yml's collections ahead of the EE's (ansible/awx, devel,
    awx/playbooks/project_update.yml): each is pinned to one version, the one the tests run and the EE carries."""
    pins = {c["name"]: c["version"] for c in _load("requirements.yml")["collections"]}
    assert sorted(pins) == ["awx.awx", "kubernetes.core"]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in pins.values()), pins
    for name, pin in pins.items():
        namespace, coll = name.split(".")
        with open(os.path.join(awx_harness.SITE_COLLECTIONS, namespace, coll, "MANIFEST.json"), encoding="utf-8") as f:
            assert json.load(f)["collection_info"]["version"] == pin, name
    # the EE's kubernetes.core tarball is that version; llmops.serving's is galaxy.yml's
    for tarball, version in (("kubernetes-core.tar.gz", pins["kubernetes.core"]),
                             ("llmops-serving.tar.gz", _galaxy_version())):
        with tarfile.open(str(ee_tree / ".build" / "ee" / "collections" / tarball)) as tar:
            assert json.load(tar.extractfile("MANIFEST.json"))["collection_info"]["version"] == version, tarball
    # and llmops.serving's own dependency admits it
    assert _load("galaxy.yml")["dependencies"]["kubernetes.core"] == ">=6.0.0"


def test_job_summary_reads_status_events_failures_and_artifacts(tmp_path):
    """`make ee` judges the job from what ansible-runner process wrote, as AWX does: status, rc, failed events
    (an ignored failure does not count) and the set_stats artifacts of playbook_on_stats."""
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


def test_make_ee_builds_with_its_own_tools_not_the_engine_venv():
    """`make ee` has no prerequisite (not `venv`, which installs the engine) and the script runs ansible-builder,
    ansible-galaxy and ansible-runner from .build/ee/tools only."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    (rule,) = [i for i, line in enumerate(lines) if line.startswith("ee:")]
    assert lines[rule].split(":", 1)[1].strip() == ""
    assert lines[rule + 1].strip() == "bash $(CURDIR)/awx/ee/build.sh"
    with open(os.path.join(ROOT, "awx", "ee", "build.sh"), encoding="utf-8") as f:
        script = f.read()
    assert ".venv" not in script
    assert 'TOOLS=$WORK/tools' in script and 'BIN=$TOOLS/bin' in script
    assert re.findall(r'"\$BIN/(ansible-[a-z]+)"', script)
    assert not re.findall(r"^\s*ansible-(builder|runner|galaxy) ", script, re.M)


def _ansible_wheel(path, version, extra=()):
    """A stand-in for the ansible package's wheel carrying kubernetes.core VERSION (docs and tests stripped, FILES.json
    kept, as the package ships its collections)."""
    import zipfile
    prefix = "ansible_collections/kubernetes/core/"
    manifest = {"collection_info": {"namespace": "kubernetes", "name": "core", "version": version,
                                    "authors": ["Kubernetes Collection Maintainers"], "readme": "README.md",
                                    "license": ["GPL-3.0-or-later"], "dependencies": {}, "tags": ["kubernetes"],
                                    "description": "Kubernetes Collection", "repository": "", "documentation": "",
                                    "homepage": "", "issues": "", "license_file": None},
                "file_manifest_file": {"name": "FILES.json", "ftype": "file", "format": 1}, "format": 1}
    with zipfile.ZipFile(str(path), "w") as zf:
        zf.writestr(prefix + "MANIFEST.json", json.dumps(manifest))
        zf.writestr(prefix + "FILES.json", json.dumps({"files": [{"name": "docs", "ftype": "dir"}], "format": 1}))
        zf.writestr(prefix + "README.md", "# kubernetes.core\n")
        zf.writestr(prefix + "plugins/modules/k8s.py", "# the k8s module\n")
        zf.writestr("ansible_collections/community/general/MANIFEST.json", "{}")
        for name, data in extra:
            zf.writestr(name, data)
    return path


def _from_package(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "awx", "ee", "collection_from_package.py")] + list(args),
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


def test_kubernetes_core_comes_from_the_ansible_package_when_galaxy_is_out_of_reach(tmp_path):
    """Galaxy is not reachable from every build host; the ansible package on the package index ships the pinned
    kubernetes.core, and `make ee` takes it from there (requirements-test.txt's range), exactly at the pin."""
    wheel = _ansible_wheel(tmp_path / "ansible-12.3.0-py3-none-any.whl", "6.2.0")
    dest = tmp_path / "kubernetes-core.tar.gz"
    proc = _from_package(str(wheel), "kubernetes.core", "6.2.0", str(dest))
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(str(dest)) as tar:
        assert json.load(tar.extractfile("MANIFEST.json"))["collection_info"]["version"] == "6.2.0"
        assert "plugins/modules/k8s.py" in tar.getnames()
        # FILES.json lists what the artifact holds, not the package's stripped docs
        assert [f["name"] for f in json.load(tar.extractfile("FILES.json"))["files"] if f["name"] == "docs"] == []


@pytest.mark.parametrize("version,name,extra,error", [
    ("6.3.0", "kubernetes.core", (), "carries kubernetes.core 6.3.0, not 6.2.0; pick the ansible release that ships"),
    ("6.2.0", "kubernetes", (), "give it as namespace.name"),
    ("6.2.0", "community.docker", (), "has no ansible_collections/community/docker/; this ansible package does not carry"),
    ("6.2.0", "kubernetes.core", (("ansible_collections/kubernetes/core/../../../x", "x"),), "leaves the collection"),
])
def test_a_package_copy_that_is_not_the_pin_is_refused(tmp_path, version, name, extra, error):
    wheel = _ansible_wheel(tmp_path / "ansible-12.9.0-py3-none-any.whl", version, extra)
    dest = tmp_path / "kubernetes-core.tar.gz"
    proc = _from_package(str(wheel), name, "6.2.0", str(dest))
    assert proc.returncode == 1 and error in proc.stderr, proc.stderr
    assert not dest.exists()


def test_a_broken_package_download_is_named(tmp_path):
    bad = tmp_path / "ansible-12.3.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    proc = _from_package(str(bad), "kubernetes.core", "6.2.0", str(tmp_path / "out.tar.gz"))
    assert proc.returncode == 1 and "is not a readable wheel" in proc.stderr and "download the ansible package again" in proc.stderr


def test_make_ee_refuses_a_base_named_by_tag(tmp_path):
    """A base named by tag is whatever image holds that name on the build host (the debootstrap of whatever day
    built it): make ee refuses it before any work unless EE_UNPINNED_BASE=1, and takes a base named by digest."""
    root, dummy_commit = _checkout(tmp_path / "repo")
    proc, dummy_plan = _plan(tmp_path / "a", ["docker"], root=root, args=())
    assert proc.returncode == 1, proc.stderr
    assert "names the base image localhost/llmops-ee-base:bookworm by tag, not by digest" in proc.stderr
    assert "set images.base_image.name to registry.example/llmops/ee-base@sha256:<digest>" in proc.stderr
    assert not (tmp_path / "a" / "calls").exists(), "refused before the runtime was asked anything"
    # asked for: it goes on (here to the next check, debootstrap, which this PATH lacks)
    proc, dummy_plan = _plan(tmp_path / "b", ["docker"], root=root, args=(), EE_UNPINNED_BASE="1")
    assert proc.returncode == 1 and "by tag, not by digest" not in proc.stderr and "debootstrap not found" in proc.stderr
    proc, plan = _plan(tmp_path / "c", ["docker"], root=root)
    assert (plan["base"], plan["base_pinned"]) == ("localhost/llmops-ee-base:bookworm", "0"), proc.stderr
    pinned = "registry.example/llmops/ee-base@sha256:" + "ab" * 32
    path = os.path.join(str(root), "execution-environment.yml")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace("name: localhost/llmops-ee-base:bookworm", "name: " + pinned))
    proc, plan = _plan(tmp_path / "d", ["docker"], root=root)
    assert (plan["base"], plan["base_pinned"]) == (pinned, "1"), proc.stderr


def _lock():
    """(header {key: value}, {name: (version, sha256)}) of meta/ee-requirements.lock.txt."""
    header, pins = {}, {}
    with open(LOCK, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^# (python|inputs): (.*)$", line)
            if m:
                header[m.group(1)] = m.group(2).strip()
            elif line.strip() and not line.startswith("#"):
                m = re.fullmatch(r"([a-z0-9][a-z0-9.-]*)==(\S+) --hash=sha256:([0-9a-f]{64})", line.strip())
                assert m, line
                pins[m.group(1)] = (m.group(2), m.group(3))
    return header, pins


def _kubernetes_core_requirements():
    with open(os.path.join(awx_harness.SITE_COLLECTIONS, "kubernetes", "core", "requirements.txt"), encoding="utf-8") as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def test_the_lock_pins_every_wheel_the_build_installs_with_its_hash():
    """meta/ee-requirements.lock.txt: one version and one sha256 per package, resolved from exactly today's inputs
    (the definition's pins, meta/ee-requirements.txt, kubernetes.core's requirements.txt at requirements.yml's
    pin, ansible-builder's own steps) - build.sh refuses a lock whose "# inputs:" line differs - and closed under
    dependencies: every requirement of a locked package (its metadata, where this venv has that version) is locked."""
    from packaging.requirements import Requirement

    header, pins = _lock()
    deps = _load("execution-environment.yml")["dependencies"]
    with open(os.path.join(ROOT, "meta", "ee-requirements.txt"), encoding="utf-8") as f:
        ee_lines = [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]
    inputs = sorted({deps["ansible_core"]["package_pip"], deps["ansible_runner"]["package_pip"], *BUILDER_EXTRAS,
                     *(x.replace(" ", "") for x in ee_lines + _kubernetes_core_requirements())})
    assert header["inputs"].split() == inputs, "run bash awx/ee/build.sh --lock"
    assert header["python"] == "%d.%d-x86_64" % sys.version_info[:2]
    for spec in inputs:
        req = Requirement(spec)
        name = req.name.lower().replace("_", "-")
        assert name in pins and req.specifier.contains(pins[name][0], prereleases=True), spec
    assert pins["ansible-core"][0] == importlib.metadata.version("ansible-core")
    env = {"python_version": "%d.%d" % sys.version_info[:2], "sys_platform": "linux", "platform_system": "Linux",
           "os_name": "posix", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "python_full_version": "%d.%d.0" % sys.version_info[:2], "extra": ""}
    checked, missing = 0, []
    for name, (version, dummy_digest) in pins.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = req.name.lower().replace("_", "-")
            if dep not in pins or not req.specifier.contains(pins[dep][0], prereleases=True):
                missing.append((name, spec))
            checked += 1
    assert missing == [] and checked > 40, missing
    # what the EE has no use for is not in it
    assert not {"numpy", "matplotlib", "tokenizers", "safetensors"} & set(pins)


def test_make_ee_downloads_exactly_the_lock_into_an_emptied_wheel_directory():
    """Before, `pip download` resolved open ranges against the index into a wheel directory that kept every earlier
    build's wheels, so what the image got depended on the day and on the build host's history."""
    with open(os.path.join(ROOT, "awx", "ee", "build.sh"), encoding="utf-8") as f:
        script = f.read()
    (download,) = [m.start() for m in re.finditer(r'"\$PY" -m pip download [^\n]*--dest "\$WORK/wheels"', script)]
    line = script[download:script.index("\n", download)]
    assert "--no-deps" in line and "--require-hashes" in line and '-r "$LOCKFILE"' in line, line
    empty = script.index('rm -rf "$WORK/wheels"')
    assert empty < download
    assert not re.search(r'--dest "\$WORK/wheels"[^\n]*-r "\$ROOT/meta/ee-requirements.txt"', script)
    # a lock made from other inputs, or for another interpreter, stops the build naming --lock
    assert "was resolved from other requirements than $INPUTS; run bash awx/ee/build.sh --lock" in script
    assert 'LOCKFILE=$ROOT/meta/ee-requirements.lock.txt' in script


def _delegations(node, inherited=None):
    """(module name, delegate_to text) of every task in a parsed task list or play list (blocks inherit)."""
    if isinstance(node, list):
        for item in node:
            yield from _delegations(item, inherited)
        return
    if not isinstance(node, dict):
        return
    here = node.get("delegate_to", inherited)
    if "hosts" in node:  # a play: its tasks run on its hosts
        here = "localhost" if str(node["hosts"]).strip() == "localhost" else here
    for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
        if key in node:
            yield from _delegations(node[key], here)
    for key in node:
        if isinstance(key, str) and key.startswith("llmops.serving."):
            yield key.split(".")[-1], str(here or "")


def _runs_in_the_ee(delegate_to):
    """Under AWX the EE is localhost: llmops_k8s_delegate_to (the templates set it to localhost) or localhost."""
    return "llmops_k8s_delegate_to" in delegate_to or delegate_to.strip() == "localhost"


def test_the_ee_carries_the_libraries_of_the_tasks_that_run_there_and_no_other():
    """Each library of meta/ee-requirements.txt is imported by a module some task runs in the EE (delegated to
    llmops_k8s_delegate_to, localhost under AWX) or by a controller-side plugin; each library of
    meta/host-requirements.txt by modules that run on the fleet's hosts only. Before, numpy, safetensors and
    tokenizers (demo_model, on gpu_nodes) and matplotlib (benchmark_report, on the benchmark client host) were in
    every EE, and pushed into every downstream EE that includes the collection."""
    from ansible_collections.llmops.serving.tests.unit.plugins.modules.test_module_requirements import (
        COMES_WITH, DIST, _needs)

    in_ee, on_hosts = set(), set()
    paths = glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")) + glob.glob(os.path.join(ROOT, "playbooks", "**", "*.yml"), recursive=True)
    for path in paths:
        if os.path.basename(path) == "awx_configure.yml":  # runs against a controller from outside AWX jobs
            continue
        with open(path, encoding="utf-8") as f:
            for module, where in _delegations(yaml.safe_load(f)):
                (in_ee if _runs_in_the_ee(where) else on_hosts).add(module)
    assert {"k8s_engine_wait", "engine_probe"} <= in_ee and {"demo_model", "benchmark_report"} <= on_hosts - in_ee

    def libs(paths):
        out = set()
        for p in paths:
            out |= {DIST.get(n, n).lower() for n in _needs(p, optional=True) - set(COMES_WITH)}
        return out
    ee_libs = libs([os.path.join(ROOT, "plugins", "modules", m + ".py") for m in sorted(in_ee)]
                   + glob.glob(os.path.join(ROOT, "plugins", "action", "*.py"))
                   + glob.glob(os.path.join(ROOT, "plugins", "filter", "*.py")))
    host_libs = libs([os.path.join(ROOT, "plugins", "modules", m + ".py") for m in sorted(on_hosts - in_ee)])

    def names(rel):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            return set(_names(f))
    assert names("meta/ee-requirements.txt") == ee_libs
    assert names("meta/host-requirements.txt") == host_libs - ee_libs
    assert {"numpy", "matplotlib", "tokenizers", "safetensors"} <= names("meta/host-requirements.txt")
