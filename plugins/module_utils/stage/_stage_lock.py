# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the lock that makes one run at a time own a staged revision.

``<dest>.lock`` is ``flock``-ed for the whole critical section of every run that writes ``dest`` or
``<dest>.partial``: staging, ``state: absent`` and pruning. Whoever deletes the lock file (absent and prune, so
that removed revisions leave nothing behind) does it while holding the lock. A waiter may have opened the old
file before it was unlinked; after acquiring, every holder checks that the path still names the inode it locked
(``fstat`` of its descriptor against ``stat`` of the path) and starts over on the new file otherwise. So two
runs can never both believe they hold the lock of one ``dest`` (flock(2), "the standard flock-then-fstat-vs-stat
dance"; https://man7.org/linux/man-pages/man2/flock.2.html).
"""
from __future__ import annotations

import errno
import fcntl
import os
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError


class DestLock(object):
    """Exclusive ``flock`` on ``path``; waits up to ``timeout`` seconds (0: one try)."""

    def __init__(self, path, timeout, poll=0.05):
        self.path = path
        self.timeout = timeout
        self.poll = poll
        self.fd = None
        self.waited = 0.0

    def _open(self):
        try:
            fd = _fsutil.open_lock_file(self.path)  # 0600: no other user can open it to hold the lock
        except ValueError as e:
            raise StageError("dest: %s" % e)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StageError("dest: lock file %s is a symlink; remove it (model_stage creates a regular file "
                                 "there)" % self.path)
            if e.errno == errno.EISDIR:
                raise StageError("dest: lock file %s is a directory; remove it (model_stage creates a regular file "
                                 "there)" % self.path)
            raise
        return fd

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        t0 = time.monotonic()
        while True:
            fd = self._open()
            try:
                if not _fsutil.wait_flock(fd, t0 + self.timeout, poll=self.poll, first_poll=0.01):
                    raise StageError("lock_timeout: another run has held %s for more than %d s; wait for it "
                                     "or raise lock_timeout" % (self.path, self.timeout))
                if self._still_at_path(fd):
                    self.fd = fd
                    self.waited = time.monotonic() - t0
                    return self
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the file was unlinked (or replaced) while we waited: lock the one there now

    def _still_at_path(self, fd):
        mine = os.fstat(fd)
        try:
            there = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)

    def unlink(self):
        """Delete the lock file while holding it (waiters that opened it start over on a new one)."""
        if self.fd is not None and self._still_at_path(self.fd):
            os.unlink(self.path)

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
