# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: greedy reference generations computed by transformers itself.

The engine is judged against these: if vLLM serves the staged files correctly, its greedy tokens for the
same prompt equal transformers' own ``generate`` on the same directory. The generation runs in a separate
interpreter (the engine environment's Python), so the module needs neither torch nor transformers itself.

Answers are cached per request (:func:`cached_reference`): the key is a SHA-256 over everything that
defines the answer - the model directory's real path, its content identity (the bytes of ``SHA256SUMS``
and every regular file's relative name, size and mtime_ns), the prompts, ``max_new_tokens``, dtype, the
generation script, the interpreter path with its file's identity and its torch/transformers versions. A
file changed in place, a new interpreter or a library upgrade is a new key, so a stale answer is never
served. An entry is read through the shared untrusted reader; one that is malformed, oversized or holds
another key is recomputed and overwritten.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _fsutil, _process_run
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json, read_bytes

SCRIPT = r'''
import json, sys, time
t0 = time.monotonic()
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
req = json.loads(sys.stdin.read())
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(req["model_path"])
model = AutoModelForCausalLM.from_pretrained(req["model_path"], dtype=getattr(torch, req["dtype"]))
model.eval()
t_load = time.monotonic() - t0
eos = model.generation_config.eos_token_id
eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
results = []
with torch.no_grad():
    for prompt in req["prompts"]:
        enc = tok(prompt, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=req["max_new_tokens"], do_sample=False,
                             pad_token_id=tok.pad_token_id)
        gen = out[0][enc.input_ids.shape[1]:].tolist()
        results.append({"prompt": prompt, "prompt_token_ids": enc.input_ids[0].tolist(), "token_ids": gen,
                        "text": tok.decode([t for t in gen if t not in eos_ids], skip_special_tokens=True)})
print(json.dumps({"references": results, "load_seconds": round(t_load, 3),
                  "generate_seconds": round(time.monotonic() - t0 - t_load, 3),
                  "library_versions": {"torch": torch.__version__, "transformers": transformers.__version__}}))
'''


class ReferenceError_(Exception):
    """The reference run failed; the message carries the interpreter's error output."""


def greedy_reference(model_path, prompts, max_new_tokens=16, dtype="float32", python=None, timeout=900):
    """Return ``{references: [{prompt, prompt_token_ids, token_ids, text}], load_seconds, ...}``."""
    req = json.dumps({"model_path": model_path, "prompts": list(prompts), "max_new_tokens": int(max_new_tokens),
                      "dtype": dtype})
    python = python or sys.executable
    try:
        # the last output line is parsed by the shared reader (size, nesting, finite numbers)
        out = _process_run.python_json(python, SCRIPT, stdin=req, timeout=timeout)
    except _process_run.PythonFailed as e:
        raise ReferenceError_("reference generation with %s exited %d: %s" % (python, e.returncode, e.stderr[-1500:]))
    except subprocess.TimeoutExpired:
        raise ReferenceError_("reference generation with %s did not finish within %s s; raise the timeout or use a "
                              "smaller model" % (python, timeout))
    except OSError as e:
        raise ReferenceError_("python: cannot run %s (%s); point python at the engine environment's interpreter"
                              % (python, e.strerror or e.__class__.__name__))
    except ValueError as e:
        raise ReferenceError_("reference generation with %s printed no usable result (%s); point python at an "
                              "interpreter with torch and transformers" % (python, e))
    if not isinstance(out, dict) or not isinstance(out.get("references"), list):
        raise ReferenceError_("reference generation with %s printed JSON without a list of references; point python "
                              "at an interpreter with torch and transformers" % python)
    # keys a module result reserves are not taken from the interpreter's output
    return dict((k, v) for k, v in out.items() if k not in ("changed", "failed", "msg", "invocation"))


#: Entries kept in a cache directory; the oldest beyond this are removed after each write.
CACHE_KEEP = 64
#: Largest entry read back; a bigger one is ignored and recomputed.
CACHE_MAX_BYTES = 4 * 1024 * 1024
#: Format of an entry; another format is recomputed.
CACHE_FORMAT = 1
#: A temporary file older than this (a writer killed before its rename) is removed by pruning.
STALE_TEMP_SECONDS = 3600
#: Largest SHA256SUMS hashed into the key (a staged revision's is a few KiB).
SUMS_MAX_BYTES = 16 * 1024 * 1024

# What the interpreter has installed, read from package metadata without importing torch (well under a second).
_VERSIONS_SCRIPT = r"""
import json
from importlib import metadata
out = {}
for name in ("torch", "transformers"):
    try:
        out[name] = metadata.version(name)
    except Exception:
        out[name] = None
print(json.dumps(out))
"""


def _file_identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}


def interpreter_identity(python, timeout=60):
    """The interpreter as the key sees it: its path, the identity of the file it resolves to and, when it answers
    a metadata query, its torch and transformers versions (None each when the query fails)."""
    ident = {"python": python, "real": os.path.realpath(python), "file": _file_identity(python), "versions": None}
    try:
        versions = _process_run.python_json(python, _VERSIONS_SCRIPT, timeout=timeout)
    except (OSError, ValueError, subprocess.SubprocessError, _process_run.PythonFailed):
        return ident
    if isinstance(versions, dict):
        ident["versions"] = dict((k, versions.get(k) if isinstance(versions.get(k), str) else None)
                                 for k in ("torch", "transformers"))
    return ident


def revision_identity(model_path):
    """The model directory's real path and content identity: the SHA-256 of its SHA256SUMS (None when absent) and
    for every regular file its relative name, size and mtime_ns (symlinks are listed with their target and the
    target's size and mtime)."""
    real = os.path.realpath(model_path)
    sums = None
    try:
        sums = hashlib.sha256(_untrusted_bytes(os.path.join(real, "SHA256SUMS"))).hexdigest()
    except FileNotFoundError:
        sums = None
    files = []
    for root, dirs, names in os.walk(real):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, real)
            try:
                lst = os.lstat(full)
                st = os.stat(full) if stat.S_ISLNK(lst.st_mode) else lst
            except OSError:
                files.append([rel, None, None, None])
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            link = os.readlink(full) if stat.S_ISLNK(lst.st_mode) else None
            files.append([rel, st.st_size, st.st_mtime_ns, link])
    return {"real_path": real, "sha256sums": sums, "files": files}


def _untrusted_bytes(path):
    try:
        return read_bytes(path, "model_path", max_bytes=SUMS_MAX_BYTES)
    except UntrustedInput as e:
        # an unreadable or oversized SHA256SUMS still identifies the revision by what can be known of it
        st = _file_identity(path)
        return json.dumps({"unreadable": str(e), "file": st}, sort_keys=True).encode("utf-8")


def cache_key(model_path, prompts, max_new_tokens, dtype, python):
    """``(key, request)``: the hex SHA-256 of the canonical JSON ``request`` that defines the answer."""
    request = {
        "format": CACHE_FORMAT,
        "script": hashlib.sha256(SCRIPT.encode("utf-8")).hexdigest(),
        "model": revision_identity(model_path),
        "prompts": list(prompts),
        "max_new_tokens": int(max_new_tokens),
        "dtype": dtype,
        "interpreter": interpreter_identity(python),
    }
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest(), request


def _cache_dir_error(cache_dir, what):
    return ReferenceError_("cache_dir: %s %s; reference_generate keeps its answers in a real directory of the user "
                           "that runs it (mode 0700): point cache_dir at such a directory (or one it may create), "
                           "or set it empty to compute without a cache" % (cache_dir, what))


def _makedirs_private(path):
    """Create ``path`` and each missing parent with mode 0700 (``os.makedirs`` gives parents the umask's mode; the
    default cache dir's parent is the engine's run dir, which the supervisor keeps 0700)."""
    missing = []
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def check_cache_dir(cache_dir, create):
    """Refuse a cache directory that is a symlink, not a directory or another user's; create it (0700) when absent
    and ``create``. Returns True when the directory exists afterwards."""
    try:
        st = os.lstat(cache_dir)
    except FileNotFoundError:
        if not create:
            return False
        try:
            _makedirs_private(cache_dir)
        except OSError as e:
            raise _cache_dir_error(cache_dir, "cannot be created (%s)" % (e.strerror or e.__class__.__name__))
        st = os.lstat(cache_dir)
    if stat.S_ISLNK(st.st_mode):
        raise _cache_dir_error(cache_dir, "is a symlink (to %s), which is not followed" % os.readlink(cache_dir))
    if not stat.S_ISDIR(st.st_mode):
        raise _cache_dir_error(cache_dir, "is not a directory")
    if st.st_uid != os.geteuid():
        raise _cache_dir_error(cache_dir, "belongs to uid %d, not to uid %d that runs this" % (st.st_uid, os.geteuid()))
    if create and st.st_mode & 0o077:
        os.chmod(cache_dir, 0o700)
    return True


def read_entry(path, key):
    """The cached result at ``path`` when it is a well-formed entry of ``key``; None otherwise (absent, malformed,
    truncated, oversized, another key or format). A symlinked entry is refused with ReferenceError_."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise ReferenceError_("cache_dir: entry %s is a symlink, which is not followed; remove it (reference_generate "
                              "writes regular files there)" % path)
    try:
        doc = load_json(path, "cache_dir", max_bytes=CACHE_MAX_BYTES, follow=False)
    except (UntrustedInput, OSError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or doc.get("key") != key:
        return None
    result = doc.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("references"), list):
        return None
    if any(k in result for k in ("changed", "failed", "msg", "invocation", "cached")):
        return None
    return result


def prune(cache_dir, keep=CACHE_KEEP, now=None):
    """Remove the oldest entries beyond ``keep`` and temporary files left by a writer that was killed; one directory
    listing. Entries are ordered by mtime (a hit renews it): a clock step can only make another entry the one
    recomputed next, never serve a wrong answer. A temporary file's age is read against the directory's own
    filesystem clock (``_clock.filesystem_now``, or ``now``). Returns the names removed."""
    entries, temps, removed = [], [], []
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return removed
    for name in names:
        full = os.path.join(cache_dir, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if ".json.tmp-" in name:
            temps.append((st.st_mtime, name))
        elif name.endswith(".json") and not stat.S_ISDIR(st.st_mode):
            entries.append((st.st_mtime_ns, name))
    if temps:
        try:
            now = _clock.filesystem_now(cache_dir) if now is None else now
        except OSError:
            now = None
        removed.extend(name for mtime, name in temps if (_clock.age(now, mtime) or 0) > STALE_TEMP_SECONDS)
    entries.sort(reverse=True)
    removed.extend(name for _m, name in entries[keep:])
    for name in removed:
        try:
            os.unlink(os.path.join(cache_dir, name))
        except OSError:
            pass
    return removed


def cached_reference(model_path, prompts, max_new_tokens=16, dtype="float32", python=None, cache_dir=None,
                     check_mode=False, timeout=900, compute=None):
    """:func:`greedy_reference` through the cache in ``cache_dir`` (None or empty: no cache).

    Returns ``(result, warnings)``: the result with ``cached`` True (an earlier computation's result, unchanged)
    or False (computed now, then written atomically, mode 0600, unless ``check_mode``). In check mode nothing is
    written and no directory is created; a hit is still served and a miss still computes (the module only
    reads). An entry that cannot be written is a warning: the answer computed is still the answer.
    """
    python = python or sys.executable
    compute = compute or greedy_reference
    if not cache_dir:
        out = dict(compute(model_path, prompts, max_new_tokens, dtype, python=python, timeout=timeout))
        out["cached"] = False
        return out, []
    exists = check_cache_dir(cache_dir, create=not check_mode)
    key, request = cache_key(model_path, prompts, max_new_tokens, dtype, python)
    path = os.path.join(cache_dir, key + ".json")
    if exists:
        hit = read_entry(path, key)
        if hit is not None:
            if not check_mode:
                try:
                    os.utime(path, follow_symlinks=False)  # most recently used: pruned last
                except OSError:
                    pass
            hit["cached"] = True
            return hit, []
    out = dict(compute(model_path, prompts, max_new_tokens, dtype, python=python, timeout=timeout))
    warnings = []
    if not check_mode:
        doc = {"format": CACHE_FORMAT, "key": key, "request": request, "result": out}
        try:
            _fsutil.atomic_write_json(path, doc, mode=0o600, sort_keys=True)
            prune(cache_dir)
        except (OSError, TypeError, ValueError) as e:
            warnings.append("cache_dir: cannot write %s (%s); the answer was computed but will be computed again "
                            "next time: free space or fix the directory's permissions, or set cache_dir empty"
                            % (path, getattr(e, "strerror", None) or e.__class__.__name__))
    out["cached"] = False
    return out, warnings
