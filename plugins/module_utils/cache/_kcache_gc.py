# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: removing kernel-cache directories nobody needs (:func:`gc`).

Keeps the newest ``keep`` fingerprints of an engine and every fingerprint in use, by ``in_use`` or by a running
process (``_inuse``: whatever path it reaches the directory by). Newest is the publish order, the ``sequence``
each manifest records when ``_kcache.publish`` puts it in place (``_clock.order_key``), never a wall time: a
manifest without one (an older version's) counts as older than all with one, ordered among themselves by
``created`` then the directory's mtime, as before. An ``in_use`` entry that names no fingerprint directory is
returned in ``unmatched_in_use`` (the module warns), never silently ignored.

An abandoned ``.partial-*`` build directory (its fingerprint's lock free) is removed once it is
``partial_max_age`` old by the filesystem's own clock (``_clock.filesystem_now``: its mtime against the mtime of a
file created now beside it), never by this host's clock against a time the filesystem (possibly an NFS server)
wrote. Only real directories count: a symlink where a
fingerprint directory, an engine copy or a build directory would be is reported, never followed or removed.
"""
from __future__ import annotations

import os
import re
import shutil

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _paths
from ansible_collections.llmops.serving.plugins.module_utils.cache._kcache import (
    FP_RE, KCacheError, RUNS, engine_root, is_real_dir, link_entry, lock_is_free, read_manifest, users_of, utc,
)


# ---- garbage collection ----------------------------------------------------------------------------

def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _managed(cache_root, engine):
    """``(dirs, links)`` below ``<cache_root>/<engine>``: ``dirs`` maps each real published fingerprint
    directory and ``.run/`` copy to its fingerprint; ``links`` lists the symlinks found where those (or a
    ``.partial-*`` build directory) would be, by ``lstat``: reported, never followed, never counted."""
    eroot = engine_root(cache_root, engine)
    dirs, links = {}, []
    for d in _listdir(eroot):
        full = os.path.join(eroot, d)
        if FP_RE.match(d) or d.startswith(".partial-"):
            if os.path.islink(full):
                links.append(link_entry(full, "fingerprint directory" if FP_RE.match(d) else "build directory"))
            elif FP_RE.match(d) and is_real_dir(full):
                dirs[full] = d
    runs = os.path.join(eroot, RUNS)
    if os.path.islink(runs):
        links.append(link_entry(runs, "engine copies directory"))
        return dirs, links
    for d in _listdir(runs):
        fp = d.split("-", 1)[0]
        full = os.path.join(runs, d)
        if not (FP_RE.match(fp) and "-" in d):
            continue
        if os.path.islink(full):
            links.append(link_entry(full, "engine copy"))
        elif is_real_dir(full):
            dirs[full] = fp
    return dirs, links


def fingerprint_users(cache_root, engine, proc_root="/proc"):
    """``({fingerprint: [user, ...]}, {dir: fingerprint})`` for the published and ``.run/`` dirs of ``engine``.

    One ``_inuse.users_of`` scan (environment paths included): a process counts whatever path it reaches
    the directory by (a symlinked ``cache_root``, a bind mount in a pod's mount namespace, an open file,
    a mapping, its working directory or a cache variable in its environment). Only real directories count
    (a symlink there is never followed, see :func:`gc`).
    """
    dirs = _managed(cache_root, engine)[0]
    found = {}
    for u in users_of(sorted(dirs), proc_root) if dirs else []:
        found.setdefault(dirs[u["path"]], []).append(u)
    return found, dirs


def mounted_fingerprints(cache_root, engine, proc_root="/proc"):
    """Fingerprints of ``cache_root/engine`` used by a running process (see :func:`fingerprint_users`)."""
    return set(fingerprint_users(cache_root, engine, proc_root)[0])


def _order(path, name):
    """``_clock.order_key`` of the published directory ``path``: its manifest's sequence; without one, its old
    order (``created``, else the directory's mtime, as text)."""
    man = None
    try:
        man = read_manifest(path)
    except (OSError, ValueError):
        pass
    seq = man.get("sequence") if man else None
    created = man.get("created") if man else None
    if not (isinstance(created, str) and created):
        try:
            created = utc(os.lstat(path).st_mtime)
        except OSError:
            created = ""
    return _clock.order_key(seq, legacy=created, name=name)


def check_in_use(in_use):
    """``in_use`` entries are fingerprints or paths (strings without NUL); refused before anything changes."""
    for i, entry in enumerate(in_use or ()):
        if not isinstance(entry, str) or not entry or "\x00" in entry:
            raise KCacheError("in_use[%d]: must be a fingerprint or a path to a fingerprint directory (or below "
                              "it); fix the entry" % i)
        if "/" not in entry and not FP_RE.match(entry):
            raise KCacheError("in_use[%d]: %r is neither a hex fingerprint nor a path; pass the fingerprint "
                              "returned by llmops.serving.kernel_fingerprint or the cache directory an engine uses"
                              % (i, entry[:80]))


def _declared(in_use, dirs):
    """Fingerprints named by ``in_use``: by name, or by a path that is (or lies below) one of ``dirs`` however it
    is spelt (``_paths.is_within``: symlinked root, ``..``, ``//``, a bind mount)."""
    out = set()
    for entry in in_use or ():
        if "/" not in entry:
            out.add(entry)
            continue
        for d, fp in dirs.items():
            if _paths.is_within(entry, d):
                out.add(fp)
    return out


def _unmatched(in_use, dirs):
    """Entries of ``in_use`` that name no fingerprint directory (published or ``.run/``) of this engine."""
    fps = set(dirs.values())
    return [e for e in in_use or () if not _declared([e], dirs) & fps]


def _remove(path, res, check_mode):
    """Delete the real directory ``path``; a symlink found there instead is reported, never followed, and an
    error is recorded with the path while gc goes on. True when removed (or would be)."""
    if os.path.islink(path):
        res["links"].append(link_entry(path, "entry replaced by a symlink during gc"))
        return False
    if check_mode:
        return True
    try:
        shutil.rmtree(path)
    except OSError as e:
        res["errors"].append({"path": path, "reason": "not removed: %s; fix its permissions or remove it by hand"
                                                      % (e.strerror or e)})
        return False
    return True


def gc(cache_root, engine, keep, in_use=(), proc_root="/proc", check_mode=False, partial_max_age=86400):
    """Keep the newest ``keep`` fingerprints of ``engine``; never remove one that is in use.

    A fingerprint is in use when ``in_use`` names it (by fingerprint, or by a path to its directory or below,
    however spelt) or when a process uses its published directory or one of its ``.run/`` copies. A copy no
    process uses goes with its fingerprint; copies of kept fingerprints, and of fingerprints ``in_use`` names
    (published or not yet), stay (the next start of that instance replaces its own). Only real directories
    count: a symlink where a fingerprint directory, an engine copy or a build directory would be is never
    followed, counted or removed, and is listed in ``links`` with the fix;
    a directory that cannot be removed is listed in ``errors``; gc goes on with the rest either way.
    """
    check_in_use(in_use)
    eroot = engine_root(cache_root, engine)
    res = {"kept": [], "removed": [], "protected": [], "removed_partials": [], "removed_runs": [], "changed": False,
           "in_use_by": {}, "links": [], "errors": [], "unmatched_in_use": []}
    if not os.path.isdir(eroot):
        res["unmatched_in_use"] = list(in_use or ())
        return res
    users, dirs = fingerprint_users(cache_root, engine, proc_root)
    res["links"] = _managed(cache_root, engine)[1]
    mounted = set(users)
    protected = _declared(in_use, dirs) | mounted
    published = dict((d, fp) for d, fp in dirs.items() if os.path.dirname(d) == eroot)
    fps = sorted(published.values())
    fps.sort(key=lambda d: _order(os.path.join(eroot, d), d), reverse=True)
    res["unmatched_in_use"] = _unmatched(in_use, dirs)
    for d in fps:  # in-use fingerprints are kept on top of the newest ``keep``
        if d in protected:
            res["protected"].append(d)
        elif len(res["kept"]) < keep:
            res["kept"].append(d)
        elif _remove(os.path.join(eroot, d), res, check_mode):
            res["removed"].append(d)
    live = set(fps) - set(res["removed"])  # kept, protected, and any that could not be removed
    busy_runs = set(u["path"] for us in users.values() for u in us)
    for d, fp in sorted(dirs.items()):
        # a copy of a fingerprint named in in_use stays even before anything is published: the per-start
        # directory an engine fills on a miss (_kcache_capture.prepare) is the engine's until it publishes
        if d in published or d in busy_runs or fp in live or fp in protected:
            continue
        if _remove(d, res, check_mode):
            res["removed_runs"].append(os.path.basename(d))
    now = None
    for d in _listdir(eroot):
        m = re.match(r"^\.partial-([0-9a-f]+)-", d)
        full = os.path.join(eroot, d)
        if not m or not is_real_dir(full):
            continue
        try:
            now = _clock.filesystem_now(eroot) if now is None else now
            age = _clock.age(now, os.lstat(full).st_mtime)
        except OSError:
            continue
        if age < partial_max_age or not lock_is_free(cache_root, engine, m.group(1)):
            continue
        if _remove(full, res, check_mode):
            res["removed_partials"].append(d)
    res["mounted"] = sorted(mounted)
    res["in_use_by"] = dict((fp, us[:5]) for fp, us in sorted(users.items()))
    res["changed"] = bool(res["removed"] or res["removed_partials"] or res["removed_runs"])
    return res
