# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: fingerprinted kernel-cache directories on node-local NVMe: where they are and
whether one can be trusted.

Layout::

    <cache_root>/<engine>/<fingerprint>/            published, verified, never written after publish
        manifest.json                               components, files (size + sha256), producer, created,
                                                    sequence (the publish order on this node)
        triton/ inductor/ deep_gemm/ flashinfer/    one subdirectory per cache kind (see KINDS)
        torch_compile/ (vLLM)  sglang/ jit/ (SGLang)
    <cache_root>/<engine>/.run/<fp>-<instance>/     writable copy one engine instance starts on (checkout)
    <cache_root>/<engine>/.partial-<fp>-XXXX/       private build / copy directory, renamed into place
    <cache_root>/<engine>/.locks/<fp>.lock          per-fingerprint flock: one builder, others wait
    <cache_root>/<engine>/.logs/<fp>.<what>.log     warm-up output and copy progress
    <cache_root>/.quarantine/<engine>-<fp>-<utc>/   tampered, incomplete or foreign directories

This file owns the layout, the manifest (:func:`write_manifest`, :func:`read_manifest`, :func:`verify_dir`),
publishing (:func:`publish`), :func:`restore` (verify before a start, quarantine what is unusable) and the
per-fingerprint lock.

The publish order: :func:`publish` renames a built or copied directory into place while ``<cache_root>/<engine>``
is locked (``_clock.sequence_lock``), after writing into its manifest ``sequence``, one more than every published
fingerprint's (``_clock.next_sequence``). gc keeps the newest by it (``_kcache_gc``), never by ``created`` (the
builder's wall clock, possibly another host's: a synced manifest carries the shared store's) or an mtime (which
``sync`` copies from the store). A directory copied from a store gets this node's next sequence, not the
store's. A manifest without a valid sequence (written before there were any) counts as older than every one with
a sequence. Building,
copying and the engine's own copy are in ``_kcache_build``, garbage collection in ``_kcache_gc``, the hit / miss
judgement of an engine log in ``_kcache_log``.

Every path read back from a ``manifest.json`` goes through ``_paths.contained``; a manifest that is not
the expected shape makes its directory ``bad_manifest`` (quarantined like a tampered one), never a
traceback. "In use" is ``_inuse.users_of``: open files, mappings, working directories, environment
paths and bind mounts in other mount namespaces, compared by device and inode.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import stat
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _fsutil, _inuse, _paths
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import load_json

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
QUARANTINE = ".quarantine"
RUNS = ".run"
DEFAULT_INSTANCE = "engine"
FP_RE = re.compile(r"^[0-9a-f]{8,64}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CHUNK = 4 * 1024 * 1024

#: Cache kinds per engine -> environment variables that point the engine at that subdirectory.
KINDS = {
    "vllm": {
        "torch_compile": ("VLLM_CACHE_ROOT",),
        "inductor": ("TORCHINDUCTOR_CACHE_DIR",),
        "triton": ("TRITON_CACHE_DIR",),
        "deep_gemm": ("DG_JIT_CACHE_DIR", "DG_CACHE_DIR"),
        "flashinfer": ("FLASHINFER_WORKSPACE_BASE",),
    },
    "sglang": {
        "sglang": ("SGLANG_CACHE_DIR",),
        "deep_gemm": ("SGLANG_DG_CACHE_DIR",),
        "jit": ("SGLANG_JIT_CACHE_DIR",),
        "triton": ("TRITON_CACHE_DIR",),
        "inductor": ("TORCHINDUCTOR_CACHE_DIR",),
        "flashinfer": ("FLASHINFER_WORKSPACE_BASE",),
    },
}


class KCacheError(RuntimeError):
    """A step failed; the message says which and what to do."""


class InUse(KCacheError):
    """A directory that should be moved aside is used by a running process."""

    def __init__(self, path, what, users):
        self.path = path
        self.users = users
        super(InUse, self).__init__(
            "cache_dir: %s is %s but in use by %s, so it is not moved aside while that process runs; stop it "
            "(or its pod) and run again" % (path, what, describe_users(users)))


class ManifestError(ValueError):
    """``manifest.json`` has the wrong shape: a field missing or of the wrong type, or a path that leaves its dir."""


# ---- layout ---------------------------------------------------------------------------------------

def engine_root(cache_root, engine):
    return os.path.join(cache_root, engine)


def fingerprint_dir(cache_root, engine, fingerprint):
    if not FP_RE.match(fingerprint or ""):
        raise KCacheError("fingerprint: %r is not a hex fingerprint; pass the fingerprint returned by "
                          "llmops.serving.kernel_fingerprint" % (fingerprint,))
    return os.path.join(cache_root, engine, fingerprint)


def run_dir(cache_root, engine, fingerprint, instance=DEFAULT_INSTANCE):
    """The writable copy of ``fingerprint`` that engine ``instance`` starts on (see :func:`checkout`)."""
    fingerprint_dir(cache_root, engine, fingerprint)
    if not isinstance(instance, str) or not _INSTANCE_RE.match(instance):
        raise KCacheError("instance: %r is not a name of letters, digits, '_', '.' or '-' (at most 64, not starting "
                          "with '.' or '-'); use the engine's process name" % (instance,))
    return os.path.join(cache_root, engine, RUNS, "%s-%s" % (fingerprint, instance))


def cache_env(engine, base):
    """Environment that points every cache of ``engine`` inside ``base`` (the path the engine sees)."""
    env = {}
    for kind, names in sorted(KINDS[engine].items()):
        for name in names:
            env[name] = os.path.join(base, kind)
    return env


def make_layout(path, engine):
    for kind in KINDS[engine]:
        os.makedirs(os.path.join(path, kind), exist_ok=True)


def utc(ts=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts if ts is not None else time.time()))


# ---- manifest -------------------------------------------------------------------------------------

def is_triton_group(path):
    """Triton's ``__grp__*.json`` files list their members by absolute path (``child_paths``)."""
    name = os.path.basename(path)
    return name.startswith("__grp__") and name.endswith(".json")


#: Largest Triton group file read (a few KiB in practice) and largest manifest (one entry per cache file).
GROUP_MAX_BYTES = 4 * 1024 * 1024
MANIFEST_MAX_BYTES = 64 * 1024 * 1024


def _group_members(full):
    data = load_json(full, "triton group file", max_bytes=GROUP_MAX_BYTES, follow=False)
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict) or not all(isinstance(v, str) for v in children.values()):
        raise ValueError("%s: no child_paths" % full)
    return data, children


def file_digest(full):
    """``(size, sha256)`` of a file; Triton group files are hashed in a location-free form.

    A group file names its members by absolute path, so its bytes depend on where the cache lives.
    Its digest covers the member names only (members always sit beside it), which keeps the manifest
    valid after the directory is renamed, copied to another node or relocated to a mount path.
    """
    if is_triton_group(full):
        try:
            data, children = _group_members(full)
        except (OSError, ValueError):
            return os.path.getsize(full), _fsutil.sha256_file(full)
        canon = dict(data, child_paths=dict((k, os.path.basename(v)) for k, v in children.items()))
        blob = json.dumps(canon, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return -1, hashlib.sha256(blob).hexdigest()
    return os.path.getsize(full), _fsutil.sha256_file(full)


def scan_files(path):
    """Sorted ``[{path, size, sha256}]`` of every regular file below ``path`` except the manifest.

    ``size`` is -1 for Triton group files (their byte size depends on the directory's location).
    Symlinks are not followed and not listed (see :func:`symlinks_in`).
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            if rel == MANIFEST or os.path.islink(full) or not os.path.isfile(full):
                continue
            size, digest = file_digest(full)
            out.append({"path": rel, "size": size, "sha256": digest})
    return out


def symlinks_in(path):
    """Relative paths of the symlinks below ``path`` (files or directories; never followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                out.append(os.path.relpath(full, path))
    return sorted(out)


def relocate(path, base):
    """Point every Triton group file below ``path`` at ``base`` (where the engine will see ``path``).

    Triton only trusts a group whose ``child_paths`` exist, so a cache built in a ``.partial-*`` dir,
    copied to another node or mounted at ``/cache`` in a container recompiles everything unless the
    paths are rewritten. Returns the number of files rewritten (0 when already in place).
    """
    changed = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames:
            full = os.path.join(dirpath, name)
            if not is_triton_group(full):
                continue
            try:
                data, children = _group_members(full)
            except (OSError, ValueError):
                continue
            here = os.path.join(base, os.path.relpath(dirpath, path))
            moved = dict((k, os.path.join(here, os.path.basename(v))) for k, v in children.items())
            if moved == children:
                continue
            data["child_paths"] = moved
            _fsutil.atomic_write_json(full, data, fsync=False)
            changed += 1
    return changed


def write_manifest(path, engine, fingerprint, components, label="", host=None, created=None):
    files = scan_files(path)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "engine": engine,
        "fingerprint": fingerprint,
        "label": label or "",
        "components": components,
        "kinds": sorted(KINDS[engine]),
        "files": files,
        "file_count": len(files),
        "total_bytes": sum(max(f["size"], 0) for f in files),
        "producer_host": host or socket.gethostname(),
        "created": created or utc(),
    }
    _fsutil.atomic_write_json(os.path.join(path, MANIFEST), manifest, indent=1, sort_keys=True)
    return manifest


def manifest_sequence(path):
    """The valid ``sequence`` of ``path``'s manifest, or None (none recorded, or unreadable)."""
    try:
        seq = read_manifest(path).get("sequence")
    except (OSError, ValueError):
        return None
    return seq if _clock.valid_sequence(seq) else None


def publish(partial, final, cache_root, engine):
    """Rename the verified directory ``partial`` to ``final`` with the next publish sequence in its manifest (see
    the module docstring); returns that sequence. The caller holds ``final``'s fingerprint lock."""
    eroot = engine_root(cache_root, engine)
    with _clock.sequence_lock(eroot):
        published = [os.path.join(eroot, d) for d in os.listdir(eroot) if FP_RE.match(d)]
        sequence = _clock.next_sequence(manifest_sequence(d) for d in published if is_real_dir(d))
        man = read_manifest(partial)
        man["sequence"] = sequence
        _fsutil.atomic_write_json(os.path.join(partial, MANIFEST), man, indent=1, sort_keys=True)
        os.rename(partial, final)
    _fsutil.fsync_dir(eroot)
    return sequence


def read_manifest(path):
    """The parsed ``manifest.json`` of ``path`` (an object with a ``files`` list), or ValueError.

    Read through ``_untrusted`` (a regular file, not a symlink, size, nesting and numbers capped): a FIFO, a
    device or a nesting bomb is a ValueError naming the file and the limit, never a hang or a traceback.
    """
    data = load_json(os.path.join(path, MANIFEST), "manifest.json", max_bytes=MANIFEST_MAX_BYTES, follow=False)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise ValueError("not a kernel-cache manifest (an object with a 'files' list)")
    return data


def manifest_entries(man):
    """The ``files`` of a manifest as ``[{path, size, sha256}]``, checked field by field.

    Raises :class:`ManifestError` naming the entry and the field: an entry that is not an object, lacks
    ``path``, ``size`` or ``sha256``, has a size that is not an integer >= -1 or a digest that is not 64
    hex digits, names a path that is absolute, climbs with ``..`` or is spelt two ways
    (``_paths.split_relative``), names ``manifest.json`` itself, or repeats another entry.
    """
    files = man.get("files") if isinstance(man, dict) else None
    if not isinstance(files, list):
        raise ManifestError("manifest.json: 'files' is not a list")
    if man.get("components") is not None and not isinstance(man.get("components"), dict):
        raise ManifestError("manifest.json: 'components' is %s, not an object" % type(man["components"]).__name__)
    out, seen = [], set()
    for i, entry in enumerate(files):
        where = "manifest.json files[%d]" % i
        if not isinstance(entry, dict):
            raise ManifestError("%s is %s, not an object" % (where, type(entry).__name__))
        for key in ("path", "size", "sha256"):
            if key not in entry:
                raise ManifestError("%s has no %r" % (where, key))
        try:
            _paths.split_relative(entry["path"], where + ".path", "the fingerprint directory")
        except _paths.PathEscape as e:
            raise ManifestError(str(e))
        rel, size, digest = entry["path"], entry["size"], entry["sha256"]
        if rel == MANIFEST:
            raise ManifestError("%s.path names manifest.json itself" % where)
        if rel in seen:
            raise ManifestError("%s.path repeats an earlier entry" % where)
        if isinstance(size, bool) or not isinstance(size, int) or size < -1:
            raise ManifestError("%s.size is not an integer >= -1" % where)
        if not isinstance(digest, str) or not _HEX64_RE.match(digest):
            raise ManifestError("%s.sha256 is not 64 hex digits" % where)
        seen.add(rel)
        out.append({"path": rel, "size": size, "sha256": digest})
    return out


def verify_dir(path, fingerprint, components=None, allow_extra=True):
    """Check a published directory against its manifest and the expected fingerprint/components.

    Returns ``{ok, status, problems, manifest}``; ``status`` is one of ``ok``, ``missing``,
    ``no_manifest`` (unreadable, not JSON, not an object with a ``files`` list), ``bad_manifest`` (an
    entry of the wrong shape or with a path that would leave the directory, see :func:`manifest_entries`),
    ``foreign`` (fingerprint or components differ), ``tampered`` (a file changed or appeared, or an entry
    goes through a symlink) or ``incomplete`` (a file is missing).
    """
    res = {"ok": False, "status": "missing", "problems": [], "manifest": None, "path": path}
    if not os.path.isdir(path):
        return res
    try:
        man = read_manifest(path)
    except (OSError, ValueError) as e:
        res.update(status="no_manifest", problems=["manifest.json unreadable: %s" % e])
        return res
    res["manifest"] = {k: v for k, v in man.items() if k != "files"}
    try:
        entries = manifest_entries(man)
    except ManifestError as e:
        res.update(status="bad_manifest", problems=[str(e)])
        return res
    if man.get("fingerprint") != fingerprint:
        shown = man.get("fingerprint") if isinstance(man.get("fingerprint"), str) else type(man.get("fingerprint")).__name__
        res.update(status="foreign", problems=["manifest fingerprint %s != %s" % (shown[:64], fingerprint)])
        return res
    if components is not None and man.get("components") != components:
        theirs = man.get("components") or {}
        keys = set(components) | set(theirs)
        diff = sorted(str(k) for k in keys if components.get(k) != theirs.get(k))
        res.update(status="foreign", problems=["components differ: %s" % ", ".join(diff)])
        return res
    listed = dict((e["path"], e) for e in entries)
    problems, missing = [], 0
    for rel, entry in sorted(listed.items()):
        try:
            full = _paths.contained(path, rel, "manifest.json path")
        except _paths.PathEscape as e:
            problems.append("unsafe path: %s" % e)
            continue
        if not os.path.isfile(full):
            problems.append("missing: %s" % rel)
            missing += 1
            continue
        if entry["size"] >= 0 and os.path.getsize(full) != entry["size"]:
            problems.append("size changed: %s (%d != %d)" % (rel, os.path.getsize(full), entry["size"]))
            continue
        if file_digest(full)[1] != entry["sha256"]:
            problems.append("content changed: %s" % rel)
    extra = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), path)
            if rel != MANIFEST and rel not in listed:
                extra.append(rel)
    extra.extend(rel for rel in symlinks_in(path) if rel not in listed and rel not in extra)
    res["extra_files"] = sorted(extra)
    if extra and not allow_extra:
        problems.extend("not in manifest: %s" % rel for rel in sorted(extra))
    if problems:
        status = "incomplete" if missing and missing == len(problems) else "tampered"
        res.update(status=status, problems=problems)
        return res
    res.update(ok=True, status="ok")
    return res


def describe_users(users, limit=3):
    """``pid 123 (fd /x/y), pid 456 (mount /cache)`` for the first ``limit`` users."""
    shown = ["pid %d (%s %s)" % (u["pid"], u["via"], u["file"]) for u in users[:limit]]
    if len(users) > limit:
        shown.append("%d more" % (len(users) - limit))
    return ", ".join(shown)


def users_of(paths, proc_root="/proc"):
    """Processes using any of ``paths`` (``_inuse.users_of`` with environment paths counted)."""
    return _inuse.users_of(paths, proc_root=proc_root, environ=True)


def quarantine(cache_root, engine, fingerprint, path, reason, proc_root="/proc", what="unusable"):
    """Move ``path`` to ``<cache_root>/.quarantine/`` with a reason file; returns the new path.

    Raises :class:`InUse` (and moves nothing) while a process uses the directory, whatever path it
    reaches it by: a running engine or a pod's bind mount keeps the inode, so moving it would not stop
    that use and would let a rebuild appear under the old name beside it.
    """
    busy = users_of([path], proc_root)
    if busy:
        raise InUse(path, what, busy)
    qroot = os.path.join(cache_root, QUARANTINE)
    os.makedirs(qroot, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = os.path.join(qroot, "%s-%s-%s-%d" % (engine, fingerprint, stamp, os.getpid()))
    os.rename(path, dest)
    _fsutil.atomic_write_json(dest + ".reason.json", {"engine": engine, "fingerprint": fingerprint, "from": path,
                                                      "at": utc(), "reason": reason}, indent=1, sort_keys=True)
    return dest


def restore(cache_root, engine, fingerprint, components, allow_extra=True, check_mode=False, do_quarantine=True,
            proc_root="/proc"):
    """Verify the published dir before the engine starts; quarantine it when it is not usable.

    A usable directory is left exactly as published (an engine starts on a :func:`checkout` copy). One
    that a process still uses is reported (``in_use_by``) and left in place, never moved under it.
    """
    path = fingerprint_dir(cache_root, engine, fingerprint)
    ver = verify_dir(path, fingerprint, components, allow_extra)
    out = {"cache_dir": path, "status": "hit" if ver["ok"] else ver["status"], "verify": ver,
           "quarantined_to": None, "changed": False, "in_use_by": []}
    if not ver["ok"] and ver["status"] != "missing" and do_quarantine:
        try:
            if check_mode:
                busy = users_of([path], proc_root)
                if busy:
                    raise InUse(path, ver["status"], busy)
            else:
                out["quarantined_to"] = quarantine(cache_root, engine, fingerprint, path,
                                                   "%s: %s" % (ver["status"], "; ".join(ver["problems"][:20])),
                                                   proc_root=proc_root, what=ver["status"])
        except InUse as e:
            out["in_use_by"] = e.users[:20]
            ver["problems"].append("not quarantined: in use by %s; stop it and run again" % describe_users(e.users))
            return out
        out["changed"] = True
        out["status"] = "quarantined"
    return out


# ---- locking ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def fingerprint_lock(cache_root, engine, fingerprint, timeout, poll=0.2):
    """Exclusive flock on ``.locks/<fp>.lock``; yields the seconds spent waiting."""
    ldir = os.path.join(engine_root(cache_root, engine), ".locks")
    os.makedirs(ldir, exist_ok=True)
    try:
        fd = _fsutil.open_lock_file(os.path.join(ldir, fingerprint + ".lock"))  # 0600: no other user can hold it
    except ValueError as e:
        raise KCacheError("cache_root: %s" % e)
    start = time.monotonic()
    try:
        if not _fsutil.wait_flock(fd, start + timeout, poll):
            raise KCacheError("lock_timeout: another build of %s/%s still holds %s after %ds; raise "
                              "lock_timeout or check the builder's log in %s"
                              % (engine, fingerprint, ldir, timeout,
                                 os.path.join(engine_root(cache_root, engine), ".logs")))
        yield time.monotonic() - start
    finally:
        os.close(fd)


def lock_is_free(cache_root, engine, fingerprint):
    path = os.path.join(engine_root(cache_root, engine), ".locks", fingerprint + ".lock")
    if not os.path.exists(path):
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        return _fsutil.try_flock(fd)
    except OSError:
        return False
    finally:
        os.close(fd)


def is_real_dir(path):
    """``path`` itself (never what a symlink there points to) is a directory."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


LINK_FIX = ("a symlink in the kernel-cache root is never followed, counted or removed as a cache; remove the link "
            "itself (rm %s, not rm -r) and put a real directory there with operation=prebuild or sync")


def link_entry(path, what):
    try:
        target = os.readlink(path)
    except OSError:
        target = None
    return {"path": path, "target": target, "what": what, "fix": LINK_FIX % path}
