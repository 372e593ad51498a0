"""Run every molecule scenario (or the ones named) with ``molecule test -s <name>``, one after the other, and end
with one plain line: ``N passed, N failed``. Exits 1 when any scenario failed.

Usage: python tests/molecule_summary.py [scenario ...]   (``make molecule`` runs it on all of extensions/molecule/*/)

The scenarios live where molecule expects them in a collection, ``extensions/molecule/<scenario>/`` (molecule 26,
ansible/molecule ``src/molecule/constants.py`` MOLECULE_COLLECTION_ROOT), and molecule runs from the collection's
root (the directory of galaxy.yml), where it finds them.

Each scenario runs to its end even when an earlier one failed, so one broken role does not hide the others.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOLECULE_DIR = os.path.join(ROOT, "extensions", "molecule")
#: A scenario should take well under a minute (``make test`` runs them all); a slower one is marked in the report.
BUDGET_S = 60
# molecule from the same environment as this interpreter (the project's .venv), else from PATH
_BESIDE = os.path.join(os.path.dirname(sys.executable), "molecule")
MOLECULE = _BESIDE if os.access(_BESIDE, os.X_OK) else "molecule"


def scenarios(molecule_dir=MOLECULE_DIR):
    """Names of the directories of ``molecule_dir`` that hold a ``molecule.yml``, sorted."""
    return sorted(n for n in os.listdir(molecule_dir) if os.path.isfile(os.path.join(molecule_dir, n, "molecule.yml")))


def summary(results):
    """The closing line for ``[(name, passed, seconds)]``."""
    passed = sum(1 for r in results if r[1])
    return "%d passed, %d failed" % (passed, len(results) - passed)


def report(results, total_seconds):
    lines = []
    for name, ok, secs in results:
        slow = "  (over the %d s budget)" % BUDGET_S if secs > BUDGET_S else ""
        lines.append("molecule %-14s %s  %5.0f s%s" % (name, "passed" if ok else "FAILED", secs, slow))
    lines.append("molecule total %.0f s" % total_seconds)
    lines.append(summary(results))
    return "\n".join(lines)


def run(names, molecule=MOLECULE, cwd=ROOT):
    results = []
    for name in names:
        start = time.monotonic()
        rc = subprocess.call([molecule, "test", "-s", name], cwd=cwd)
        results.append((name, rc == 0, time.monotonic() - start))
    return results


def main(argv, molecule_dir=MOLECULE_DIR, molecule=MOLECULE, project=ROOT):
    known = scenarios(molecule_dir)
    names = argv or known
    unknown = [n for n in names if n not in known]
    if unknown:
        where = os.path.relpath(molecule_dir, project)
        sys.stderr.write("unknown scenario(s) %s; %s has: %s\n" % (", ".join(unknown), where, ", ".join(known)))
        return 2
    start = time.monotonic()
    results = run(names, molecule, project)
    print(report(results, time.monotonic() - start))
    return 0 if all(r[1] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
