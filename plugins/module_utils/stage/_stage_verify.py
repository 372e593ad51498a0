# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what model_stage knows about the source before it writes, and whether a
file is still the one that was listed.

:func:`verify_source` reads src once before anything is written: every ``*.safetensors`` header (kept as raw
bytes, so a copy's header is compared byte for byte without a second full read of the source), the
``model.safetensors.index.json`` against the shards' tensors, and with ``verify=sha256`` the checksums
manifest, which must list every file of src. The result, a :class:`SourceContent`, is what planning
(``_stage_plan``) and the copy (``_stage_copy``) compare copies against.

A listed source file is identified by ``(dev, ino, mtime_ns, ctime_ns)`` (:func:`ident`);
:func:`check_unchanged` refuses a file whose size or identity moved since it was listed.
"""
from __future__ import annotations

import hashlib
import os

from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError


def header_digest(raw):
    return hashlib.sha256(raw).hexdigest() if raw is not None else None


class SourceContent(object):
    """What reading src's headers and manifest established: raw headers, manifest digests, manifest path."""

    def __init__(self, headers, sums, manifest_rel):
        self.headers = headers
        self.sums = sums
        self.manifest_rel = manifest_rel
        self.header_digests = dict((k, header_digest(v)) for k, v in headers.items())

    def level(self, rel, mode):
        """The verify level a fresh copy of ``rel`` reaches in ``mode``."""
        if mode == "sha256" and rel not in self.sums and rel != self.manifest_rel:
            return "headers"
        return mode


def verify_source(src, files, mode, checksums_path=None):
    """Check src before anything is written; returns a :class:`SourceContent`.

    ``headers`` maps each ``*.safetensors`` file to its raw header bytes (compared byte-for-byte with the
    copy afterwards, so the copy's header is verified without a second full read).
    """
    headers, sums = {}, {}
    manifest_rel = None
    if mode == "size":
        return SourceContent(headers, sums, manifest_rel)
    shard_tensors = {}
    for f in files:
        if f["path"].endswith(".safetensors"):
            summary, raw = _safetensors.verify_file(os.path.join(src, f["path"]), f["size"])
            headers[f["path"]] = raw
            shard_tensors[f["path"]] = set(summary["tensors"])
    for f in files:
        if os.path.basename(f["path"]) == _safetensors.INDEX_NAME:
            index_path = os.path.join(src, f["path"])
            base = os.path.dirname(f["path"])
            local = {os.path.relpath(p, base) if base else p: t for p, t in shard_tensors.items()}
            _safetensors.check_index(index_path, _safetensors.load_index(index_path), local)
    if mode == "sha256":
        if not checksums_path:
            raise StageError("checksums: verify=sha256 needs a manifest; none given and %s has no SHA256SUMS"
                             % src)
        sums = _marker.load_checksums(checksums_path)
        present = {f["path"] for f in files}
        for name in sorted(sums):
            if name not in present:
                raise _safetensors.CheckpointError(
                    os.path.join(src, name), "missing shard: listed in %s but not in src" % checksums_path)
        if _paths.is_within(checksums_path, src):
            manifest_rel = os.path.relpath(os.path.realpath(checksums_path), src)
        for f in files:
            if f["path"] not in sums and f["path"] != manifest_rel:
                raise StageError("checksums: %s has no entry for %s; regenerate the manifest or use "
                                 "verify=headers" % (checksums_path, f["path"]))
    return SourceContent(headers, sums, manifest_rel)


def check_copy_header(path, size, src_header):
    """The copy at ``path`` is a valid safetensors file whose header is byte for byte ``src_header``."""
    summary, raw = _safetensors.verify_file(path, size)
    if src_header is not None and raw != src_header:
        raise _safetensors.CheckpointError(path, "header differs from the source file's header")
    return summary


def ident(f):
    """The identity of listed source file ``f``: ``(dev, ino, mtime_ns, ctime_ns)``."""
    return (f["dev"], f["ino"], f["mtime_ns"], f["ctime_ns"])


def check_unchanged(path, st, f, when):
    """Refuse source file ``path`` when its ``stat`` ``st`` is no longer listed file ``f``."""
    if (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) != (f["size"],) + ident(f):
        raise StageError("src: %s changed %s; src must be an immutable revision directory" % (path, when))
