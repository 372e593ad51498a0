"""Declared dependencies: every Python library a module imports at run time (itself or through the module_utils
it uses) is in its DOCUMENTATION ``requirements`` and in the execution environment's ``meta/ee-requirements.txt``,
and a missing library ends the module with ``missing_required_lib`` (or, for matplotlib, a report without plots),
never a traceback.

Imports are read with ``ast`` (code, not the text of engine-side scripts kept in strings). Libraries that
ansible-core itself depends on (PyYAML) or that come with a declared library (urllib3 with kubernetes) need no
entry of their own.
"""
from __future__ import annotations

import ast
import glob
import importlib
import os
import re
import sys

import pytest
import yaml

import ansible_collections.llmops.serving as collection
from ansible_collections.llmops.serving.plugins.modules import demo_model, k8s_engine_wait

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
PKG = "ansible_collections.llmops.serving.plugins.module_utils"
# PyYAML: a dependency of ansible-core; urllib3: installed with (and only used beside) the kubernetes client
COMES_WITH = {"yaml": "ansible-core", "urllib3": "kubernetes"}
# import name -> distribution name where they differ
DIST = {"yaml": "pyyaml"}


def _top_level(tree):
    """Import statements run when the file is imported (the module body, and ``try``/``if`` blocks in it)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.Try, ast.If)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            stack.extend(b for h in getattr(node, "handlers", []) for b in h.body)


def _imports(path):
    """``(module_utils names, third-party top-level names)`` imported by the Python file ``path``: every
    third-party import in its code (functions too), the module_utils it imports when it is imported (a
    module_utils imported inside a function serves another module: the child-process helper _bench_round imports in run_client)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    utils, libs = set(), set()
    for node in _top_level(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PKG or (node.module.startswith(PKG + ".")
                                      and not node.module.rsplit(".", 1)[1].startswith("_")):
                utils.update(a.name for a in node.names)  # module_utils files (flat, or a package's)
            elif node.module.startswith(PKG + "."):
                utils.add(node.module.rsplit(".", 1)[1])
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("ansible"):
                continue
            if node.level == 0:
                libs.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            libs.update(a.name.split(".")[0] for a in node.names)
    third = {n for n in libs if n not in sys.stdlib_module_names and n not in ("ansible", "ansible_collections")}
    return utils, third, _optional(tree) & third


def _optional(tree):
    """Libraries imported only under ``try: ... except ImportError:`` with a fallback (not re-raised)."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        catches = [h for h in node.handlers if h.type is not None and "ImportError" in ast.dump(h.type)]
        if not catches or any(isinstance(b, ast.Raise) for h in catches for b in ast.walk(h)):
            continue
        for stmt in node.body:
            for sub in ast.walk(stmt):
                if isinstance(sub, ast.Import):
                    out.update(a.name.split(".")[0] for a in sub.names)
                elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                    out.add(sub.module.split(".")[0])
    return out


def _module_utils_file(name):
    """The file of the module_utils ``name``, whichever package holds it."""
    found = glob.glob(os.path.join(ROOT, "plugins", "module_utils", "**", name + ".py"), recursive=True)
    assert len(found) == 1, (name, found)
    return found[0]


def _needs(module_path, optional=False):
    """Third-party libraries the module imports, itself or through module_utils (transitively); without
    ``optional``, those it can do without (imported under ``except ImportError`` with a fallback) are left out."""
    utils, libs, opt = _imports(module_path)
    libs = libs if optional else libs - opt
    seen = set()
    while utils - seen:
        name = sorted(utils - seen)[0]
        seen.add(name)
        more, third, opt = _imports(_module_utils_file(name))
        utils |= more
        libs |= third if optional else third - opt
    return libs


def _requirements(module_path):
    """The text of the ``requirements`` list of the module's DOCUMENTATION (the block up to the next top-level
    key, so that the audit does not depend on the rest of the document)."""
    with open(module_path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DOCUMENTATION":
            m = re.search(r"^requirements:\n((?:[ -].*\n)*)", node.value.value, re.M)
            return yaml.safe_load(m.group(1)) and " ".join(yaml.safe_load(m.group(1))) if m else ""
    raise AssertionError("%s has no DOCUMENTATION" % module_path)


def _ee_names():
    """Libraries declared for where the modules run: the EE's (meta/ee-requirements.txt) and the fleet hosts'
    (meta/host-requirements.txt); tests/unit/test_ee.py checks which side each belongs to."""
    names = set()
    for rel in ("ee-requirements.txt", "host-requirements.txt"):
        with open(os.path.join(ROOT, "meta", rel), encoding="utf-8") as f:
            names |= {re.split(r"[<>=!~;\[ ]", line.split("#", 1)[0].strip(), maxsplit=1)[0].lower()
                      for line in f if line.split("#", 1)[0].strip()}
    return names


MODULES = sorted(glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")))


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_every_library_a_module_imports_is_declared(path):
    needs = _needs(path) - set(COMES_WITH)
    every = _needs(path, optional=True) - set(COMES_WITH)
    doc = _requirements(path).lower()
    ee = _ee_names()
    assert sorted(n for n in needs if n.lower() not in doc) == [], "missing from DOCUMENTATION requirements"
    assert sorted(n for n in every if DIST.get(n, n).lower() not in ee) == [], "missing from meta/ee-requirements.txt and meta/host-requirements.txt"


def test_the_audit_sees_the_libraries_behind_module_utils():
    """The walk is not vacuous: it finds what the known users import."""
    mods = dict((os.path.basename(p)[:-3], p) for p in MODULES)
    assert {"numpy", "safetensors", "tokenizers"} <= _needs(mods["demo_model"])
    assert "kubernetes" in _needs(mods["k8s_engine_wait"]) and "kubernetes" in _needs(mods["engine_diagnose"])
    # optional in code (a report without plots), declared all the same: the plots are what a user expects
    assert "matplotlib" in _needs(mods["benchmark_report"], optional=True) - _needs(mods["benchmark_report"])
    assert "matplotlib" in _requirements(mods["benchmark_report"]) and "matplotlib" in _ee_names()
    assert "jsonschema" in _needs(mods["engine_probe"], optional=True) - _needs(mods["engine_probe"])
    assert "matplotlib" not in _needs(mods["benchmark_plan"], optional=True)


def _hide(monkeypatch, *names):
    """``import name`` raises ImportError, as on a host without the library."""
    for mod in list(sys.modules):
        if mod.split(".")[0] in names:
            monkeypatch.delitem(sys.modules, mod)
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def test_demo_model_without_its_libraries_fails_with_missing_required_lib(run_module, monkeypatch, tmp_path):
    _hide(monkeypatch, "numpy", "safetensors", "tokenizers")
    r = run_module(demo_model, {"models_root": str(tmp_path)})
    assert r["failed"] and r["msg"].startswith("Failed to import the required Python library (")
    assert "Traceback" not in r["msg"] and os.listdir(str(tmp_path)) == []


def test_k8s_engine_wait_without_the_kubernetes_client_fails_with_missing_required_lib(run_module, monkeypatch):
    _hide(monkeypatch, "kubernetes")
    try:
        mod = importlib.reload(k8s_engine_wait)
        r = run_module(mod, {"namespace": "llm", "selector": {"app": "engine"}})
    finally:
        monkeypatch.undo()
        importlib.reload(k8s_engine_wait)
    assert r["failed"] and "required Python library (kubernetes)" in r["msg"], r
    assert list(collection.__path__)
