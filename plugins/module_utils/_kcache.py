# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: fingerprinted kernel-cache directories on node-local NVMe.

Layout::

    <cache_root>/<engine>/<fingerprint>/            published, verified, never written after publish
        manifest.json                               components, files (size + sha256), producer, created
        triton/ inductor/ deep_gemm/ flashinfer/    one subdirectory per cache kind (see KINDS)
        torch_compile/ (vLLM)  sglang/ jit/ (SGLang)
    <cache_root>/<engine>/.run/<fp>-<instance>/     writable copy one engine instance starts on (checkout)
    <cache_root>/<engine>/.partial-<fp>-XXXX/       private build / copy directory, renamed into place
    <cache_root>/<engine>/.locks/<fp>.lock          per-fingerprint flock: one builder, others wait
    <cache_root>/<engine>/.logs/<fp>.<what>.log     warm-up output and copy progress
    <cache_root>/.quarantine/<engine>-<fp>-<utc>/   tampered, incomplete or foreign directories

An engine never runs on the published directory: :func:`checkout` copies it into ``.run/`` and the
engine's cache variables point there, so kernels it compiles while starting land in its copy, are
reported by :func:`start_report` (``new_files``) and never change what other hosts and later starts
verify against.

Every path read back from a ``manifest.json`` goes through ``_paths.contained``; a manifest that is not
the expected shape makes its directory ``bad_manifest`` (quarantined like a tampered one), never a
traceback. "In use" is ``_inuse.users_of``: open files, mappings, working directories, environment
paths and bind mounts in other mount namespaces, compared by device and inode.

No AnsibleModule needed (the warm-up's HTTP goes through ``_http``, its process through ``_process_run.Child``),
so benchmark scripts can drive the same code outside a module.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil, _http, _inuse, _paths, _probe, _process_run
from ansible_collections.llmops.serving.plugins.module_utils._untrusted import load_json, loads_json, open_regular

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
QUARANTINE = ".quarantine"
RUNS = ".run"
DEFAULT_INSTANCE = "engine"
_FP_RE = re.compile(r"^[0-9a-f]{8,64}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_CHUNK = 4 * 1024 * 1024

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

#: Log lines that decide hit / miss after the engine started (substring match).
LOG_SIGNS = {
    "vllm": {
        "miss": (
            "Compiling model again due to a load failure",
            "Compiling a graph for compile range",
            "vLLM's torch.compile cache is disabled",
            "saved AOT compiled function to",
        ),
        "hit": (
            "Directly load the compiled graph(s)",
            "Directly load AOT compilation from path",
        ),
    },
    "sglang": {
        "miss": ("Entering DeepGEMM JIT Pre-Compile session",),
        "hit": (),
    },
}
POISON_SIGNS = (
    "corrupted compilation artifact",
    "AssertionError: expected size",
    "Compile cache file corrupted",
)
MOE_FALLBACK_SIGNS = (
    "Using default MoE config. Performance might be sub-optimal",
    "Using default MoE kernel config. Performance might be sub-optimal",
    "Fallback to triton version",
)
_VLLM_CACHE_DIR_RE = re.compile(r"(?:Using cache directory: (\S+) for vLLM's torch\.compile"
                                r"|Directly load AOT compilation from path (\S+)"
                                r"|saved AOT compiled function to (\S+))")


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
    if not _FP_RE.match(fingerprint or ""):
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


def _utc(ts=None):
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
    Symlinks are not followed and not listed (see :func:`_links`).
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


def _links(path):
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
        "created": created or _utc(),
    }
    _fsutil.atomic_write_json(os.path.join(path, MANIFEST), manifest, indent=1, sort_keys=True)
    return manifest


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
    extra.extend(rel for rel in _links(path) if rel not in listed and rel not in extra)
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
                                                      "at": _utc(), "reason": reason}, indent=1, sort_keys=True)
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
    fd = os.open(os.path.join(ldir, fingerprint + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
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


# ---- warm-up -----------------------------------------------------------------------------------------

class _Log(object):
    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(path, "a")
        self.t0 = time.monotonic()

    def __call__(self, msg):
        self.f.write("[%s +%.1fs] %s\n" % (_utc(), time.monotonic() - self.t0, msg))
        self.f.flush()

    def close(self):
        self.f.close()


def _default_http_post(url, body, timeout):
    """POST ``body`` as JSON: ``(status, text)``; raises ``_http.HttpError`` (an error status, no answer)."""
    resp = _http.request("POST", url, payload=body, timeout=timeout)
    return resp.status, resp.text


def response_text(payload):
    """Text of an OpenAI-style completion or chat response, or '' when there is none."""
    try:
        choice = loads_json(payload, "warm-up response")["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    if not isinstance(choice, dict):
        return ""
    if isinstance(choice.get("text"), str):
        return choice["text"]
    msg = choice.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, str) else ""


def run_warmup(warmup, env, log, logfile, http_post=None, poll=2.0):
    """Run the warm-up (``mode: run`` to completion, or ``mode: serve`` until a correct response).

    ``warmup``: ``{command: [...], mode, url, body, expect, timeout, cwd}``. The command runs as a
    ``_process_run.Child`` (its whole process group is stopped afterwards); ``mode: serve`` polls with
    ``_probe.retry`` until the answer's text contains ``expect``. Raises KCacheError.
    """
    cmd = list(warmup.get("command") or [])
    if not cmd:
        raise KCacheError("warmup_command: empty; give the engine command that fills the caches")
    mode = warmup.get("mode", "run")
    timeout = float(warmup.get("timeout") or 3600)
    log("warm-up (%s): %s" % (mode, " ".join(cmd)))
    try:
        child = _process_run.Child(cmd, logfile, env=env, cwd=warmup.get("cwd"))
    except OSError as e:
        raise KCacheError("warmup_command: cannot start %s (%s)" % (cmd[0], e))
    t0 = time.monotonic()
    try:
        if mode == "run":
            rc = child.wait(timeout)
            if rc is None:
                raise KCacheError("warmup_timeout: warm-up still running after %ds; see %s" % (timeout, logfile))
            if rc != 0:
                raise KCacheError("warmup_command exited %d; see %s" % (rc, logfile))
            log("warm-up finished in %.1fs" % (time.monotonic() - t0))
            return {"duration_s": round(time.monotonic() - t0, 2), "response": None}
        post = http_post or _default_http_post
        url, body, expect = warmup.get("url"), warmup.get("body") or {}, warmup.get("expect") or ""
        if not url:
            raise KCacheError("warmup_url: required with warmup_mode=serve")

        def answered():
            try:
                code, payload = post(url, body, 30)
            except Exception as e:  # connection refused while the engine loads
                raise _probe.Transient("%s: %s" % (type(e).__name__, e))
            text = response_text(payload) if code == 200 else ""
            if text.strip() and expect in text:
                return text
            raise _probe.Transient("HTTP %s %r" % (code, payload[:120]))

        def exited():
            rc = child.returncode
            return None if rc is None else "warmup_command exited %d before answering; see %s" % (rc, logfile)

        def waiting(n, last):
            if n % 15 == 1:
                log("waiting for %s (%.0fs elapsed): %s" % (url, time.monotonic() - t0, last))

        try:
            text, n = _probe.retry(answered, t0 + timeout, poll, process_exited=exited, on_retry=waiting)
        except _probe.Exited as e:
            raise KCacheError(e.msg)
        except _probe.Expired as e:
            raise KCacheError("warmup_timeout: no correct response from %s after %ds (last: %s); see %s"
                              % (url, timeout, e.last, logfile))
        log("first correct response after %.1fs (%d probes): %r" % (time.monotonic() - t0, n, text[:80]))
        return {"duration_s": round(time.monotonic() - t0, 2), "response": text}
    finally:
        child.stop()


def prebuild(cache_root, engine, fingerprint, components, warmup, label="", extra_env=None,
             lock_timeout=7200, allow_extra=True, check_mode=False, http_post=None, host=None, proc_root="/proc"):
    """Build the cache once per fingerprint: lock, re-check, warm up into ``.partial-*``, verify, rename.

    A caller that waited for another builder finds the published directory and reports a hit.
    """
    final = fingerprint_dir(cache_root, engine, fingerprint)
    eroot = engine_root(cache_root, engine)
    res = {"cache_dir": final, "built": False, "changed": False, "quarantined_to": None, "waited_s": 0.0}
    if check_mode:
        ver = verify_dir(final, fingerprint, components, allow_extra)
        res.update(status="hit" if ver["ok"] else "would_build", changed=not ver["ok"], verify=ver)
        return res
    os.makedirs(eroot, exist_ok=True)
    with fingerprint_lock(cache_root, engine, fingerprint, lock_timeout) as waited:
        res["waited_s"] = round(waited, 2)
        ver = verify_dir(final, fingerprint, components, allow_extra)
        if ver["ok"]:
            res.update(status="hit", verify=ver)
            return res
        if ver["status"] != "missing":
            res["quarantined_to"] = quarantine(cache_root, engine, fingerprint, final,
                                               "%s before prebuild: %s" % (ver["status"], "; ".join(ver["problems"][:20])),
                                               proc_root=proc_root, what=ver["status"])
            res["changed"] = True
        logfile = os.path.join(eroot, ".logs", "%s.prebuild.log" % fingerprint)
        log = _Log(logfile)
        partial = tempfile.mkdtemp(prefix=".partial-%s-" % fingerprint, dir=eroot)
        try:
            make_layout(partial, engine)
            env = dict(os.environ)
            env.update(extra_env or {})
            env.update(cache_env(engine, partial))
            log("building %s/%s (%s) in %s" % (engine, fingerprint, label, partial))
            w = run_warmup(warmup, env, log, logfile, http_post=http_post)
            relocate(partial, final)
            man = write_manifest(partial, engine, fingerprint, components, label, host=host)
            check = verify_dir(partial, fingerprint, components, allow_extra=False)
            if not check["ok"]:
                raise KCacheError("prebuild: fresh cache failed its own verification: %s" % check["problems"][:5])
            os.rename(partial, final)
            _fsync_dir(eroot)
            log("published %s: %d files, %d bytes" % (final, man["file_count"], man["total_bytes"]))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        finally:
            log.close()
        res.update(status="built", built=True, changed=True, log_path=logfile,
                   warmup_s=w["duration_s"], file_count=man["file_count"], total_bytes=man["total_bytes"],
                   verify=verify_dir(final, fingerprint, components, allow_extra))
        return res


_fsync_dir = _fsutil.fsync_dir


# ---- copy between a shared store and node-local NVMe -----------------------------------------------

def _copy_listed(src, dst, entries, log=None, progress_every=2.0):
    """Copy the manifest ``entries`` from ``src`` into the fresh directory ``dst``, each hashed while copied.

    Both sides go through ``_paths.contained``: an entry cannot read or write outside its directory, nor
    follow a symlink. Returns the bytes copied; raises KCacheError when a file's digest differs.
    """
    total = sum(max(e["size"], 0) for e in entries)
    done, t0, last = 0, time.monotonic(), 0.0
    for entry in entries:
        try:
            s = _paths.contained(src, entry["path"], "manifest.json path")
            d = _paths.contained(dst, entry["path"], "manifest.json path")
        except _paths.PathEscape as e:
            raise KCacheError("%s: %s" % (src, e))
        os.makedirs(os.path.dirname(d), exist_ok=True)
        h = hashlib.sha256()
        fdi = os.open(s, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fdi, "rb") as fi, os.fdopen(
                os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as fo:
            for chunk in iter(lambda: fi.read(_CHUNK), b""):
                h.update(chunk)
                fo.write(chunk)
                done += len(chunk)
                now = time.monotonic()
                if log is not None and now - last >= progress_every:
                    last = now
                    rate = done / max(now - t0, 1e-6)
                    log("%d/%d bytes (%.1f%%) %.1f MiB/s ETA %.0fs" % (
                        done, total, 100.0 * done / max(total, 1), rate / 2 ** 20, (total - done) / max(rate, 1)))
            fo.flush()
            os.fsync(fo.fileno())
        digest = file_digest(d)[1] if is_triton_group(d) else h.hexdigest()
        if digest != entry["sha256"]:
            raise KCacheError("sync: %s changed while copying (sha256 mismatch); the source is being "
                              "written to or is corrupt" % s)
    return done


def sync(source_root, cache_root, engine, fingerprint, components, lock_timeout=7200, allow_extra=True,
         check_mode=False, progress_every=2.0, proc_root="/proc"):
    """Copy a verified fingerprint dir from ``source_root`` to ``cache_root`` the verified way.

    Every file is hashed while it is copied and compared with the source manifest; the copy lands in a
    ``.partial-*`` dir and is renamed into place only when all of it matches. Progress (bytes, rate,
    ETA) goes to ``.logs/<fp>.sync.log`` under the destination.
    """
    src = fingerprint_dir(source_root, engine, fingerprint)
    final = fingerprint_dir(cache_root, engine, fingerprint)
    res = {"cache_dir": final, "source_dir": src, "copied": False, "changed": False, "quarantined_to": None}
    sver = verify_dir(src, fingerprint, components, allow_extra=False)
    if not sver["ok"]:
        raise KCacheError("source_root: %s is not a verified cache for this fingerprint (%s: %s); prebuild it "
                          "there first" % (src, sver["status"], "; ".join(sver["problems"][:5])))
    entries = manifest_entries(read_manifest(src))
    if check_mode:
        ver = verify_dir(final, fingerprint, components, allow_extra)
        res.update(status="hit" if ver["ok"] else "would_copy", changed=not ver["ok"])
        return res
    eroot = engine_root(cache_root, engine)
    os.makedirs(eroot, exist_ok=True)
    with fingerprint_lock(cache_root, engine, fingerprint, lock_timeout) as waited:
        res["waited_s"] = round(waited, 2)
        ver = verify_dir(final, fingerprint, components, allow_extra)
        if ver["ok"]:
            res["status"] = "hit"
            return res
        if ver["status"] != "missing":
            res["quarantined_to"] = quarantine(cache_root, engine, fingerprint, final,
                                               "%s before sync: %s" % (ver["status"], "; ".join(ver["problems"][:20])),
                                               proc_root=proc_root, what=ver["status"])
        log = _Log(os.path.join(eroot, ".logs", "%s.sync.log" % fingerprint))
        partial = tempfile.mkdtemp(prefix=".partial-%s-" % fingerprint, dir=eroot)
        t0 = time.monotonic()
        try:
            make_layout(partial, engine)
            total = _copy_listed(src, partial, entries, log, progress_every)
            shutil.copy2(os.path.join(src, MANIFEST), os.path.join(partial, MANIFEST))
            relocate(partial, final)
            check = verify_dir(partial, fingerprint, components, allow_extra=False)
            if not check["ok"]:
                raise KCacheError("sync: copy failed verification: %s" % check["problems"][:5])
            os.rename(partial, final)
            _fsync_dir(eroot)
            dt = time.monotonic() - t0
            log("copied %d files, %d bytes in %.2fs (%.1f MiB/s)" % (len(entries), total, dt, total / max(dt, 1e-6) / 2 ** 20))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        finally:
            log.close()
        res.update(status="copied", copied=True, changed=True, bytes=total, file_count=len(entries),
                   duration_s=round(time.monotonic() - t0, 3), log_path=log.path)
        return res


# ---- the engine's writable copy ------------------------------------------------------------------------

def compare_to_manifest(path, entries):
    """What ``path`` holds beyond ``entries``: ``{new_files: [{path, size, change}], missing_files: [...]}``.

    ``change`` is ``added`` (not in the manifest) or ``changed`` (its digest differs); Triton group files
    compare location-free, so a relocated copy does not count as changed. Symlinks count as added.
    """
    listed = dict((e["path"], e) for e in entries)
    new, present = [], set()
    for f in scan_files(path):
        present.add(f["path"])
        entry = listed.get(f["path"])
        if entry is not None and entry["sha256"] == f["sha256"]:
            continue
        size = os.path.getsize(os.path.join(path, f["path"]))
        new.append({"path": f["path"], "size": size, "change": "added" if entry is None else "changed"})
    for rel in _links(path):
        present.add(rel)
        new.append({"path": rel, "size": 0, "change": "added"})
    new.sort(key=lambda f: f["path"])
    return {"new_files": new, "missing_files": sorted(set(listed) - present)}


def checkout(cache_root, engine, fingerprint, components, instance=DEFAULT_INSTANCE, mount_path=None,
             allow_extra=True, lock_timeout=7200, check_mode=False, proc_root="/proc"):
    """Give engine ``instance`` its own writable copy of the verified published directory.

    The copy is ``.run/<fp>-<instance>/`` (the same path on every run, so an engine left running keeps its
    spec): built in a ``.partial-*`` directory from the manifest's files, each hashed while copied, its
    Triton groups pointed at ``mount_path`` (default: the copy itself), then renamed into place. An
    existing copy is kept as it is while a process uses it (``in_use``), kept when it still equals the
    published files (``ready``), and replaced otherwise (``copied``, with ``discarded_files``: what a
    stopped start had added). The published directory is only read.
    """
    published = fingerprint_dir(cache_root, engine, fingerprint)
    rd = run_dir(cache_root, engine, fingerprint, instance)
    base = mount_path or rd
    res = {"cache_dir": published, "engine_dir": rd, "changed": False, "in_use_by": [], "discarded_files": [],
           "relocated_files": 0}
    ver = verify_dir(published, fingerprint, components, allow_extra)
    if not ver["ok"]:
        raise KCacheError("checkout: %s is not a verified cache for this fingerprint (%s: %s); run operation=verify "
                          "and prebuild or sync first" % (published, ver["status"], "; ".join(ver["problems"][:5])))
    entries = manifest_entries(read_manifest(published))

    def current():
        if os.path.islink(rd):
            # not a copy this module made: never read, relocated or deleted through; the link itself is replaced
            res["replaced_link"] = _link_entry(rd, "engine copy")
            return "link"
        if not _is_real_dir(rd):
            return None
        busy = users_of([rd], proc_root)
        if busy:
            res.update(status="in_use", in_use_by=busy[:20])
            return "in_use"
        try:
            if read_manifest(rd).get("fingerprint") != fingerprint:
                return "stale"
        except (OSError, ValueError):
            return "stale"
        diff = compare_to_manifest(rd, entries)
        res["discarded_files"] = diff["new_files"][:200] + [
            {"path": p, "size": 0, "change": "removed"} for p in diff["missing_files"][:200]]
        return "stale" if res["discarded_files"] else "same"

    if check_mode:
        state = current()
        if state != "in_use":
            res.update(status="ready" if state == "same" else "would_copy", changed=state != "same")
        return res
    os.makedirs(os.path.join(engine_root(cache_root, engine), RUNS), exist_ok=True)
    with fingerprint_lock(cache_root, engine, fingerprint, lock_timeout):
        state = current()
        if state == "in_use":
            return res
        if state == "same":
            res["relocated_files"] = relocate(rd, base)
            res.update(status="ready", changed=res["relocated_files"] > 0)
            return res
        eroot = engine_root(cache_root, engine)
        partial = tempfile.mkdtemp(prefix=".partial-%s-run-" % fingerprint, dir=eroot)
        try:
            make_layout(partial, engine)
            total = _copy_listed(published, partial, entries)
            shutil.copyfile(os.path.join(published, MANIFEST), os.path.join(partial, MANIFEST))
            res["relocated_files"] = relocate(partial, base)
            if state == "stale":
                shutil.rmtree(rd)
            elif state == "link":
                os.unlink(rd)
            os.rename(partial, rd)
            _fsync_dir(os.path.dirname(rd))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        res.update(status="copied", changed=True, bytes=total, file_count=len(entries))
    return res


def start_report(cache_root, engine, fingerprint, log_text, instance=DEFAULT_INSTANCE, mount_path=None):
    """Hit or miss of the latest engine start, from its log and from what it wrote into its cache copy.

    Files the engine added or changed in its copy (``.run/<fp>-<instance>``) relative to the published
    manifest are ``new_files`` and make the start a miss; ``worth_publishing`` says whether they are a
    clean addition a rebuilt cache should hold. The published directory is checked byte for byte
    (``published_unchanged``). Without a copy (an engine pointed at the published directory itself),
    files written there make the start a miss.
    """
    published = fingerprint_dir(cache_root, engine, fingerprint)
    rd = run_dir(cache_root, engine, fingerprint, instance)
    engine_dir = rd if os.path.isdir(rd) else published
    res = analyze_log(log_text, engine, mount_path or engine_dir)
    pub = verify_dir(published, fingerprint, None, allow_extra=False)
    res.update(engine_dir=engine_dir, published_unchanged=pub["ok"], problems=[], new_files=[], missing_files=[])
    if engine_dir == published:
        res["cache_unchanged"] = pub["ok"]
        if pub["status"] in ("tampered", "incomplete"):
            res["result"] = "miss"
            res["miss_lines"].append("cache changed during start: %s" % "; ".join(pub["problems"][:5]))
        res.update(worth_publishing=False, publish_advice="the engine ran on the published directory itself; "
                   "start it on operation=checkout's engine_dir so what it compiles is reported, not mixed in")
        return res
    if not pub["ok"] and pub["status"] != "missing":
        res["problems"].append("published directory %s no longer verifies (%s): %s" % (
            published, pub["status"], "; ".join(pub["problems"][:5])))
        if pub["status"] in ("tampered", "incomplete"):
            # something wrote into it during the start: this engine if it was pointed there, not at its copy
            res["result"] = "miss"
            res["miss_lines"].append("published directory changed during start (was the engine given the "
                                     "checkout's env?): %s" % "; ".join(pub["problems"][:5]))
    try:
        entries = manifest_entries(read_manifest(rd))
    except (OSError, ValueError) as e:
        res.update(cache_unchanged=False, worth_publishing=False, publish_advice="no usable manifest in the copy")
        res["problems"].append("engine_dir %s: manifest.json unusable (%s); run operation=checkout again" % (rd, e))
        return res
    diff = compare_to_manifest(rd, entries)
    new, missing = diff["new_files"], diff["missing_files"]
    res.update(new_files=new[:200], new_file_count=len(new), new_bytes=sum(f["size"] for f in new),
               missing_files=missing[:200], cache_unchanged=not new and not missing)
    changed = [f for f in new if f["change"] == "changed"]
    if new or missing:
        res["result"] = "miss"
        res["miss_lines"].append("the start wrote %d new or changed files (%d bytes) into %s%s" % (
            len(new), res["new_bytes"], rd, ", removed %d" % len(missing) if missing else ""))
    if not new:
        worth, advice = False, "nothing new: the start used only published files"
    elif res["poisoned"]:
        worth, advice = False, "the log shows a corrupted cache: these files are a recovery, not kernels to publish"
    elif changed or missing:
        worth, advice = True, (
            "the engine rewrote or removed %d published files: what it compiles depends on an input this "
            "fingerprint does not record (another torch installation or compiler, for example); worth publishing "
            "only as a new fingerprint, keyed on that input and prebuilt on its own" % (len(changed) + len(missing)))
    else:
        worth, advice = True, (
            "%d files the warm-up did not compile (other shapes or code paths, or compile keys this fingerprint "
            "does not record): worth publishing as a new fingerprint directory; widen the warm-up "
            "(kernel_cache_warmup_*) or key the differing input, then prebuild; a published directory is never "
            "changed in place" % len(new))
    res.update(worth_publishing=worth, publish_advice=advice)
    return res


# ---- garbage collection ----------------------------------------------------------------------------

def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _is_real_dir(path):
    """``path`` itself (never what a symlink there points to) is a directory."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


LINK_FIX = ("a symlink in the kernel-cache root is never followed, counted or removed as a cache; remove the link "
            "itself (rm %s, not rm -r) and put a real directory there with operation=prebuild or sync")


def _link_entry(path, what):
    try:
        target = os.readlink(path)
    except OSError:
        target = None
    return {"path": path, "target": target, "what": what, "fix": LINK_FIX % path}


def _managed(cache_root, engine):
    """``(dirs, links)`` below ``<cache_root>/<engine>``: ``dirs`` maps each real published fingerprint
    directory and ``.run/`` copy to its fingerprint; ``links`` lists the symlinks found where those (or a
    ``.partial-*`` build directory) would be, by ``lstat``: reported, never followed, never counted."""
    eroot = engine_root(cache_root, engine)
    dirs, links = {}, []
    for d in _listdir(eroot):
        full = os.path.join(eroot, d)
        if _FP_RE.match(d) or d.startswith(".partial-"):
            if os.path.islink(full):
                links.append(_link_entry(full, "fingerprint directory" if _FP_RE.match(d) else "build directory"))
            elif _FP_RE.match(d) and _is_real_dir(full):
                dirs[full] = d
    runs = os.path.join(eroot, RUNS)
    if os.path.islink(runs):
        links.append(_link_entry(runs, "engine copies directory"))
        return dirs, links
    for d in _listdir(runs):
        fp = d.split("-", 1)[0]
        full = os.path.join(runs, d)
        if not (_FP_RE.match(fp) and "-" in d):
            continue
        if os.path.islink(full):
            links.append(_link_entry(full, "engine copy"))
        elif _is_real_dir(full):
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


def _created(path):
    try:
        created = read_manifest(path).get("created")
        if isinstance(created, str) and created:
            return created
    except (OSError, ValueError):
        pass
    try:
        return _utc(os.lstat(path).st_mtime)
    except OSError:
        return ""


def check_in_use(in_use):
    """``in_use`` entries are fingerprints or paths (strings without NUL); refused before anything changes."""
    for i, entry in enumerate(in_use or ()):
        if not isinstance(entry, str) or not entry or "\x00" in entry:
            raise KCacheError("in_use[%d]: must be a fingerprint or a path to a fingerprint directory (or below "
                              "it); fix the entry" % i)
        if "/" not in entry and not _FP_RE.match(entry):
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


def _remove(path, res, check_mode):
    """Delete the real directory ``path``; a symlink found there instead is reported, never followed, and an
    error is recorded with the path while gc goes on. True when removed (or would be)."""
    if os.path.islink(path):
        res["links"].append(_link_entry(path, "entry replaced by a symlink during gc"))
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
    process uses goes with its fingerprint; copies of kept fingerprints stay (the next start of that instance
    replaces its own). Only real directories count: a symlink where a fingerprint directory, an engine copy or
    a build directory would be is never followed, counted or removed, and is listed in ``links`` with the fix;
    a directory that cannot be removed is listed in ``errors``; gc goes on with the rest either way.
    """
    check_in_use(in_use)
    eroot = engine_root(cache_root, engine)
    res = {"kept": [], "removed": [], "protected": [], "removed_partials": [], "removed_runs": [], "changed": False,
           "in_use_by": {}, "links": [], "errors": []}
    if not os.path.isdir(eroot):
        return res
    users, dirs = fingerprint_users(cache_root, engine, proc_root)
    res["links"] = _managed(cache_root, engine)[1]
    mounted = set(users)
    protected = _declared(in_use, dirs) | mounted
    published = dict((d, fp) for d, fp in dirs.items() if os.path.dirname(d) == eroot)
    fps = sorted(published.values())
    fps.sort(key=lambda d: (_created(os.path.join(eroot, d)), d), reverse=True)
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
        if d in published or d in busy_runs or fp in live:
            continue
        if _remove(d, res, check_mode):
            res["removed_runs"].append(os.path.basename(d))
    now = time.time()
    for d in _listdir(eroot):
        m = re.match(r"^\.partial-([0-9a-f]+)-", d)
        full = os.path.join(eroot, d)
        if not m or not _is_real_dir(full):
            continue
        try:
            age = now - os.lstat(full).st_mtime
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


#: The engine log is judged on its last LOG_TAIL_BYTES (every start appends to one log; the latest start is at
#: the end).
LOG_TAIL_BYTES = 64 * 1024 * 1024


def read_log(path, tail=LOG_TAIL_BYTES):
    """The last ``tail`` bytes of the engine log ``path`` as text (undecodable bytes replaced).

    Opened through ``_untrusted.open_regular``: a FIFO, a device (``/dev/zero``), a socket or a directory is a
    :class:`KCacheError` naming ``log_path``, never a hang; a huge log costs at most ``tail`` bytes of memory.
    """
    try:
        with open_regular(path, "log_path") as f:
            size = os.fstat(f.fileno()).st_size
            if size > tail:
                f.seek(size - tail)
            data = f.read(tail)
    except ValueError as e:  # _untrusted.UntrustedInput: not a regular file; names log_path and the file
        raise KCacheError("%s; point log_path at the engine's log" % e)
    except OSError as e:
        raise KCacheError("log_path: cannot read %s (%s); point it at the engine's log" % (path, e.strerror or e))
    return data.decode("utf-8", "replace")


# ---- hit / miss from the engine log ------------------------------------------------------------------

START_BANNER = re.compile(r"^==== \S+ starting: ", re.M)


def analyze_log(text, engine, cache_dir=None):
    """Decide whether a start used the restored cache, from the engine's own log lines.

    A start that recompiled anything is a miss, even if some graphs loaded. ``unknown`` when the log
    holds neither kind of line (e.g. compile disabled by ``--enforce-eager``).
    """
    signs = LOG_SIGNS[engine]
    hits, misses, poison, moe, dirs = [], [], [], [], []
    # engine_process appends every start to one log behind a "==== <time> starting:" banner: judge only
    # the latest start, never an older one's compile lines.
    starts = [m.start() for m in START_BANNER.finditer(text)]
    if starts:
        text = text[starts[-1]:]
    for line in text.splitlines():
        if any(s in line for s in signs["miss"]):
            misses.append(line.strip()[-300:])
        elif any(s in line for s in signs["hit"]):
            hits.append(line.strip()[-300:])
        if any(s in line for s in POISON_SIGNS):
            poison.append(line.strip()[-300:])
        if any(s in line for s in MOE_FALLBACK_SIGNS):
            moe.append(line.strip()[-300:])
        m = _VLLM_CACHE_DIR_RE.search(line)
        if m:
            dirs.append(next(g for g in m.groups() if g).rstrip(","))
    outside = []
    if cache_dir:
        outside = [d for d in dirs if not _paths.is_within(d, cache_dir)]
    if misses or poison or outside:
        result = "miss"
    elif hits:
        result = "hit"
    else:
        result = "unknown"
    return {
        "result": result,
        "hit_lines": hits[:20],
        "miss_lines": misses[:20],
        "poisoned": bool(poison),
        "poison_lines": poison[:5],
        "moe_fallback_lines": moe[:10],
        "cache_dirs_used": sorted(set(dirs)),
        "cache_dirs_outside": sorted(set(outside)),
    }
