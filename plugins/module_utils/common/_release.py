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

A version says little: ``galaxy.yml`` said 0.1.0 for hundreds of commits, so an execution environment built from
any of them passed beside any later project. The identity of a build is the commit it was built from:

* the artifact's :data:`BUILD_IDENTITY_FILE` (written into the built tree only, by the one build recipe,
  ``awx/ee/build_artifact.py``: ``make install``, ``make ee`` and the tests' builds), read by
  :func:`build_identity` and trusted only when the artifact's ``FILES.json`` lists it with the same SHA-256 (it
  was in the tree ``ansible-galaxy collection build`` packed, not added later);
* the playbooks' revision, read by :func:`playbook_revision`: the value AWX gives every job as
  ``awx_project_revision`` (``Job.awx_meta_vars``: ``self.project.scm_revision``, ansible/awx
  ``awx/main/models/jobs.py``; AWX copies the project into the job without its ``.git``,
  ``RunProjectUpdate.make_local_copy`` in ``awx/main/tasks/jobs.py``), else the ``HEAD`` of a git checkout whose
  root is the playbooks' release directory (read from ``.git`` files, no subprocess);
* :func:`judge` gives the verdict: ``ok`` only when both are known and the same commit (a build from uncommitted
  changes on that commit also needs every shipped file to be the playbooks' tree's file), ``mismatch`` naming
  both commits, or ``unknown`` with the reason it cannot tell.
"""
from __future__ import annotations

import hashlib
import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, load_json, load_yaml, read_bytes, read_text)

#: Neither file is ever large (the galaxy.yml of this repository is about 3 KiB).
MAX_BYTES = 1024 * 1024
#: The files a release is read from, in the order tried.
RELEASE_FILES = ("MANIFEST.json", "galaxy.yml")
#: Where the build recipe writes the build identity, relative to the collection's root (never in git: .gitignore).
BUILD_IDENTITY_FILE = "meta/build_identity.json"
#: A git object name: SHA-1 (40 hex digits) or SHA-256 (64).
COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
#: A ref a HEAD may point at (no ``..``, no leading ``/``); symbolic refs are followed this many times at most.
_REF = re.compile(r"^refs/[A-Za-z0-9._/-]+$")
_MAX_REF_HOPS = 5
#: Git's small files (HEAD, a loose ref, the gitdir pointer) and packed-refs are bounded.
_SMALL = 4096
_PACKED_REFS_MAX = 16 * 1024 * 1024
#: A file the artifact ships, hashed to compare a build from uncommitted changes with the playbooks' tree.
_SHIPPED_FILE_MAX = 64 * 1024 * 1024
#: The top-level directories whose files ship (galaxy.yml's build_ignore keeps the rest out); a file in one of
#: them in the playbooks' tree but not in the artifact is a difference too.
_SHIPPED_DIRS = ("plugins", "roles", "playbooks", "meta")


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


# ---- build identity ---------------------------------------------------------------------------------------------

def _unknown(code, why):
    return {"commit": None, "dirty": None, "unknown": code, "why": why}


def build_identity(collection_dir):
    """The commit an installed collection was built from: ``{"commit", "dirty", "file", "unknown", "why"}``.

    ``unknown`` is None when the identity is known, else the code of the reason (``source_tree``,
    ``no_build_identity``, ``identity_not_in_artifact``, ``invalid_build_identity``, ``build_not_from_git``) and
    ``why`` says it in words. Never raises for a missing or hostile file: that is a reason it cannot tell.
    """
    path = os.path.join(collection_dir, BUILD_IDENTITY_FILE)
    manifest = os.path.join(collection_dir, "MANIFEST.json")
    if not os.path.exists(manifest):
        out = _unknown("source_tree", "the collection at %s is a source tree (no MANIFEST.json): it records no build; "
                       "install the artifact (make install) or run the playbooks of that same tree" % collection_dir)
    else:
        out = _read_identity(collection_dir, path)
    out["file"] = path
    return out


def _read_identity(collection_dir, path):
    """The identity of an artifact whose MANIFEST.json exists (see :func:`build_identity`)."""
    try:
        data = read_bytes(path, BUILD_IDENTITY_FILE, max_bytes=_SMALL)
    except FileNotFoundError:
        return _unknown("no_build_identity", "%s has no %s: it was not built by the build recipe "
                        "(awx/ee/build_artifact.py; make install, make ee)" % (collection_dir, BUILD_IDENTITY_FILE))
    except UntrustedInput as e:
        return _unknown("invalid_build_identity", str(e))
    listed = _files_json(collection_dir).get(BUILD_IDENTITY_FILE)
    if listed != hashlib.sha256(data).hexdigest():
        return _unknown("identity_not_in_artifact", "%s is not the one the artifact's FILES.json lists: it was "
                        "written after the build; reinstall the collection from its artifact" % path)
    try:
        doc = load_json(path, BUILD_IDENTITY_FILE, max_bytes=_SMALL, max_depth=2)
    except (UntrustedInput, FileNotFoundError) as e:
        return _unknown("invalid_build_identity", str(e))
    doc = doc if isinstance(doc, dict) else {}
    commit, dirty = doc.get("commit"), doc.get("dirty")
    if commit is None and isinstance(doc.get("why"), str):
        return _unknown("build_not_from_git", "%s records no commit (%s)" % (path, doc["why"][:200]))
    if not isinstance(commit, str) or not COMMIT.match(commit) or not isinstance(dirty, bool):
        return _unknown("invalid_build_identity", "%s has no commit (40 or 64 hex digits) and dirty flag (true or "
                        "false); rebuild the artifact with the build recipe" % path)
    return {"commit": commit, "dirty": dirty, "unknown": None, "why": None}


def _files_json(collection_dir):
    """``{name: sha256}`` of the files an artifact's FILES.json lists (empty when it cannot be read)."""
    try:
        doc = load_json(os.path.join(collection_dir, "FILES.json"), "FILES.json", max_depth=4)
    except (UntrustedInput, FileNotFoundError):
        return {}
    entries = doc.get("files") if isinstance(doc, dict) else None
    return {e["name"]: e.get("chksum_sha256") for e in entries or ()
            if isinstance(e, dict) and e.get("ftype") == "file" and isinstance(e.get("name"), str)}


# ---- the playbooks' revision ------------------------------------------------------------------------------------

def playbook_revision(playbook_release_dir, given=None):
    """The commit of the playbooks: ``{"commit", "source", "unknown", "why"}``.

    ``given`` (AWX's ``awx_project_revision``) wins; else the HEAD of the git checkout whose root is
    ``playbook_release_dir`` (only there: a repository further up, such as a home directory kept in git, is not
    the playbooks'). Uncommitted changes in that checkout are not seen: ``source`` says ``git HEAD``.
    """
    if given not in (None, ""):
        value = str(given).strip().lower()
        if not COMMIT.match(value):
            return dict(_unknown("invalid_playbook_revision", "playbook_revision is not a commit (40 or 64 hex "
                                 "digits); pass awx_project_revision as AWX gives it"), source="playbook_revision")
        return {"commit": value, "source": "playbook_revision", "unknown": None, "why": None}
    try:
        commit = _git_head(playbook_release_dir)
    except (UntrustedInput, ValueError) as e:
        return dict(_unknown("no_playbook_revision", "the playbooks' git checkout at %s cannot be read (%s)"
                             % (playbook_release_dir, e)), source="git HEAD")
    if commit is None:
        return dict(_unknown("no_playbook_revision", "%s is not a git checkout and no playbook_revision was given "
                             "(AWX gives awx_project_revision)" % playbook_release_dir), source=None)
    return {"commit": commit, "source": "git HEAD", "unknown": None, "why": None}


def _git_dir(root):
    """The git directory of the checkout whose root is ``root`` (``.git`` or the file pointing at one), or None."""
    dot = os.path.join(root, ".git")
    if os.path.isdir(dot):
        return dot
    try:
        text = read_text(dot, ".git", max_bytes=_SMALL).strip()
    except FileNotFoundError:
        return None
    if not text.startswith("gitdir:"):
        raise ValueError("%s is neither a git directory nor a gitdir: pointer" % dot)
    return os.path.normpath(os.path.join(root, text[len("gitdir:"):].strip()))


def _git_head(root):
    """The commit ``HEAD`` names in the checkout whose root is ``root`` (None when it is no checkout)."""
    gitdir = _git_dir(root)
    if gitdir is None:
        return None
    try:
        common = read_text(os.path.join(gitdir, "commondir"), "commondir", max_bytes=_SMALL).strip()
        common = os.path.normpath(os.path.join(gitdir, common))
    except FileNotFoundError:
        common = gitdir
    value = read_text(os.path.join(gitdir, "HEAD"), "HEAD", max_bytes=_SMALL).strip()
    for hop in range(_MAX_REF_HOPS):
        if COMMIT.match(value):
            return value
        if not value.startswith("ref:"):
            break
        ref = value[len("ref:"):].strip()
        if not _REF.match(ref) or ".." in ref:
            raise ValueError("HEAD names a ref that is not under refs/")
        value = _read_ref(gitdir, ref) if gitdir != common else None  # a worktree's own refs, then the shared ones
        value = value if value is not None else _read_ref(common, ref)
        if value is None:
            raise ValueError("%s has no commit yet" % ref)
    raise ValueError("HEAD does not resolve to a commit")


def _read_ref(gitdir, ref):
    """A loose ref's content in ``gitdir``, else its line in that directory's packed-refs, else None."""
    try:
        return read_text(os.path.join(gitdir, ref), ref, max_bytes=_SMALL).strip()
    except FileNotFoundError:
        pass
    try:
        packed = read_text(os.path.join(gitdir, "packed-refs"), "packed-refs", max_bytes=_PACKED_REFS_MAX)
    except FileNotFoundError:
        return None
    for line in packed.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == ref and not line.startswith(("#", "^")):
            return parts[0]
    return None


# ---- the verdict ------------------------------------------------------------------------------------------------

def differing_files(collection_dir, tree_dir, limit=20):
    """The shipped files in which the artifact at ``collection_dir`` and the source tree at ``tree_dir`` differ
    (changed, missing on either side), at most ``limit`` names; None when the artifact's FILES.json cannot be read.
    """
    listed = _files_json(collection_dir)
    if not listed:
        return None
    listed.pop(BUILD_IDENTITY_FILE, None)
    out = []
    for name in sorted(listed):
        try:
            digest = hashlib.sha256(read_bytes(os.path.join(tree_dir, name), name, max_bytes=_SHIPPED_FILE_MAX,
                                               follow=False)).hexdigest()
        except (FileNotFoundError, UntrustedInput):
            digest = None
        if digest != listed[name]:
            out.append(name)
    for top in _SHIPPED_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(tree_dir, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fname in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, fname), tree_dir)
                if not fname.endswith(".pyc") and rel not in listed and rel != BUILD_IDENTITY_FILE:
                    out.append(rel)
    return sorted(out)[:limit]


def judge(build, playbooks, differing=None):
    """The verdict of a build identity against the playbooks' revision: ``{"verdict", "reason", "why"}``.

    ``ok`` only when both commits are known and equal and, for a build from uncommitted changes (``dirty``), the
    shipped files are the playbooks' tree's (``differing`` is the list of :func:`differing_files`, empty when
    they are; None when they could not be compared). ``mismatch`` names both commits and the fix; ``unknown``
    gives the reason it cannot tell.
    """
    for side in (build, playbooks):
        if side.get("unknown") or not side.get("commit"):
            return {"verdict": "unknown", "reason": side.get("unknown") or "no_commit", "why": side.get("why") or ""}
    fix = ("rebuild the execution environment from the playbooks' commit %s (make ee at that commit) or pin the "
           "project's scm_branch to the build's commit %s (llmops_awx_scm_branch)" % (playbooks["commit"], build["commit"]))
    if build["commit"] != playbooks["commit"]:
        return {"verdict": "mismatch", "reason": "commit_mismatch",
                "why": "the collection was built from commit %s%s but the playbooks are commit %s; %s"
                       % (build["commit"], " (with uncommitted changes)" if build.get("dirty") else "",
                          playbooks["commit"], fix)}
    if not build.get("dirty"):
        return {"verdict": "ok", "reason": "same_commit", "why": ""}
    if differing is None:
        return {"verdict": "unknown", "reason": "dirty_build",
                "why": "the collection was built from uncommitted changes on %s and its files could not be compared "
                       "with the playbooks' tree; rebuild it from a clean checkout" % build["commit"]}
    if differing:
        return {"verdict": "mismatch", "reason": "files_differ",
                "why": "the collection was built from uncommitted changes on %s and differs from the playbooks' "
                       "tree in %s; rebuild it from the playbooks' tree (make install, make ee)"
                       % (build["commit"], ", ".join(differing))}
    return {"verdict": "ok", "reason": "same_files", "why": ""}


def check_identity(playbook_release_dir, collection_dir=None, playbook_revision_value=None):
    """The identity verdict of the running collection (``collection_dir``) against the playbooks at
    ``playbook_release_dir``: :func:`judge`'s keys plus ``build_commit``, ``build_dirty``, ``build_identity_file``,
    ``playbooks_revision`` and ``playbooks_revision_source``. The same directory on both sides (a source tree
    running its own playbooks, or an installed collection's own playbooks) is ``ok``: the files are the same."""
    collection_dir = collection_dir or running_collection_dir()
    if os.path.realpath(collection_dir) == os.path.realpath(playbook_release_dir):
        return {"verdict": "ok", "reason": "same_tree", "why": "", "build_commit": None, "build_dirty": None,
                "build_identity_file": None, "playbooks_revision": None, "playbooks_revision_source": None}
    build = build_identity(collection_dir)
    playbooks = playbook_revision(playbook_release_dir, playbook_revision_value)
    differing = None
    if build.get("dirty") and not playbooks["unknown"] and build["commit"] == playbooks["commit"]:
        differing = differing_files(collection_dir, playbook_release_dir)
    out = judge(build, playbooks, differing)
    out.update(build_commit=build["commit"], build_dirty=build["dirty"], build_identity_file=build["file"],
               playbooks_revision=playbooks["commit"], playbooks_revision_source=playbooks["source"])
    return out
