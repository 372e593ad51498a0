"""The user-facing interface stays what other tools call: module names, options, return keys, filters, role variables.

Module and variable names are contracts (playbooks, AWX templates and sites call them by name). Moving code between
files must not change any of them; an intended change is recorded explicitly (``tests/lib/interface.py --write``)
and shows up in review as a diff of ``tests/unit/fixtures/interface.json``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "lib", "interface.py")
SNAPSHOT = os.path.join(ROOT, "tests", "unit", "fixtures", "interface.json")


@pytest.fixture(scope="module")
def current():
    # its own interpreter: ansible's collection loader must import ansible_collections first (see the script)
    out = subprocess.run([sys.executable, SCRIPT, "--json"], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def recorded():
    with open(SNAPSHOT, encoding="utf-8") as f:
        return json.load(f)


def test_the_interface_is_the_recorded_one(current, recorded):
    if current != recorded:
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import interface  # pylint: disable=import-outside-toplevel

        pytest.fail("the user-facing interface changed (- recorded, + working tree); if intended, record it with "
                    "`.venv/bin/python tests/lib/interface.py --write`:\n" + interface.diff(recorded, current))


def test_every_module_role_and_filter_is_in_the_comparison(current):
    modules = {n[:-3] for n in os.listdir(os.path.join(ROOT, "plugins", "modules"))
               if n.endswith(".py") and not n.startswith("_")}
    roles = {n for n in os.listdir(os.path.join(ROOT, "roles"))
             if os.path.isfile(os.path.join(ROOT, "roles", n, "meta", "argument_specs.yml"))}
    assert set(current["modules"]) == modules
    assert set(current["roles"]) == roles and all(current["roles"][r].get("main") for r in roles)
    assert {"k8s_cold_start", "timeline_table"} <= set(current["filters"])


def test_options_from_shared_doc_fragments_are_compared_as_the_module_shows_them(current):
    # the node fragment's roots and the render_dir fragment's option belong to the modules that extend them
    # (ansible-doc merges them the same way), so moving a shared block into a fragment changes nothing here
    assert {"sysfs_root", "proc_root"} <= set(current["modules"]["benchmark_round"]["options"])
    assert "render_dir" in current["modules"]["engine_manifests"]["options"]
    # defaults, types and return keys are part of the contract
    assert current["modules"]["benchmark_coldstart"]["options"]["rep"] == {"default": 1, "type": "int"}
    assert current["modules"]["engine_probe"]["returns"], "engine_probe documents what it returns"
