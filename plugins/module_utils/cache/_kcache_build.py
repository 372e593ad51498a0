# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: filling kernel-cache directories: build once, publish, copy, check out.

* :func:`prebuild` - one builder per fingerprint (the lock of ``_kcache``) runs the warm-up (:func:`run_warmup`)
  into a ``.partial-*`` directory, verifies it and renames it into place; a waiter finds it published.
* :func:`sync` - a verified copy from a shared store to node-local NVMe, each file hashed while copied.
* :func:`checkout` / :func:`start_report` - an engine never runs on the published directory: it starts on its own
  ``.run/`` copy, so kernels it compiles while starting land there, are reported (``new_files``) and never change
  what other hosts and later starts verify against.

No AnsibleModule needed (the warm-up's HTTP goes through ``_http``, its process through ``_process_run.Child``),
so benchmark scripts can drive the same code outside a module. Every ``.partial-*`` directory is a
``_process_run.scratch_dir``: removed when the build fails, or when the module is signalled (SIGTERM, SIGHUP,
SIGINT) after the warm-up's process group was stopped.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _http, _paths, _process_run
from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe
from ansible_collections.llmops.serving.plugins.module_utils.cache._kcache import (
    CHUNK, DEFAULT_INSTANCE, KCacheError, MANIFEST, RUNS, cache_env, engine_root, file_digest, fingerprint_dir,
    fingerprint_lock, is_real_dir, is_triton_group, link_entry, make_layout, manifest_entries, publish, quarantine,
    read_manifest, relocate, run_dir, scan_files, symlinks_in, users_of, utc, verify_dir, write_manifest,
)
from ansible_collections.llmops.serving.plugins.module_utils.cache._kcache_log import analyze_log
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import loads_json


# ---- warm-up -----------------------------------------------------------------------------------------

class _Log(object):
    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(path, "a")
        self.t0 = time.monotonic()

    def __call__(self, msg):
        self.f.write("[%s +%.1fs] %s\n" % (utc(), time.monotonic() - self.t0, msg))
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


def empty_warmup_message(warmup, engine, logfile):
    """Why a warm-up that wrote no file is refused: published, an empty cache verifies, so every node would count it
    as a hit and compile everything itself at start, the cold start the cache exists to avoid."""
    how = "answered correctly" if warmup.get("mode", "run") == "serve" else "exited 0"
    names = sorted(cache_env(engine, "/").keys())
    return ("warmup_command: the warm-up %s but wrote no file into the cache directories it was pointed at (%s); "
            "an empty cache would verify and count as a hit on every node, nothing was published. Run the engine "
            "itself with those variables (a wrapper script or container entrypoint must not reset them), or leave "
            "kernel_cache out for an engine that compiles nothing; see %s" % (how, ", ".join(names), logfile))


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
        try:
            with _process_run.scratch_dir(".partial-%s-" % fingerprint, eroot) as partial:
                make_layout(partial, engine)
                env = dict(os.environ)
                env.update(extra_env or {})
                env.update(cache_env(engine, partial))
                log("building %s/%s (%s) in %s" % (engine, fingerprint, label, partial))
                w = run_warmup(warmup, env, log, logfile, http_post=http_post)
                relocate(partial, final)
                man = write_manifest(partial, engine, fingerprint, components, label, host=host)
                if not man["file_count"]:
                    raise KCacheError(empty_warmup_message(warmup, engine, logfile))
                check = verify_dir(partial, fingerprint, components, allow_extra=False)
                if not check["ok"]:
                    raise KCacheError("prebuild: fresh cache failed its own verification: %s" % check["problems"][:5])
                publish(partial, final, cache_root, engine)  # with the next publish sequence (_kcache)
                log("published %s: %d files, %d bytes" % (final, man["file_count"], man["total_bytes"]))
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
            for chunk in iter(lambda: fi.read(CHUNK), b""):
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
        t0 = time.monotonic()
        try:
            with _process_run.scratch_dir(".partial-%s-" % fingerprint, eroot) as partial:
                make_layout(partial, engine)
                total = _copy_listed(src, partial, entries, log, progress_every)
                shutil.copy2(os.path.join(src, MANIFEST), os.path.join(partial, MANIFEST))
                relocate(partial, final)
                check = verify_dir(partial, fingerprint, components, allow_extra=False)
                if not check["ok"]:
                    raise KCacheError("sync: copy failed verification: %s" % check["problems"][:5])
                publish(partial, final, cache_root, engine)  # with the next publish sequence (_kcache)
                dt = time.monotonic() - t0
                log("copied %d files, %d bytes in %.2fs (%.1f MiB/s)" % (len(entries), total, dt, total / max(dt, 1e-6) / 2 ** 20))
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
    for rel in symlinks_in(path):
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
            res["replaced_link"] = link_entry(rd, "engine copy")
            return "link"
        if not is_real_dir(rd):
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
        with _process_run.scratch_dir(".partial-%s-run-" % fingerprint, eroot) as partial:
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
