# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which tests a change needs: the areas of the collection, the paths each owns and the tests that are about it.

``make check`` (``tests/check.py``) runs, for the files a change touches, the tests this module selects; ``make test``
runs every test. Selection has three sources, so that it cannot miss the tests a change breaks:

* **imports** - a unit or property test file runs when it imports, directly or through other files of this repository
  (``plugins/``, ``tests/lib/``, the test packages), a Python file the change touches;
* **areas** - every tracked path belongs to an area (:data:`AREAS`); a change in an area runs that area's unit test
  directories, its integration test files and its molecule scenarios (a role's YAML has no importers, its tests are
  named here);
* **the change's own test files**, and the checks that read the whole tree (:data:`ALWAYS`).

A molecule scenario runs roles: a change confined to roles (``roles/<role>/``) runs the area's scenarios that run one
of those roles, directly or through a role that includes it (:func:`scenario_roles`); any other change of the area
runs all of its scenarios.

Integration tests are chosen by area, never by imports: they run playbooks and real processes, and most of them reach
any Python file through a role; the area names the ones that are about it.

``tests/unit/test_areas.py`` keeps the table honest: every integration test file and every molecule scenario belongs
to an area, and every tracked file under ``plugins/``, ``roles/``, ``playbooks/``, ``awx/``, ``inventories/`` and
``tests/lib/`` is claimed by one.

Usage: ``python tests/lib/areas.py [--json] PATH...`` prints the selection for those changed paths.
"""
from __future__ import annotations

import ast
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = "ansible_collections.llmops.serving"

#: area -> ``paths`` (prefixes it owns), ``unit`` (test files or directories run on any change in it),
#: ``integration`` (tests/integration files about it), ``molecule`` (scenarios of its roles).
AREAS = {
    "stage": {
        "paths": ("plugins/module_utils/stage/", "plugins/modules/model_stage", "plugins/action/model_stage_follow.py",
                  "roles/model_stage/", "playbooks/stage.yml", "playbooks/tasks/model_revision.yml",
                  "tests/lib/stage_synth.py", "tests/lib/fake_peers.py", "tests/lib/netns.py",
                  "benchmarks/fanout_bench.py", "benchmarks/fanout_wire_cpu.py", "benchmarks/fanout_floor.py"),
        "unit": ("tests/unit/plugins/module_utils/stage/", "tests/unit/plugins/modules/test_model_stage.py",
                 "tests/unit/plugins/action/test_follow_progress.py", "tests/property/test_stage_properties.py",
                 "tests/property/test_peer_properties.py"),
        "integration": ("test_stage_copy.py", "test_stage_fanout.py", "test_fanout_netns.py",
                        "test_model_stage_follow.py", "test_netns_fleet.py"),
        "molecule": ("model_stage",),
    },
    "cache": {
        "paths": ("plugins/module_utils/cache/", "plugins/modules/kernel_cache.py", "plugins/modules/kernel_fingerprint.py",
                  "plugins/modules/moe_config_check.py", "roles/kernel_cache/"),
        "unit": ("tests/unit/plugins/module_utils/cache/", "tests/unit/plugins/modules/test_kernel_modules.py",
                 "tests/unit/plugins/modules/test_moe_config_check.py", "tests/property/test_kcache_capture_properties.py"),
        "integration": ("test_kernel_cache_role.py", "test_engine_argv.py"),
        "molecule": ("kernel_cache",),
    },
    "engine": {
        "paths": ("plugins/module_utils/engine/", "plugins/modules/engine_process.py", "plugins/modules/engine_probe.py",
                  "plugins/modules/demo_model.py", "plugins/modules/reference_generate.py",
                  "plugins/modules/preflight_facts.py", "plugins/filter/reference_checks.yml", "roles/engine/",
                  "roles/demo_model/", "roles/preflight/", "roles/diagnose/", "playbooks/site.yml",
                  "playbooks/diagnose.yml", "playbooks/stop.yml", "inventories/local/", "requirements-engine-cpu.txt"),
        "unit": ("tests/unit/plugins/module_utils/engine/", "tests/unit/plugins/modules/test_engine_process.py",
                 "tests/unit/plugins/modules/test_engine_probe.py", "tests/unit/plugins/modules/test_demo_model.py",
                 "tests/unit/plugins/modules/test_preflight_facts.py", "tests/unit/plugins/modules/test_engine_diagnose.py"),
        "integration": ("test_site_local.py", "test_diagnose_local.py", "test_site_demo_model_default.py",
                        "test_engine_argv.py", "test_argument_specs.py"),
        "molecule": ("engine", "demo_model", "preflight", "diagnose"),
    },
    # The revision upgrade of a local engine: its test stops and restarts an engine of its own four times (about 5
    # minutes), so it runs when the upgrade changes, not on every change of the engine (``make test`` runs it always).
    # ``_serving.py`` is under the engine's directory too: a change there selects both areas.
    "upgrade": {
        "paths": ("roles/upgrade/", "playbooks/upgrade.yml", "playbooks/demo_upgrade.yml", "plugins/modules/serving_record.py",
                  "plugins/module_utils/engine/_serving.py", "plugins/modules/upgrade_slo_check.py",
                  "plugins/module_utils/bench/_bench_slo"),
        "unit": ("tests/unit/plugins/modules/test_serving_record.py", "tests/unit/plugins/modules/test_upgrade_slo_check.py",
                 "tests/unit/plugins/module_utils/bench/test_bench_slo.py", "tests/property/test_slo_judge_properties.py"),
        "integration": ("test_upgrade_local.py", "test_awx_upgrade_netns.py"),
        "molecule": (),
    },
    "kube": {
        "paths": ("plugins/module_utils/kube/", "plugins/modules/engine_manifests.py", "plugins/modules/k8s_engine_wait.py",
                  "plugins/modules/pd_manifests.py", "plugins/modules/engine_diagnose.py", "plugins/modules/k8s_upgrade_plan.py",
                  "plugins/modules/k8s_canary_answer.py", "plugins/filter/k8s_",
                  "plugins/filter/timeline_table.yml", "inventories/example-h20/", "tests/lib/kube_",
                  "tests/lib/aibrix_oracle.py", "tests/lib/role_tasks.py"),
        "unit": ("tests/unit/plugins/module_utils/kube/", "tests/unit/plugins/modules/test_k8s_engine_wait.py",
                 "tests/unit/plugins/modules/test_engine_manifests.py", "tests/unit/plugins/modules/test_pd_manifests_module.py",
                 "tests/unit/plugins/modules/test_k8s_auth.py", "tests/unit/test_pd_apply_replay.py",
                 "tests/unit/test_route_oracle.py", "tests/unit/test_kube_api.py"),
        "integration": ("test_engine_render.py", "test_example_fleet.py", "test_renamed_variables.py", "test_engine_rbac.py"),
        "molecule": ("engine", "pd_disagg"),
    },
    "transport": {
        "paths": ("plugins/module_utils/transport/", "plugins/modules/rdma_counters.py", "plugins/modules/pd_load.py",
                  "roles/pd_disagg/", "playbooks/verify_transport.yml", "playbooks/pd_deploy.yml"),
        "unit": ("tests/unit/plugins/module_utils/transport/", "tests/unit/plugins/modules/test_rdma_counters.py",
                 "tests/unit/plugins/modules/test_rdma_hardware_layouts.py", "tests/unit/plugins/modules/test_pd_load.py",
                 "tests/unit/test_pd_proxy_robust.py", "tests/unit/test_pd_apply_replay.py"),
        "integration": ("test_pd_local.py",),
        "molecule": ("pd_disagg",),
    },
    "bench": {
        "paths": ("plugins/module_utils/bench/", "plugins/modules/benchmark_", "plugins/filter/bench.py",
                  "plugins/filter/bench_tokenizer_paths.yml", "plugins/filter/k8s_cold_start.yml",
                  "roles/benchmark/", "playbooks/benchmark.yml", "playbooks/coldstart.yml", "benchmarks/"),
        "unit": ("tests/unit/plugins/module_utils/bench/", "tests/unit/plugins/modules/test_benchmark_modules.py",
                 "tests/unit/plugins/modules/test_benchmark_job_fleet.py", "tests/property/test_bench_process_properties.py"),
        "integration": ("test_benchmark_local.py",),
        "molecule": ("benchmark",),
    },
    "common": {
        "paths": ("plugins/module_utils/common/", "plugins/filter/serving.py", "plugins/filter/k8s_timeline_lines.yml",
                  "plugins/doc_fragments/", "plugins/plugin_utils/", "plugins/modules/release_check.py", "plugins/action/release_check.py",
                  "plugins/modules/deprecated_vars.py", "plugins/action/deprecated_vars.py",
                  "playbooks/tasks/release_check.yml", "tests/lib/no_hang.py", "tests/lib/ansiballz.py",
                  "tests/lib/interface.py", "tests/lib/refusals.py", "tests/lib/areas.py", "tests/check.py"),
        "unit": ("tests/unit/plugins/module_utils/common/", "tests/unit/plugins/action/test_deprecated_vars.py",
                 "tests/unit/plugins/plugin_utils/",
                 "tests/unit/test_ansiballz.py", "tests/unit/test_module_docs.py",
                 "tests/unit/plugins/modules/test_url_credentials.py", "tests/unit/plugins/modules/test_module_requirements.py",
                 "tests/property/test_process_signal_properties.py"),
        "integration": ("test_renamed_variables.py", "test_argument_specs.py"),
        "molecule": (),
    },
    "awx": {
        "paths": ("awx/", "inventories/example-h20-awx/", "playbooks/awx_configure.yml",
                  "playbooks/lookup_plugins/awx_literal_inputs.py", "tests/lib/awx_", "execution-environment.yml",
                  "meta/ee-requirements.txt", "meta/ee-requirements.lock.txt", "meta/host-requirements.txt",
                  "meta/ee-bindep.txt", "bindep.txt", "requirements.yml"),
        "unit": ("tests/unit/test_awx_hosts.py", "tests/unit/test_awx_surveys.py", "tests/unit/test_ee.py",
                 "tests/unit/test_awx_workflow.py", "tests/unit/test_awx_roles.py", "tests/property/test_awx_workflow_properties.py",
                 "tests/unit/test_awx_credentials.py", "tests/unit/test_awx_pd_endpoints.py",
                 "tests/property/test_awx_configure_properties.py"),
        "integration": ("test_awx_runner.py", "test_awx_configure_api.py", "test_awx_netns.py", "test_awx_deploy_netns.py",
                        "test_awx_jobs_netns.py", "test_awx_upgrade_configure.py", "test_awx_upgrade_netns.py"),
        "molecule": (),
    },
}

#: How a role is run in YAML: ``role: llmops.serving.X`` (a play's roles), ``name: llmops.serving.X`` (include_role,
#: import_role); a module task (``llmops.serving.X:``) is neither.
ROLE_USE = re.compile(r"""(?:role|name):\s*['"]?llmops\.serving\.(\w+)""")

#: Checks that read the whole tree: cheap, and any change can break them.
ALWAYS = ("tests/unit/test_layout.py", "tests/unit/test_interface.py", "tests/unit/test_self_contained.py",
          "tests/unit/test_areas.py", "tests/unit/test_suite_order.py", "tests/unit/test_process_layout.py",
          "tests/unit/test_http_bounded.py")

#: Python test trees the import graph covers (integration tests are chosen by area: they run playbooks, not imports).
IMPORT_TREES = ("tests/unit", "tests/property")


def area_of(path):
    """The areas that own ``path`` (a repo-relative path), longest prefix first; empty when none does."""
    hits = [(len(p), name) for name, a in AREAS.items() for p in a["paths"] if path.startswith(p)]
    return [hit[1] for hit in sorted(hits, reverse=True)]


def _module_file(dotted):
    """The repo file of a dotted import under the collection (a module or a package), or None."""
    if not dotted.startswith(PKG + "."):
        return None
    rel = dotted[len(PKG) + 1:].replace(".", "/")
    for cand in (rel + ".py", rel + "/__init__.py"):
        if os.path.isfile(os.path.join(ROOT, cand)):
            return cand
    return None


#: ``rel`` -> (its modification time, its imports): :func:`select` parses each file once per process while it is
#: unchanged (tests/unit/test_areas.py selects several times; each full parse of the tree costs seconds).
_IMPORTS = {}


def imports_of(rel):
    """Repo files the Python file ``rel`` imports: modules of the collection (``from PKG.x import y`` may name a module
    ``y`` of package ``x``) and a test directory's own helpers (``from llmops_testlib import ...``)."""
    path = os.path.join(ROOT, rel)
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return set()
    if _IMPORTS.get(rel, (None,))[0] != stamp:
        _IMPORTS[rel] = (stamp, _parse_imports(rel))
    return set(_IMPORTS[rel][1])


def _parse_imports(rel):
    """:func:`imports_of`, read from the file."""
    try:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + ["%s.%s" % (node.module, a.name) for a in node.names]
            sibling = os.path.join(os.path.dirname(rel), node.module.replace(".", "/") + ".py")
            if os.path.isfile(os.path.join(ROOT, sibling)):
                out.add(os.path.normpath(sibling))
        else:
            continue
        for name in names:
            found = _module_file(name)
            if found:
                out.add(found)
    return out


def python_files(tree):
    """The test files (``test_*.py``) under ``tree``, repo-relative, fixtures and caches left out."""
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, tree)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "fixtures"))
        for name in sorted(filenames):
            if name.startswith("test_") and name.endswith(".py"):
                yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def closure(rel, graph):
    """Every repo file ``rel`` imports, directly or through others (``graph`` caches each file's own imports)."""
    seen, stack = set(), [rel]
    while stack:
        cur = stack.pop()
        if cur not in graph:
            graph[cur] = imports_of(cur)
        for dep in graph[cur]:
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return seen


def _roles_named(directory):
    """The roles of this collection that the YAML files under ``directory`` (repo-relative) run."""
    roles_dir = os.path.join(ROOT, "roles")
    known = set(os.listdir(roles_dir)) if os.path.isdir(roles_dir) else set()
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, directory)):
        dirnames.sort()
        for name in filenames:
            if name.endswith((".yml", ".yaml")):
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    found.update(m for m in ROLE_USE.findall(f.read()) if m in known)
    return found


def scenario_roles(scenario):
    """The roles the molecule ``scenario`` runs: those its files name, and every role those include, transitively."""
    seen, stack = set(), sorted(_roles_named(os.path.join("extensions", "molecule", scenario)))
    while stack:
        role = stack.pop()
        if role not in seen:
            seen.add(role)
            stack.extend(sorted(_roles_named(os.path.join("roles", role)) - seen))
    return seen


def _scenarios_for(scenarios, paths):
    """Of an area's ``scenarios``, those its changed ``paths`` need: all of them, unless every path is a role's file;
    then the ones that run one of those roles."""
    if not all(p.startswith("roles/") for p in paths):
        return set(scenarios)
    roles = set(p.split("/")[1] for p in paths)
    return set(s for s in scenarios if scenario_roles(s) & roles)


def _under(path, prefixes):
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes)


def select(changed):
    """For repo-relative ``changed`` paths: ``{"tests": [...], "integration": [...], "molecule": [...], "areas": [...],
    "unowned": [...]}``. ``tests`` are unit and property test files (or directories), ``integration`` files of
    tests/integration; ``unowned`` lists changed paths no area owns (they select by imports only)."""
    changed = sorted(set(os.path.normpath(p) for p in changed))
    areas, unowned = [], []
    for path in changed:
        found = area_of(path)
        if found:
            areas.extend(a for a in found if a not in areas)
        elif not path.startswith("tests/"):
            unowned.append(path)
    tests = set(ALWAYS)
    integration, molecule = set(), set()
    for name in areas:
        tests.update(AREAS[name]["unit"])
        integration.update("tests/integration/" + f for f in AREAS[name]["integration"])
        molecule.update(_scenarios_for(AREAS[name]["molecule"], [p for p in changed if name in area_of(p)]))
    py_changed = set(p for p in changed if p.endswith(".py"))
    graph = {}
    for tree in IMPORT_TREES:
        for test in python_files(tree):
            if test in py_changed or closure(test, graph) & py_changed:
                tests.add(test)
    integration.update(p for p in changed if p.startswith("tests/integration/test_") and p.endswith(".py"))
    helpers = set(p for p in py_changed if p.startswith("tests/integration/") and not os.path.basename(p).startswith("test_"))
    if helpers:  # the integration tests' own helpers: their conftest serves every file, a module the files importing it
        for test in python_files("tests/integration"):
            if "tests/integration/conftest.py" in helpers or closure(test, graph) & helpers:
                integration.add(test)
    for path in changed:
        if path.startswith("extensions/molecule/"):
            scenario = path.split("/")[2]
            if os.path.isfile(os.path.join(ROOT, "extensions", "molecule", scenario, "molecule.yml")):
                molecule.add(scenario)
    # a directory makes its files redundant
    dirs = [t for t in tests if t.endswith("/")]
    tests = set(t for t in tests if t.endswith("/") or not _under(t, dirs))
    return {"areas": areas, "tests": sorted(t for t in tests if _exists(t)),
            "integration": sorted(t for t in integration if _exists(t)), "molecule": sorted(molecule),
            "unowned": unowned}


def _exists(path):
    """A deleted test file is not run."""
    return os.path.exists(os.path.join(ROOT, path))


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    sel = select(paths)
    if as_json:
        print(json.dumps(sel, indent=1, sort_keys=True))
    else:
        for key in ("areas", "tests", "integration", "molecule", "unowned"):
            print("%-12s %s" % (key + ":", " ".join(sel[key]) or "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
