# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: model_stage's progress file (sizes and durations read as ``_units`` writes them).

While a copy runs, :class:`Progress` rewrites ``progress_file`` (atomically: temp file + rename) once per
``interval`` seconds with one JSON object: ``state`` (``copying``, ``publishing``, ``done``, ``failed``),
``bytes_done``/``bytes_total``, ``files_done``/``files_total``, ``percent``, ``elapsed_seconds``,
``rate_bytes_per_second``, ``eta_seconds`` (null until a rate is known), ``message`` and ``updated``.
Writing it is best effort: a progress file that cannot be written never fails a copy.
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
