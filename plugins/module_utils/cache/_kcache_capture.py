# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a kernel cache captured from an engine's first start, published after it answered.

Where no prebuild can run (a Kubernetes engine: the compilers are in the image, not on the node), a miss is filled
by the engine itself:

* :func:`prepare` - before the engine starts, its per-start directory (``.run/<fp>-<instance>/``, the path a
  checkout would have, so the pod spec is the same on a hit and on a miss) is made empty, laid out for the engine's
  cache kinds, with a ``capture.json`` marker naming the fingerprint and its components. A directory a process uses
  is left as it is (the running engine keeps compiling into it).
* :func:`publish_capture` - after the engine's first correct answer, what it compiled there is copied (each file
  hashed while copied, a file that changes meanwhile refused) into a ``.partial-*`` directory, given a manifest,
  verified and published under the fingerprint lock with the next publish sequence (``_kcache.publish``), exactly
  as a prebuild. The first publisher of a fingerprint wins: a later one finds it published (``hit``) and publishes
  nothing. A published directory that does not verify is quarantined first, never overwritten in place. A marker
  of another fingerprint or other components, a symlink in the capture, or an empty capture publishes nothing.

The per-start directory then holds the published manifest, so it is the instance's checkout of what was just
published (``_kcache_build.checkout`` keeps it while it equals the published files).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _paths, _process_run
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import load_json
from ansible_collections.llmops.serving.plugins.module_utils.cache._kcache import (
    CHUNK, DEFAULT_INSTANCE, KCacheError, MANIFEST, RUNS, engine_root, file_digest, fingerprint_dir, fingerprint_lock,
    is_real_dir, is_triton_group, link_entry, make_layout, publish, quarantine, relocate, run_dir,
    symlinks_in, users_of, utc, verify_dir, write_manifest,
)

MARKER = "capture.json"
MARKER_SCHEMA = 1
MARKER_MAX_BYTES = 1024 * 1024


def is_scratch(rel):
    """A compiler's own unfinished output: Triton builds each kernel in ``tmp.pid_<pid>_<id>/`` and renames it into
    place (triton ``python/triton/runtime/cache.py``, ``FileCacheManager.put``), so such a directory is never part
    of a cache."""
    return any(part.startswith("tmp.pid_") for part in rel.split(os.sep)[:-1])


def read_marker(path):
    """The ``capture.json`` of ``path`` (an object), or ValueError / OSError."""
    data = load_json(os.path.join(path, MARKER), MARKER, max_bytes=MARKER_MAX_BYTES, follow=False)
    if not isinstance(data, dict):
        raise ValueError("%s is not an object" % MARKER)
    return data


def captured_files(path):
    """``(files, skipped)``: relative paths of the regular files the engine wrote below ``path`` (not the marker,
    not a manifest, not a compiler's scratch directory), sorted; ``skipped`` the scratch files left out."""
    files, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            if rel in (MARKER, MANIFEST) or os.path.islink(full) or not os.path.isfile(full):
                continue
            (skipped if is_scratch(rel) else files).append(rel)
    return files, skipped


def _marker_problem(path, engine, fingerprint, components):
    """Why ``path`` is not a capture of this fingerprint, or None."""
    try:
        marker = read_marker(path)
    except (OSError, ValueError) as e:
        return "no capture marker (%s)" % e
    for key, want in (("engine", engine), ("fingerprint", fingerprint)):
        if marker.get(key) != want:
            return "%s %s is %r, not %r" % (MARKER, key, marker.get(key), want)
    if marker.get("components") != components:
        theirs = marker.get("components") if isinstance(marker.get("components"), dict) else {}
        keys = set(components) | set(theirs)
        return "%s components differ: %s" % (MARKER, ", ".join(sorted(str(k) for k in keys
                                                                      if components.get(k) != theirs.get(k))))
    return None


def prepare(cache_root, engine, fingerprint, components, instance=DEFAULT_INSTANCE, label="", lock_timeout=7200,
            check_mode=False, proc_root="/proc", host=None):
    """Make ``.run/<fp>-<instance>/`` the empty per-start directory an engine fills on a miss.

    Refused while the fingerprint is published and verifies (then the engine starts on ``checkout``). Status
    ``in_use`` (left alone: a process uses it), ``ready`` (already an empty capture of this fingerprint, kept),
    ``created`` (made; ``discarded_files`` lists what an earlier start that no process uses had left) or
    ``would_create``.
    """
    published = fingerprint_dir(cache_root, engine, fingerprint)
    rd = run_dir(cache_root, engine, fingerprint, instance)
    res = {"cache_dir": published, "engine_dir": rd, "changed": False, "in_use_by": [], "discarded_files": []}
    if verify_dir(published, fingerprint, components)["ok"]:
        raise KCacheError("capture: %s is published and verifies; give the engine operation=checkout's copy, not "
                          "an empty capture" % published)

    def current():
        if os.path.islink(rd):
            res["replaced_link"] = link_entry(rd, "engine copy")
            return "link"
        if not is_real_dir(rd):
            return None
        busy = users_of([rd], proc_root)
        if busy:
            res.update(status="in_use", in_use_by=busy[:20])
            return "in_use"
        files, skipped = captured_files(rd)
        if _marker_problem(rd, engine, fingerprint, components) is None and not files and not skipped:
            return "same"
        res["discarded_files"] = (files + skipped)[:200]
        return "stale"

    if check_mode:
        state = current()
        if state != "in_use":
            res.update(status="ready" if state == "same" else "would_create", changed=state != "same")
        return res
    eroot = engine_root(cache_root, engine)
    os.makedirs(os.path.join(eroot, RUNS), exist_ok=True)
    with fingerprint_lock(cache_root, engine, fingerprint, lock_timeout):
        state = current()
        if state == "in_use":
            return res
        if state == "same":
            res["status"] = "ready"
            return res
        with _process_run.scratch_dir(".partial-%s-capture-" % fingerprint, eroot) as partial:
            make_layout(partial, engine)
            _fsutil.atomic_write_json(os.path.join(partial, MARKER), {
                "schema": MARKER_SCHEMA, "engine": engine, "fingerprint": fingerprint, "components": components,
                "label": label or "", "instance": instance, "host": host or socket.gethostname(), "prepared": utc(),
            }, indent=1, sort_keys=True)
            if state == "stale":
                shutil.rmtree(rd)
            elif state == "link":
                os.unlink(rd)
            os.rename(partial, rd)
            _fsutil.fsync_dir(os.path.dirname(rd))
        res.update(status="created", changed=True)
    return res


def _copy_captured(src, dst, files):
    """Copy ``files`` from the capture ``src`` into the fresh ``dst``, each hashed while copied; a file whose size,
    mtime or content moves while it is copied is refused (the engine was writing it). Returns the bytes copied."""
    done = 0
    for rel in files:
        try:
            s = _paths.contained(src, rel, "captured file")
            d = _paths.contained(dst, rel, "captured file")
        except _paths.PathEscape as e:
            raise KCacheError("publish_capture: %s" % e)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        h = hashlib.sha256()
        fdi = os.open(s, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fdi, "rb") as fi, os.fdopen(
                os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as fo:
            before = os.fstat(fi.fileno())
            for chunk in iter(lambda: fi.read(CHUNK), b""):
                h.update(chunk)
                fo.write(chunk)
                done += len(chunk)
            fo.flush()
            os.fsync(fo.fileno())
        after = os.stat(s, follow_symlinks=False)
        digest = file_digest(s)[1] if is_triton_group(s) else _fsutil.sha256_file(s)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or \
                digest != (file_digest(d)[1] if is_triton_group(d) else h.hexdigest()):
            raise KCacheError("publish_capture: %s changed while it was copied (the engine is still writing it); "
                              "nothing was published, run the publish again once the engine is idle" % s)
    return done


def publish_capture(cache_root, engine, fingerprint, components, instance=DEFAULT_INSTANCE, label="",
                    lock_timeout=7200, check_mode=False, proc_root="/proc", host=None):
    """Publish what the engine compiled into its capture directory as the fingerprint's cache (see the module
    docstring). Status ``published``, ``hit`` (already published and verified: this capture is not used),
    ``empty`` (nothing compiled there, nothing published), ``would_publish``."""
    final = fingerprint_dir(cache_root, engine, fingerprint)
    rd = run_dir(cache_root, engine, fingerprint, instance)
    eroot = engine_root(cache_root, engine)
    res = {"cache_dir": final, "engine_dir": rd, "changed": False, "quarantined_to": None, "published": False}
    if os.path.islink(rd) or not is_real_dir(rd):
        raise KCacheError("publish_capture: %s is not a real directory; run operation=capture before the engine "
                          "starts, and publish on the node the engine ran on" % rd)
    if not os.path.exists(os.path.join(rd, MARKER)) and verify_dir(final, fingerprint, components)["ok"]:
        res["status"] = "hit"  # published by an earlier run: the directory is its checkout now
        return res
    problem = _marker_problem(rd, engine, fingerprint, components)
    if problem:
        raise KCacheError("publish_capture: %s is not a capture of %s/%s (%s), so it is never published under this "
                          "fingerprint; run operation=capture for this fingerprint before the engine starts"
                          % (rd, engine, fingerprint, problem))
    links = symlinks_in(rd)
    if links:
        raise KCacheError("publish_capture: %s holds symlinks (%s); a cache is regular files only, nothing was "
                          "published" % (rd, ", ".join(links[:5])))
    files, skipped = captured_files(rd)
    res.update(file_count=len(files), skipped_files=skipped[:200])
    if not files:
        res["status"] = "empty"
        return res
    if check_mode:
        ver = verify_dir(final, fingerprint, components)
        res.update(status="hit" if ver["ok"] else "would_publish", changed=not ver["ok"])
        return res
    with fingerprint_lock(cache_root, engine, fingerprint, lock_timeout) as waited:
        res["waited_s"] = round(waited, 2)
        ver = verify_dir(final, fingerprint, components)
        if ver["ok"]:
            res["status"] = "hit"
            return res
        if ver["status"] != "missing":
            res["quarantined_to"] = quarantine(cache_root, engine, fingerprint, final, "%s before publish_capture: %s"
                                               % (ver["status"], "; ".join(ver["problems"][:20])),
                                               proc_root=proc_root, what=ver["status"])
            res["changed"] = True
        with _process_run.scratch_dir(".partial-%s-" % fingerprint, eroot) as partial:
            make_layout(partial, engine)
            total = _copy_captured(rd, partial, files)
            relocate(partial, final)
            man = write_manifest(partial, engine, fingerprint, components, label, host=host)
            check = verify_dir(partial, fingerprint, components, allow_extra=False)
            if not check["ok"]:
                raise KCacheError("publish_capture: the copy failed its own verification: %s" % check["problems"][:5])
            res["sequence"] = publish(partial, final, cache_root, engine)  # with the next publish sequence
        # the per-start directory becomes this instance's checkout of what was just published
        shutil.copyfile(os.path.join(final, MANIFEST), os.path.join(rd, MANIFEST + ".tmp"))
        os.replace(os.path.join(rd, MANIFEST + ".tmp"), os.path.join(rd, MANIFEST))
        os.unlink(os.path.join(rd, MARKER))
        res.update(status="published", published=True, changed=True, bytes=total, total_bytes=man["total_bytes"],
                   verify=verify_dir(final, fingerprint, components))
        res["file_count"] = man["file_count"]
    return res
