# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: model_stage's progress file (sizes and durations read as ``_units`` writes them),
and the per-stream rate its byte count enforces.

While a copy runs, :class:`Progress` rewrites ``progress_file`` (atomically: temp file + rename) once per
``interval`` seconds with one JSON object: ``state`` (``copying``, ``publishing``, ``done``, ``failed``),
``bytes_done``/``bytes_total``, ``files_done``/``files_total``, ``percent``, ``elapsed_seconds``,
``rate_bytes_per_second``, ``eta_seconds`` (null until a rate is known), ``message`` and ``updated``.
Writing it is best effort: a progress file that cannot be written never fails a copy.

* :class:`Progress` - the counter and its file;
* :class:`SourcedProgress` - the same for a run whose bytes come from two sources (``bytes_from_source``,
  ``bytes_from_peers``), holding every copy stream to ``read_rate_limit``;
* :class:`Throttle` - at most so many bytes/s through one stream (reads of src, transfers from a peer).
"""
from __future__ import annotations

import os
import threading
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _units


# The names _stage and _stage_copy import; the formats live in _units.
human_bytes = _units.human_bytes
human_seconds = _units.human_seconds


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
        snapshot = self.snapshot()
        try:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            # rewritten every interval, so a write lost in a crash costs nothing: not fsynced
            _fsutil.atomic_write_json(self.path, snapshot, mode=0o666, fsync=False, sort_keys=True, newline=True)
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


class Throttle(object):
    """At most ``rate`` bytes/s through one stream (0: unlimited); idle time earns at most half a second."""

    def __init__(self, rate, clock=time.monotonic, sleep=time.sleep):
        self.rate = rate
        self.clock = clock
        self.sleep = sleep
        self.t0 = None
        self.done = 0

    def consume(self, n):
        if not self.rate or n <= 0:
            return
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        self.done += n
        ahead = self.done / float(self.rate) - (now - self.t0)
        if ahead < -0.5:
            self.t0 = now - self.done / float(self.rate) - 0.5
        elif ahead > 0:
            self.sleep(ahead)


class SourcedProgress(Progress):
    """The progress file of a run that moves bytes from two sources; ``read_rate_limit`` per stream applies
    to every byte counted through :meth:`add` by a copy stream (the copy engine counts each chunk it reads)."""

    def __init__(self, *args, **kwargs):
        self.read_rate_limit = kwargs.pop("read_rate_limit", 0)
        super(SourcedProgress, self).__init__(*args, **kwargs)
        self.from_source = 0
        self.from_peers = 0
        self._local = threading.local()

    def add(self, nbytes=0, files=0, peer=False):
        super(SourcedProgress, self).add(nbytes, files)
        with self._lock:
            if peer:
                self.from_peers += nbytes
            else:
                self.from_source += nbytes
        if nbytes and not peer and self.read_rate_limit:
            t = getattr(self._local, "throttle", None)
            if t is None:
                t = self._local.throttle = Throttle(self.read_rate_limit)
            t.consume(nbytes)

    def snapshot(self):
        doc = super(SourcedProgress, self).snapshot()
        with self._lock:
            src, peers = self.from_source, self.from_peers
        doc["bytes_from_source"] = src
        doc["bytes_from_peers"] = peers
        doc["message"] += " (%s from the shared filesystem, %s from peers)" % (human_bytes(src), human_bytes(peers))
        return doc
