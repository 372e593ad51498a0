# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a fleet-wide cap on concurrent readers, held as lease files.

The lease directory lives on the shared filesystem every host mounts. It holds ``slot-NNNN.lease``
for NNNN < cap; a reader owns a slot while its lease file exists with its token inside. Leases are
created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and NFSv3+), so at most ``cap``
streams read at once across every host and every concurrent playbook run that uses the directory.

A holder touches its leases every ``heartbeat`` seconds. A lease is stale, and may be taken over,
when either

* its holder is on this host and its process is gone (recorded pid + process start time), or
* a waiter has seen its mtime/inode unchanged for ``stale_after`` seconds of the waiter's own
  monotonic clock (no cross-host clock comparison, so clock skew does not matter).

A take-over renames the stale file to a unique name first (only one contender can win the
rename), so a killed host frees its slots without two hosts taking the same one.
``fleet.json`` records the cap; a run with a different cap for the same directory is refused.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import random
import socket
import tempfile
import threading
import time
import uuid

CAP_FILE = "fleet.json"


class FleetSlotError(RuntimeError):
    """The lease directory cannot be used (wrong cap, not writable, ...)."""


def _proc_start_time(pid, proc_root="/proc"):
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "r") as f:
            stat = f.read()
    except OSError:
        return None
    # field 22 (starttime) after the ")" that closes the command name
    return stat.rsplit(")", 1)[1].split()[19]


class FleetSlots:
    """Acquire/release per-stream read slots. Thread-safe within one process."""

    def __init__(self, directory, cap, host_id=None, host_max=None, heartbeat=5.0, stale_after=60.0,
                 poll=0.25, proc_root="/proc", lock_dir=None):
        if cap < 1:
            raise FleetSlotError("fleet_read_streams must be at least 1 (got %d)" % cap)
        self.directory = directory
        self.cap = cap
        self.host_id = host_id or socket.gethostname()
        self.host_max = host_max
        self.heartbeat = heartbeat
        self.stale_after = stale_after
        self.poll = poll
        self.proc_root = proc_root
        self.pid = os.getpid()
        self.start_time = _proc_start_time(self.pid, proc_root)
        self._held = {}  # path -> token
        self._lock = threading.Lock()
        self._seen = {}  # path -> ((ino, mtime_ns), first seen monotonic)
        self._stop = threading.Event()
        self._thread = None
        self.wait_seconds = 0.0
        key = hashlib.sha256(os.path.abspath(directory).encode("utf-8")).hexdigest()[:16]
        self._host_lock_path = os.path.join(lock_dir or tempfile.gettempdir(),
                                            "llmops-fleet-%s-%s.lock" % (key, self.host_id))

    # ---- setup -----------------------------------------------------------------------------
    def open(self):
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise FleetSlotError("fleet_slots_dir: cannot create %s: %s" % (self.directory, e.strerror))
        cap_path = os.path.join(self.directory, CAP_FILE)
        try:
            fd = os.open(cap_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump({"fleet_read_streams": self.cap}, f)
        except FileExistsError:
            recorded = None
            for dummy in range(20):  # the creator may still be writing it
                try:
                    with open(cap_path, "r") as f:
                        recorded = json.load(f).get("fleet_read_streams")
                    break
                except ValueError:
                    time.sleep(0.05)
            if recorded != self.cap:
                raise FleetSlotError(
                    "fleet_read_streams: %s records a cap of %s for this lease directory but this run asks "
                    "for %d; use the same value on every host and run (or remove %s when no copy is running)"
                    % (cap_path, recorded, self.cap, cap_path))
        except OSError as e:
            raise FleetSlotError("fleet_slots_dir: cannot write %s: %s" % (cap_path, e.strerror))
        self._thread = threading.Thread(target=self._heartbeat_loop, name="fleet-heartbeat", daemon=True)
        self._thread.start()
        return self

    def close(self):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            held = list(self._held)
        for path in held:
            self.release(path)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # ---- leases ----------------------------------------------------------------------------
    def _slot_paths(self):
        return [os.path.join(self.directory, "slot-%04d.lease" % i) for i in range(self.cap)]

    def _read_lease(self, path):
        try:
            with open(path, "r") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _host_count(self):
        count = 0
        for path in self._slot_paths():
            lease = self._read_lease(path)
            if lease and lease.get("host") == self.host_id and not self._is_dead_local(lease):
                count += 1
        return count

    def _is_dead_local(self, lease):
        if lease.get("host") != self.host_id:
            return False
        pid = lease.get("pid")
        if not isinstance(pid, int):
            return False
        if pid == self.pid:
            return False
        start = _proc_start_time(pid, self.proc_root)
        return start is None or start != lease.get("start_time")

    def _is_stale(self, path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        lease = self._read_lease(path)
        if lease and self._is_dead_local(lease):
            return True
        key = (st.st_ino, st.st_mtime_ns)
        now = time.monotonic()
        seen = self._seen.get(path)
        if seen is None or seen[0] != key:
            self._seen[path] = (key, now)
            return False
        return now - seen[1] >= self.stale_after

    def _take_over(self, path):
        grave = "%s.stale-%s" % (path, uuid.uuid4().hex)
        try:
            os.rename(path, grave)
        except FileNotFoundError:
            return
        # A live lease re-created between our stat and the rename would be fresh: put it back.
        lease = self._read_lease(grave)
        if lease and not self._is_dead_local(lease):
            try:
                st = os.stat(grave)
                if (st.st_ino, st.st_mtime_ns) != self._seen.get(path, (None,))[0]:
                    os.link(grave, path)
            except OSError:
                pass
        self._seen.pop(path, None)
        try:
            os.unlink(grave)
        except OSError:
            pass

    def _try_create(self, path):
        token = uuid.uuid4().hex
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "w") as f:
            json.dump({"host": self.host_id, "pid": self.pid, "start_time": self.start_time,
                       "token": token, "acquired": time.time()}, f)
        return token

    def acquire(self, timeout=None):
        """Block until a slot is ours; returns the lease path. Time spent waiting adds to wait_seconds."""
        t0 = time.monotonic()
        try:
            while True:
                got = self._try_acquire_once()
                if got:
                    return got
                if timeout is not None and time.monotonic() - t0 > timeout:
                    raise FleetSlotError("no fleet read slot free in %s after %.0f s" % (self.directory, timeout))
                time.sleep(self.poll * (0.5 + random.random()))
        finally:
            with self._lock:
                self.wait_seconds += time.monotonic() - t0

    def _try_acquire_once(self):
        with open(self._host_lock_path, "a") as hl:
            fcntl.flock(hl.fileno(), fcntl.LOCK_EX)
            try:
                if self.host_max is not None and self._host_count() >= self.host_max:
                    return None
                paths = self._slot_paths()
                random.shuffle(paths)
                for path in paths:
                    if os.path.exists(path):
                        if not self._is_stale(path):
                            continue
                        self._take_over(path)
                    token = self._try_create(path)
                    if token:
                        with self._lock:
                            self._held[path] = token
                        return path
                return None
            finally:
                fcntl.flock(hl.fileno(), fcntl.LOCK_UN)

    def release(self, path):
        with self._lock:
            token = self._held.pop(path, None)
        if token is None:
            return
        lease = self._read_lease(path)
        if lease and lease.get("token") == token:
            try:
                os.unlink(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise

    def _heartbeat_loop(self):
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                held = list(self._held)
            for path in held:
                try:
                    os.utime(path, None)
                except OSError:
                    pass
