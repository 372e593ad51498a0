# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: deleting staged revisions (``state: absent`` and ``keep_revisions``).

Only what model_stage staged is ever deleted: a directory carrying its marker file (:func:`remove`; a broken
marker is still ours) or, for pruning, a real directory with a valid marker beside ``dest`` (:func:`prune`).
Pruning keeps the newest by the marker's ``sequence``, the publish order (``_stage_publish``,
``_clock.order_key``), never by ``staged_at`` or an mtime: a revision staged while the clock was a year ahead
does not outlive newer ones. A marker without a sequence (written before there were any) counts as older than
every marker with one, and such markers keep their old order (``staged_at``) among themselves.

Nothing is deleted that is pinned (:func:`is_pinned`: by path, or by revision name, compared after Unicode
normalisation with ``_names.same_name``, so a pin typed in NFC protects the directory stored in NFD); a pin
that names no staged revision beside ``dest`` is returned in ``unmatched_pins`` (the module warns), never
silently ignored. Nothing is deleted that is in use (:func:`users`, the ``_inuse`` scan: a process with a file below it open or mapped, its
working or root directory there, or a mount of it in its mount namespace), or overlaps the running stage's src,
manifest or progress file. Each deletion holds the revision's lock (``_stage_lock``), deletes it with one rename first
(``_stage_layout.remove_tree``) and deletes the lock file while holding it.
"""
from __future__ import annotations

import os

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock
from ansible_collections.llmops.serving.plugins.module_utils.common import _inuse
from ansible_collections.llmops.serving.plugins.module_utils.common import _names
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_lock import DestLock
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError


def check_pinned(pinned):
    """``pinned`` entries are strings without NUL; refused before anything changes."""
    for i, p in enumerate(pinned or ()):
        if not isinstance(p, str) or "\x00" in p:
            raise StageError("pinned[%d]: must be a revision directory name or a path (a string without NUL); fix "
                             "the entry" % i)


def is_pinned(dest, pinned):
    """``dest`` is named by an entry of ``pinned``: a bare name (no ``/`` once trailing slashes are dropped) is a
    revision directory name, or the name of a symlink beside the revisions that points at one (``current``);
    anything else is a path (relative to the working directory when relative) and names
    ``dest`` when it is the same directory however it is spelt (``_paths.same_path``: symlinked root, ``..``,
    ``//``, a bind mount). Names are compared after Unicode normalisation (``_names.same_name``; a path's
    components are looked up in whatever spelling they are stored, ``_names.find_spelling``)."""
    name = os.path.basename(dest.rstrip("/"))
    parent = os.path.dirname(dest.rstrip("/"))
    for p in pinned:
        if not p or not isinstance(p, str):
            continue
        bare = p.rstrip("/")
        if not bare:
            continue
        if "/" not in bare:
            # the revision's name, or a link beside it naming it ("current" -> the revision it points to)
            if _names.same_name(bare, name):
                return True
            if bare not in (".", ".."):
                link = _names.find_spelling(os.path.join(parent, bare))
                if link and _paths.same_path(link, dest):
                    return True
            continue
        spelt = _names.find_spelling(bare)
        if spelt and _paths.same_path(spelt, dest):
            return True
        pin_parent = _names.find_spelling(os.path.dirname(bare) or "/")
        if pin_parent and _paths.same_path(pin_parent, parent) and _names.same_name(os.path.basename(bare), name):
            return True
    return False


def unmatched_pins(paths, pinned):
    """The entries of ``pinned`` that name none of ``paths`` (see :func:`is_pinned`), in their order."""
    return [p for p in pinned if not any(is_pinned(path, [p]) for path in paths)]


_VIA = {"fd": "has %s open", "map": "maps %s", "cwd": "works in %s", "root": "is chrooted in %s",
        "environ": "names %s in its environment", "mount": "mounts it at %s (its mount namespace)"}


def users(paths, proc_root="/proc"):
    """Processes using any of ``paths`` by any path to them (``_inuse.users_of``)."""
    return _inuse.users_of([p for p in paths if os.path.lexists(p)], proc_root=proc_root)


def describe_user(u):
    return "pid %d %s" % (u["pid"], _VIA.get(u["via"], u["via"] + " %s") % u["file"])


def _in_use_entry(path, u):
    return {"path": path, "pid": u["pid"], "via": u["via"], "file": u["file"]}


def _check_removable(lay):
    """A dest to delete must carry a marker file; its marker need not be valid (a broken one is still ours)."""
    if not os.path.lexists(lay.real):
        return
    ms = _marker.read_marker(lay.real)
    if ms.kind in ("none", "foreign"):
        raise StageError("dest: %s %s, so it was not staged by this module; refusing to delete it"
                         % (lay.dest, ms.reason or "has no %s" % _marker.MARKER))


def remove(dest, pinned=(), check_mode=False, lock_timeout=3600, proc_root="/proc"):
    """state=absent: remove a staged revision unless pinned or in use (by any path, in any mount namespace)."""
    check_pinned(pinned)
    lay = _stage_layout.Layout(dest)
    result = {"changed": False, "dest": lay.dest}
    if not os.path.lexists(lay.real) and not os.path.lexists(lay.partial):
        return result
    if is_pinned(lay.dest, pinned) or is_pinned(lay.real, pinned):
        raise StageError("pinned: %s is pinned; remove it from pinned before deleting it" % lay.dest)
    lay.check_not_links()

    def refuse_in_use():
        found = users([lay.real, lay.partial], proc_root)
        if found:
            raise StageError("dest: %s is in use (%s); stop it before removing the revision"
                             % (lay.dest, describe_user(found[0])))

    if check_mode:
        _check_removable(lay)
        refuse_in_use()
        result["changed"] = True
        return result
    with DestLock(lay.lock, lock_timeout) as lock:
        lay.check_not_links()
        if os.path.lexists(lay.real) or os.path.lexists(lay.partial):
            _check_removable(lay)
            refuse_in_use()
            if os.path.lexists(lay.real):
                _stage_layout.remove_tree(lay.real)
            _stage_layout.remove_partial(lay.partial)
            result["changed"] = True
        lock.unlink()
    return result


def prune(dest, keep, pinned=(), check_mode=False, proc_root="/proc", protect=()):
    """Keep the newest ``keep`` staged revisions beside ``dest`` (``dest`` always counts as kept), newest by the
    publish order (see the module docstring).

    Only real directories with a valid marker count as revisions; one that overlaps a path in ``protect`` (the
    run's src, manifest, progress file) is never removed. Each removal holds the revision's lock and checks for
    users under it. ``unmatched_pins`` in the result lists the pins that name no staged revision here.
    """
    lay = dest if isinstance(dest, _stage_layout.Layout) else _stage_layout.Layout(dest)
    out = {"removed": [], "in_use": [], "unmatched_pins": []}
    if not os.path.isdir(lay.parent):  # check mode before the first staging
        out["unmatched_pins"] = unmatched_pins([lay.real], pinned)
        return out
    revs, staged = [], [lay.real]
    for path, ms in _stage_layout.revisions(lay.parent, skip=lay.name):
        staged.append(path)
        if ms.kind != "ok" or any(p and _paths.overlaps(path, p) for p in protect):
            continue
        m = ms.marker
        revs.append((_clock.order_key(m.sequence, legacy=m.staged_at, name=os.path.basename(path)), path))
    out["unmatched_pins"] = unmatched_pins(staged, pinned)
    revs.sort(reverse=True)
    for _ts, path in revs[max(keep - 1, 0):]:
        if is_pinned(path, pinned):
            continue
        if check_mode:
            found = users([path], proc_root)
            if found:
                out["in_use"].append(_in_use_entry(path, found[0]))
            else:
                out["removed"].append(path)
            continue
        try:
            with DestLock(path + _stage_layout.LOCK_SUFFIX, 0) as lock:
                if _marker.read_marker(path).kind != "ok":
                    continue
                found = users([path, path + _stage_layout.PARTIAL_SUFFIX], proc_root)
                if found:
                    out["in_use"].append(_in_use_entry(path, found[0]))
                    continue
                _stage_layout.remove_tree(path)
                _stage_layout.remove_partial(path + _stage_layout.PARTIAL_SUFFIX)
                lock.unlink()
        except StageError:
            out["in_use"].append({"path": path, "pid": None, "via": "lock", "file": path + _stage_layout.LOCK_SUFFIX})
            continue
        out["removed"].append(path)
    return out
