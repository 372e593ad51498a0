# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: verified, resumable staging of a model revision to local disk.

Layout next to the published revision ``dest`` (its parent resolved, see ``_stage_layout``):

* ``<dest>.partial/`` - the copy being built. A file appears there under its final name only once it
  is completely written, verified and fsynced (``<name>.llmops-part`` while in flight), and is then recorded
  in ``.llmops-staged.journal`` with the identity of the source file it came from, so a copy killed at any
  point resumes, from the same source or another one, by reusing only what it can prove.
* ``<dest>.lock`` - ``flock`` held for the whole run by whoever writes ``dest`` (``_stage_lock``).
* ``<dest>/.llmops-staged.json`` - the completion marker (``_stage_marker``): per file its size, header digest,
  sha256 where one was computed, the source file's identity and the copy's ``lstat`` at publish.
  ``<dest>.partial`` becomes ``dest`` with one ``rename`` (or an atomic exchange with the previous revision);
  nothing half-copied is ever at ``dest``.

A re-run ``lstat``s the source files and the published copies and compares them with the marker: no data and no
header is read when nothing changed. A copy removed, resized or rewritten after publish, or whose source file is
no longer the one it was copied from, is staged again, alone: the intact files are hard-linked into the new
partial dir and the revision is republished.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils import _fleet_slots
from ansible_collections.llmops.serving.plugins.module_utils import _inuse
from ansible_collections.llmops.serving.plugins.module_utils import _paths
from ansible_collections.llmops.serving.plugins.module_utils import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils._stage_lock import DestLock
from ansible_collections.llmops.serving.plugins.module_utils._stage_marker import StageError

MARKER = _marker.MARKER
PART_SUFFIX = _marker.PART_SUFFIX
PARTIAL_SUFFIX = _stage_layout.PARTIAL_SUFFIX
LOCK_SUFFIX = _stage_layout.LOCK_SUFFIX
VERIFY_MODES = _marker.VERIFY_MODES
CHUNK = 64 * 1024 * 1024        # per copy_file_range/sendfile call (also the progress granularity)
DIRECT_BUF = 16 * 1024 * 1024   # O_DIRECT request size: large, page-aligned, one buffer per stream
DIRECT_ALIGN = 4096             # O_DIRECT needs block-aligned offsets and lengths; an unaligned tail is buffered
HASH_BUF = 1024 * 1024          # buffered reads in user space: small enough for hash + write to hit CPU cache

__all__ = ["DestLock", "StageError", "stage", "remove", "prune"]

load_checksums = _marker.load_checksums
read_marker = _marker.read_marker
_strength = _marker.strength


def _header_digest(raw):
    return hashlib.sha256(raw).hexdigest() if raw is not None else None


# ---- verification ------------------------------------------------------------------------------
class SourceContent(object):
    """What reading src's headers and manifest established: raw headers, manifest digests, manifest path."""

    def __init__(self, headers, sums, manifest_rel):
        self.headers = headers
        self.sums = sums
        self.manifest_rel = manifest_rel
        self.header_digests = dict((k, _header_digest(v)) for k, v in headers.items())

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
        sums = load_checksums(checksums_path)
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


def _check_copy_header(path, size, src_header):
    summary, raw = _safetensors.verify_file(path, size)
    if src_header is not None and raw != src_header:
        raise _safetensors.CheckpointError(path, "header differs from the source file's header")
    return summary


def sha256_file(path):
    h = hashlib.sha256()
    buf = bytearray(HASH_BUF)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
    return h.hexdigest()


# ---- progress ----------------------------------------------------------------------------------
def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n  # pragma: no cover


def human_seconds(s):
    s = int(round(s))
    return "%d:%02d:%02d" % (s // 3600, (s % 3600) // 60, s % 60)


class Progress:
    """Thread-safe byte counter that writes a JSON progress file once per ``interval`` seconds."""

    def __init__(self, path, dest, bytes_total, files_total, interval=1.0, clock=time.monotonic):
        self.path = path
        self.dest = dest
        self.bytes_total = bytes_total
        self.files_total = files_total
        self.bytes_done = 0
        self.files_done = 0
        self.state = "copying"
        self.interval = interval
        self.clock = clock
        self.t0 = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def add(self, nbytes=0, files=0):
        with self._lock:
            self.bytes_done += nbytes
            self.files_done += files

    def snapshot(self):
        with self._lock:
            done, files = self.bytes_done, self.files_done
        elapsed = max(self.clock() - self.t0, 1e-9)
        rate = done / elapsed
        left = max(self.bytes_total - done, 0)
        eta = (left / rate) if rate > 0 else None
        pct = 100.0 * done / self.bytes_total if self.bytes_total else 100.0
        msg = "%s: %s / %s (%.1f%%), %d/%d files, %s/s, ETA %s" % (
            self.state, human_bytes(done), human_bytes(self.bytes_total), pct, files, self.files_total,
            human_bytes(rate), human_seconds(eta) if eta is not None else "unknown")
        return {
            "state": self.state, "dest": self.dest, "bytes_done": done, "bytes_total": self.bytes_total,
            "files_done": files, "files_total": self.files_total, "percent": round(pct, 2),
            "elapsed_seconds": round(elapsed, 3), "rate_bytes_per_second": round(rate, 1),
            "eta_seconds": round(eta, 1) if eta is not None else None, "message": msg,
            "updated": time.time(),
        }

    def write(self):
        if not self.path:
            return
        data = json.dumps(self.snapshot(), sort_keys=True)
        tmp = "%s.tmp-%d" % (self.path, os.getpid())
        try:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            with open(tmp, "w") as f:
                f.write(data + "\n")
            os.replace(tmp, self.path)
        except OSError:
            pass  # progress is best effort; never fail a copy over it

    def start(self):
        if self.path:
            self.write()
            self._thread = threading.Thread(target=self._loop, name="stage-progress", daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.write()

    def finish(self, state):
        self.state = state
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.write()


# ---- copying -----------------------------------------------------------------------------------
# ---- copying -----------------------------------------------------------------------------------
class _Copier:
    """Copies files with at most ``streams`` open on src, each stream holding a fleet slot if any.

    Every completed file is recorded (``records`` and the partial dir's journal) with the identity of the source
    file it was read from, checked on the open descriptor before the first byte is read.
    """

    def __init__(self, src, partial, mode, content, streams, slots, progress, do_fsync, direct_io=True,
                 journal=None):
        self.src = src
        self.direct_io = direct_io
        self.direct_files = 0
        self.partial = partial
        self.mode = mode
        self.content = content
        self.headers = content.headers
        self.sums = content.sums
        self.streams = streams
        self.slots = slots
        self.progress = progress
        self.do_fsync = do_fsync
        self.journal = journal
        self.records = {}
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self.open_streams = 0
        self.peak_streams = 0

    def _enter(self):
        with self._lock:
            self.open_streams += 1
            self.peak_streams = max(self.peak_streams, self.open_streams)

    def _leave(self):
        with self._lock:
            self.open_streams -= 1

    def run(self, files):
        order = sorted(files, key=lambda f: -f["size"])  # big files first: better balance
        errors = []
        with ThreadPoolExecutor(max_workers=max(1, min(self.streams, len(order) or 1))) as pool:
            futures = [pool.submit(self._one_guarded, f, errors) for f in order]
            for fut in futures:
                fut.result()
        if errors:
            raise errors[0]

    def _one_guarded(self, f, errors):
        if self.cancel.is_set():
            return
        try:
            self._one(f)
        except BaseException as e:  # first error wins; the others stop at their next chunk
            self.cancel.set()
            errors.append(e)

    def _one(self, f):
        rel = f["path"]
        src_path = os.path.join(self.src, rel)
        final = _paths.contained(self.partial, rel, "src")
        tmp = final + PART_SUFFIX
        os.makedirs(os.path.dirname(final), exist_ok=True)
        lease = self.slots.acquire() if self.slots else None
        try:
            digest = self._copy(src_path, tmp, f)
        except OSError as e:
            _unlink(tmp)
            if e.errno == errno.ENOSPC:
                raise StageError("no space left on device while writing %s (%s); free space on the dest "
                                 "filesystem or stage elsewhere" % (final, human_bytes(f["size"])))
            raise StageError("copy of %s failed: %s" % (src_path, e))
        except BaseException:
            _unlink(tmp)
            raise
        finally:
            if lease:
                self.slots.release(lease)
        try:
            _check_unchanged(src_path, os.stat(src_path), f, "while it was being copied")
            size = os.path.getsize(tmp)
            if size != f["size"]:
                raise _safetensors.CheckpointError(tmp, "copy is %d bytes, source is %d" % (size, f["size"]))
            if self.mode in ("headers", "sha256") and rel in self.headers:
                _check_copy_header(tmp, size, self.headers[rel])
            if self.mode == "sha256" and rel in self.sums and digest != self.sums[rel]:
                raise _safetensors.CheckpointError(
                    src_path, "checksum mismatch: sha256 %s, manifest says %s" % (digest, self.sums[rel]))
            os.chmod(tmp, f["mode"] | 0o400)
            os.utime(tmp, ns=(f["mtime_ns"], f["mtime_ns"]))
            os.rename(tmp, final)
        except BaseException:
            _unlink(tmp)
            raise
        rec = _marker.FileRecord(rel, f["size"], _ident(f), _marker.copy_stat(os.lstat(final)),
                                 self.content.level(rel, self.mode), self.content.header_digests.get(rel),
                                 digest if self.mode == "sha256" else None)
        with self._lock:
            self.records[rel] = rec
        if self.journal:
            self.journal.append(rec)
        self.progress.add(files=1)

    def _copy(self, src_path, tmp, f):
        """Copy one file; returns its sha256 in sha256 mode (computed from the single read).

        With ``direct_io`` both ends use O_DIRECT where the filesystem allows it: the data goes from the
        device into one aligned buffer (hashed there in sha256 mode) and back out without a page-cache copy,
        which keeps the kernel's CPU time and the node's page cache out of a 700 GiB copy. Where neither
        end can, the kernel copies (``copy_file_range``); sha256 mode then reads through a small buffer.
        """
        size = f["size"]
        fin = RawFile(src_path, os.O_RDONLY, self.direct_io)
        self._enter()
        try:
            # what is read is the file that was listed (a symlink retargeted since cannot slip another in)
            _check_unchanged(src_path, os.fstat(fin.fd), f, "since it was listed")
            fout = RawFile(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.direct_io)
            try:
                if not fin.direct:
                    _fadvise(fin.fd, getattr(os, "POSIX_FADV_SEQUENTIAL", None))
                if fin.direct or fout.direct or self.mode == "sha256":
                    digest = self._copy_user(fin, fout, size, src_path)
                else:
                    digest = None
                    self._copy_kernel(fin, fout, size, src_path)
                if fin.went_direct and fout.went_direct:
                    with self._lock:
                        self.direct_files += 1
                if self.do_fsync:
                    os.fsync(fout.fd)
            finally:
                fout.close()
            if not fin.direct:
                _fadvise(fin.fd, getattr(os, "POSIX_FADV_DONTNEED", None))  # src pages are not needed again
            return digest
        finally:
            self._leave()
            fin.close()

    def _copy_user(self, fin, fout, size, src_path, offset=0):
        """Read into one aligned buffer, hash it in sha256 mode, write it out (from ``offset`` on)."""
        h = hashlib.sha256() if self.mode == "sha256" else None
        buf = mmap.mmap(-1, DIRECT_BUF)  # anonymous mappings are page-aligned, as O_DIRECT needs
        try:
            with memoryview(buf) as mv:
                while offset < size:
                    self._check_cancel()
                    with mv[:DIRECT_BUF if fin.direct else HASH_BUF] as target:
                        n = min(fin.read_at(target, offset), size - offset)
                    if n <= 0:
                        raise _safetensors.CheckpointError(src_path, "file ended early at byte %d of %d"
                                                           % (offset, size))
                    with mv[:n] as chunk:
                        if h is not None:
                            h.update(chunk)
                        fout.write_at(chunk, offset)
                    offset += n
                    self.progress.add(n)
        finally:
            buf.close()
        return h.hexdigest() if h is not None else None

    def _check_cancel(self):
        if self.cancel.is_set():
            raise StageError("cancelled after another file failed")

    def _copy_kernel(self, fin, fout, size, src_path):
        """In-kernel copy of two buffered files; where neither call works, the rest goes through _copy_user."""
        offset = 0
        use = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
        while offset < size:
            self._check_cancel()
            count = min(CHUNK, size - offset)
            try:
                if use == "copy_file_range":
                    n = os.copy_file_range(fin.fd, fout.fd, count, offset, offset)
                else:
                    os.lseek(fout.fd, offset, os.SEEK_SET)
                    n = os.sendfile(fout.fd, fin.fd, offset, count)
            except OSError as e:
                if use == "copy_file_range" and e.errno in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                                            errno.EOPNOTSUPP, errno.EPERM):
                    use = "sendfile"
                    continue
                if use == "sendfile" and e.errno in (errno.EINVAL, errno.ENOSYS):
                    self._copy_user(fin, fout, size, src_path, offset)
                    return
                raise
            if n == 0:
                raise _safetensors.CheckpointError(src_path, "file ended early at byte %d of %d" % (offset, size))
            offset += n
            self.progress.add(n)


class RawFile:
    """A file descriptor that uses O_DIRECT while the filesystem and the alignment allow it.

    The open falls back to buffered I/O when the filesystem refuses O_DIRECT (EINVAL), and so does any later
    read or write it refuses, or an unaligned tail: O_DIRECT is switched off on the descriptor
    (``F_SETFL``) and the same call is retried, so a copy never fails only because direct I/O is unavailable.
    """

    def __init__(self, path, flags, direct, mode=0o600):
        self.direct = False
        self.refused = False  # the filesystem refused O_DIRECT (at open or later), not just an unaligned tail
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(path, flags | os.O_DIRECT, mode)
                self.direct = self.opened_direct = True
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.refused = True
        self.fd = os.open(path, flags, mode)
        self.opened_direct = False

    @property
    def went_direct(self):
        """True when the data moved with O_DIRECT (apart from an unaligned tail)."""
        return self.opened_direct and not self.refused

    def buffered(self, refused=False):
        if self.direct:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False
        self.refused = self.refused or refused

    def read_at(self, mv, offset):
        """One read into ``mv`` at ``offset``; returns the byte count (0 at end of file)."""
        if self.direct and offset % DIRECT_ALIGN:
            self.buffered()
        try:
            return os.preadv(self.fd, [mv], offset)
        except OSError as e:
            if not self.direct or e.errno != errno.EINVAL:
                raise
        self.buffered(refused=True)
        return os.preadv(self.fd, [mv], offset)

    def write_at(self, mv, offset):
        """Write all of ``mv`` at ``offset``."""
        done, n = 0, len(mv)
        while done < n:
            if self.direct and ((offset + done) % DIRECT_ALIGN or (n - done) % DIRECT_ALIGN):
                self.buffered()
            with mv[done:] as rest:
                try:
                    w = os.pwrite(self.fd, rest, offset + done)
                except OSError as e:
                    if not self.direct or e.errno != errno.EINVAL:
                        raise
                    self.buffered(refused=True)
                    continue
            if w <= 0:
                raise OSError(errno.EIO, "write returned %d" % w)
            done += w

    def close(self):
        os.close(self.fd)


def _fadvise(fd, advice):
    if advice is None or not hasattr(os, "posix_fadvise"):
        return
    try:
        os.posix_fadvise(fd, 0, 0, advice)
    except OSError:
        pass


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


_fsync_dir = _fsutil.fsync_dir


def _free_bytes(path):
    st = os.statvfs(_fsutil.nearest_existing(path))
    return st.f_bavail * st.f_frsize


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


def _ident(f):
    return (f["dev"], f["ino"], f["mtime_ns"], f["ctime_ns"])


def _check_unchanged(path, st, f, when):
    if (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) != (f["size"],) + _ident(f):
        raise StageError("src: %s changed %s; src must be an immutable revision directory" % (path, when))


def _remove_tree(path):
    """Make ``path`` vanish in one rename, then delete the renamed tree."""
    grave = "%s%s%s" % (path, _stage_layout.REMOVING_INFIX, uuid.uuid4().hex[:8])
    os.rename(path, grave)
    shutil.rmtree(grave, ignore_errors=True)


def _remove_partial(path):
    if os.path.islink(path) or os.path.isfile(path):
        _unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def is_pinned(dest, pinned):
    dest = os.path.abspath(dest)
    return any(p and (os.path.abspath(p) == dest if os.sep in p else p == os.path.basename(dest))
               for p in pinned)


# ---- in use ------------------------------------------------------------------------------------
_VIA = {"fd": "has %s open", "map": "maps %s", "cwd": "works in %s", "root": "is chrooted in %s",
        "environ": "names %s in its environment", "mount": "mounts it at %s (its mount namespace)"}


def users(paths, proc_root="/proc"):
    """Processes using any of ``paths`` by any path to them (``_inuse.users_of``)."""
    return _inuse.users_of([p for p in paths if os.path.lexists(p)], proc_root=proc_root)


def describe_user(u):
    return "pid %d %s" % (u["pid"], _VIA.get(u["via"], u["via"] + " %s") % u["file"])


def _in_use_entry(path, u):
    return {"path": path, "pid": u["pid"], "via": u["via"], "file": u["file"]}


# ---- planning ----------------------------------------------------------------------------------
class Plan(object):
    """What a run does with each source file, decided from the marker (see ``_stage_marker``)."""

    def __init__(self):
        self.keep = {}        # rel -> FileRecord: the published copy is intact and of this very source file
        self.upgrade = {}     # rel -> FileRecord: the same, but verified more weakly than this run asks
        self.copy = []        # source file dicts to copy
        self.restaged = []    # {path, reason}: files of the published revision that are copied again
        self.extras = []      # paths in dest that src does not have
        self.refresh = False  # the marker must be rewritten even when no data moves
        self.bad_marker = None

    @property
    def clean(self):
        return not (self.copy or self.upgrade or self.extras or self.refresh)


def _dest_listing(root):
    """Relative paths of everything under ``root`` that is not a directory (directory symlinks included)."""
    out = set()
    prefix = root.rstrip("/") + "/"
    for dirpath, dirnames, filenames in os.walk(root):
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                dirnames.remove(d)
                out.add(full[len(prefix):])
        for fn in filenames:
            out.add(os.path.join(dirpath, fn)[len(prefix):])
    out.discard(MARKER)
    return out


def _src_change(rec, f):
    if rec.size != f["size"]:
        return "size %d, staged from %d" % (f["size"], rec.size)
    return "another file, or rewritten: inode, mtime, ctime or header differ"


def _plan(files, src_real, lay, mstate, verify, content=None):
    """Stat-only plan (``content`` None) or the full one once src's headers and manifest are read."""
    plan = Plan()
    marker = mstate.marker if mstate.kind == "ok" else None
    if mstate.kind == "bad":
        plan.bad_marker = mstate.reason
    if marker is None:
        plan.copy = list(files)
        return plan
    src_paths = set(f["path"] for f in files)
    plan.extras = sorted(_dest_listing(lay.real) - src_paths)
    if set(marker.files) != src_paths or marker.source != src_real:
        plan.refresh = True
    for f in files:
        rel = f["path"]
        rec = marker.files.get(rel)
        if rec is None:
            plan.copy.append(f)
            continue
        why = rec.damage(lay.real)
        exact = False
        if why is None:
            same, exact = rec.same_source(f, src_real, marker.source,
                                          content.header_digests.get(rel) if content else None,
                                          content.sums.get(rel) if content else None)
            if not same:
                why = "its source file is not the one staged (%s)" % _src_change(rec, f)
        if why:
            plan.copy.append(f)
            plan.restaged.append({"path": rel, "reason": why})
            continue
        if not exact:
            plan.refresh = True
        if _strength(rec.verify) < _strength(verify):
            plan.upgrade[rel] = rec
        else:
            plan.keep[rel] = rec
    return plan


def _check_upgrades(plan, lay, files, content, verify):
    """Verify intact copies that were checked more weakly than asked, in place; failures are staged again."""
    by_path = dict((f["path"], f) for f in files)
    for rel in sorted(plan.upgrade):
        rec = plan.upgrade[rel]
        path = _paths.contained(lay.real, rel, "marker")
        try:
            if _strength(rec.verify) < _strength("headers") and rel in content.headers:
                _check_copy_header(path, rec.size, content.headers[rel])
            sha = rec.sha256
            want = content.sums.get(rel) if verify == "sha256" else None
            if want and sha != want:
                sha = sha256_file(path)
                if sha != want:
                    raise _safetensors.CheckpointError(path, "checksum mismatch: sha256 %s, manifest says %s"
                                                       % (sha, want))
            if rec.damage(lay.real):
                raise _safetensors.CheckpointError(path, "changed while it was being verified")
        except _safetensors.CheckpointError as e:
            plan.copy.append(by_path[rel])
            plan.restaged.append({"path": rel, "reason": "the published copy fails verify=%s: %s"
                                                         % (verify, e.reason)})
            continue
        plan.keep[rel] = _marker.FileRecord(rel, rec.size, rec.src, rec.copy, content.level(rel, verify),
                                            content.header_digests.get(rel) or rec.header_sha256, sha)
        plan.refresh = True
    plan.upgrade = {}


def _link_kept(lay, keep, records, by_path, content, journal):
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
        rec = _kept_record(keep[rel], by_path[rel], content, _marker.copy_stat(os.lstat(target)))
        records[rel] = rec
        journal.append(rec)
    return failed


def _kept_record(rec, f, content, copy=None):
    """The record of a kept copy, with the current source identity."""
    return _marker.FileRecord(f["path"], f["size"], _ident(f), copy or rec.copy, rec.verify,
                              (content.header_digests.get(f["path"]) if content else None) or rec.header_sha256,
                              rec.sha256)


def _partial_reusable(partial, files, src_real, verify, content):
    """Files a previous run completed in ``partial`` that are provably copies of today's source files."""
    reuse = {}
    if not os.path.isdir(partial) or os.path.islink(partial):
        return reuse
    prev = _marker.partial_records(partial)
    for f in files:
        rel = f["path"]
        entry = prev.get(rel)
        if entry is None:
            continue
        rec, source = entry
        if rec.damage(partial) is not None:
            continue
        same, _exact = rec.same_source(f, src_real, source, content.header_digests.get(rel), content.sums.get(rel))
        if same and _strength(rec.verify) >= _strength(content.level(rel, verify)):
            reuse[rel] = _kept_record(rec, f, content)
    return reuse


def _prepare_partial(partial, reuse):
    """Leave in ``partial`` only the files in ``reuse`` (no symlinks, no in-flight files, no old journal)."""
    os.makedirs(partial, exist_ok=True)
    prefix = partial.rstrip("/") + "/"
    for dirpath, dirnames, filenames in os.walk(partial):
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                dirnames.remove(d)
                _unlink(full)
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            if full[len(prefix):] not in reuse or os.path.islink(full):
                _unlink(full)


def _reason(plan, mstate, verify, n_new):
    if mstate.kind == "none":
        return "not staged yet"
    if mstate.kind == "bad":
        return "not staged: %s" % mstate.reason
    parts = []
    if plan.restaged:
        first = plan.restaged[0]
        more = ", ..." if len(plan.restaged) > 1 else ""
        parts.append("%d file(s) staged again (%s: %s%s)" % (len(plan.restaged), first["path"], first["reason"], more))
    if n_new:
        parts.append("%d file(s) new in src" % n_new)
    if plan.extras:
        more = ", ..." if len(plan.extras) > 1 else ""
        parts.append("dest holds %d file(s) src does not (%s%s)" % (len(plan.extras), plan.extras[0], more))
    if not parts and plan.refresh:
        parts.append("marker refreshed (verify %s, or the source moved with identical content)" % verify)
    return "; ".join(parts) or None


def _min_level(records):
    return min((r.verify for r in records), key=_strength, default="sha256")


def _refresh_copy_stats(root, records):
    changed = False
    for r in records:
        st = os.lstat(_paths.contained(root, r.path, "marker"))
        if _marker.copy_stat(st) != r.copy:
            r.copy = _marker.copy_stat(st)
            changed = True
    return changed


# ---- entry points ------------------------------------------------------------------------------
def _diff(before_records, after_files, dest):
    def fmt(files):
        return "".join("%s %d\n" % (f["path"], f["size"]) for f in files)
    before = [{"path": r.path, "size": r.size} for r in before_records]
    return {"before_header": dest + " (staged files)", "after_header": dest + " (after staging)",
            "before": fmt(before), "after": fmt(after_files)}


def stage(src, dest, verify="headers", checksums=None, read_streams=4, fleet_slots_dir=None,
          fleet_read_streams=None, fleet_host_id=None, fleet_stale_seconds=60.0, min_free_bytes=0,
          progress_file=None, check_mode=False, diff=False, lock_timeout=3600, fsync=True,
          keep_revisions=0, pinned=(), proc_root="/proc", direct_io=True):
    """Stage ``src`` to ``dest`` (state=present); returns the module result dict."""
    t0 = time.monotonic()
    if verify not in VERIFY_MODES:
        raise StageError("verify: must be one of %s, got %r" % (", ".join(VERIFY_MODES), verify))
    if read_streams < 1:
        raise StageError("read_streams: must be at least 1 (got %d)" % read_streams)
    if fleet_slots_dir and not fleet_read_streams:
        raise StageError("fleet_read_streams: required when fleet_slots_dir is set")
    src_real, lay = _stage_layout.resolve(src, dest)
    if checksums is None and verify == "sha256" and os.path.isfile(os.path.join(src_real, "SHA256SUMS")):
        checksums = os.path.join(src_real, "SHA256SUMS")
    _stage_layout.check_side_paths(src_real, lay, progress_file, checksums, fleet_slots_dir)

    result = {"changed": False, "dest": lay.dest, "verify": verify, "files_total": 0, "files_copied": 0,
              "files_skipped": 0, "bytes_total": 0, "bytes_copied": 0, "seconds": 0.0,
              "read_bytes_per_second": 0.0, "peak_read_streams": 0, "fleet_wait_seconds": 0.0,
              "direct_io_files": 0, "copied_files": [], "restaged_files": [], "reason": None,
              "pruned": [], "kept_in_use": []}
    protect = [src_real] + ([checksums] if checksums else []) + ([progress_file] if progress_file else [])

    def _finish():
        result["seconds"] = round(time.monotonic() - t0, 3)
        if keep_revisions:
            pr = prune(lay, keep_revisions, pinned, check_mode=check_mode, proc_root=proc_root, protect=protect)
            result["pruned"], result["kept_in_use"] = pr["removed"], pr["in_use"]
            result["changed"] = result["changed"] or bool(pr["removed"])
        return result

    if check_mode:
        return _stage_check(src_real, lay, verify, checksums, result, diff, _finish)

    with DestLock(lay.lock, lock_timeout):
        lay.check_not_links()
        files, mstate = _scan_src_and_marker(src_real, lay, result)
        plan = _plan(files, src_real, lay, mstate, verify)
        if plan.clean:
            result["files_skipped"] = len(files)
            return _finish()
        by_path = dict((f["path"], f) for f in files)

        slots = None
        if fleet_slots_dir:
            slots = _fleet_slots.FleetSlots(fleet_slots_dir, fleet_read_streams, host_id=fleet_host_id,
                                            host_max=read_streams, stale_after=fleet_stale_seconds,
                                            acquire_timeout=lock_timeout)
            try:
                slots.open()
            except _fleet_slots.FleetSlotError as e:
                raise StageError(str(e), file=e.file, reason=e.reason)
        progress = copier = journal = None
        t_copy = time.monotonic()
        try:
            # Reading src headers/manifests is a read stream too: it holds a fleet slot like a copy.
            lease = slots.acquire() if slots else None
            try:
                content = verify_source(src_real, files, verify, checksums)
            finally:
                if lease:
                    slots.release(lease)
            plan = _plan(files, src_real, lay, mstate, verify, content)
            _check_upgrades(plan, lay, files, content, verify)
            n_new = len(plan.copy) - len(plan.restaged)
            result["restaged_files"] = plan.restaged
            result["reason"] = _reason(plan, mstate, verify, n_new)
            if not plan.copy and not plan.extras:
                # every published file is intact and of this source: only the record changes
                records = [_kept_record(plan.keep[f["path"]], f, content) for f in files]
                _marker.write_marker(lay.real, src_real, _min_level(records), records, fsync)
                result.update(changed=True, files_skipped=len(files))
                if diff:
                    result["diff"] = _diff(mstate.marker.records, files, lay.dest)
                return _finish()

            reuse = _partial_reusable(lay.partial, files, src_real, verify, content)
            todo = [f for f in plan.copy if f["path"] not in reuse]
            need = sum(f["size"] for f in todo)
            free = _free_bytes(lay.real)
            if free - need < min_free_bytes:
                raise StageError(
                    "no space: %s needs %s for %d files but the dest filesystem has %s free and min_free_bytes "
                    "asks to keep %s; free space on it or lower min_free_bytes"
                    % (lay.dest, human_bytes(need), len(todo), human_bytes(free), human_bytes(min_free_bytes)))
            _prepare_partial(lay.partial, reuse)
            _unlink(os.path.join(lay.partial, _marker.JOURNAL))
            journal = _marker.Journal(lay.partial, src_real)
            records = dict(reuse)
            for rec in reuse.values():
                journal.append(rec)

            progress = Progress(progress_file, lay.dest, need, len(todo)).start()
            t_copy = time.monotonic()
            copier = _Copier(src_real, lay.partial, verify, content, read_streams, slots, progress, fsync,
                             direct_io=direct_io, journal=journal)
            copier.run(todo)
            # Intact published files join the build as hard links only now: a copy that failed above has not
            # touched the published revision (a new link changes its inode's ctime).
            unlinked = _link_kept(lay, plan.keep, records, by_path, content, journal)
            if unlinked:
                todo = todo + unlinked
                need += sum(f["size"] for f in unlinked)
                progress.bytes_total, progress.files_total = need, len(todo)
                copier.run(unlinked)
            records.update(copier.records)
        except _fleet_slots.FleetSlotError as e:  # no read slot within lock_timeout, or a broken lease dir
            if progress:
                progress.finish("failed")
            raise StageError(str(e), file=e.file, reason=e.reason)
        except BaseException:
            if progress:
                progress.finish("failed")
            raise
        finally:
            if journal:
                journal.close()
            if slots:
                slots.close()
        copy_seconds = time.monotonic() - t_copy
        progress.state = "publishing"
        ordered = [records[f["path"]] for f in files]
        _publish(lay, src_real, ordered, fsync)
        progress.finish("done")

        result.update(
            changed=True, files_copied=len(todo), files_skipped=len(files) - len(todo), bytes_copied=need,
            copied_files=[f["path"] for f in todo],
            read_bytes_per_second=round(need / copy_seconds, 1) if copy_seconds > 0 else 0.0,
            peak_read_streams=copier.peak_streams if copier else 0,
            direct_io_files=copier.direct_files if copier else 0,
            fleet_wait_seconds=round(slots.wait_seconds, 3) if slots else 0.0)
        if diff:
            result["diff"] = _diff(mstate.marker.records if mstate.marker else [], files, lay.dest)
        return _finish()


def _publish(lay, src_real, records, fsync):
    """Marker into the partial dir, then one rename (or exchange with the old revision) makes it dest.

    Hard links shared with the old revision change their ctime when the old tree is deleted, so the copies'
    stats are taken again afterwards and the marker rewritten when they moved.
    """
    _marker.write_marker(lay.partial, src_real, _min_level(records), records, fsync)
    _unlink(os.path.join(lay.partial, _marker.JOURNAL))
    if fsync:
        _fsync_dir(lay.partial)
    if os.path.lexists(lay.real):
        if _exchange(lay.partial, lay.real):
            shutil.rmtree(lay.partial, ignore_errors=True)  # the previous revision, now at the partial path
        else:
            _remove_tree(lay.real)
            if _refresh_copy_stats(lay.partial, records):
                _marker.write_marker(lay.partial, src_real, _min_level(records), records, fsync)
            os.rename(lay.partial, lay.real)
    else:
        os.rename(lay.partial, lay.real)
    if fsync:
        _fsync_dir(lay.parent)
    if _refresh_copy_stats(lay.real, records):
        _marker.write_marker(lay.real, src_real, _min_level(records), records, fsync)


def _scan_src_and_marker(src_real, lay, result):
    """List src, record its totals in ``result`` and read dest's marker; refuse a dest not staged by us."""
    files = _stage_layout.scan_src(src_real)
    result["files_total"] = len(files)
    result["bytes_total"] = sum(f["size"] for f in files)
    mstate = read_marker(lay.real) if os.path.isdir(lay.real) else _marker.MarkerState("none")
    if os.path.lexists(lay.real) and mstate.kind in ("none", "foreign"):
        why = mstate.reason or "has no %s" % MARKER
        raise StageError("dest: %s exists but %s, so it was not staged by this module; remove it or choose "
                         "another dest" % (lay.dest, why))
    return files, mstate


def _stage_check(src_real, lay, verify, checksums, result, diff, finish):
    """Check mode: the same plan as a real run, reading only."""
    files, mstate = _scan_src_and_marker(src_real, lay, result)
    plan = _plan(files, src_real, lay, mstate, verify)
    if plan.clean:
        result["files_skipped"] = len(files)
        return finish()
    content = verify_source(src_real, files, verify, checksums)
    plan = _plan(files, src_real, lay, mstate, verify, content)
    _check_upgrades(plan, lay, files, content, verify)
    reuse = {}
    if plan.copy or plan.extras:
        reuse = _partial_reusable(lay.partial, files, src_real, verify, content)
    todo = [f for f in plan.copy if f["path"] not in reuse]
    result.update(changed=True, files_copied=len(todo), files_skipped=len(files) - len(todo),
                  bytes_copied=sum(f["size"] for f in todo), copied_files=[f["path"] for f in todo],
                  restaged_files=plan.restaged,
                  reason=_reason(plan, mstate, verify, len(plan.copy) - len(plan.restaged)))
    if diff:
        result["diff"] = _diff(mstate.marker.records if mstate.marker else [], files, lay.dest)
    return finish()


def _check_removable(lay):
    """A dest to delete must carry a marker file; its marker need not be valid (a broken one is still ours)."""
    if not os.path.lexists(lay.real):
        return
    ms = read_marker(lay.real)
    if ms.kind in ("none", "foreign"):
        raise StageError("dest: %s %s, so it was not staged by this module; refusing to delete it"
                         % (lay.dest, ms.reason or "has no %s" % MARKER))


def remove(dest, pinned=(), check_mode=False, lock_timeout=3600, proc_root="/proc"):
    """state=absent: remove a staged revision unless pinned or in use (by any path, in any mount namespace)."""
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
                _remove_tree(lay.real)
            _remove_partial(lay.partial)
            result["changed"] = True
        lock.unlink()
    return result


def prune(dest, keep, pinned=(), check_mode=False, proc_root="/proc", protect=()):
    """Keep the newest ``keep`` staged revisions beside ``dest`` (``dest`` always counts as kept).

    Only real directories with a valid marker count as revisions; one that overlaps a path in ``protect`` (the
    run's src, manifest, progress file) is never removed. Each removal holds the revision's lock and checks for
    users under it.
    """
    lay = dest if isinstance(dest, _stage_layout.Layout) else _stage_layout.Layout(dest)
    out = {"removed": [], "in_use": []}
    if not os.path.isdir(lay.parent):  # check mode before the first staging
        return out
    revs = []
    for name in sorted(os.listdir(lay.parent)):
        path = os.path.join(lay.parent, name)
        if path == lay.real or name.endswith(PARTIAL_SUFFIX) or name.endswith(LOCK_SUFFIX) \
                or _stage_layout.REMOVING_INFIX in name:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or any(p and _paths.overlaps(path, p) for p in protect):
            continue
        ms = read_marker(path)
        if ms.kind == "ok":
            revs.append((ms.marker.staged_at, path))
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
            with DestLock(path + LOCK_SUFFIX, 0) as lock:
                if read_marker(path).kind != "ok":
                    continue
                found = users([path, path + PARTIAL_SUFFIX], proc_root)
                if found:
                    out["in_use"].append(_in_use_entry(path, found[0]))
                    continue
                _remove_tree(path)
                _remove_partial(path + PARTIAL_SUFFIX)
                lock.unlink()
        except StageError:
            out["in_use"].append({"path": path, "pid": None, "via": "lock", "file": path + LOCK_SUFFIX})
            continue
        out["removed"].append(path)
    return out
