# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: fingerprinted kernel-cache directories on node-local NVMe.

Layout::

    <cache_root>/<engine>/<fingerprint>/            published, verified, what the engine mounts
        manifest.json                               components, files (size + sha256), producer, created
        triton/ inductor/ deep_gemm/ flashinfer/    one subdirectory per cache kind (see KINDS)
        torch_compile/ (vLLM)  sglang/ jit/ (SGLang)
    <cache_root>/<engine>/.partial-<fp>-XXXX/       private build / copy directory, renamed into place
    <cache_root>/<engine>/.locks/<fp>.lock          per-fingerprint flock: one builder, others wait
    <cache_root>/<engine>/.logs/<fp>.<what>.log     warm-up output and copy progress
    <cache_root>/.quarantine/<engine>-<fp>-<utc>/   tampered, incomplete or foreign directories

Standard library only (``ansible.module_utils.urls`` is imported lazily for the HTTP warm-up probe),
so benchmark scripts can drive the same code outside Ansible.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
QUARANTINE = ".quarantine"
_FP_RE = re.compile(r"^[0-9a-f]{8,64}$")
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


# ---- layout ---------------------------------------------------------------------------------------

def engine_root(cache_root, engine):
    return os.path.join(cache_root, engine)


def fingerprint_dir(cache_root, engine, fingerprint):
    if not _FP_RE.match(fingerprint or ""):
        raise KCacheError("fingerprint: %r is not a hex fingerprint; pass the fingerprint returned by "
                          "llmops.serving.kernel_fingerprint" % (fingerprint,))
    return os.path.join(cache_root, engine, fingerprint)


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

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def is_triton_group(path):
    """Triton's ``__grp__*.json`` files list their members by absolute path (``child_paths``)."""
    name = os.path.basename(path)
    return name.startswith("__grp__") and name.endswith(".json")


def _group_members(full):
    with open(full, "r") as f:
        data = json.load(f)
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict):
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
            return os.path.getsize(full), sha256_file(full)
        canon = dict(data, child_paths=dict((k, os.path.basename(v)) for k, v in children.items()))
        blob = json.dumps(canon, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return -1, hashlib.sha256(blob).hexdigest()
    return os.path.getsize(full), sha256_file(full)


def scan_files(path):
    """Sorted ``[{path, size, sha256}]`` of every regular file below ``path`` except the manifest.

    ``size`` is -1 for Triton group files (their byte size depends on the directory's location).
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
            tmp = full + ".relocate.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, full)
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
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))
    return manifest


def read_manifest(path):
    with open(os.path.join(path, MANIFEST), "r") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise ValueError("not a kernel-cache manifest")
    return data


def verify_dir(path, fingerprint, components=None, allow_extra=True):
    """Check a published directory against its manifest and the expected fingerprint/components.

    Returns ``{ok, status, problems, manifest}``; ``status`` is one of ``ok``, ``missing``,
    ``no_manifest``, ``foreign`` (fingerprint or components differ), ``tampered`` (a file changed or
    appeared) or ``incomplete`` (a file is missing).
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
    if man.get("fingerprint") != fingerprint:
        res.update(status="foreign", problems=["manifest fingerprint %s != %s" % (man.get("fingerprint"), fingerprint)])
        return res
    if components is not None and man.get("components") != components:
        keys = set(components) | set(man.get("components") or {})
        diff = sorted(k for k in keys if components.get(k) != (man.get("components") or {}).get(k))
        res.update(status="foreign", problems=["components differ: %s" % ", ".join(diff)])
        return res
    listed = {}
    for entry in man["files"]:
        listed[entry["path"]] = entry
    problems, missing = [], 0
    for rel, entry in sorted(listed.items()):
        full = os.path.join(path, rel)
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
    res["extra_files"] = sorted(extra)
    if extra and not allow_extra:
        problems.extend("not in manifest: %s" % rel for rel in sorted(extra))
    if problems:
        status = "incomplete" if missing and missing == len(problems) else "tampered"
        res.update(status=status, problems=problems)
        return res
    res.update(ok=True, status="ok")
    return res


def quarantine(cache_root, engine, fingerprint, path, reason):
    """Move ``path`` to ``<cache_root>/.quarantine/`` with a reason file; returns the new path."""
    qroot = os.path.join(cache_root, QUARANTINE)
    os.makedirs(qroot, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = os.path.join(qroot, "%s-%s-%s-%d" % (engine, fingerprint, stamp, os.getpid()))
    os.rename(path, dest)
    with open(dest + ".reason.json", "w") as f:
        json.dump({"engine": engine, "fingerprint": fingerprint, "from": path, "at": _utc(),
                   "reason": reason}, f, indent=1, sort_keys=True)
    return dest


def restore(cache_root, engine, fingerprint, components, allow_extra=True, check_mode=False, do_quarantine=True,
            mount_path=None):
    """Verify the published dir before the engine starts; quarantine it when it is not usable.

    A usable dir is relocated to ``mount_path`` (default: where it is) so Triton finds its kernels.
    """
    path = fingerprint_dir(cache_root, engine, fingerprint)
    ver = verify_dir(path, fingerprint, components, allow_extra)
    out = {"cache_dir": path, "status": "hit" if ver["ok"] else ver["status"], "verify": ver,
           "quarantined_to": None, "changed": False, "relocated_files": 0}
    if ver["ok"] and not check_mode:
        out["relocated_files"] = relocate(path, mount_path or path)
        out["changed"] = out["relocated_files"] > 0
    if not ver["ok"] and ver["status"] != "missing" and do_quarantine:
        out["changed"] = True
        if not check_mode:
            out["quarantined_to"] = quarantine(cache_root, engine, fingerprint, path,
                                               "%s: %s" % (ver["status"], "; ".join(ver["problems"][:20])))
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
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() - start > timeout:
                    raise KCacheError("lock_timeout: another build of %s/%s still holds %s after %ds; raise "
                                      "lock_timeout or check the builder's log in %s"
                                      % (engine, fingerprint, ldir, timeout,
                                         os.path.join(engine_root(cache_root, engine), ".logs")))
                time.sleep(poll)
        yield time.monotonic() - start
    finally:
        os.close(fd)


def lock_is_free(cache_root, engine, fingerprint):
    path = os.path.join(engine_root(cache_root, engine), ".locks", fingerprint + ".lock")
    if not os.path.exists(path):
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
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
    from ansible.module_utils.urls import open_url  # lazy: keeps this file importable without Ansible

    resp = open_url(url, data=json.dumps(body), headers={"Content-Type": "application/json"},
                    method="POST", timeout=timeout)
    return resp.getcode(), resp.read().decode("utf-8", "replace")


def response_text(payload):
    """Text of an OpenAI-style completion or chat response, or '' when there is none."""
    try:
        choice = json.loads(payload)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    if isinstance(choice.get("text"), str):
        return choice["text"]
    msg = choice.get("message") or {}
    return msg.get("content") or ""


def _stop(proc, grace=30):
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait(10)


def run_warmup(warmup, env, log, logfile, http_post=None, poll=2.0):
    """Run the warm-up (``mode: run`` to completion, or ``mode: serve`` until a correct response).

    ``warmup``: ``{command: [...], mode, url, body, expect, timeout, cwd}``. Raises KCacheError.
    """
    cmd = list(warmup.get("command") or [])
    if not cmd:
        raise KCacheError("warmup_command: empty; give the engine command that fills the caches")
    mode = warmup.get("mode", "run")
    timeout = float(warmup.get("timeout") or 3600)
    log("warm-up (%s): %s" % (mode, " ".join(cmd)))
    out = open(logfile, "a")
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=warmup.get("cwd") or None, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        out.close()
        raise KCacheError("warmup_command: cannot start %s (%s)" % (cmd[0], e))
    t0 = time.monotonic()
    try:
        if mode == "run":
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise KCacheError("warmup_timeout: warm-up still running after %ds; see %s" % (timeout, logfile))
            if rc != 0:
                raise KCacheError("warmup_command exited %d; see %s" % (rc, logfile))
            log("warm-up finished in %.1fs" % (time.monotonic() - t0))
            return {"duration_s": round(time.monotonic() - t0, 2), "response": None}
        post = http_post or _default_http_post
        url, body, expect = warmup.get("url"), warmup.get("body") or {}, warmup.get("expect") or ""
        if not url:
            raise KCacheError("warmup_url: required with warmup_mode=serve")
        last, n = "", 0
        while True:
            if proc.poll() is not None:
                raise KCacheError("warmup_command exited %d before answering; see %s" % (proc.returncode, logfile))
            if time.monotonic() - t0 > timeout:
                raise KCacheError("warmup_timeout: no correct response from %s after %ds (last: %s); see %s"
                                  % (url, timeout, last, logfile))
            n += 1
            try:
                code, payload = post(url, body, 30)
                text = response_text(payload) if code == 200 else ""
                if text.strip() and expect in text:
                    log("first correct response after %.1fs (%d probes): %r" % (time.monotonic() - t0, n, text[:80]))
                    return {"duration_s": round(time.monotonic() - t0, 2), "response": text}
                last = "HTTP %s %r" % (code, payload[:120])
            except Exception as e:  # connection refused while the engine loads
                last = "%s: %s" % (type(e).__name__, e)
            if n % 15 == 1:
                log("waiting for %s (%.0fs elapsed): %s" % (url, time.monotonic() - t0, last))
            time.sleep(poll)
    finally:
        _stop(proc)
        out.close()


def prebuild(cache_root, engine, fingerprint, components, warmup, label="", extra_env=None,
             lock_timeout=7200, allow_extra=True, check_mode=False, http_post=None, host=None):
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
                                               "%s before prebuild: %s" % (ver["status"], "; ".join(ver["problems"][:20])))
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

def sync(source_root, cache_root, engine, fingerprint, components, lock_timeout=7200, allow_extra=True,
         check_mode=False, progress_every=2.0):
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
    man = read_manifest(src)
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
                                               "%s before sync: %s" % (ver["status"], "; ".join(ver["problems"][:20])))
        log = _Log(os.path.join(eroot, ".logs", "%s.sync.log" % fingerprint))
        partial = tempfile.mkdtemp(prefix=".partial-%s-" % fingerprint, dir=eroot)
        total = sum(max(f["size"], 0) for f in man["files"])
        done, t0, last = 0, time.monotonic(), 0.0
        try:
            make_layout(partial, engine)
            for entry in man["files"]:
                s, d = os.path.join(src, entry["path"]), os.path.join(partial, entry["path"])
                os.makedirs(os.path.dirname(d), exist_ok=True)
                h = hashlib.sha256()
                with open(s, "rb") as fi, open(d, "wb") as fo:
                    for chunk in iter(lambda: fi.read(_CHUNK), b""):
                        h.update(chunk)
                        fo.write(chunk)
                        done += len(chunk)
                        now = time.monotonic()
                        if now - last >= progress_every:
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
            shutil.copy2(os.path.join(src, MANIFEST), os.path.join(partial, MANIFEST))
            relocate(partial, final)
            check = verify_dir(partial, fingerprint, components, allow_extra=False)
            if not check["ok"]:
                raise KCacheError("sync: copy failed verification: %s" % check["problems"][:5])
            os.rename(partial, final)
            _fsync_dir(eroot)
            dt = time.monotonic() - t0
            log("copied %d files, %d bytes in %.2fs (%.1f MiB/s)" % (len(man["files"]), total, dt, total / max(dt, 1e-6) / 2 ** 20))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        finally:
            log.close()
        res.update(status="copied", copied=True, changed=True, bytes=total, file_count=len(man["files"]),
                   duration_s=round(time.monotonic() - t0, 3), log_path=log.path)
        return res


# ---- garbage collection ----------------------------------------------------------------------------

def mounted_fingerprints(cache_root, engine, proc_root="/proc"):
    """Fingerprints of ``cache_root/engine`` referenced by a running process (environment or mapped files)."""
    base = os.path.realpath(engine_root(cache_root, engine)).rstrip("/") + "/"
    pat = re.compile(re.escape(base) + r"([0-9a-f]{8,64})(?=/|\x00|\s|$)")
    found = set()
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        for name in ("environ", "maps"):
            try:
                with open(os.path.join(proc_root, pid, name), "rb") as f:
                    data = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            found.update(pat.findall(data))
    return found


def _created(path):
    try:
        return read_manifest(path).get("created") or _utc(os.path.getmtime(path))
    except (OSError, ValueError):
        try:
            return _utc(os.path.getmtime(path))
        except OSError:
            return ""


def gc(cache_root, engine, keep, in_use=(), proc_root="/proc", check_mode=False, partial_max_age=86400):
    """Keep the newest ``keep`` fingerprints of ``engine``; never remove one that is in use."""
    eroot = engine_root(cache_root, engine)
    res = {"kept": [], "removed": [], "protected": [], "removed_partials": [], "changed": False}
    if not os.path.isdir(eroot):
        return res
    mounted = mounted_fingerprints(cache_root, engine, proc_root)
    protected = set(in_use or ()) | mounted
    dirs = [d for d in os.listdir(eroot) if _FP_RE.match(d) and os.path.isdir(os.path.join(eroot, d))]
    dirs.sort(key=lambda d: (_created(os.path.join(eroot, d)), d), reverse=True)
    for i, d in enumerate(dirs):
        if d in protected:
            res["protected"].append(d)
        elif i < keep:
            res["kept"].append(d)
        else:
            res["removed"].append(d)
            if not check_mode:
                shutil.rmtree(os.path.join(eroot, d))
    now = time.time()
    for d in sorted(os.listdir(eroot)):
        m = re.match(r"^\.partial-([0-9a-f]+)-", d)
        full = os.path.join(eroot, d)
        if not m or now - os.path.getmtime(full) < partial_max_age or not lock_is_free(cache_root, engine, m.group(1)):
            continue
        res["removed_partials"].append(d)
        if not check_mode:
            shutil.rmtree(full, ignore_errors=True)
    res["mounted"] = sorted(mounted)
    res["changed"] = bool(res["removed"] or res["removed_partials"])
    return res


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
        root = os.path.realpath(cache_dir).rstrip("/") + "/"
        outside = [d for d in dirs if not os.path.realpath(d).startswith(root)]
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
