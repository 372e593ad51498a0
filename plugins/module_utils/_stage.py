# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: verified, resumable staging of a model revision to local disk.

Layout next to the published revision ``dest``:

* ``<dest>.partial/`` - the copy being built. A file appears there under its final name only once it
  is completely written, verified and fsynced (``<name>.llmops-part`` while in flight), so a copy
  killed at any point resumes by re-checking what is there.
* ``<dest>.lock`` - ``flock`` held by the run that owns ``dest``; a second run waits on it.
* ``<dest>/.llmops-staged.json`` - the completion marker (file list, sizes, mtimes, verify mode,
  source). ``<dest>.partial`` becomes ``dest`` with one ``rename``; nothing half-copied is ever at
  ``dest``.
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
import socket
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils import _fleet_slots
from ansible_collections.llmops.serving.plugins.module_utils import _safetensors

MARKER = ".llmops-staged.json"
PART_SUFFIX = ".llmops-part"
PARTIAL_SUFFIX = ".partial"
LOCK_SUFFIX = ".lock"
VERIFY_MODES = ("size", "headers", "sha256")
CHUNK = 64 * 1024 * 1024        # per copy_file_range/sendfile call (also the progress granularity)
DIRECT_BUF = 16 * 1024 * 1024   # O_DIRECT request size: large, page-aligned, one buffer per stream
DIRECT_ALIGN = 4096             # O_DIRECT needs block-aligned offsets and lengths; an unaligned tail is buffered
HASH_BUF = 1024 * 1024          # buffered reads in user space: small enough for hash + write to hit CPU cache
MARKER_FORMAT = 1


class StageError(Exception):
    """Staging refused or failed; ``str()`` names the option or file and the fix."""


# ---- source inventory --------------------------------------------------------------------------
def scan_tree(root, skip=()):
    """Regular files under ``root`` (file symlinks followed): list of dicts sorted by path."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, root)
            if rel in skip:
                continue
            try:
                st = os.stat(full)
            except FileNotFoundError:
                raise StageError("src: %s is a dangling symlink or vanished while listing" % full)
            if not _is_regular(st):
                continue
            files.append({"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                          "mode": st.st_mode & 0o777})
    return files


def _is_regular(st):
    return stat.S_ISREG(st.st_mode)


def load_checksums(path):
    """Parse a ``sha256sum`` manifest: ``<64 hex> [ *]<relative path>`` per line."""
    sums = {}
    try:
        with open(path, "r", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise StageError("checksums: cannot read %s: %s" % (path, e.strerror))
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, sep, name = line.partition(" ")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise StageError("checksums: %s line %d is not '<sha256>  <file>': %r" % (path, lineno, line))
        if name[:1] in (" ", "*"):
            name = name[1:]
        sums[os.path.normpath(name)] = digest.lower()
    return sums


def read_marker(dest):
    try:
        with open(os.path.join(dest, MARKER), "r", encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("files"), list) else None


def _meta(files):
    return {f["path"]: (f["size"], f["mtime_ns"]) for f in files}


def _strength(mode):
    return VERIFY_MODES.index(mode) if mode in VERIFY_MODES else -1


# ---- verification ------------------------------------------------------------------------------
def verify_source(src, files, mode, checksums_path=None):
    """Check src before anything is written. Returns ``(headers, sums)``.

    ``headers`` maps each ``*.safetensors`` file to its raw header bytes (compared byte-for-byte with the
    copy afterwards, so the copy's header is verified without a second full read).
    """
    headers, sums = {}, {}
    if mode == "size":
        return headers, sums
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
        manifest_rel = os.path.relpath(checksums_path, src)
        for f in files:
            if f["path"] not in sums and f["path"] != manifest_rel:
                raise StageError("checksums: %s has no entry for %s; regenerate the manifest or use "
                                 "verify=headers" % (checksums_path, f["path"]))
    return headers, sums


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
class _Copier:
    """Copies files with at most ``streams`` open on src, each stream holding a fleet slot if any."""

    def __init__(self, src, partial, mode, headers, sums, streams, slots, progress, do_fsync, direct_io=True):
        self.src = src
        self.direct_io = direct_io
        self.direct_files = 0
        self.partial = partial
        self.mode = mode
        self.headers = headers
        self.sums = sums
        self.streams = streams
        self.slots = slots
        self.progress = progress
        self.do_fsync = do_fsync
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
        final = os.path.join(self.partial, rel)
        tmp = final + PART_SUFFIX
        os.makedirs(os.path.dirname(final), exist_ok=True)
        lease = self.slots.acquire() if self.slots else None
        try:
            digest = self._copy(src_path, tmp, f["size"])
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
            st = os.stat(src_path)
            if (st.st_size, st.st_mtime_ns) != (f["size"], f["mtime_ns"]):
                raise StageError("src: %s changed while it was being copied; src must be an immutable "
                                 "revision directory" % src_path)
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
        self.progress.add(files=1)

    def _copy(self, src_path, tmp, size):
        """Copy one file; returns its sha256 in sha256 mode (computed from the single read).

        With ``direct_io`` both ends use O_DIRECT where the filesystem allows it: the data goes from the
        device into one aligned buffer (hashed there in sha256 mode) and back out without a page-cache copy,
        which keeps the kernel's CPU time and the node's page cache out of a 700 GiB copy. Where neither
        end can, the kernel copies (``copy_file_range``); sha256 mode then reads through a small buffer.
        """
        fin = RawFile(src_path, os.O_RDONLY, self.direct_io)
        self._enter()
        try:
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


# ---- locking -----------------------------------------------------------------------------------
class DestLock:
    """Exclusive ``flock`` on ``<dest>.lock``; waits up to ``timeout`` seconds."""

    def __init__(self, dest, timeout, poll=0.2):
        self.path = dest + LOCK_SUFFIX
        self.timeout = timeout
        self.poll = poll
        self.fd = None
        self.waited = 0.0

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() - t0 > self.timeout:
                    os.close(self.fd)
                    raise StageError("lock_timeout: another run has held %s for more than %d s; wait for it "
                                     "or raise lock_timeout" % (self.path, self.timeout))
                time.sleep(self.poll)
        self.waited = time.monotonic() - t0
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# ---- in-use detection --------------------------------------------------------------------------
def users_of(path, proc_root="/proc"):
    """Processes that have a file under ``path`` open or mapped: list of ``{pid, file}``."""
    path = os.path.realpath(path)
    prefix = path.rstrip("/") + "/"
    me = str(os.getpid())
    found = []
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit() and p != me]
    except OSError:
        return found
    for pid in pids:
        hit = None
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                if target == path or target.startswith(prefix):
                    hit = target
                    break
        except OSError:
            pass
        if hit is None:
            try:
                with open(os.path.join(proc_root, pid, "maps"), "r") as f:
                    for line in f:
                        parts = line.split(None, 5)
                        if len(parts) == 6:
                            target = parts[5].strip()
                            if target.startswith(prefix):
                                hit = target
                                break
            except OSError:
                pass
        if hit is not None:
            found.append({"pid": int(pid), "file": hit})
    return found


def _remove_tree(path):
    """Make ``path`` vanish in one rename, then delete the renamed tree."""
    grave = "%s.removing-%s" % (path, uuid.uuid4().hex[:8])
    os.rename(path, grave)
    shutil.rmtree(grave, ignore_errors=True)


def is_pinned(dest, pinned):
    dest = os.path.abspath(dest)
    return any(p and (os.path.abspath(p) == dest if os.sep in p else p == os.path.basename(dest))
               for p in pinned)


# ---- entry points ------------------------------------------------------------------------------
def _diff(before_files, after_files, dest):
    def fmt(files):
        return "".join("%s %d\n" % (f["path"], f["size"]) for f in files)
    return {"before_header": dest + " (staged files)", "after_header": dest + " (after staging)",
            "before": fmt(before_files), "after": fmt(after_files)}


def stage(src, dest, verify="headers", checksums=None, read_streams=4, fleet_slots_dir=None,
          fleet_read_streams=None, fleet_host_id=None, fleet_stale_seconds=60.0, min_free_bytes=0,
          progress_file=None, check_mode=False, diff=False, lock_timeout=3600, fsync=True,
          keep_revisions=0, pinned=(), proc_root="/proc", direct_io=True):
    """Stage ``src`` to ``dest`` (state=present); returns the module result dict."""
    t0 = time.monotonic()
    src = os.path.abspath(src)
    dest = os.path.abspath(dest)
    if verify not in VERIFY_MODES:
        raise StageError("verify: must be one of %s, got %r" % (", ".join(VERIFY_MODES), verify))
    if read_streams < 1:
        raise StageError("read_streams: must be at least 1 (got %d)" % read_streams)
    if not os.path.isdir(src):
        raise StageError("src: %s is not a directory; point src at the revision directory on the shared "
                         "filesystem" % src)
    if dest == src or dest.startswith(src.rstrip("/") + "/") or src.startswith(dest.rstrip("/") + "/"):
        raise StageError("dest: %s overlaps src %s; stage to a separate directory" % (dest, src))
    if fleet_slots_dir and not fleet_read_streams:
        raise StageError("fleet_read_streams: required when fleet_slots_dir is set")
    if checksums is None and verify == "sha256" and os.path.isfile(os.path.join(src, "SHA256SUMS")):
        checksums = os.path.join(src, "SHA256SUMS")

    result = {"changed": False, "dest": dest, "verify": verify, "files_total": 0, "files_copied": 0,
              "files_skipped": 0, "bytes_total": 0, "bytes_copied": 0, "seconds": 0.0,
              "read_bytes_per_second": 0.0, "peak_read_streams": 0, "fleet_wait_seconds": 0.0,
              "direct_io_files": 0,
              "copied_files": [], "pruned": [], "kept_in_use": []}

    def _finish():
        result["seconds"] = round(time.monotonic() - t0, 3)
        if keep_revisions:
            pr = prune(dest, keep_revisions, pinned, check_mode=check_mode, proc_root=proc_root)
            result["pruned"], result["kept_in_use"] = pr["removed"], pr["in_use"]
            result["changed"] = result["changed"] or bool(pr["removed"])
        return result

    if check_mode:
        return _finish_check(src, dest, verify, checksums, result, diff, t0, _finish)

    with DestLock(dest, lock_timeout):
        files, marker = _scan_src_and_marker(src, dest, result)
        if marker is not None and marker.get("source") == src and _meta(marker["files"]) == _meta(files):
            if _strength(marker.get("verify")) >= _strength(verify):
                result["files_skipped"] = len(files)
                return _finish()
            return _finish_upgrade(src, dest, files, marker, verify, checksums, result, _finish)

        slots = None
        if fleet_slots_dir:
            slots = _fleet_slots.FleetSlots(fleet_slots_dir, fleet_read_streams, host_id=fleet_host_id,
                                            host_max=read_streams, stale_after=fleet_stale_seconds)
            try:
                slots.open()
            except _fleet_slots.FleetSlotError as e:
                raise StageError(str(e))
        progress = None
        copier = None
        try:
            # Reading src headers/manifests is a read stream too: it holds a fleet slot like a copy.
            lease = slots.acquire() if slots else None
            try:
                headers, sums = verify_source(src, files, verify, checksums)
            finally:
                if lease:
                    slots.release(lease)
            partial = dest + PARTIAL_SUFFIX
            reuse = _reusable(partial, dest, marker, files, verify, headers, sums)
            todo = [f for f in files if f["path"] not in reuse]
            need = sum(f["size"] for f in todo)
            free = _free_bytes(dest)
            if free - need < min_free_bytes:
                raise StageError(
                    "no space: %s needs %s for %d files but the dest filesystem has %s free and min_free_bytes "
                    "asks to keep %s; free space on it or lower min_free_bytes"
                    % (dest, human_bytes(need), len(todo), human_bytes(free), human_bytes(min_free_bytes)))
            os.makedirs(partial, exist_ok=True)
            for rel, how in reuse.items():
                if how == "link":
                    target = os.path.join(partial, rel)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    _unlink(target)
                    os.link(os.path.join(dest, rel), target)
            _clean_partial(partial, {f["path"] for f in files})

            progress = Progress(progress_file, dest, need, len(todo)).start()
            t_copy = time.monotonic()
            copier = _Copier(src, partial, verify, headers, sums, read_streams, slots, progress, fsync,
                             direct_io=direct_io)
            copier.run(todo)
        except BaseException:
            if progress:
                progress.finish("failed")
            raise
        finally:
            if slots:
                slots.close()
        copy_seconds = time.monotonic() - t_copy
        progress.state = "publishing"
        _write_marker(partial, src, files, verify, sums)
        if fsync:
            _fsync_dir(partial)
        if marker is not None:  # replacing an older staging of this dest
            if not _exchange(partial, dest):
                _remove_tree(dest)
                os.rename(partial, dest)
            else:
                shutil.rmtree(partial, ignore_errors=True)
        else:
            os.rename(partial, dest)
        if fsync:
            _fsync_dir(os.path.dirname(dest))
        progress.finish("done")

        result.update(
            changed=True, files_copied=len(todo), files_skipped=len(files) - len(todo), bytes_copied=need,
            copied_files=[f["path"] for f in todo],
            read_bytes_per_second=round(need / copy_seconds, 1) if copy_seconds > 0 else 0.0,
            peak_read_streams=copier.peak_streams if copier else 0,
            direct_io_files=copier.direct_files if copier else 0,
            fleet_wait_seconds=round(slots.wait_seconds, 3) if slots else 0.0)
        if diff:
            result["diff"] = _diff(marker["files"] if marker else [], files, dest)
        return _finish()


def _scan_src_and_marker(src, dest, result):
    """List src, record its totals in ``result`` and read dest's marker; refuse a dest not staged by us."""
    files = scan_tree(src)
    result["files_total"] = len(files)
    result["bytes_total"] = sum(f["size"] for f in files)
    marker = read_marker(dest) if os.path.isdir(dest) else None
    if os.path.exists(dest) and marker is None:
        raise StageError("dest: %s exists but has no %s, so it was not staged by this module; remove it "
                         "or choose another dest" % (dest, MARKER))
    return files, marker


def _finish_check(src, dest, verify, checksums, result, diff, t0, finish):
    files, marker = _scan_src_and_marker(src, dest, result)
    if marker is not None and marker.get("source") == src and _meta(marker["files"]) == _meta(files) \
            and _strength(marker.get("verify")) >= _strength(verify):
        result["files_skipped"] = len(files)
        return finish()
    headers, sums = verify_source(src, files, verify, checksums)
    partial = dest + PARTIAL_SUFFIX
    reuse = _reusable(partial, dest, marker, files, verify, headers, sums)
    todo = [f for f in files if f["path"] not in reuse]
    need = sum(f["size"] for f in todo)
    result.update(changed=True, files_copied=len(todo), files_skipped=len(files) - len(todo),
                  bytes_copied=need, copied_files=[f["path"] for f in todo])
    if diff:
        result["diff"] = _diff(marker["files"] if marker else [], files, dest)
    return finish()


def _finish_upgrade(src, dest, files, marker, verify, checksums, result, finish):
    """Metadata matches but the copy was verified more weakly than asked: verify it in place."""
    headers, sums = verify_source(src, files, verify, checksums)
    for f in files:
        path = os.path.join(dest, f["path"])
        if f["path"] in headers:
            _check_copy_header(path, f["size"], headers[f["path"]])
        if verify == "sha256" and f["path"] in sums:
            got = sha256_file(path)
            if got != sums[f["path"]]:
                raise _safetensors.CheckpointError(path, "checksum mismatch: sha256 %s, manifest says %s; "
                                                         "remove dest (state=absent) and stage again"
                                                   % (got, sums[f["path"]]))
    _write_marker(dest, src, files, verify, sums)
    result.update(changed=True, files_skipped=len(files))
    return finish()


def _reusable(partial, dest, marker, files, verify, headers, sums):
    """Files already complete in ``<dest>.partial`` (verified) or unchanged in the old ``dest``."""
    reuse = {}
    old = _meta(marker["files"]) if marker else {}
    for f in files:
        rel = f["path"]
        cand = os.path.join(partial, rel)
        how = "partial"
        try:
            st = os.stat(cand)
        except OSError:
            st = None
        if st is None and old.get(rel) == (f["size"], f["mtime_ns"]) and \
                _strength(marker.get("verify")) >= _strength(verify):
            cand, how = os.path.join(dest, rel), "link"
            try:
                st = os.stat(cand)
            except OSError:
                continue
        if st is None or (st.st_size, st.st_mtime_ns) != (f["size"], f["mtime_ns"]):
            continue
        try:
            if rel in headers:
                _check_copy_header(cand, f["size"], headers[rel])
            if verify == "sha256" and rel in sums and sha256_file(cand) != sums[rel]:
                continue
        except _safetensors.CheckpointError:
            continue
        reuse[rel] = how
    return reuse


def _clean_partial(partial, wanted):
    """Drop in-flight ``*.llmops-part`` files and anything src no longer has."""
    for dirpath, _dirnames, filenames in os.walk(partial):
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, partial)
            if fn.endswith(PART_SUFFIX) or rel not in wanted:
                _unlink(full)


def _write_marker(directory, src, files, verify, sums):
    doc = {
        "format": MARKER_FORMAT, "source": src, "verify": verify, "host": socket.gethostname(),
        "staged_at": time.time(),
        "files": [dict(path=f["path"], size=f["size"], mtime_ns=f["mtime_ns"],
                       **({"sha256": sums[f["path"]]} if f["path"] in sums else {})) for f in files],
    }
    tmp = os.path.join(directory, MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, MARKER))


def remove(dest, pinned=(), check_mode=False, lock_timeout=3600, proc_root="/proc"):
    """state=absent: remove a staged revision unless pinned or in use."""
    dest = os.path.abspath(dest)
    partial = dest + PARTIAL_SUFFIX
    result = {"changed": False, "dest": dest}
    if not os.path.exists(dest) and not os.path.exists(partial):
        return result
    if is_pinned(dest, pinned):
        raise StageError("pinned: %s is pinned; remove it from pinned before deleting it" % dest)
    if os.path.exists(dest) and read_marker(dest) is None:
        raise StageError("dest: %s has no %s, so it was not staged by this module; refusing to delete it"
                         % (dest, MARKER))
    users = users_of(dest, proc_root) if os.path.exists(dest) else []
    if users:
        raise StageError("dest: %s is in use (pid %d has %s open); stop it before removing the revision"
                         % (dest, users[0]["pid"], users[0]["file"]))
    result["changed"] = True
    if check_mode:
        return result
    with DestLock(dest, lock_timeout):
        if os.path.exists(dest):
            _remove_tree(dest)
        shutil.rmtree(partial, ignore_errors=True)
    _unlink(dest + LOCK_SUFFIX)
    return result


def prune(dest, keep, pinned=(), check_mode=False, proc_root="/proc"):
    """Keep the newest ``keep`` staged revisions beside ``dest`` (``dest`` always counts as kept)."""
    parent = os.path.dirname(os.path.abspath(dest))
    revs = []
    out = {"removed": [], "in_use": []}
    if not os.path.isdir(parent):  # check mode before the first staging
        return out
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if path == os.path.abspath(dest) or not os.path.isdir(path) or name.endswith(PARTIAL_SUFFIX) \
                or ".removing-" in name:
            continue
        marker = read_marker(path)
        if marker is not None:
            revs.append((marker.get("staged_at", 0), path))
    revs.sort(reverse=True)
    for _ts, path in revs[max(keep - 1, 0):]:
        if is_pinned(path, pinned):
            continue
        users = users_of(path, proc_root)
        if users:
            out["in_use"].append({"path": path, "pid": users[0]["pid"]})
            continue
        if not check_mode:
            try:
                with DestLock(path, 0):
                    _remove_tree(path)
                    shutil.rmtree(path + PARTIAL_SUFFIX, ignore_errors=True)
            except StageError:
                out["in_use"].append({"path": path, "pid": None})
                continue
            _unlink(path + LOCK_SUFFIX)
        out["removed"].append(path)
    return out
