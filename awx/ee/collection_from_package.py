# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An artifact tarball of one collection taken from the ``ansible`` package's wheel, when Galaxy cannot be reached.

    python awx/ee/collection_from_package.py ansible-12.3.0-py3-none-any.whl kubernetes.core 6.2.0 OUT.tar.gz

The ansible package carries each collection under ``ansible_collections/<namespace>/<name>/`` with its MANIFEST.json
(the release it ships). The copy must be exactly VERSION, or nothing is written and the error names both versions.
The tarball is rebuilt with ``ansible-galaxy collection build`` (tests/lib/awx_harness.py ``repack_collection``:
the package strips docs and tests but keeps FILES.json, so its tree cannot be tarred as it is).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PackageError(Exception):
    pass


def extract(wheel, name, version, dest):
    """Write <namespace>-<name> VERSION from WHEEL as the artifact DEST; return DEST."""
    namespace, dot, coll = name.partition(".")
    if not (namespace and dot and coll):
        raise PackageError("collection %r: give it as namespace.name (for example kubernetes.core)" % name)
    prefix = "ansible_collections/%s/%s/" % (namespace, coll)
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PackageError("%s is not a readable wheel (%s); download the ansible package again" % (wheel, exc)) from exc
    with zf, tempfile.TemporaryDirectory(prefix="collection-", dir=os.path.dirname(os.path.abspath(dest))) as work:
        members = [m for m in zf.infolist() if m.filename.startswith(prefix) and not m.is_dir()]
        if not any(m.filename == prefix + "MANIFEST.json" for m in members):
            raise PackageError("%s has no %s; this ansible package does not carry %s" % (os.path.basename(wheel), prefix, name))
        try:
            info = json.loads(zf.read(prefix + "MANIFEST.json").decode("utf-8"))["collection_info"]
            found = str(info["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PackageError("%s: %sMANIFEST.json has no collection_info.version" % (os.path.basename(wheel), prefix)) from exc
        if found != version:
            raise PackageError("%s carries %s %s, not %s; pick the ansible release that ships %s %s, or put the %s "
                               "artifact at %s" % (os.path.basename(wheel), name, found, version, name, version, name, dest))
        tree = os.path.join(work, "tree")
        for m in members:
            rel = m.filename[len(prefix):]
            parts = rel.split("/")
            if os.path.isabs(rel) or ".." in parts:
                raise PackageError("%s: member %s leaves the collection directory" % (os.path.basename(wheel), m.filename))
            path = os.path.join(tree, *parts)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with zf.open(m) as src, open(path, "wb") as out:
                shutil.copyfileobj(src, out)
        sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
        try:
            import awx_harness
        finally:
            sys.path.pop(0)
        try:
            built = awx_harness.repack_collection(tree, work)
        except RuntimeError as exc:
            raise PackageError(str(exc)) from exc
        shutil.move(built, dest)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.stderr.write(__doc__)
        sys.exit(2)
    try:
        print(extract(*sys.argv[1:]))
    except PackageError as exc:
        sys.stderr.write("collection_from_package: %s\n" % exc)
        sys.exit(1)
