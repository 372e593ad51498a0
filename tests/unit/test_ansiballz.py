"""Every module imports from its AnsiballZ payload alone, as it must on a managed host.

ansible-core packs what a module imports from ``module_utils`` into the module's payload
(``ansible/executor/module_common.py``: ``modify_module``, ``ModuleDepFinder``); a file the finder cannot see, or a
package without its ``__init__.py``, works in tests that import the working tree and fails on every GPU node.
``tests/lib/ansiballz.py`` builds each payload with ansible-core itself and imports the module from it in a clean
``python -I`` (see its docstring).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "lib", "ansiballz.py")


def _run(*args):
    # its own interpreter: ansible's collection loader must import ansible_collections first
    out = subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, check=False)
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert results, out.stderr[-2000:]
    return out.returncode, results


def test_every_host_module_imports_from_its_own_payload():
    rc, results = _run()
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import ansiballz  # pylint: disable=import-outside-toplevel

    assert sorted(r["module"] for r in results) == ansiballz.host_modules()
    assert [(r["module"], r["error"]) for r in results if not r["ok"]] == [] and rc == 0
    # the payload really is what the module runs from: its module_utils are packed, not found elsewhere
    probe = next(r for r in results if r["module"] == "engine_probe")
    assert "ansible_collections/llmops/serving/plugins/module_utils/common/_http.py" in probe["packed"]


def test_a_module_util_missing_from_the_payload_is_caught():
    rc, results = _run("engine_probe", "--drop", "ansible_collections/llmops/serving/plugins/module_utils/common/_http.py")
    assert rc == 1 and not results[0]["ok"]
    assert "_http" in results[0]["error"]
