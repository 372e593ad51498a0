# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a fleet-wide cap on concurrent readers, held as lease files.

The lease directory lives on the shared filesystem every host mounts. It holds ``slot-NNNN.lease``
for NNNN < cap; a reader owns a slot while its lease file exists with its token inside. Leases are
created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and NFSv3+), so at most ``cap``
streams read at once across every host and every concurrent playbook run that uses the directory.

A lease records who took it: host id, pid, the process start time and a digest of its command line
(both from ``/proc/<pid>``), the kernel boot id and the pid namespace. A holder touches its leases
every ``heartbeat`` seconds. A lease is taken over

* at once when its holder is a process of this host (same host id, boot and pid namespace) that is
  no longer the stager that took it: gone, a zombie, or a pid reused by another process (start
  time or command line differ from the record; a stager that ``exec``s keeps its pid and start time
  but not its command line);
* otherwise when a waiter has seen its mtime/inode unchanged for ``stale_after`` seconds of the
  waiter's own monotonic clock (no cross-host clock comparison, so clock skew does not matter). This
  covers other hosts, other pid namespaces, a rebooted host, and leases that cannot be read.

A take-over renames the stale file to a unique name first (only one contender can win the rename),
so a killed host frees its slots without two hosts taking the same one.

Waiting is bounded: ``acquire`` gives up after ``acquire_timeout`` seconds (or its ``timeout``)
with an error naming the directory, how many slots each host holds, and the fix.

``fleet.json`` records the cap; a run with a different cap for the same directory is refused.
Malformed files never raise anything but :class:`FleetSlotError`, whose message never quotes them:

* ``fleet.json`` empty, truncated or not JSON (a creator died mid-write): after a short wait for a
  writer, replaced by this run's record (it holds no cap to honour);
* ``fleet.json`` larger than a cap record, valid JSON of another shape (not an object, no
  ``fleet_read_streams``, not a positive integer), not a regular file, or unreadable: an error
  naming the file and the fix (nothing is removed);
* a lease file of any malformed kind (wrong type, truncated, missing fields, a directory, a FIFO):
  its holder cannot be judged, so it is taken over once unchanged for ``stale_after``.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import random
import re
import socket
import tempfile
import threading
import time
import uuid

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _untrusted

CAP_FILE = "fleet.json"
MAX_RECORD_BYTES = 4096  # a cap record or a lease is well under 1 KiB
DEFAULT_ACQUIRE_TIMEOUT = 3600.0
#: A holder rewrites its lease this often (seconds).
HEARTBEAT = 5.0
#: Shortest ``stale_after`` a run may ask for (``fleet_stale_seconds``): three missed heartbeats, so a lease whose
#: holder is alive but slow for a moment is never taken over.
MIN_STALE_SECONDS = 3 * HEARTBEAT
_HOST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")

# Tokens of the leases this process holds, across FleetSlots instances.
_LIVE_TOKENS = set()
_LIVE_LOCK = threading.Lock()


class FleetSlotError(RuntimeError):
    """The lease directory cannot be used (wrong cap, not writable, no slot in time, ...).

    ``file`` names the file or directory concerned, ``reason`` is a short machine-readable cause.
    """

    def __init__(self, msg, file=None, reason=None):
        super(FleetSlotError, self).__init__(msg)
        self.file = file
        self.reason = reason


# ---- /proc -------------------------------------------------------------------------------------
def _read_small(path, limit=65536):
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _proc_stat(pid, proc_root="/proc"):
    """(state, starttime) of ``pid`` from ``<proc_root>/<pid>/stat``, or None when there is no such process."""
    raw = _read_small(os.path.join(proc_root, str(pid), "stat"))
    if raw is None:
        return None
    try:
        # fields 3 (state) and 22 (starttime) after the ")" that closes the command name
        fields = raw.decode("ascii", "replace").rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except IndexError:
        return None


def _proc_start_time(pid, proc_root="/proc"):
    st = _proc_stat(pid, proc_root)
    return st[1] if st else None


def _proc_cmdline_digest(pid, proc_root="/proc"):
    raw = _read_small(os.path.join(proc_root, str(pid), "cmdline"), limit=1 << 20)
    return hashlib.sha256(raw).hexdigest()[:16] if raw else None


def _boot_id(proc_root="/proc"):
    raw = _read_small(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"))
    if not raw:
        return None
    return raw.decode("ascii", "replace").strip() or None


def _pid_ns(pid, proc_root="/proc"):
    try:
        return os.readlink(os.path.join(proc_root, str(pid), "ns", "pid"))
    except OSError:
        return None


# ---- small JSON records ------------------------------------------------------------------------
def _read_record(path):
    """("ok", value) | ("absent", None) | ("unparsable", None) | ("special", None) | ("large", size)
    | ("unreadable", strerror) for a small JSON file, through the shared reader (without blocking on a FIFO or
    reading a huge file; nesting and numbers within its limits)."""
    try:
        raw = _untrusted.read_bytes(path, "fleet_slots_dir", MAX_RECORD_BYTES)
    except FileNotFoundError:
        return "absent", None
    except _untrusted.UntrustedInput as e:
        if e.limit == "type":
            return "special", None
        if e.limit == "size":
            try:
                return "large", os.stat(path).st_size
            except OSError:
                return "large", MAX_RECORD_BYTES + 1
        return "unreadable", str(e)
    try:
        return "ok", _untrusted.loads_json(raw, "fleet_slots_dir: %s" % path, max_depth=8, file=path, max_bytes=MAX_RECORD_BYTES)
    except _untrusted.UntrustedInput:  # not UTF-8, not JSON, too deep, a number out of range
        return "unparsable", None


def _kind(value):
    return {dict: "a JSON object", list: "a JSON list", str: "a JSON string", bool: "a JSON boolean",
            type(None): "JSON null"}.get(type(value), "a JSON number")


def _secs(value):
    return "%d s" % value if value == int(value) else "%.1f s" % value


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class FleetSlots:
    """Acquire/release per-stream read slots. Thread-safe within one process."""

    # How long an unparsable fleet.json may still be its creator's write in progress.
    CAP_SETTLE_SECONDS = 1.0

    def __init__(self, directory, cap, host_id=None, host_max=None, heartbeat=HEARTBEAT, stale_after=60.0,
                 poll=0.25, proc_root="/proc", lock_dir=None, acquire_timeout=DEFAULT_ACQUIRE_TIMEOUT):
        if not _positive_int(cap):
            raise FleetSlotError("fleet_read_streams must be at least 1 (got %r)" % (cap,), reason="bad_cap")
        self.directory = directory
        self.cap = cap
        self.host_id = host_id or socket.gethostname()
        self.host_max = host_max
        self.heartbeat = heartbeat
        self.stale_after = stale_after
        self.poll = poll
        self.proc_root = proc_root
        self.acquire_timeout = acquire_timeout
        self.pid = os.getpid()
        self.start_time = _proc_start_time(self.pid, proc_root)
        self.cmdline = _proc_cmdline_digest(self.pid, proc_root)
        self.boot_id = _boot_id(proc_root)
        self.pid_ns = _pid_ns(self.pid, proc_root)
        self._held = {}  # path -> token
        self._lock = threading.Lock()
        self._seen = {}  # path -> ((ino, mtime_ns), first seen monotonic)
        self._stop = threading.Event()
        self._thread = None
        self.wait_seconds = 0.0
        key = hashlib.sha256(os.path.abspath(directory).encode("utf-8")).hexdigest()[:16]
        self._host_lock_path = os.path.join(lock_dir or tempfile.gettempdir(),
                                            "llmops-fleet-%s-%s.lock" % (key, self._safe_host(self.host_id)))

    @staticmethod
    def _safe_host(host):
        return host if isinstance(host, str) and _HOST_ID.match(host) else "unnamed"

    # ---- setup -----------------------------------------------------------------------------
    def open(self):
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise FleetSlotError("fleet_slots_dir: cannot create %s: %s" % (self.directory, e.strerror),
                                 file=self.directory, reason="not_writable")
        self._check_cap(os.path.join(self.directory, CAP_FILE))
        self._thread = threading.Thread(target=self._heartbeat_loop, name="fleet-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _cap_error(self, cap_path, what, reason):
        return FleetSlotError(
            "fleet_slots_dir: %s is not the cap record {\"fleet_read_streams\": <int>} this collection writes (%s); "
            "remove it when no copy uses %s (the next run writes it again)" % (cap_path, what, self.directory),
            file=cap_path, reason=reason)

    def _check_cap(self, cap_path):
        """Create ``fleet.json`` or check it records our cap; replace it only when it holds no record."""
        for dummy in range(5):
            if self._create_cap(cap_path):
                return
            state, value = self._settled_cap(cap_path)
            if state == "absent":
                continue  # removed meanwhile: create it
            if state == "ok":
                if not isinstance(value, dict):
                    raise self._cap_error(cap_path, "it holds %s" % _kind(value), "cap_file_type")
                if "fleet_read_streams" not in value:
                    raise self._cap_error(cap_path, "it has no fleet_read_streams", "cap_file_field")
                recorded = value["fleet_read_streams"]
                if not _positive_int(recorded):
                    raise self._cap_error(cap_path, "its fleet_read_streams is %s, not a positive integer"
                                          % _kind(recorded), "cap_file_field")
                if recorded != self.cap:
                    raise FleetSlotError(
                        "fleet_read_streams: %s records a cap of %d for this lease directory but this run asks "
                        "for %d; use the same value on every host and run (or remove %s when no copy is running)"
                        % (cap_path, recorded, self.cap, cap_path), file=cap_path, reason="cap_mismatch")
                return
            if state == "special":
                raise self._cap_error(cap_path, "it is not a regular file", "cap_file_type")
            if state == "large":
                raise self._cap_error(cap_path, "it is %d bytes" % value, "cap_file_size")
            if state == "unreadable":
                raise FleetSlotError("fleet_slots_dir: cannot read %s: %s; make it readable by the user running "
                                     "the copy" % (cap_path, value), file=cap_path, reason="cap_file_unreadable")
            self._reclaim_cap(cap_path)  # empty, truncated, not JSON: it holds no cap to honour
        raise FleetSlotError("fleet_slots_dir: %s keeps changing while being read; check what else writes it"
                             % cap_path, file=cap_path, reason="cap_file_unstable")

    def _create_cap(self, cap_path):
        """Publish our cap record unless one exists; False when it does. Written in full under a temporary
        name and hard-linked into place, so nobody ever reads a half-written record from this collection."""
        tmp = "%s.new-%s" % (cap_path, uuid.uuid4().hex)
        try:
            with open(tmp, "x") as f:
                json.dump({"fleet_read_streams": self.cap}, f)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, cap_path)
                return True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV):
                    raise
            # a filesystem without hard links: exclusive create (a reader may see it half-written)
            try:
                fd = os.open(cap_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                json.dump({"fleet_read_streams": self.cap}, f)
            return True
        except OSError as e:
            raise FleetSlotError("fleet_slots_dir: cannot write %s: %s" % (cap_path, e.strerror),
                                 file=cap_path, reason="not_writable")
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _settled_cap(self, cap_path):
        """Read the cap file; an unparsable one is re-read for CAP_SETTLE_SECONDS (an older writer may be at it)."""
        deadline = time.monotonic() + self.CAP_SETTLE_SECONDS
        while True:
            state, value = _read_record(cap_path)
            if state != "unparsable" or time.monotonic() >= deadline:
                return state, value
            time.sleep(0.05)

    @staticmethod
    def _reclaim_cap(cap_path):
        """Move the unparsable cap file aside and drop it; whatever parses (another run's record written
        after we looked) is put back."""
        grave = "%s.bad-%s" % (cap_path, uuid.uuid4().hex)
        try:
            os.rename(cap_path, grave)
        except FileNotFoundError:
            return
        except OSError as e:
            raise FleetSlotError("fleet_slots_dir: cannot replace the unreadable %s: %s; remove it when no copy "
                                 "uses the directory" % (cap_path, e.strerror), file=cap_path, reason="not_writable")
        if _read_record(grave)[0] != "unparsable":
            try:
                os.link(grave, cap_path)
            except OSError:
                pass
        try:
            os.unlink(grave)
        except OSError:
            pass

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
        """The lease as a dict, or None (absent, being written, malformed, not a regular file)."""
        state, value = _read_record(path)
        return value if state == "ok" and isinstance(value, dict) else None

    def _is_local(self, lease):
        """True when the lease's pid can be looked up in our /proc: same host id, boot and pid namespace."""
        if lease.get("host") != self.host_id:
            return False
        for field, ours in (("boot_id", self.boot_id), ("pid_ns", self.pid_ns)):
            theirs = lease.get(field)
            if theirs is not None and ours is not None and theirs != ours:
                return False  # this host rebooted since, or another container with our host name
        return True

    def _holder_gone(self, lease):
        """True when the lease's holder is provably not the stager that took it (take over at once)."""
        if not self._is_local(lease):
            return False
        pid = lease.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 1:
            return False  # not written by a stager: judged by staleness only
        if not all(isinstance(lease.get(f), (str, type(None))) for f in ("start_time", "cmdline")):
            return False
        token = lease.get("token")
        if pid == self.pid:
            recorded = lease.get("start_time")
            if recorded is not None and recorded != self.start_time:
                return True  # an earlier process with our pid
            with _LIVE_LOCK:
                return token not in _LIVE_TOKENS
        st = _proc_stat(pid, self.proc_root)
        if st is None:
            return not self._hidden_but_alive(pid)
        state, start = st
        if state in ("Z", "X", "x"):
            return True  # exited, not yet reaped
        recorded = lease.get("start_time")
        if recorded is not None and recorded != start:
            return True  # pid reused
        if recorded is None:
            return False  # a lease without a start time cannot prove which process it meant
        cmdline = lease.get("cmdline")
        return cmdline is not None and cmdline != _proc_cmdline_digest(pid, self.proc_root)

    def _hidden_but_alive(self, pid):
        """/proc mounted with hidepid hides other users' processes: ask the kernel whether the pid exists."""
        if os.path.realpath(self.proc_root) != "/proc":
            return False
        try:
            os.kill(pid, 0)
        except PermissionError:
            return True
        except OSError:
            return False
        return True

    def _host_count(self):
        count = 0
        for path in self._slot_paths():
            lease = self._read_lease(path)
            if lease and lease.get("host") == self.host_id and not self._holder_gone(lease):
                count += 1
        return count

    def _stale_key(self, path):
        """The (inode, mtime) of ``path`` when its lease may be taken over now, else None."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns)
        lease = self._read_lease(path)
        if lease and self._holder_gone(lease):
            return key
        now = time.monotonic()
        seen = self._seen.get(path)
        if seen is None or seen[0] != key:
            self._seen[path] = (key, now)
            return None
        return key if now - seen[1] >= self.stale_after else None

    def _take_over(self, path, key):
        grave = "%s.stale-%s" % (path, uuid.uuid4().hex)
        try:
            os.rename(path, grave)
        except OSError:
            return
        self._seen.pop(path, None)
        try:
            st = os.lstat(grave)
            if (st.st_ino, st.st_mtime_ns) != key:
                os.link(grave, path)  # re-created or refreshed after we judged it: put it back
        except OSError:
            pass
        try:
            os.unlink(grave)
        except IsADirectoryError:
            try:
                os.rmdir(grave)
            except OSError:
                pass
        except OSError:
            pass

    def _try_create(self, path):
        token = uuid.uuid4().hex
        with _LIVE_LOCK:
            _LIVE_TOKENS.add(token)  # before the file exists: a lease with our pid is never judged gone while new
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            with _LIVE_LOCK:
                _LIVE_TOKENS.discard(token)
            if e.errno == errno.EEXIST:
                return None
            raise FleetSlotError("fleet_slots_dir: cannot create a lease in %s: %s; the directory must be writable "
                                 "by the user running the copy on every host" % (self.directory, e.strerror),
                                 file=self.directory, reason="not_writable")
        with os.fdopen(fd, "w") as f:
            json.dump({"host": self.host_id, "pid": self.pid, "start_time": self.start_time,
                       "cmdline": self.cmdline, "boot_id": self.boot_id, "pid_ns": self.pid_ns,
                       "token": token, "acquired": time.time()}, f)
        return token

    def acquire(self, timeout=None):
        """Wait for a slot; returns the lease path. Time spent waiting adds to wait_seconds.

        Waits at most ``timeout`` seconds (default: ``acquire_timeout``; None there waits forever), then
        raises FleetSlotError naming the directory, the hosts holding its slots and the fix.
        """
        if timeout is None:
            timeout = self.acquire_timeout
        t0 = time.monotonic()
        try:
            while True:
                got = self._try_acquire_once()
                if got:
                    return got
                if timeout is not None and time.monotonic() - t0 >= timeout:
                    raise self._timeout_error(timeout)
                time.sleep(self.poll * (0.5 + random.random()))
        finally:
            with self._lock:
                self.wait_seconds += time.monotonic() - t0

    def holders(self):
        """({host id: slots held}, pids of this host's holders) over the lease files now; leases that
        cannot be read count under the host None."""
        count, pids = {}, []
        for path in self._slot_paths():
            if not os.path.lexists(path):
                continue
            lease = self._read_lease(path)
            host = self._safe_host(lease.get("host")) if lease else None
            count[host] = count.get(host, 0) + 1
            pid = lease.get("pid") if lease else None
            if lease and self._is_local(lease) and isinstance(pid, int) and not isinstance(pid, bool):
                pids.append(pid)
        return count, sorted(pids)

    def _timeout_error(self, timeout):
        held, pids = self.holders()
        named = sorted((h, n) for h, n in held.items() if h is not None)
        who = ", ".join("%s: %d" % (h, n) for h, n in named) or "no host named"
        if pids:
            who += "; on this host pid %s" % ", ".join(str(p) for p in pids)
        if held.get(None):
            who += "; %d lease(s) unreadable or malformed, taken over once unchanged for fleet_stale_seconds" % held[None]
        total = sum(held.values())
        mine = held.get(self._safe_host(self.host_id), 0)
        if self.host_max is not None and mine >= self.host_max and total < self.cap:
            why = ("this host (%s) already holds %d slot(s), its read_streams limit (%d), for other copies running "
                   "on it" % (self.host_id, mine, self.host_max))
        else:
            why = "%d of %d slots are held" % (total, self.cap)
        return FleetSlotError(
            "fleet_slots_dir: no read slot free in %s after %s: %s (%s). Wait for those copies and re-run, raise "
            "lock_timeout, or raise fleet_read_streams on every host and run; a host that died frees its slots "
            "after fleet_stale_seconds (%s), a process of this host that is gone or was replaced at once"
            % (self.directory, _secs(timeout), why, who, _secs(self.stale_after)),
            file=self.directory, reason="slot_timeout")

    def _try_acquire_once(self):
        try:  # 0600: no other user can open it to hold the lock
            hl = os.fdopen(_fsutil.open_lock_file(self._host_lock_path), "ab")
        except (OSError, ValueError) as e:
            raise FleetSlotError("fleet_slots_dir: cannot open the host lock %s: %s"
                                 % (self._host_lock_path, getattr(e, "strerror", None) or e),
                                 file=self._host_lock_path, reason="not_writable")
        with hl:
            fcntl.flock(hl.fileno(), fcntl.LOCK_EX)
            try:
                free = []
                for path in self._slot_paths():
                    if os.path.lexists(path):
                        key = self._stale_key(path)
                        if key is None:
                            continue
                        self._take_over(path, key)
                    free.append(path)
                if not free or (self.host_max is not None and self._host_count() >= self.host_max):
                    return None
                random.shuffle(free)
                for path in free:
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
        try:
            lease = self._read_lease(path)
            if lease and lease.get("token") == token:
                try:
                    os.unlink(path)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        raise
        finally:
            # only now: until the file is gone, a lease with our pid and a live token is never taken over
            with _LIVE_LOCK:
                _LIVE_TOKENS.discard(token)

    def _heartbeat_loop(self):
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                held = list(self._held)
            for path in held:
                try:
                    os.utime(path, None)
                except OSError:
                    pass
