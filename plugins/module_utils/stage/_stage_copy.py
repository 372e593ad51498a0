# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: model_stage's copy engine.

:class:`Copier` copies the files a run decided to copy into ``<dest>.partial`` with at most ``read_streams``
read streams open on src at once (each holding a fleet read slot where ``fleet_slots_dir`` is set), biggest
files first. A file bigger than ``RANGE`` is split into ranges that several streams copy at once (except in
sha256 mode, where one stream reads the file in order to hash it), so a revision of a few big files keeps every
stream busy. One file goes to ``<name>.llmops-part`` (a split one with its blocks reserved up front), is checked once its last
range is in (source unchanged since it was listed, size, safetensors header byte for byte against the source's,
sha256 against the manifest), gets the source's mode and mtime, is fsynced and renamed to its name, and is then
recorded in the partial dir's journal; those steps run beside the streams (which go on copying) and are done
before :meth:`Copier.run` returns. The first failure cancels the other streams at their next block and removes
their in-flight files.

The header is compared in the buffers the copy writes from (:class:`HeaderCheck`, before they are written), so it
is not read back from the copy; only a file the kernel copied (no buffers) has its header read back.

Within a stream, reading and writing overlap: a reader thread fills the next of ``STREAM_BUFFERS`` aligned
buffers from src while the stream hashes and writes the one before, so each stream keeps one read and one write
in flight instead of alternating between them.

With ``piece_size`` set, every copied file also gets the sha256 of each ``piece_size`` piece of the bytes read
from the source (``piece_digests[path]``, hashed in the buffers the copy already holds, in every verify mode;
ranges start on piece boundaries, so each stream hashes whole pieces); :meth:`Copier.digest_copies` reads them
back from the copies a previous run completed, for a resumed run. ``on_piece(path, index, digest)``, when given,
is called as soon as a piece's last byte is written to ``<name>.llmops-part`` (before the file is complete), so a
seed's server can hand the piece on while the rest of the file is still being copied.

The bytes move through :class:`RawFile`: O_DIRECT on both ends where the filesystem allows it (no page-cache
copy), buffered where it refuses O_DIRECT at open or later, or for an unaligned tail. Between two buffered files
with nothing to hash the kernel copies (``copy_file_range``, then ``sendfile``, then read/write where neither
call works).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import mmap
import os
import queue
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import PART_SUFFIX, StageError
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_progress import human_bytes

CHUNK = 64 * 1024 * 1024        # per copy_file_range/sendfile call (also the progress granularity)
# Request size (page-aligned: O_DIRECT needs it). 4 MiB is a whole request on a disk taking up to 4 MiB at once
# (``max_sectors_kb``) and keeps a stream's buffers small: they are fresh memory in every run, faulted in (zeroed)
# before the first byte moves. Measured against 16 MiB (docs/benchmarks/model_stage.md): less system CPU from RAM
# and from disk, no slower.
DIRECT_BUF = 4 * 1024 * 1024
STREAM_BUFFERS = 3              # buffers per stream: one being read, one being written, one spare
DIRECT_ALIGN = 4096             # O_DIRECT needs block-aligned offsets and lengths; an unaligned tail is buffered
RANGE = 256 * 1024 * 1024       # files above this are split into ranges of it that streams copy in parallel
HASH_BUF = _fsutil.HASH_BUF     # buffered reads when reading copies back (digest_copies without O_DIRECT)
PREALLOCATE = True              # reserve a split file's blocks before its ranges are written, see _preallocate


class Copier:
    """Copies files with at most ``streams`` read streams open on src, each holding a fleet slot if any.

    Every completed file is recorded (``records`` and the partial dir's journal) with the identity of the source
    file it was read from, checked on each open descriptor before its first byte is read.
    """

    def __init__(self, src, partial, mode, content, streams, slots, progress, do_fsync, direct_io=True,
                 journal=None, piece_size=None, on_piece=None):
        if piece_size is not None and (isinstance(piece_size, bool) or not isinstance(piece_size, int)
                                       or piece_size <= 0 or piece_size % DIRECT_ALIGN):
            raise StageError("piece_size: must be a positive multiple of %d bytes (got %r); use e.g. %d (64 MiB)"
                             % (DIRECT_ALIGN, piece_size, 64 << 20))
        self.piece_size = piece_size
        self.piece_digests = {}
        self.on_piece = on_piece if piece_size else None
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
        self._local = threading.local()
        self._buffers = []
        self.open_streams = 0
        self.peak_streams = 0

    def _enter(self):
        with self._lock:
            self.open_streams += 1
            self.peak_streams = max(self.peak_streams, self.open_streams)

    def _leave(self):
        with self._lock:
            self.open_streams -= 1

    def range_size(self):
        """Bytes per range of a split file: ``RANGE`` rounded up to whole pieces (and direct I/O blocks)."""
        unit = self.piece_size or DIRECT_ALIGN
        return max(unit, -(-RANGE // unit) * unit)

    def ranges(self, size):
        """The ``(start, end)`` ranges streams copy ``size`` bytes in: one in sha256 mode (hashed in order)."""
        step = self.range_size()
        if self.mode == "sha256" or size <= step:
            return [(0, size)]
        return [(s, min(s + step, size)) for s in range(0, size, step)]

    def run(self, files):
        order = sorted(files, key=lambda f: -f["size"])  # big files first: better balance
        jobs = []
        for f in order:
            job = _FileJob(self, f)
            jobs.extend((job, start, end) for start, end in job.ranges)
        errors = []
        workers = max(1, min(self.streams, len(jobs) or 1))
        # a copied file is checked, fsynced, renamed and journaled off the stream, which goes on to its next range;
        # the finishers are waited for before run returns, so nothing is published before it is durable
        with ThreadPoolExecutor(max_workers=workers) as finisher:
            try:
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    futures = [pool.submit(self._range_guarded, job, start, end, errors, finisher)
                               for job, start, end in jobs]
                    for fut in futures:
                        fut.result()
            finally:
                self._free_buffers()
        if errors:
            raise errors[0]

    def _range_guarded(self, job, start, end, errors, finisher):
        if self.cancel.is_set():
            return
        try:
            if self._range(job, start, end):
                finisher.submit(self._finish_guarded, job, errors)
        except BaseException as e:  # first error wins; the others stop at their next block
            self._failed(job, e, errors)

    def _finish_guarded(self, job, errors):
        try:
            self._finish(job)
        except BaseException as e:
            self._failed(job, e, errors)

    def _failed(self, job, e, errors):
        self.cancel.set()
        errors.append(e)
        _stage_layout.try_unlink(job.tmp)

    def _range(self, job, start, end):
        """Copy bytes ``[start, end)`` of ``job``'s file; True when this was the file's last range to finish."""
        lease = self.slots.acquire() if self.slots else None
        try:
            self._check_cancel()
            job.create()
            digest, pieces, direct = self._copy(job, start, end)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise StageError("no space left on device while writing %s (%s); free space on the dest "
                                 "filesystem or stage elsewhere" % (job.final, human_bytes(job.f["size"])))
            raise StageError("copy of %s failed: %s" % (job.src_path, e))
        finally:
            if lease:
                self.slots.release(lease)
        return job.range_done(start, digest, pieces, direct)

    def _finish(self, job):
        """Check the complete copy of one file, make it durable, give it its name and record it."""
        f, rel, tmp = job.f, job.rel, job.tmp
        _verify.check_unchanged(job.src_path, os.stat(job.src_path), f, "while it was being copied")
        size = os.path.getsize(tmp)
        if size != f["size"]:
            raise _safetensors.CheckpointError(tmp, "copy is %d bytes, source is %d" % (size, f["size"]))
        if self.mode in ("headers", "sha256") and rel in self.headers and not job.header_written():
            # a range that went through the kernel's copy (no buffers to compare): read the copy's header back
            _verify.check_copy_header(tmp, size, self.headers[rel])
        digest = job.digest
        if self.mode == "sha256" and rel in self.sums and digest != self.sums[rel]:
            raise _safetensors.CheckpointError(
                job.src_path, "checksum mismatch: sha256 %s, manifest says %s" % (digest, self.sums[rel]))
        os.chmod(tmp, f["mode"] | 0o400)
        os.utime(tmp, ns=(f["mtime_ns"], f["mtime_ns"]))
        if self.do_fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.rename(tmp, job.final)
        rec = _marker.FileRecord(rel, f["size"], _verify.ident(f), _marker.copy_stat(os.lstat(job.final)),
                                 self.content.level(rel, self.mode), self.content.header_digests.get(rel),
                                 digest if self.mode == "sha256" else None)
        with self._lock:
            self.records[rel] = rec
            if self.piece_size:
                self.piece_digests[rel] = job.pieces()
            if job.direct:
                self.direct_files += 1
        if self.journal:
            self.journal.append(rec)
        self.progress.add(files=1)

    def _copy(self, job, start, end):
        """Copy one range; returns ``(sha256 in sha256 mode, piece digests, both ends went direct)``.

        With ``direct_io`` both ends use O_DIRECT where the filesystem allows it: the data goes from the
        device into aligned buffers (hashed there) and back out without a page-cache copy, which keeps the
        kernel's CPU time and the node's page cache out of a 700 GiB copy. Where neither end can and there is
        nothing to hash, the kernel copies (``copy_file_range``).
        """
        fin = RawFile(job.src_path, os.O_RDONLY, self.direct_io)
        self._enter()
        try:
            # what is read is the file that was listed (a symlink retargeted since cannot slip another in)
            _verify.check_unchanged(job.src_path, os.fstat(fin.fd), job.f, "since it was listed")
            fout = RawFile(job.tmp, os.O_WRONLY, self.direct_io)
            try:
                if not fin.direct:
                    _fadvise(fin.fd, getattr(os, "POSIX_FADV_SEQUENTIAL", None), start, end - start)
                h = hashlib.sha256() if self.mode == "sha256" else None
                ph = PieceHasher(self.piece_size) if self.piece_size else None
                sinks = [s for s in (h, ph) if s is not None]
                written = self._piece_reporter(job.rel, start, ph) if self.on_piece else None
                if fin.direct or fout.direct or sinks:
                    if job.header is not None and start < len(job.header):
                        sinks.append(HeaderCheck(job, start))
                    self._pipe(fin, fout, start, end, job.src_path, sinks, written)
                else:
                    self._copy_kernel(fin, fout, start, end, job.src_path)
                direct = fin.went_direct and fout.went_direct
            finally:
                fout.close()
            pieces = ph.finish() if ph is not None else None
            if written is not None:  # the range's last, short piece is complete only now
                written()
            if not fin.direct:  # src pages are not needed again
                _fadvise(fin.fd, getattr(os, "POSIX_FADV_DONTNEED", None), start, end - start)
            return (h.hexdigest() if h is not None else None), pieces, direct
        finally:
            self._leave()
            fin.close()

    def _piece_reporter(self, rel, start, ph):
        """A callable telling ``on_piece`` of every piece ``ph`` completed since it was last called (called after
        each write, so a reported piece is in the file)."""
        base = start // self.piece_size
        told = [0]

        def written():
            while told[0] < len(ph.digests):
                self.on_piece(rel, base + told[0], ph.digests[told[0]])
                told[0] += 1
        return written

    def _stream_buffers(self):
        """This stream's ``STREAM_BUFFERS`` aligned buffers (anonymous mappings are page-aligned), reused."""
        views = getattr(self._local, "views", None)
        if views is None or len(views[0]) != DIRECT_BUF:
            maps = [aligned_buffer(DIRECT_BUF) for dummy in range(STREAM_BUFFERS)]
            views = [memoryview(m) for m in maps]
            self._local.views = views
            with self._lock:
                self._buffers.append((maps, views))
        return views

    def _free_buffers(self):
        with self._lock:
            held, self._buffers = self._buffers, []
        for maps, views in held:
            for v in views:
                v.release()
            for m in maps:
                m.close()
        self._local = threading.local()

    def _pipe(self, fin, fout, start, end, src_path, sinks, written=None):
        """Copy ``[start, end)``: a reader thread fills buffers from ``fin`` while this thread hashes and writes
        the ones it filled before, in order (calling ``written`` after each write)."""
        views = self._stream_buffers()
        free, full, stop = queue.Queue(), queue.Queue(), threading.Event()
        for i in range(len(views)):
            free.put(i)
        reader = threading.Thread(target=self._read_ahead, args=(fin, start, end, src_path, views, free, full, stop),
                                  name="stage-read", daemon=True)
        reader.start()
        try:
            while True:
                item = full.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                i, offset, n = item
                self._check_cancel()
                with views[i][:n] as chunk:
                    for s in sinks:
                        s.update(chunk)
                    fout.write_at(chunk, offset)
                free.put(i)
                if written is not None:
                    written()
                self.progress.add(n)
        finally:
            stop.set()  # the reader stops at its next buffer
            free.put(None)
            reader.join()

    def _read_ahead(self, fin, offset, end, src_path, views, free, full, stop):
        try:
            while offset < end:
                i = free.get()
                if i is None or stop.is_set():
                    return
                if self.cancel.is_set():
                    full.put(StageError("cancelled after another file failed"))
                    return
                want = min(len(views[i]), -(-(end - offset) // DIRECT_ALIGN) * DIRECT_ALIGN)
                with views[i][:want] as target:
                    n = min(fin.read_at(target, offset), end - offset)
                if n <= 0:
                    full.put(_safetensors.CheckpointError(src_path, "file ended early at byte %d of %d"
                                                          % (offset, end)))
                    return
                full.put((i, offset, n))
                offset += n
            full.put(None)
        except BaseException as e:  # handed to the writing side, which raises it
            full.put(e)

    def _check_cancel(self):
        if self.cancel.is_set():
            raise StageError("cancelled after another file failed")

    def _copy_kernel(self, fin, fout, offset, end, src_path):
        """In-kernel copy of two buffered files; where neither call works, the rest goes through _pipe."""
        use = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
        while offset < end:
            self._check_cancel()
            count = min(CHUNK, end - offset)
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
                    self._pipe(fin, fout, offset, end, src_path, [])
                    return
                raise
            if n == 0:
                raise _safetensors.CheckpointError(src_path, "file ended early at byte %d of %d" % (offset, end))
            offset += n
            self.progress.add(n)

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
        buf = aligned_buffer(DIRECT_BUF)
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


class _FileJob(object):
    """One file being copied, possibly by several streams at once (one per range)."""

    def __init__(self, copier, f):
        self.f = f
        self.rel = f["path"]
        self.src_path = os.path.join(copier.src, self.rel)
        self.final = _paths.contained(copier.partial, self.rel, "src")
        self.tmp = self.final + PART_SUFFIX
        self.ranges = copier.ranges(f["size"])
        raw = copier.headers.get(self.rel) if copier.mode in ("headers", "sha256") else None
        # the bytes the copy must start with: the header's length and the header read from src before the copy
        self.header = struct.pack("<Q", len(raw)) + raw if raw is not None else None
        self._header_matched = 0
        self.left = len(self.ranges)
        self.created = False
        self.direct = True
        self.digest = None
        self._pieces = {}
        self._lock = threading.Lock()

    def create(self):
        """Create ``<name>.llmops-part`` (truncated, blocks reserved) before the first range writes to it."""
        with self._lock:
            if self.created:
                return
            os.makedirs(os.path.dirname(self.final), exist_ok=True)
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if PREALLOCATE and len(self.ranges) > 1:
                    _preallocate(fd, self.f["size"])
            finally:
                os.close(fd)
            self.created = True

    def range_done(self, start, digest, pieces, direct):
        with self._lock:
            self.left -= 1
            self.direct = self.direct and direct
            if digest is not None:
                self.digest = digest
            if pieces is not None:
                self._pieces[start] = pieces
            return self.left == 0

    def header_matched(self, n):
        with self._lock:
            self._header_matched += n

    def header_written(self):
        """True when every byte of the header went out of a buffer that matched the source's header."""
        return self.header is not None and self._header_matched == len(self.header)

    def pieces(self):
        out = []
        for start in sorted(self._pieces):
            out.extend(self._pieces[start])
        return out


class HeaderCheck:
    """A sink of a range's bytes (fed in order from ``start``) that compares the part of the file's header it
    covers with the header read from src before the copy, in the buffers the copy writes from: the copy's header
    is verified byte for byte without reading it back. A mismatch raises before that buffer is written."""

    def __init__(self, job, start):
        self.job = job
        self.pos = start

    def update(self, chunk):
        want = self.job.header
        pos = self.pos
        self.pos += len(chunk)
        if pos >= len(want):
            return
        k = min(len(chunk), len(want) - pos)
        with chunk[:k] as part:
            same = part == want[pos:pos + k]
        if not same:
            raise _safetensors.CheckpointError(self.job.tmp, "header differs from the source file's header")
        self.job.header_matched(k)


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


def aligned_buffer(size):
    """A page-aligned ``size``-byte buffer for O_DIRECT, in transparent huge pages where the kernel has them.

    Private anonymous memory, not ``mmap(-1, size)``'s default ``MAP_SHARED``: shared anonymous memory is shmem,
    which gets huge pages only where ``shmem_enabled`` allows it (``never`` by default), so every 16 MiB request
    pinned and released 4096 small pages; measured on 3 GiB from tmpfs, private huge pages halved the copy's system
    CPU time (docs/benchmarks/model_stage.md).
    """
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buf = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        pass
    return buf


def _fadvise(fd, advice, offset=0, length=0):
    if advice is None or not hasattr(os, "posix_fadvise"):
        return
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except OSError:
        pass


_FALLOCATE = []


def _fallocate():
    """libc's ``fallocate``, or None where there is none."""
    if not _FALLOCATE:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _FALLOCATE.append(fn)
    return _FALLOCATE[0]


def _preallocate(fd, size):
    """Reserve the blocks of a ``size``-byte file (``fallocate(2)``, mode 0) where the filesystem can.

    A full disk then fails here, before a byte is copied, and the writes that follow overwrite allocated blocks
    inside the file instead of extending it: filesystems such as ext4 and XFS run aligned direct overwrites of one
    file in parallel (the ranges of a split file) but extend a file one write at a time. Where the filesystem
    cannot (EOPNOTSUPP), the file is written as before. Not ``posix_fallocate``: glibc emulates that by writing
    every block.
    """
    fn = _fallocate() if size > 0 else None
    if fn is None or fn(fd, 0, 0, size) == 0:
        return
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return
    raise OSError(err, os.strerror(err))
