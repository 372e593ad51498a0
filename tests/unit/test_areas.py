"""tests/lib/areas.py: the table ``make check`` selects tests by. It must own every file and name every integration
test and molecule scenario, or a change could run none of the tests that cover it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

import areas  # noqa: E402

OWNED_TREES = ("plugins/", "roles/", "playbooks/", "awx/", "inventories/", "tests/lib/", "benchmarks/")


def _tracked():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return [p for p in out if p and os.path.exists(os.path.join(ROOT, p))]


def test_every_file_of_the_collection_belongs_to_an_area():
    orphans = [p for p in _tracked() if p.startswith(OWNED_TREES) and not p.endswith("__init__.py")
               and not areas.area_of(p)]
    assert orphans == [], "add these paths to an area of tests/lib/areas.py: %s" % orphans


def test_every_integration_test_and_molecule_scenario_belongs_to_an_area():
    named = set(f for a in areas.AREAS.values() for f in a["integration"])
    files = set(f for f in os.listdir(os.path.join(ROOT, "tests", "integration")) if f.startswith("test_") and f.endswith(".py"))
    assert files - named == set(), "name these in an area's integration list"
    assert named - files == set(), "these integration files do not exist"
    scenarios = set(d for d in os.listdir(os.path.join(ROOT, "extensions", "molecule"))
                    if os.path.isfile(os.path.join(ROOT, "extensions", "molecule", d, "molecule.yml")))
    mol = set(s for a in areas.AREAS.values() for s in a["molecule"])
    assert scenarios - mol == set() and mol - scenarios == set()


def test_every_path_the_table_names_exists():
    tracked = _tracked()
    for name, a in areas.AREAS.items():
        for prefix in a["paths"]:
            assert any(p.startswith(prefix) for p in tracked), "%s: %s matches no file" % (name, prefix)
        for test in a["unit"]:
            assert os.path.exists(os.path.join(ROOT, test)), "%s: %s does not exist" % (name, test)


def test_a_staging_change_runs_the_staging_tests_and_not_the_engines():
    sel = areas.select(["plugins/module_utils/stage/_stage_copy.py"])
    assert sel["areas"] == ["stage"]
    assert "tests/unit/plugins/module_utils/stage/" in sel["tests"]
    assert "tests/integration/test_stage_copy.py" in sel["integration"]
    assert "tests/integration/test_pd_local.py" not in sel["integration"]
    assert "tests/integration/test_benchmark_local.py" not in sel["integration"]
    assert sel["molecule"] == ["model_stage"]


def test_a_role_change_runs_the_tests_named_for_its_area():
    sel = areas.select(["roles/pd_disagg/tasks/main.yml"])
    assert sel["areas"] == ["transport"]
    assert "tests/integration/test_pd_local.py" in sel["integration"]
    assert sel["molecule"] == ["pd_disagg"]


def test_an_engine_change_shares_the_session_engine_and_leaves_the_upgrade_out():
    # test_upgrade_local starts, stops and restarts an engine of its own: it runs when the upgrade changes
    sel = areas.select(["roles/engine/tasks/main.yml"])
    assert sel["areas"] == ["engine"]
    assert "tests/integration/test_site_local.py" in sel["integration"]
    assert "tests/integration/test_upgrade_local.py" not in sel["integration"]
    for changed in ("roles/upgrade/tasks/main.yml", "playbooks/upgrade.yml", "plugins/modules/serving_record.py"):
        sel = areas.select([changed])
        assert sel["areas"] == ["upgrade"], changed
        # the upgrade's own engine, and its AWX workflow on a fleet of two engines (network namespaces)
        assert sel["integration"] == ["tests/integration/test_awx_upgrade_netns.py",
                                      "tests/integration/test_upgrade_local.py"], changed
        assert "tests/unit/plugins/modules/test_serving_record.py" in sel["tests"]
    # the serving record's logic lives under the engine's directory: both areas run
    assert areas.select(["plugins/module_utils/engine/_serving.py"])["areas"] == ["upgrade", "engine"]


def test_a_role_change_runs_the_scenarios_that_run_that_role():
    # the engine role's scenario only: demo_model, preflight and diagnose never run the engine role
    assert areas.select(["roles/engine/tasks/main.yml"])["molecule"] == ["engine"]
    # the engine role includes the diagnose role: both scenarios run it
    assert "diagnose" in areas.scenario_roles("engine")
    assert areas.select(["roles/diagnose/tasks/main.yml"])["molecule"] == ["diagnose", "engine"]
    # a module may serve any role of the area: every scenario of the area runs
    assert areas.select(["plugins/modules/engine_process.py"])["molecule"] == ["demo_model", "diagnose", "engine", "preflight"]
    assert areas.select(["roles/engine/tasks/main.yml", "plugins/modules/engine_process.py"])["molecule"] == [
        "demo_model", "diagnose", "engine", "preflight"]


def test_a_test_that_imports_the_changed_file_through_a_module_runs():
    # test_engine_manifests imports modules/engine_manifests, which imports kube/_k8s_engine -> kube/_k8s_names
    sel = areas.select(["plugins/module_utils/common/_units.py"])
    assert "tests/unit/plugins/module_utils/common/" in sel["tests"]
    chain = areas.closure("tests/unit/plugins/modules/test_model_stage.py", {})
    assert "plugins/module_utils/common/_units.py" in chain
    assert "tests/unit/plugins/modules/test_model_stage.py" in sel["tests"]


def test_a_changed_test_file_runs_and_a_deleted_one_does_not():
    sel = areas.select(["tests/unit/test_release.py", "tests/unit/test_gone.py"])
    assert "tests/unit/test_release.py" in sel["tests"]
    assert "tests/unit/test_gone.py" not in sel["tests"]
    for always in areas.ALWAYS:
        assert always in sel["tests"]


@pytest.mark.parametrize("changed,tool", [
    (["roles/engine/tasks/main.yml"], "ansible-lint"), (["plugins/module_utils/common/_units.py"], "flake8")])
def test_check_lints_the_changed_files_that_exist(changed, tool):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import check  # pylint: disable=import-outside-toplevel

    cmds = check.lint_commands(changed + ["roles/engine/tasks/gone.yml", "plugins/gone.py"])
    assert [os.path.basename(c[0]) for c in cmds] == [tool]
    assert changed[0] in cmds[0] and "roles/engine/tasks/gone.yml" not in cmds[0] and "plugins/gone.py" not in cmds[0]
