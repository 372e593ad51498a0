# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: is the collection that runs a job the release of the playbooks it runs?

Under AWX the playbooks come from the project (a checkout of the repository, synced to a branch) and the roles and
modules from the execution environment (an image built from some commit): nothing ties the two unless the job
checks. A release is read from where it is recorded, never from a constant here that could drift:

* an installed collection (an artifact, an execution environment): its ``MANIFEST.json``
  (``collection_info.namespace``, ``name``, ``version``);
* a source tree (a project checkout, a development tree): its ``galaxy.yml`` (``namespace``, ``name``,
  ``version``).

The running collection is the one this file belongs to (``plugins/module_utils/`` sits two levels under the
collection's root); the playbooks' release is the directory above ``playbook_dir``.
"""
from __future__ import annotations

import os

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json, load_yaml

#: Neither file is ever large (the galaxy.yml of this repository is about 3 KiB).
MAX_BYTES = 1024 * 1024
#: The files a release is read from, in the order tried.
RELEASE_FILES = ("MANIFEST.json", "galaxy.yml")


class ReleaseError(ValueError):
    """A release that cannot be read or does not match; ``file`` names the file, ``reason`` the kind
    (``missing``, ``unreadable``, ``invalid``, ``mismatch``)."""

    def __init__(self, msg, file=None, reason=None):
        super(ReleaseError, self).__init__(msg)
        self.file = file
        self.reason = reason


def running_collection_dir():
    """The root of the collection this module belongs to (the one whose plugins run the job)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _info(doc, path):
    """``collection_info`` of a MANIFEST.json, or the top level of a galaxy.yml."""
    if os.path.basename(path) == "MANIFEST.json":
        doc = doc.get("collection_info") if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else None


def read_release(directory, what):
    """``{"collection": "<namespace>.<name>", "version": ..., "file": ...}`` of the collection at ``directory``.

    ``what`` names the directory in errors (``the running collection``, ``playbook_release_dir``). Raises
    :class:`ReleaseError`; the message names the file, never its content.
    """
    tried = []
    for name in RELEASE_FILES:
        path = os.path.join(directory, name)
        tried.append(path)
        try:
            doc = load_json(path, what, max_bytes=MAX_BYTES) if name.endswith(".json") else \
                load_yaml(path, what, max_bytes=MAX_BYTES)
        except FileNotFoundError:
            continue
        except UntrustedInput as e:
            raise ReleaseError("%s; %s records the release, restore it (reinstall the collection or check the "
                               "file out again)" % (e, name), file=path, reason="unreadable")
        info = _info(doc, path)
        fields = [info.get(k) if info else None for k in ("namespace", "name", "version")]
        if not all(isinstance(v, str) and v for v in fields):
            raise ReleaseError("%s: %s has no namespace, name and version (as strings); restore the file the "
                               "collection was built or checked out with" % (what, path), file=path,
                               reason="invalid")
        return {"collection": "%s.%s" % (fields[0], fields[1]), "version": fields[2], "file": path}
    raise ReleaseError("%s: %s holds neither MANIFEST.json nor galaxy.yml, so its release is unknown; run the "
                       "playbooks from a checkout of the repository (galaxy.yml) or from an installed collection "
                       "(MANIFEST.json)" % (what, directory), file=tried[0], reason="missing")


def compare(playbook_release_dir, collection_dir=None):
    """The result of comparing the running collection (``collection_dir``, default :func:`running_collection_dir`)
    with the release of the playbooks at ``playbook_release_dir``. Raises :class:`ReleaseError` when either
    cannot be read or they differ, with the fix."""
    running = read_release(collection_dir or running_collection_dir(), "the running collection")
    playbooks = read_release(playbook_release_dir, "playbook_release_dir")
    result = {"collection": running["collection"], "collection_version": running["version"],
              "collection_file": running["file"], "playbooks_collection": playbooks["collection"],
              "playbooks_version": playbooks["version"], "playbooks_file": playbooks["file"]}
    if (running["collection"], running["version"]) != (playbooks["collection"], playbooks["version"]):
        raise ReleaseError(
            "the playbooks are %s %s (%s) but the collection that runs them is %s %s (%s); rebuild the execution "
            "environment from this commit (make ee builds llmops-serving-ee:%s) or sync the project to the release "
            "the execution environment carries (%s %s)"
            % (playbooks["collection"], playbooks["version"], playbooks["file"], running["collection"],
               running["version"], running["file"], playbooks["version"], running["collection"],
               running["version"]),
            file=running["file"], reason="mismatch")
    return result
