"""plugins/module_utils is a few packages by concern, and their imports go one way (docs/development.md,
"Architecture"): ``common`` imports no concern, and a concern imports another one only through the files
named as its interface in :data:`ALLOWED`."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MU = os.path.join(ROOT, "plugins", "module_utils")
P = "ansible_collections.llmops.serving.plugins.module_utils"

#: package -> {package it may import: the files it may import there ("*": any)}. Its own package is always allowed.
ALLOWED = {
    "common": {},
    "stage": {"common": "*"},
    "cache": {"common": "*", "engine": {"_probe"}},  # the warm-up waits for a correct answer like any engine
    "engine": {"common": "*"},
    # a pod's diagnosis shares the findings, log analysis and exit classification of engine/_diagnose, and a
    # container command obeys the same foreground rule as a local engine (engine/_process_command)
    "kube": {"common": "*", "engine": {"_diagnose", "_process_command"}},
    "transport": {"common": "*"},
    # the cold start prepares a kernel-cache layout; rounds read NIXL metrics and RDMA counters
    "bench": {"common": "*", "cache": {"_kcache"}, "transport": {"_prom", "_rdma"}},
}


def imported(path):
    """``(line, package or None, module)`` for every import of a module_utils file in ``path`` (function-level
    imports included); ``package`` is None for an import from the flat ``module_utils`` itself."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (node.module == P or node.module.startswith(P + ".")):
            parts = node.module[len(P) + 1:].split(".") if node.module != P else []
            if not parts:
                out += [(node.lineno, None, a.name) for a in node.names]
            elif len(parts) == 1 and not parts[0].startswith("_"):
                out += [(node.lineno, parts[0], a.name) for a in node.names]
            else:
                out.append((node.lineno, parts[0] if len(parts) > 1 else None, parts[-1]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(P + "."):
                    parts = a.name[len(P) + 1:].split(".")
                    out.append((node.lineno, parts[0] if len(parts) > 1 else None, parts[-1]))
    return out


def violations(mu=MU, allowed=None):
    """Every forbidden import under ``mu``, as a message naming the file, the line, the import and the rule."""
    allowed = ALLOWED if allowed is None else allowed
    bad = []
    for dirpath, dirnames, filenames in os.walk(mu):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel_dir = os.path.relpath(dirpath, mu)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            rel = os.path.normpath(os.path.join("plugins/module_utils", rel_dir, name))
            if rel_dir == ".":
                bad.append("%s: a file outside every package; move it into one of %s" % (rel, ", ".join(allowed)))
                continue
            own = rel_dir.split(os.sep)[0]
            if own not in allowed:
                bad.append("%s: package %s is not in ALLOWED (tests/unit/test_layout.py) nor in the architecture map "
                           "of docs/development.md; add it to both" % (rel, own))
                continue
            for line, pkg, mod in imported(os.path.join(dirpath, name)):
                if pkg is None:
                    bad.append("%s:%d imports %s from the flat module_utils; import it from its package"
                               % (rel, line, mod))
                elif pkg != own:
                    rule = allowed[own].get(pkg)
                    if rule is None and not allowed[own]:
                        bad.append("%s:%d imports %s.%s: %s imports no other package" % (rel, line, pkg, mod, own))
                    elif rule is None:
                        bad.append("%s:%d imports %s.%s: %s may import only %s" % (
                            rel, line, pkg, mod, own, ", ".join(sorted(allowed[own]))))
                    elif rule != "*" and mod not in rule:
                        bad.append("%s:%d imports %s.%s: %s may import %s only through %s" % (
                            rel, line, pkg, mod, own, pkg, ", ".join(sorted(rule))))
    return bad


def test_module_utils_imports_go_one_way():
    assert violations() == []


def test_every_package_has_its_init_and_a_place_in_the_map():
    with open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8") as f:
        doc = f.read()
    found = sorted(d for d in os.listdir(MU) if os.path.isdir(os.path.join(MU, d)) and d != "__pycache__")
    assert found == sorted(ALLOWED)
    for pkg in found:
        assert os.path.isfile(os.path.join(MU, pkg, "__init__.py")), pkg
        assert "`%s/`" % pkg in doc, "docs/development.md's architecture map does not name %s/" % pkg


def _tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_forbidden_import_is_named_with_its_file_and_the_rule(tmp_path):
    mu = _tree(tmp_path, {
        "common/_helper.py": "from %s.stage import _stage\n" % P,
        "kube/_wait.py": "def f():\n    from %s.engine import _process, _diagnose\n" % P,
        "stage/_copy.py": "from %s.common._helper import x\nfrom %s.stage import _other\n" % (P, P),
        "_flat.py": "x = 1\n",
    })
    assert violations(mu) == [
        "plugins/module_utils/_flat.py: a file outside every package; move it into one of "
        + ", ".join(ALLOWED),
        "plugins/module_utils/common/_helper.py:1 imports stage._stage: common imports no other package",
        "plugins/module_utils/kube/_wait.py:2 imports engine._process: kube may import engine only through "
        "_diagnose, _process_command",
    ]


def test_an_import_from_the_flat_layout_is_named(tmp_path):
    mu = _tree(tmp_path, {"bench/_run.py": "from %s import _http\nimport %s._kcache\n" % (P, P)})
    assert violations(mu) == [
        "plugins/module_utils/bench/_run.py:1 imports _http from the flat module_utils; import it from its package",
        "plugins/module_utils/bench/_run.py:2 imports _kcache from the flat module_utils; import it from its package",
    ]
