# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: how long something took, how old it is, and which of two came first.

A wall clock (``time.time()``, a file's mtime, a timestamp another host wrote) can be wrong, can step (NTP, an
operator, a VM resumed) and differs between hosts, so the collection never derives an order or an age from one
clock compared with another. Three rules, each with one helper here:

* **Durations and deadlines inside one process** use ``time.monotonic()``: it never goes backwards and is not
  affected by changes of the system clock (PEP 418; ``CLOCK_MONOTONIC``, clock_gettime(2)). :class:`Stopwatch`
  measures, :func:`deadline` / :class:`Deadline` bounds a wait.
* **The age of something another host timestamps** is a difference of two times read from that one host
  (:func:`age`): a Kubernetes pod's ``creationTimestamp`` against another time the API server wrote (a condition's
  ``lastTransitionTime``, an event, the response's ``Date``), never this host's ``now`` minus the server's time
  (a controller 20 minutes ahead read a pod pending for 5 s as pending for 1,205 s). The age of a file is its
  mtime against the mtime of a file created now in the same directory (:func:`filesystem_now`): one clock, the
  filesystem's (the local kernel's, or an NFS server's), whatever the controller's or this host's says.
* **Which of two published things is newer** is a sequence number recorded at publish (:func:`next_sequence`,
  under :func:`sequence_lock`), never a wall time or an mtime: a revision published while the clock was a year
  ahead would otherwise stay "newest" and retention would delete the newer one. :func:`order_key` sorts entries
  that predate sequences (a marker or manifest an older version wrote) below every sequenced one, in their old
  order among themselves.

**Across processes of one host** (a plan written by one module run, read by the next), the monotonic clock
still serves: on Linux ``CLOCK_MONOTONIC`` is one system-wide clock for every process of a boot (clock_gettime(2)),
so :func:`host_instant` records it with the boot's id and :func:`elapsed_since` subtracts it in a later process of
the same boot; another boot (the clock restarted) is an unknown elapsed time, never a negative or absurd one. How
long a process of this host has run is the kernel's own time since boot against the process's start
(:func:`process_age`).

Timestamps written for people (``staged_at``, ``created``, log lines) still come from ``time.time()``; nothing
compares them.
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import tempfile
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil


class Stopwatch(object):
    """Seconds elapsed since it was started, on the monotonic clock (``clock`` for tests)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.started = clock()

    def elapsed(self):
        return self._clock() - self.started

    def restart(self):
        """Start again from now; returns the seconds elapsed until now."""
        now = self._clock()
        took, self.started = now - self.started, now
        return took


class Deadline(object):
    """A point ``seconds`` from now on the monotonic clock; ``at`` is comparable with ``time.monotonic()``."""

    def __init__(self, seconds, clock=time.monotonic):
        self._clock = clock
        self.seconds = seconds
        self.at = clock() + seconds

    def remaining(self):
        """Seconds left, never below 0."""
        return max(0.0, self.at - self._clock())

    def expired(self):
        return self._clock() >= self.at


def deadline(seconds, clock=time.monotonic):
    """A :class:`Deadline` ``seconds`` from now."""
    return Deadline(seconds, clock)


def age(later, earlier):
    """Seconds from ``earlier`` to ``later``, two times read from **one** clock (see the module docstring); None
    when either is unknown.

    Both are epoch seconds (numbers) or both ``datetime`` objects. A ``later`` before ``earlier`` (the same clock
    stepped back between the two readings) is an age of 0, never a negative one.
    """
    if later is None or earlier is None:
        return None
    diff = later - earlier
    seconds = diff.total_seconds() if hasattr(diff, "total_seconds") else float(diff)
    return max(0.0, seconds)


def filesystem_now(directory):
    """The time of ``directory``'s filesystem clock now: the mtime of an unnamed file created in it (``O_TMPFILE``
    where the filesystem has it, else a named file deleted at once). Compare it with the mtimes of that
    filesystem's files (:func:`age`); never with ``time.time()``, which may be another clock (NFS)."""
    with tempfile.TemporaryFile(dir=directory, prefix=".llmops-clock-") as f:
        return os.fstat(f.fileno()).st_mtime


# ---- across processes of one host -----------------------------------------------------------------------

def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def boot_id(proc_root="/proc"):
    """This boot's id: ``/proc/sys/kernel/random/boot_id``, a random UUID the kernel draws at each boot (proc(5),
    random(4)); None where it cannot be read (not Linux)."""
    value = _read_text(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"))
    return value or None


def _time_namespace(proc_root):
    """The time namespace of this process (time_namespaces(7), Linux 5.6+: it offsets ``CLOCK_MONOTONIC``), or
    None where the kernel has none or it cannot be read."""
    try:
        return os.readlink(os.path.join(proc_root, "self", "ns", "time"))
    except OSError:
        return None


def host_instant(proc_root="/proc", clock=time.monotonic):
    """Now, as a later process of this host can compare it with its own now (:func:`elapsed_since`):
    ``{"boot_id", "monotonic", "time_ns"}`` (JSON, for a file another module run reads), or None where the boot
    cannot be identified.

    ``monotonic`` is ``CLOCK_MONOTONIC`` (``time.monotonic()``, PEP 418): "a nonsettable system-wide clock"
    counting from a point fixed at boot, not affected by discontinuous jumps in the system time (clock_gettime(2)),
    so neither NTP, an operator nor a VM resumed with a wrong clock changes a difference of two readings. It
    restarts at every boot, hence ``boot_id``; a time namespace offsets it, hence ``time_ns``.
    """
    bid = boot_id(proc_root)
    if bid is None:
        return None
    return {"boot_id": bid, "monotonic": float(clock()), "time_ns": _time_namespace(proc_root)}


def elapsed_since(instant, proc_root="/proc", clock=time.monotonic):
    """Seconds from ``instant`` (:func:`host_instant`, read back from where another process wrote it) to now, or
    None - unknown - when ``instant`` is missing or not one, was taken in another boot or time namespace, or this
    boot cannot be identified. Never negative (:func:`age`)."""
    if not isinstance(instant, dict):
        return None
    then = instant.get("monotonic")
    if isinstance(then, bool) or not isinstance(then, (int, float)) or not math.isfinite(then):
        return None
    bid = boot_id(proc_root)
    if bid is None or instant.get("boot_id") != bid:
        return None
    ns, here = instant.get("time_ns"), _time_namespace(proc_root)
    if ns is not None and here is not None and ns != here:
        return None
    return age(float(clock()), float(then))


def process_age(start_ticks, proc_root="/proc"):
    """Seconds since a process of this host started, or None when it cannot be read: ``/proc/uptime`` (seconds
    since boot) against the process's ``starttime`` (``/proc/<pid>/stat`` field 22, clock ticks after boot,
    ``sysconf(_SC_CLK_TCK)`` a second; proc(5)). Both are the kernel's time since boot, one clock that no wall
    clock setting moves."""
    if isinstance(start_ticks, bool) or not isinstance(start_ticks, int) or start_ticks < 0:
        return None
    text = _read_text(os.path.join(proc_root, "uptime"))
    try:
        uptime = float(text.split()[0])
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, IndexError, ValueError, OSError):
        return None
    return age(uptime, start_ticks / hz)


# ---- publish order -----------------------------------------------------------------------------------

def valid_sequence(value):
    """``value`` is a sequence number (an integer >= 1; a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def next_sequence(existing):
    """One more than the largest valid sequence in ``existing`` (1 when there is none); call it under
    :func:`sequence_lock` of the directory the entries live in, and record the result in what is published."""
    return max([s for s in existing if valid_sequence(s)], default=0) + 1


def order_key(sequence, legacy=None, name=""):
    """Sort key, oldest first: every entry with a valid ``sequence`` above every entry without one; entries
    without (written before sequences existed) in their ``legacy`` order (a number or a string; one kind per
    caller); ``name`` breaks ties (two runs publishing at the very same moment where the directory cannot be
    locked)."""
    if valid_sequence(sequence):
        return (1, sequence, "", name)
    return (0, 0, legacy if legacy is not None else "", name)


@contextlib.contextmanager
def sequence_lock(directory, timeout=60.0):
    """Exclusive ``flock`` on ``directory`` itself (no file is created) while a publisher reads the sequences
    beside it and publishes with the next one, so two publishers never take the same number. A publisher holds it
    for a listing, one small write and a rename.

    Where the filesystem cannot lock a directory (an NFS client emulates flock with fcntl byte-range locks,
    flock(2) NOTES, and an exclusive one needs a file open for writing), or another holder keeps it past
    ``timeout`` seconds, it yields ``False`` and the order of two simultaneous publishers falls back to their
    names (:func:`order_key`); otherwise ``True``.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield False
        return
    try:
        try:
            held = _fsutil.wait_flock(fd, time.monotonic() + timeout, poll=0.05, first_poll=0.005)
        except OSError as e:
            if e.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            held = False
        yield held
    finally:
        os.close(fd)  # closing the descriptor releases the lock
