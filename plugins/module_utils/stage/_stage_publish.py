# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: building ``<dest>.partial`` and making it ``dest``.

:func:`prepare_partial` leaves in the build directory only the files a resumed run reuses;
:func:`link_kept` hard-links the intact published files into it, only after the copy succeeded (a new link
changes the published inode's ctime) and reports those that cannot be linked (another filesystem, link
limits) so they are copied instead. :func:`publish` writes the marker into the build directory, then one
``rename`` (or a ``renameat2(RENAME_EXCHANGE)`` with the previous revision) makes it ``dest``, so nothing
half-copied is ever at ``dest``; the copies' stats are taken again afterwards and the marker rewritten when
they moved.

The publish order: the marker records ``sequence``, one more than the largest sequence of the revisions beside
``dest`` (:func:`publish_sequence`), taken while the parent directory is locked (``_clock.sequence_lock``) and
held until the rename, so two runs publishing beside each other never take one number. Pruning keeps the
newest by it (``_stage_prune``); no wall clock takes part, so a run whose clock was a year ahead cannot make its
revision outlive newer ones.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_plan as _plan


def prepare_partial(partial, reuse):
    """Leave in ``partial`` only the files in ``reuse`` (no symlinks, no in-flight files, no old journal)."""
    os.makedirs(partial, exist_ok=True)
    for full, rel, is_dir_link in _stage_layout.walk_leaves(partial):
        if is_dir_link or rel not in reuse or os.path.islink(full):
            _stage_layout.try_unlink(full)


def link_kept(lay, keep, records, by_path, content, journal):
    """Hard-link intact published files into the partial dir; returns the files that could not be linked."""
    failed = []
    for rel in sorted(keep):
        if rel in records:
            continue
        target = _paths.contained(lay.partial, rel, "src")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(_paths.contained(lay.real, rel, "marker"), target)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP):
                raise
            failed.append(by_path[rel])  # copied from src instead
            continue
        rec = _plan.kept_record(keep[rel], by_path[rel], content, _marker.copy_stat(os.lstat(target)))
        records[rel] = rec
        journal.append(rec)
    return failed


def publish_sequence(lay):
    """The next place in the publish order beside ``dest`` (call it under ``_clock.sequence_lock(lay.parent)``):
    one more than every sequence a revision there records, ``dest``'s own previous one included."""
    return _clock.next_sequence(ms.marker.sequence for _path, ms in _stage_layout.revisions(lay.parent)
                                if ms.kind == "ok")


def rewrite_marker(lay, src_real, records, fsync):
    """Rewrite the published revision's marker in place (its files are kept, the record changed): a new publish,
    so it takes the next sequence."""
    with _clock.sequence_lock(lay.parent):
        _marker.write_marker(lay.real, src_real, _marker.min_level(records), records, fsync,
                             sequence=publish_sequence(lay))


def publish(lay, src_real, records, fsync):
    """Marker into the partial dir, then one rename (or exchange with the old revision) makes it dest.

    Hard links shared with the old revision change their ctime when the old tree is deleted, so the copies'
    stats are taken again afterwards and the marker rewritten when they moved (with the same sequence).
    """
    with _clock.sequence_lock(lay.parent):
        sequence = publish_sequence(lay)

        def write(directory):
            _marker.write_marker(directory, src_real, _marker.min_level(records), records, fsync, sequence=sequence)

        write(lay.partial)
        _stage_layout.try_unlink(os.path.join(lay.partial, _marker.JOURNAL))
        if fsync:
            _fsutil.fsync_dir(lay.partial)
        exchanged = False
        if os.path.lexists(lay.real):
            exchanged = _exchange(lay.partial, lay.real)
            if not exchanged:
                _stage_layout.remove_tree(lay.real)
                if _refresh_copy_stats(lay.partial, records):
                    write(lay.partial)
                os.rename(lay.partial, lay.real)
        else:
            os.rename(lay.partial, lay.real)
    if exchanged:
        shutil.rmtree(lay.partial, ignore_errors=True)  # the previous revision, now at the partial path
    if fsync:
        _fsutil.fsync_dir(lay.parent)
    if _refresh_copy_stats(lay.real, records):
        write(lay.real)


_RENAME_EXCHANGE = 2


def _exchange(a, b):
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False when the kernel/libc cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def _refresh_copy_stats(root, records):
    changed = False
    for r in records:
        st = os.lstat(_paths.contained(root, r.path, "marker"))
        if _marker.copy_stat(st) != r.copy:
            r.copy = _marker.copy_stat(st)
            changed = True
    return changed
