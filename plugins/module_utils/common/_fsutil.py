# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: small filesystem helpers shared by staging, caches, the process supervisor
and preflight: content hashes, atomic file writes, directory fsync, a lock file only its owner can open and
waiting for an exclusive flock on it, the nearest existing parent, a part of a regular file read without blocking.

An atomic write goes to a temporary file in the destination's own directory (a name no other writer can
pick: pid and a random part), is fsynced, renamed over the destination with ``os.replace`` and the
directory fsynced. Readers see the old file or the new one, never a mix; a failed write leaves the old
file as it was and no temporary file behind.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import time
import uuid

#: Read size for hashing: buffered reads into one reused buffer, small enough to stay in CPU cache.
HASH_BUF = 1024 * 1024


def sha256_file(path, bufsize=HASH_BUF):
    """Hex SHA-256 of the file at ``path``, read ``bufsize`` bytes at a time into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
    return h.hexdigest()


def fsync_dir(path):
    """fsync a directory so that renames inside it are durable; best effort."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path):
    """A name beside ``path`` that no other writer (thread, process or host) picks at the same time."""
    return "%s.tmp-%d-%s" % (path, os.getpid(), uuid.uuid4().hex[:12])


def atomic_write_bytes(path, data, mode=0o644, fsync=True):
    """Replace ``path`` with ``data`` atomically (see the module docstring); returns ``path``.

    ``mode`` is the new file's permission bits before the umask (``0o600`` for a private file). With
    ``fsync`` false the data and the rename are left to the page cache (progress files).
    Raises OSError; the old file, if any, is then unchanged.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    return path


def atomic_write_text(path, text, mode=0o644, fsync=True):
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode, fsync=fsync)


def atomic_write_json(path, doc, mode=0o644, fsync=True, indent=None, sort_keys=False, newline=False):
    """:func:`atomic_write_bytes` of ``json.dumps(doc, indent=indent, sort_keys=sort_keys)``.

    The document is serialised before anything is written, so a value JSON cannot represent raises
    (TypeError, ValueError) with the old file untouched. ``newline`` appends a final line feed.
    """
    text = json.dumps(doc, indent=indent, sort_keys=sort_keys)
    return atomic_write_text(path, text + "\n" if newline else text, mode=mode, fsync=fsync)


def open_lock_file(path):
    """``path`` opened for an exclusive ``flock`` (:func:`wait_flock`): created with mode 0600, never through a
    symlink (ELOOP), close-on-exec. ``flock`` needs only a descriptor, read-only or not (flock(2)), so a lock file
    another local user can open is a lock that user can hold to stop every run: one of this user's that others
    may read (0644, as lock files were made before) is made 0600, and one of another user (put first where both
    may write, such as /tmp) is refused. Raises OSError, and ValueError with a message naming ``path`` and the
    fix when it is not a regular file or belongs to another user."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    me = os.geteuid()
    if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
        os.close(fd)
        raise ValueError("lock file %s is %s; another user could hold it and stop every run; remove it" % (
            path, "not a regular file" if not stat.S_ISREG(st.st_mode) else
            "of uid %d, not of uid %d that runs this" % (st.st_uid, me)))
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def try_flock(fd):
    """Take an exclusive ``flock`` on ``fd`` without waiting: True when taken, False while another holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def wait_flock(fd, deadline, poll=0.2, first_poll=None):
    """Exclusive ``flock`` on ``fd``, tried every ``poll`` seconds (from ``first_poll``, doubling up to ``poll``)
    until the ``time.monotonic()`` ``deadline``: True when taken, False when the deadline passed first."""
    delay = poll if first_poll is None else min(first_poll, poll)
    while not try_flock(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, poll)
    return True


def nearest_existing(path):
    """``path`` itself or its nearest existing parent (where a not-yet-created path will live)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def read_part(path, size, from_end=False):
    """Up to ``size`` bytes from the start (or the end) of the regular file ``path``; None when it is absent,
    unreadable or not a regular file. Opened without blocking, so a FIFO or a device is refused at once (the
    rule of :mod:`_untrusted`, for reads that take only a part of a file that may be large)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if from_end and st.st_size > size:
            os.lseek(fd, st.st_size - size, os.SEEK_SET)
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
