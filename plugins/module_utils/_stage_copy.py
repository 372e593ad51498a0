# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: model_stage's copy engine.

:class:`Copier` copies the files a run decided to copy into ``<dest>.partial`` with at most ``read_streams``
files open on src at once (each holding a fleet read slot where ``fleet_slots_dir`` is set), biggest files
first. One file goes to ``<name>.llmops-part``, is checked (source unchanged since it was listed, size,
safetensors header byte for byte against the source's, sha256 against the manifest), gets the source's mode
and mtime, is fsynced and renamed to its name, and is then recorded in the partial dir's journal. The first
failure cancels the other streams at their next chunk and removes their in-flight files.

With ``piece_size`` set, every copied file also gets the sha256 of each ``piece_size`` piece of the bytes read
from the source (``piece_digests[path]``, hashed in the buffers the copy already holds, in every verify mode);
:meth:`Copier.digest_copies` reads them back from the copies a previous run completed, for a resumed run.

The bytes move through :class:`RawFile`: O_DIRECT on both ends where the filesystem allows it (one aligned
buffer per stream, hashed there in sha256 mode, no page-cache copy), buffered where it refuses O_DIRECT at
open or later, or for an unaligned tail. Between two buffered files the kernel copies (``copy_file_range``,
then ``sendfile``, then read/write where neither call works).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils import _paths
from ansible_collections.llmops.serving.plugins.module_utils import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils._stage_marker import PART_SUFFIX, StageError
from ansible_collections.llmops.serving.plugins.module_utils._stage_progress import human_bytes

CHUNK = 64 * 1024 * 1024        # per copy_file_range/sendfile call (also the progress granularity)
DIRECT_BUF = 16 * 1024 * 1024   # O_DIRECT request size: large, page-aligned, one buffer per stream
DIRECT_ALIGN = 4096             # O_DIRECT needs block-aligned offsets and lengths; an unaligned tail is buffered
HASH_BUF = _fsutil.HASH_BUF     # buffered reads in user space (the sha256 path without O_DIRECT)


class Copier:
    """Copies files with at most ``streams`` open on src, each stream holding a fleet slot if any.

    Every completed file is recorded (``records`` and the partial dir's journal) with the identity of the source
    file it was read from, checked on the open descriptor before the first byte is read.
    """

    def __init__(self, src, partial, mode, content, streams, slots, progress, do_fsync, direct_io=True,
                 journal=None, piece_size=None):
        if piece_size is not None and (isinstance(piece_size, bool) or not isinstance(piece_size, int)
                                       or piece_size <= 0 or piece_size % DIRECT_ALIGN):
            raise StageError("piece_size: must be a positive multiple of %d bytes (got %r); use e.g. %d (64 MiB)"
                             % (DIRECT_ALIGN, piece_size, 64 << 20))
        self.piece_size = piece_size
        self.piece_digests = {}
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

    def digest_copies(self, rels):
        """Piece digests of files a previous run completed in the partial dir, which a resumed run reuses without
        copying: read back from those copies (the bytes that run read from the source), ``streams`` at a time.
        Fills ``piece_digests`` for each path and returns it."""
        if not self.piece_size:
            raise StageError("piece_size: digest_copies needs the Copier's piece_size set")
        errors = []

        def one(rel):
            if self.cancel.is_set():
                return
            try:
                pieces = self._digest_file(_paths.contained(self.partial, rel, "src"))
                with self._lock:
                    self.piece_digests[rel] = pieces
            except BaseException as e:
                self.cancel.set()
                errors.append(e)

        rels = list(rels)
        with ThreadPoolExecutor(max_workers=max(1, min(self.streams, len(rels) or 1))) as pool:
            for fut in [pool.submit(one, rel) for rel in rels]:
                fut.result()
        if errors:
            e = errors[0]
            if isinstance(e, OSError):
                raise StageError("reading back %s for its piece digests failed: %s" % (e.filename, e))
            raise e
        return self.piece_digests

    def _digest_file(self, path):
        fin = RawFile(path, os.O_RDONLY, self.direct_io)
        ph = PieceHasher(self.piece_size)
        buf = mmap.mmap(-1, DIRECT_BUF)
        try:
            size = os.fstat(fin.fd).st_size
            offset = 0
            with memoryview(buf) as mv:
                while offset < size:
                    self._check_cancel()
                    with mv[:DIRECT_BUF if fin.direct else HASH_BUF] as target:
                        n = min(fin.read_at(target, offset), size - offset)
                    if n <= 0:
                        raise StageError("%s ended early at byte %d of %d while reading back its piece digests"
                                         % (path, offset, size))
                    with mv[:n] as chunk:
                        ph.update(chunk)
                    offset += n
        finally:
            buf.close()
            fin.close()
        return ph.finish()

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
            digest, pieces = self._copy(src_path, tmp, f)
        except OSError as e:
            _stage_layout.try_unlink(tmp)
            if e.errno == errno.ENOSPC:
                raise StageError("no space left on device while writing %s (%s); free space on the dest "
                                 "filesystem or stage elsewhere" % (final, human_bytes(f["size"])))
            raise StageError("copy of %s failed: %s" % (src_path, e))
        except BaseException:
            _stage_layout.try_unlink(tmp)
            raise
        finally:
            if lease:
                self.slots.release(lease)
        try:
            _verify.check_unchanged(src_path, os.stat(src_path), f, "while it was being copied")
            size = os.path.getsize(tmp)
            if size != f["size"]:
                raise _safetensors.CheckpointError(tmp, "copy is %d bytes, source is %d" % (size, f["size"]))
            if self.mode in ("headers", "sha256") and rel in self.headers:
                _verify.check_copy_header(tmp, size, self.headers[rel])
            if self.mode == "sha256" and rel in self.sums and digest != self.sums[rel]:
                raise _safetensors.CheckpointError(
                    src_path, "checksum mismatch: sha256 %s, manifest says %s" % (digest, self.sums[rel]))
            os.chmod(tmp, f["mode"] | 0o400)
            os.utime(tmp, ns=(f["mtime_ns"], f["mtime_ns"]))
            os.rename(tmp, final)
        except BaseException:
            _stage_layout.try_unlink(tmp)
            raise
        rec = _marker.FileRecord(rel, f["size"], _verify.ident(f), _marker.copy_stat(os.lstat(final)),
                                 self.content.level(rel, self.mode), self.content.header_digests.get(rel),
                                 digest if self.mode == "sha256" else None)
        with self._lock:
            self.records[rel] = rec
            if pieces is not None:
                self.piece_digests[rel] = pieces
        if self.journal:
            self.journal.append(rec)
        self.progress.add(files=1)

    def _copy(self, src_path, tmp, f):
        """Copy one file; returns ``(sha256 in sha256 mode, piece digests with piece_size)`` from the single read.

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
            _verify.check_unchanged(src_path, os.fstat(fin.fd), f, "since it was listed")
            fout = RawFile(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.direct_io)
            try:
                if not fin.direct:
                    _fadvise(fin.fd, getattr(os, "POSIX_FADV_SEQUENTIAL", None))
                if fin.direct or fout.direct or self.mode == "sha256" or self.piece_size:
                    digest, pieces = self._copy_user(fin, fout, size, src_path)
                else:
                    digest, pieces = None, None
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
            return digest, pieces
        finally:
            self._leave()
            fin.close()

    def _copy_user(self, fin, fout, size, src_path, offset=0):
        """Read into one aligned buffer, hash it in sha256 mode, write it out (from ``offset`` on)."""
        h = hashlib.sha256() if self.mode == "sha256" else None
        ph = PieceHasher(self.piece_size) if self.piece_size else None
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
                        if ph is not None:
                            ph.update(chunk)
                        fout.write_at(chunk, offset)
                    offset += n
                    self.progress.add(n)
        finally:
            buf.close()
        return (h.hexdigest() if h is not None else None), (ph.finish() if ph is not None else None)

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


class PieceHasher:
    """sha256 of each ``piece_size`` piece of a byte stream fed in order: piece i is bytes
    ``[i * piece_size, min((i + 1) * piece_size, size))``; an empty stream has no pieces."""

    def __init__(self, piece_size):
        self.piece_size = piece_size
        self.digests = []
        self._h = hashlib.sha256()
        self._fill = 0

    def update(self, data):
        with memoryview(data) as mv:
            pos, n = 0, len(mv)
            while pos < n:
                take = min(n - pos, self.piece_size - self._fill)
                with mv[pos:pos + take] as part:
                    self._h.update(part)
                self._fill += take
                pos += take
                if self._fill == self.piece_size:
                    self.digests.append(self._h.hexdigest())
                    self._h, self._fill = hashlib.sha256(), 0

    def finish(self):
        if self._fill:
            self.digests.append(self._h.hexdigest())
            self._h, self._fill = hashlib.sha256(), 0
        return self.digests


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
