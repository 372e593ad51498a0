"""The suite stands on the repository alone: no test, test library or fixture names a file outside the checkout
(a machine's shared folder, another checkout). Schemas and fixtures the tests need live under tests/ with their
upstream source and version (tests/unit/fixtures/schemas/README.md)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Absolute paths a test may name: the system's own trees (device files, /proc, tools) and the kernel's.
SYSTEM = ("/proc", "/sys", "/dev", "/etc", "/tmp", "/var/tmp", "/usr", "/bin", "/sbin", "/lib", "/run")
# and the running user's own home (tools' caches, such as the engine's ~/.cache/vllm named in a sample log line)
SYSTEM += (os.path.expanduser("~") + "/",) if os.path.expanduser("~") not in ("", "/") else ()


def _python_files():
    for top in ("tests", "extensions", "benchmarks"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".hypothesis")]
            for fn in filenames:
                if fn.endswith(".py"):
                    yield os.path.join(dirpath, fn)


def outside_paths(path, system=SYSTEM):
    """String constants of ``path`` that are absolute paths to something that exists outside the checkout and
    outside the ``system`` trees."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            s = node.value.strip()
            if not s.startswith("/") or "\n" in s or len(s) > 300:
                continue
            if not s.strip("/.") or s.startswith(system) or s.startswith(ROOT + "/"):
                continue
            if os.path.exists(s):
                found.append("%s:%d %s" % (os.path.relpath(path, ROOT), node.lineno, s))
    return found


def test_no_test_reads_a_path_outside_the_checkout():
    found = [hit for p in _python_files() for hit in outside_paths(p)]
    assert found == [], "vendor these under tests/ (with their upstream source and version): %s" % found


def test_the_check_sees_an_outside_path(tmp_path):
    outside = tmp_path / "schema.yaml"
    outside.write_text("{}")
    probe = tmp_path / "test_probe.py"
    probe.write_text("SCHEMA = %r\nMISSING = %r\n" % (str(outside), str(tmp_path / "absent.yaml")))
    # tmp_path is under /tmp, a system tree: judged without that allowance, the existing file is found, the
    # missing one is not
    system = tuple(p for p in SYSTEM if not str(tmp_path).startswith(p + "/"))
    assert [h.split(" ", 1)[1] for h in outside_paths(str(probe), system)] == [str(outside)]
