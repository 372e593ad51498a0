"""``make check``: the fast loop for the change at hand - lint of the changed files, then the tests it needs.

What changed: the files ``git diff --name-only BASE`` names (the working tree against ``BASE``, default ``HEAD``: the
uncommitted change) and the untracked files git does not ignore. Which tests: ``tests/lib/areas.py`` (the unit and
property tests that import a changed file, the tests of the changed areas, the whole-tree checks), run as one pytest
on ``JOBS`` workers like ``make test``; the molecule scenarios of the changed roles run beside the lints and pytest. ``make test``
stays the gate: it runs everything.

``FILES`` (``make check FILES="a b"``, ``--files``) names the changed files instead of git: the loop for one area
while the tree holds other work, and how the times of docs/development.md "The test loop" are measured.

Usage: python tests/check.py [--base REV | --files PATH...] [--jobs N] [--dry-run]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

import areas  # noqa: E402  (tests/lib is not a package on sys.path by default)

BIN = os.path.dirname(sys.executable)
#: YAML that ansible-lint reads (roles, playbooks, the molecule scenarios, AWX data, inventories).
LINTED_YAML = ("roles/", "playbooks/", "extensions/", "awx/", "inventories/", "changelogs/", "meta/")


def changed_files(base):
    """Repo-relative paths changed against ``base`` (tracked: modified, added, deleted) and untracked, not ignored."""
    def git(*args):
        return subprocess.run(["git"] + list(args), cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    names = set(git("diff", "--name-only", base)) | set(git("ls-files", "-o", "--exclude-standard"))
    return sorted(n for n in names if n)


def lint_commands(changed):
    """The lint commands for the changed files that still exist: flake8 (ansible-test's pep8 limit) on Python,
    ansible-lint (production profile) on the YAML it reads."""
    present = [p for p in changed if os.path.isfile(os.path.join(ROOT, p))]
    cmds = []
    py = [p for p in present if p.endswith(".py")]
    if py:
        # E402: a module's imports follow DOCUMENTATION/EXAMPLES/RETURN, as ansible-test's pep8 allows
        cmds.append([os.path.join(BIN, "flake8"), "--max-line-length", "160", "--extend-ignore", "E402"] + py)
    yml = [p for p in present if p.endswith((".yml", ".yaml")) and p.startswith(LINTED_YAML)]
    if yml:
        cmds.append([os.path.join(BIN, "ansible-lint"), "--profile", "production", "--offline"] + yml)
    return cmds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--base", default=os.environ.get("BASE") or "HEAD", help="compare the working tree with this revision")
    ap.add_argument("--jobs", default=os.environ.get("JOBS") or "3", help="pytest workers (pytest-xdist -n)")
    ap.add_argument("--files", nargs="+", metavar="PATH", help="select for these repo-relative paths, not for git's changes")
    ap.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = ap.parse_args(argv)
    start = time.monotonic()
    changed = sorted(set(args.files)) if args.files else changed_files(args.base)
    sel = areas.select(changed)
    what = "(--files)" if args.files else "against " + args.base
    print("changed %s: %d file(s); areas: %s" % (what, len(changed), ", ".join(sel["areas"]) or "none"))
    if sel["unowned"]:
        print("owned by no area (selected by imports only): %s" % " ".join(sel["unowned"]))
    tests = sel["tests"] + sel["integration"]
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(args.jobs),
                  "--dist", "loadfile", "--no-loadscope-reorder"] + tests
    molecule_cmd = [sys.executable, os.path.join(ROOT, "tests", "molecule_summary.py")] + sel["molecule"]
    lints = lint_commands(changed)
    if args.dry_run:
        for cmd in lints + [pytest_cmd] + ([molecule_cmd] if sel["molecule"] else []):
            print(" ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT + "/") else c for c in cmd))
        return 0
    failed = []
    mol = None
    if sel["molecule"]:  # beside the lints and pytest from the start: the scenarios depend on neither
        mol_log = open(os.path.join(ROOT, ".build", "check-molecule.log"), "w", encoding="utf-8")  # pylint: disable=consider-using-with
        mol = subprocess.Popen(molecule_cmd, cwd=ROOT, stdout=mol_log, stderr=subprocess.STDOUT)  # pylint: disable=consider-using-with
    for cmd in lints:
        print("$ %s ..." % os.path.basename(cmd[0]), flush=True)
        if subprocess.call(cmd, cwd=ROOT) != 0:
            failed.append(os.path.basename(cmd[0]))
    print("$ pytest -n %s: %d unit/property target(s), %d integration file(s) (lint took %.0f s)"
          % (args.jobs, len(sel["tests"]), len(sel["integration"]), time.monotonic() - start), flush=True)
    pytest_start = time.monotonic()
    if subprocess.call(pytest_cmd, cwd=ROOT) != 0:
        failed.append("pytest")
    print("pytest took %.0f s" % (time.monotonic() - pytest_start), flush=True)
    if mol is not None:
        rc = mol.wait()
        mol_log.close()
        with open(mol_log.name, encoding="utf-8") as f:
            lines = f.read().splitlines()
        print("\n".join(line for line in lines if line.startswith("molecule ") or "passed" in line[-30:]))
        if rc != 0:
            failed.append("molecule (log: %s)" % os.path.relpath(mol_log.name, ROOT))
    took = time.monotonic() - start
    print("make check: %s in %.0f s" % ("FAILED: " + ", ".join(failed) if failed else "passed", took))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
