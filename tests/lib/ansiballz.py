"""Build every module's AnsiballZ payload the way ansible-core does, and import the module from it in a clean interpreter.

A module runs on the managed host from its payload alone: ansible packs the ``module_utils`` files the module
imports (found by ansible's own ``ModuleDepFinder``, packages included, each with its ``__init__.py``) into a zip.
A ``module_utils`` file that only the working tree has - a package without ``__init__.py``, an import the finder
cannot see - works in the tests, which import the working tree, and fails on every host. This script builds each
payload with ``ansible.executor.module_common.modify_module`` (ansible-core) and, in a clean ``python -I``, unpacks
it with the wrapper's own ``explode`` command and imports the module as the payload carries it, with the path
starting at the unpacked payload, so every ``ansible`` and ``ansible_collections`` import resolves from the payload
or fails.

    .venv/bin/python tests/lib/ansiballz.py [MODULE ...]     # prints one JSON object per module

It runs in its own interpreter (the test starts one): ansible's collection loader must import ``ansible_collections``
first.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import interface  # tests/lib/interface.py, beside this script (a script's own folder is on its path)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Import the module's source from the payload; main() is not run (the module's __name__ is not "__main__").
_IMPORT = r"""
import json, os, runpy, sys
wrapper, name, drop = sys.argv[1], sys.argv[2], sys.argv[3:]
payload = os.path.join(os.path.dirname(wrapper), "debug_dir")
sys.argv = [wrapper, "explode"]  # the wrapper's own debug command unpacks the payload into debug_dir beside it
try:
    runpy.run_path(wrapper, run_name="__main__")
except SystemExit:
    pass
for rel in drop:  # the check's own test removes a packed file to see it fail
    os.remove(os.path.join(payload, rel))
sys.path.insert(0, payload)
packed = sorted(os.path.relpath(os.path.join(d, f), payload) for d, _dirs, files in os.walk(payload)
                for f in files if f.endswith(".py") and "llmops" in d)
try:  # the module as the payload carries it (ansible/legacy/<ns>/<coll>/<name>.py); main() is not run
    runpy.run_path(os.path.join(payload, "ansible", "legacy", "llmops", "serving", name + ".py"),
                   run_name="ansiballz_import_check")
except BaseException as exc:  # what the host would see
    print(json.dumps({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc), "packed": packed}))
    sys.exit(1)
# aliases (ansible.module_utils.distro is the system's distro where installed, six.moves maps to the stdlib) are
# ansible's own choice on every host; a module loaded under its own name must come from the payload
outside = sorted(n for n, m in sys.modules.items()
                 if (n == "ansible" or n.startswith(("ansible.", "ansible_collections.")))
                 and getattr(m, "__name__", None) == n
                 and getattr(m, "__file__", None) and not m.__file__.startswith(payload))
print(json.dumps({"ok": not outside, "packed": packed,
                  "error": "imported from outside the payload: %s" % outside if outside else ""}))
sys.exit(1 if outside else 0)
"""


def check(names, workdir, drop=()):
    from ansible.executor import module_common
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    init_plugin_loader([interface.collection_path()])
    templar = Templar(loader=DataLoader())
    for name in names:
        source = os.path.join(ROOT, "plugins", "modules", name + ".py")
        built = module_common.modify_module(module_name="llmops.serving." + name, module_path=source, module_args={},
                                            templar=templar, task_vars={"ansible_python_interpreter": sys.executable})
        where = os.path.join(workdir, name)
        os.makedirs(where)
        wrapper = os.path.join(where, "AnsiballZ_%s.py" % name)
        with open(wrapper, "wb") as f:
            f.write(built.b_module_data)
        run = subprocess.run([sys.executable, "-I", "-c", _IMPORT, wrapper, name] + list(drop), cwd=where,
                             capture_output=True, text=True, check=False)
        try:
            verdict = json.loads(run.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            verdict = {"ok": False, "error": (run.stderr or run.stdout).strip()[-2000:], "packed": []}
        yield dict(verdict, module=name)


def host_modules():
    """The modules that run on a managed host: not those an action plugin of the same name runs on the controller."""
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))
                  if not os.path.basename(p).startswith("_")
                  and not os.path.exists(os.path.join(ROOT, "plugins", "action", os.path.basename(p))))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("modules", nargs="*", help="default: every module that runs on a managed host")
    parser.add_argument("--drop", action="append", default=[], metavar="PATH",
                        help="remove this file from each unpacked payload first (shows that the check can fail)")
    args = parser.parse_args(argv)
    names = args.modules or host_modules()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ansiballz-") as workdir:
        for result in check(names, workdir, args.drop):
            failed += not result["ok"]
            print(json.dumps(result, sort_keys=True))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
