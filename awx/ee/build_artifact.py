# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one recipe of the llmops.serving artifact: ``ansible-galaxy collection build`` of this checkout, with the
commit it was built from written into the built tree as ``meta/build_identity.json``.

``make install``, ``make ee`` (awx/ee/build.sh) and the tests' AWX jobs (tests/lib/awx_harness.py) build through it,
so every artifact says which commit it is; the release check of every job template compares that commit with the
playbooks' revision (plugins/module_utils/common/_release.py). The identity is written into a private copy of the
files git knows (tracked, and untracked but not ignored), never into the checkout, so that a source tree never
carries a stale one and concurrent builds never share one:

    {"format": 1, "commit": "<git rev-parse HEAD>", "dirty": <git status --porcelain is not empty>,
     "version": "<galaxy.yml's version>"}

Outside a git checkout the commit is null and ``why`` says so (the release check then cannot tell, and says so).

    python3 awx/ee/build_artifact.py --output-path DIR [--galaxy PATH/TO/ansible-galaxy]

Prints the path of the built tarball.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IDENTITY = os.path.join("meta", "build_identity.json")
#: What a build without git copies (build_ignore drops the rest of what ansible-galaxy would pack).
NOT_COPIED = (".git", ".venv", ".build", ".hypothesis", ".pytest_cache", "__pycache__")


def _git(*args, source=ROOT):
    proc = subprocess.run(["git", "-C", source] + list(args), capture_output=True, check=False, timeout=120)
    if proc.returncode:
        raise RuntimeError((proc.stderr or b"").decode("utf-8", "replace").strip() or "git %s failed" % args[0])
    return proc.stdout


def _version(source):
    with open(os.path.join(source, "galaxy.yml"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^version:\s*['\"]?([^'\"\s#]+)", line)
            if m:
                return m.group(1)
    raise SystemExit("build_artifact: %s/galaxy.yml has no version" % source)


def identity(source=ROOT):
    """The build identity of the checkout at ``source`` (see the module docstring)."""
    doc = {"format": 1, "commit": None, "dirty": None, "version": _version(source)}
    try:
        doc["commit"] = _git("rev-parse", "--verify", "HEAD^{commit}", source=source).decode().strip()
        doc["dirty"] = bool(_git("status", "--porcelain", "--untracked-files=normal", source=source).strip())
    except (OSError, RuntimeError) as e:
        doc.update(commit=None, dirty=None, why="not built from a git checkout (%s)" % str(e)[:200])
    return doc


def stage(source, dest, doc):
    """Copy the files of ``source`` that git knows into ``dest`` and write the identity there."""
    if doc["commit"]:
        names = _git("ls-files", "-co", "--exclude-standard", "-z", source=source).decode("utf-8").split("\0")
        for rel in names:
            src = os.path.join(source, rel)
            if rel and (os.path.isfile(src) or os.path.islink(src)):
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)
    else:
        shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
    os.makedirs(os.path.join(dest, "meta"), exist_ok=True)
    path = os.path.join(dest, IDENTITY)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, sort_keys=True)
        f.write("\n")


def build(output_path, galaxy="ansible-galaxy", source=ROOT):
    """Build the artifact of ``source`` into ``output_path``; returns the tarball's path."""
    doc = identity(source)
    os.makedirs(output_path, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="llmops-artifact-")
    try:
        tree = os.path.join(tmp, "serving")
        os.makedirs(tree)
        stage(source, tree, doc)
        proc = subprocess.run([galaxy, "collection", "build", "--force", "--output-path", output_path, tree],
                              capture_output=True, text=True, check=False, timeout=600,
                              env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
        if proc.returncode:
            raise SystemExit("build_artifact: ansible-galaxy collection build failed: %s"
                             % (proc.stdout + proc.stderr)[-2000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tarball = os.path.join(output_path, "llmops-serving-%s.tar.gz" % doc["version"])
    if not os.path.isfile(tarball):
        raise SystemExit("build_artifact: ansible-galaxy wrote no %s" % tarball)
    return tarball


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--output-path", required=True)
    parser.add_argument("--galaxy", default="ansible-galaxy", help="the ansible-galaxy to build with")
    parser.add_argument("--source", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    print(build(os.path.abspath(args.output_path), args.galaxy, os.path.abspath(args.source)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
