"""Every role has a molecule scenario that tests it the same way (default driver on localhost, no prerun, the built
collection, syntax -> converge -> idempotence -> testinfra verify, cleaned up by destroy), in the layout molecule
expects for a collection (extensions/molecule/<scenario>/), and `make molecule`'s summary script reports each
scenario and fails when one failed.

molecule 26.10.0 (ansible/molecule, src/molecule/util.py ``molecule_directory``): in a collection (a galaxy.yml in
the working directory) scenarios are read from ``extensions/molecule/**/molecule.yml``; a ``molecule/`` directory at
the collection's root is still read but logs "Molecule scenarios should migrate to 'extensions/molecule'".
"""
from __future__ import annotations

import ast
import os
import stat
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOLECULE = os.path.join(ROOT, "extensions", "molecule")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import molecule_summary  # noqa: E402  (tests/ is not a package)

# Roles without a scenario, and why. A role listed here that gains a scenario must leave the list.
WITHOUT_SCENARIO = {
    "upgrade": "it upgrades a serving engine, so a scenario would start two more real engines beside the engine "
               "scenario's; tests/integration/test_upgrade_local.py runs the role against the real engine (A, three "
               "B revisions, the rollback, the second run that changes nothing, check mode)",
}
# Scenarios without the idempotence step, and why.
NOT_IDEMPOTENT = {
    "benchmark": "every run is a new measurement: benchmark_plan moves the previous run's files under "
                 "previous/<time>/ and reports a change",
}
ROLES = sorted(n for n in os.listdir(os.path.join(ROOT, "roles")) if os.path.isdir(os.path.join(ROOT, "roles", n)))
SCENARIOS = molecule_summary.scenarios(MOLECULE)


def test_scenarios_are_in_the_collection_layout():
    assert molecule_summary.MOLECULE_DIR == MOLECULE
    assert not os.path.exists(os.path.join(ROOT, "molecule")), "move scenarios to extensions/molecule/"
    assert os.path.isfile(os.path.join(molecule_summary.ROOT, "galaxy.yml")), "molecule runs from the collection root"


def load(*parts):
    with open(os.path.join(MOLECULE, *parts)) as f:
        return yaml.safe_load(f)


def test_every_role_has_a_scenario_named_after_it():
    assert [r for r in ROLES if r not in SCENARIOS and r not in WITHOUT_SCENARIO] == []
    assert [r for r in WITHOUT_SCENARIO if r in SCENARIOS or r not in ROLES] == []
    assert [s for s in SCENARIOS if s not in ROLES] == [], "a scenario for a role that does not exist"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_scenario_runs_on_localhost_with_the_built_collection(name):
    cfg = load(name, "molecule.yml")
    assert cfg["prerun"] is False
    assert cfg["driver"]["name"] == "default"
    assert cfg["scenario"]["name"] == name
    built = "${MOLECULE_PROJECT_DIRECTORY}/.build/collections"
    assert cfg["ansible"]["env"]["ANSIBLE_COLLECTIONS_PATH"] == built
    assert cfg["ansible"]["cfg"]["defaults"]["collections_path"] == built
    inventory = "--inventory=${MOLECULE_SCENARIO_DIRECTORY}/../shared/inventory.yml"
    assert cfg["ansible"]["executor"]["args"]["ansible_playbook"] == [inventory]
    assert cfg["ansible"]["playbooks"]["destroy"] == "../shared/destroy.yml"
    for playbook in cfg["ansible"]["playbooks"].values():
        assert os.path.isfile(os.path.join(MOLECULE, name, playbook)), playbook


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_sequence_checks_idempotence_and_verifies_with_testinfra(name):
    cfg = load(name, "molecule.yml")
    seq = cfg["scenario"]["test_sequence"]
    assert seq[0] == seq[-1] == "destroy", "start clean and remove what the scenario wrote"
    core = [s for s in seq if s in ("syntax", "converge", "idempotence", "verify")]
    if name in NOT_IDEMPOTENT:
        assert core == ["syntax", "converge", "verify"]
    else:
        assert core == ["syntax", "converge", "idempotence", "verify"]
    assert ("prepare" in seq) == ("prepare" in cfg["ansible"]["playbooks"])
    assert cfg["verifier"]["name"] == "testinfra"
    assert cfg["verifier"]["options"]["hosts"] == "ansible://localhost"
    tests = [f for f in os.listdir(os.path.join(MOLECULE, name, "tests")) if f.startswith("test_") and f.endswith(".py")]
    assert tests, "no testinfra tests in extensions/molecule/%s/tests" % name
    for t in tests:
        with open(os.path.join(MOLECULE, name, "tests", t)) as f:
            tree = ast.parse(f.read())
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert funcs and all(any(isinstance(x, ast.Assert) for x in ast.walk(fn)) for fn in funcs), t


@pytest.mark.parametrize("name", SCENARIOS)
def test_converge_applies_the_role_and_writes_under_the_scenario_root(name):
    plays = load(name, "converge.yml")
    roles = [r["role"] if isinstance(r, dict) else r for play in plays for r in play.get("roles", [])]
    for play in plays:
        for task in play.get("tasks", []):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                if key in task:
                    roles.append(task[key]["name"])
    assert roles and set(roles) == {"llmops.serving." + name}
    text = open(os.path.join(MOLECULE, name, "converge.yml")).read()
    assert "/var/tmp" not in text and "/tmp/" not in text, "write under molecule_root, not a shared path"


def test_the_shared_inventory_roots_every_scenario_in_its_ephemeral_directory():
    inv = load("shared", "inventory.yml")
    assert inv["all"]["hosts"]["localhost"]["ansible_connection"] == "local"
    assert "MOLECULE_EPHEMERAL_DIRECTORY" in inv["all"]["vars"]["molecule_root"]
    tasks = load("shared", "destroy.yml")[0]["tasks"]
    assert tasks[-1]["ansible.builtin.file"] == {"path": "{{ molecule_root }}", "state": "absent"}


def test_testinfra_is_a_test_requirement():
    with open(os.path.join(ROOT, "requirements-test.txt")) as f:
        names = [line.split("#")[0].strip() for line in f]
    assert any(n.startswith("pytest-testinfra") for n in names)


@pytest.fixture
def fake_project(tmp_path):
    """An extensions/molecule/ with three scenarios and a molecule executable that fails scenario ``bad`` (and
    records the directory it ran in)."""
    scenarios = tmp_path / "extensions" / "molecule"
    for name in ("alpha", "bad", "gamma"):
        (scenarios / name).mkdir(parents=True)
        (scenarios / name / "molecule.yml").write_text("---\n")
    (scenarios / "shared").mkdir()  # no molecule.yml: not a scenario
    exe = tmp_path / "molecule-bin"
    exe.write_text("#!/bin/sh\necho \"$@\" >> %s/calls\npwd >> %s/cwd\n[ \"$3\" != bad ]\n" % (tmp_path, tmp_path))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return tmp_path, str(exe)


def test_the_excepted_scenarios_exist():
    assert [s for s in NOT_IDEMPOTENT if s not in SCENARIOS] == []


def test_summary_runs_every_scenario_and_fails_when_one_failed(fake_project, capsys):
    root, exe = fake_project
    rc = molecule_summary.main([], molecule_dir=str(root / "extensions" / "molecule"), molecule=exe, project=str(root))
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert out[-1] == "2 passed, 1 failed"
    assert [line.split()[1:3] for line in out[:3]] == [["alpha", "passed"], ["bad", "FAILED"], ["gamma", "passed"]]
    assert (root / "calls").read_text().splitlines() == ["test -s alpha", "test -s bad", "test -s gamma"]
    # molecule runs from the collection root, where it finds extensions/molecule/
    assert set((root / "cwd").read_text().splitlines()) == {str(root)}


def test_summary_passes_for_named_scenarios_and_refuses_unknown_ones(fake_project, capsys):
    root, exe = fake_project
    kw = dict(molecule_dir=str(root / "extensions" / "molecule"), molecule=exe, project=str(root))
    assert molecule_summary.main(["gamma", "alpha"], **kw) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 passed, 0 failed"
    assert molecule_summary.main(["shared"], **kw) == 2
    assert "unknown scenario(s) shared" in capsys.readouterr().err
    assert (root / "calls").read_text().splitlines() == ["test -s gamma", "test -s alpha"]
