# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what a model_stage run does with each source file.

:func:`plan` compares the source listing with the published marker (``_stage_marker``): a published copy is
kept when it is intact (``FileRecord.damage``) and of this very source file (``FileRecord.same_source``),
upgraded in place when it was verified more weakly than this run asks (:func:`check_upgrades`), and copied
again otherwise, with the reason in ``restaged``. It runs twice: on ``stat`` alone (a clean plan reads no data),
then with the source's headers and manifest (``_stage_verify.SourceContent``) once something is to be done.

:func:`partial_reusable` decides which files a killed run already completed in ``<dest>.partial`` are provably
copies of today's source files (from its journal), so a resumed run copies only the rest. :func:`reason` is the
one-line ``reason`` of the module result.
"""
from __future__ import annotations

import hashlib
import os

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, open_regular


class Plan(object):
    """What a run does with each source file, decided from the marker (see ``_stage_marker``)."""

    def __init__(self):
        self.keep = {}        # rel -> FileRecord: the published copy is intact and of this very source file
        self.upgrade = {}     # rel -> FileRecord: the same, but verified more weakly than this run asks
        self.copy = []        # source file dicts to copy
        self.restaged = []    # {path, reason}: files of the published revision that are copied again
        self.extras = []      # paths in dest that src does not have
        self.refresh = False  # the marker must be rewritten even when no data moves
        self.bad_marker = None

    @property
    def clean(self):
        return not (self.copy or self.upgrade or self.extras or self.refresh)


def dest_listing(root):
    """Relative paths of everything under ``root`` that is not a directory (directory symlinks included)."""
    out = set(rel for _full, rel, _is_dir_link in _stage_layout.walk_leaves(root))
    out.discard(_marker.MARKER)
    return out


def src_change(rec, f):
    if rec.size != f["size"]:
        return "size %d, staged from %d" % (f["size"], rec.size)
    return "another file, or rewritten: inode, mtime, ctime or header differ"


def plan(files, src_real, lay, mstate, verify, content=None):
    """Stat-only plan (``content`` None) or the full one once src's headers and manifest are read."""
    plan = Plan()
    marker = mstate.marker if mstate.kind == "ok" else None
    if mstate.kind == "bad":
        plan.bad_marker = mstate.reason
    if marker is None:
        plan.copy = list(files)
        return plan
    src_paths = set(f["path"] for f in files)
    plan.extras = sorted(dest_listing(lay.real) - src_paths)
    if set(marker.files) != src_paths or marker.source != src_real:
        plan.refresh = True
    for f in files:
        rel = f["path"]
        rec = marker.files.get(rel)
        if rec is None:
            plan.copy.append(f)
            continue
        why = rec.damage(lay.real)
        exact = False
        if why is None:
            same, exact = rec.same_source(f, src_real, marker.source,
                                          content.header_digests.get(rel) if content else None,
                                          content.sums.get(rel) if content else None)
            if not same:
                why = "its source file is not the one staged (%s)" % src_change(rec, f)
        if why:
            plan.copy.append(f)
            plan.restaged.append({"path": rel, "reason": why})
            continue
        if not exact:
            plan.refresh = True
        if _marker.strength(rec.verify) < _marker.strength(verify):
            plan.upgrade[rel] = rec
        else:
            plan.keep[rel] = rec
    return plan


def check_upgrades(plan, lay, files, content, verify):
    """Verify intact copies that were checked more weakly than asked, in place; failures are staged again."""
    by_path = dict((f["path"], f) for f in files)
    for rel in sorted(plan.upgrade):
        rec = plan.upgrade[rel]
        path = _paths.contained(lay.real, rel, "marker")
        try:
            if _marker.strength(rec.verify) < _marker.strength("headers") and rel in content.headers:
                _verify.check_copy_header(path, rec.size, content.headers[rel])
            sha = rec.sha256
            want = content.sums.get(rel) if verify == "sha256" else None
            if want and sha != want:
                sha = _sha256_copy(path)
                if sha != want:
                    raise _safetensors.CheckpointError(path, "checksum mismatch: sha256 %s, manifest says %s"
                                                       % (sha, want))
            if rec.damage(lay.real):
                raise _safetensors.CheckpointError(path, "changed while it was being verified")
        except _safetensors.CheckpointError as e:
            plan.copy.append(by_path[rel])
            plan.restaged.append({"path": rel, "reason": "the published copy fails verify=%s: %s"
                                                         % (verify, e.reason)})
            continue
        plan.keep[rel] = _marker.FileRecord(rel, rec.size, rec.src, rec.copy, content.level(rel, verify),
                                            content.header_digests.get(rel) or rec.header_sha256, sha,
                                            rec.pieces, rec.piece_size)
        plan.refresh = True
    plan.upgrade = {}


def _sha256_copy(path):
    """sha256 of a published copy, read only if it is (still) a regular file reached without a symlink: a FIFO or
    device swapped in after planning is a failed verification (staged again), never a hang."""
    try:
        h = hashlib.sha256()
        with open_regular(path, follow=False) as f:
            for chunk in iter(lambda: f.read(_fsutil.HASH_BUF), b""):
                h.update(chunk)
        return h.hexdigest()
    except UntrustedInput as e:
        raise _safetensors.CheckpointError(path, _safetensors.untrusted_reason(path, e))
    except OSError as e:
        raise _safetensors.CheckpointError(path, "cannot read: %s" % (e.strerror or e.__class__.__name__))


def kept_record(rec, f, content, copy=None):
    """The record of a kept copy, with the current source identity."""
    return _marker.FileRecord(f["path"], f["size"], _verify.ident(f), copy or rec.copy, rec.verify,
                              (content.header_digests.get(f["path"]) if content else None) or rec.header_sha256,
                              rec.sha256, rec.pieces, rec.piece_size)


def partial_reusable(partial, files, src_real, verify, content):
    """Files a previous run completed in ``partial`` that are provably copies of today's source files."""
    reuse = {}
    if not os.path.isdir(partial) or os.path.islink(partial):
        return reuse
    prev = _marker.partial_records(partial)
    for f in files:
        rel = f["path"]
        entry = prev.get(rel)
        if entry is None:
            continue
        rec, source = entry
        if rec.damage(partial) is not None:
            continue
        same, _exact = rec.same_source(f, src_real, source, content.header_digests.get(rel), content.sums.get(rel))
        if same and _marker.strength(rec.verify) >= _marker.strength(content.level(rel, verify)):
            reuse[rel] = kept_record(rec, f, content)
    return reuse


def reason(plan, mstate, verify, n_new):
    if mstate.kind == "none":
        return "not staged yet"
    if mstate.kind == "bad":
        return "not staged: %s" % mstate.reason
    parts = []
    if plan.restaged:
        first = plan.restaged[0]
        more = ", ..." if len(plan.restaged) > 1 else ""
        parts.append("%d file(s) staged again (%s: %s%s)" % (len(plan.restaged), first["path"], first["reason"], more))
    if n_new:
        parts.append("%d file(s) new in src" % n_new)
    if plan.extras:
        more = ", ..." if len(plan.extras) > 1 else ""
        parts.append("dest holds %d file(s) src does not (%s%s)" % (len(plan.extras), plan.extras[0], more))
    if not parts and plan.refresh:
        parts.append("marker refreshed (verify %s, or the source moved with identical content)" % verify)
    return "; ".join(parts) or None
