"""The collection's user-facing interface, as other tools call it: one comparable document.

What it holds, each read the way ansible itself reads it:
- every module's documented options (doc fragments merged by ansible's own ``get_docstring``, as ``ansible-doc``
  shows them) with type, required, default, choices, elements and suboptions, and its documented return keys;
- every filter plugin's name (``FilterModule.filters()``);
- every role's entry points and their options from ``meta/argument_specs.yml`` (the variables a site sets).

Descriptions are left out: rewording a sentence is not an interface change; renaming, removing or retyping an
option, a return key, a filter or a role variable is. ``tests/unit/test_interface.py`` compares the tree with the
recorded ``tests/unit/fixtures/interface.json``; an intended change is recorded with

    .venv/bin/python tests/lib/interface.py --write

It runs as a script in its own interpreter (the test starts one): ansible's collection loader must be the first to
import ``ansible_collections``, which a pytest process has already imported its own way.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import importlib
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNAPSHOT = os.path.join(ROOT, "tests", "unit", "fixtures", "interface.json")
_KEYS = ("type", "required", "default", "choices", "elements", "aliases")


def _jsonable(value):
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def _options(options):
    out = {}
    for name, spec in sorted((options or {}).items()):
        spec = spec or {}
        entry = {k: _jsonable(spec[k]) for k in _KEYS if k in spec}
        if spec.get("suboptions") or spec.get("options"):
            entry["suboptions"] = _options(spec.get("suboptions") or spec.get("options"))
        out[name] = entry
    return out


def _returns(returns):
    out = {}
    for name, spec in sorted((returns or {}).items()):
        spec = spec or {}
        entry = {"type": spec.get("type")}
        if spec.get("contains"):
            entry["contains"] = _returns(spec["contains"])
        out[name] = entry
    return out


def collection_path():
    """The folder to put on ansible's collection path so that it loads the working tree as llmops.serving."""
    tree = os.path.join(ROOT, ".build", "pycoll")
    link = os.path.join(tree, "ansible_collections", "llmops", "serving")
    if not os.path.islink(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(ROOT, link)
    return tree


def modules():
    from ansible.plugins.loader import fragment_loader, init_plugin_loader
    from ansible.utils.plugin_docs import get_docstring

    init_plugin_loader([collection_path()])
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))):
        name = os.path.basename(path)[:-3]
        if name.startswith("_"):
            continue
        doc, _plainexamples, returndocs, _metadata = get_docstring(
            path, fragment_loader, collection_name="llmops.serving")
        out[name] = {"options": _options(doc.get("options")), "returns": _returns(returndocs)}
    return out


def filters():
    tree = collection_path()
    if tree not in sys.path:
        sys.path.insert(0, tree)
    names = set()
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "filter", "*.py"))):
        mod = importlib.import_module("ansible_collections.llmops.serving.plugins.filter."
                                      + os.path.basename(path)[:-3])
        names.update(mod.FilterModule().filters())
    return sorted(names)


def roles():
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "meta", "argument_specs.yml"))):
        role = path.split(os.sep)[-3]
        with open(path, encoding="utf-8") as f:
            specs = (yaml.safe_load(f) or {}).get("argument_specs") or {}
        out[role] = {entry: _options((spec or {}).get("options")) for entry, spec in sorted(specs.items())}
    return out


def collect():
    return {"modules": modules(), "filters": filters(), "roles": roles()}


def dumps(doc):
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def diff(recorded, current):
    """Unified diff of the two documents, recorded first ("-" = what callers rely on and is gone or changed)."""
    return "".join(difflib.unified_diff(dumps(recorded).splitlines(True), dumps(current).splitlines(True),
                                        "recorded interface", "working tree", n=2))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", action="store_true", help="record the working tree's interface as the snapshot")
    parser.add_argument("--json", action="store_true", help="print the working tree's interface")
    args = parser.parse_args(argv)
    current = collect()
    if args.json:
        sys.stdout.write(dumps(current))
        return 0
    if args.write:
        with open(SNAPSHOT, "w", encoding="utf-8") as f:
            f.write(dumps(current))
        print("recorded %d modules, %d filters, %d roles in %s" % (
            len(current["modules"]), len(current["filters"]), len(current["roles"]), os.path.relpath(SNAPSHOT, ROOT)))
        return 0
    with open(SNAPSHOT, encoding="utf-8") as f:
        recorded = json.load(f)
    text = diff(recorded, current)
    sys.stdout.write(text or "interface unchanged\n")
    return 1 if text else 0


if __name__ == "__main__":
    sys.exit(main())
