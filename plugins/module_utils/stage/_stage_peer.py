# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what a node serves to its peers during a fan-out, and the server doing it.

A node serves, read-only, the pieces of a staged revision it holds *verified*:

* the files of its published marker (``<dest>/.llmops-staged.json``) that carry piece digests at this run's
  piece size and whose copy is intact (``FileRecord.damage``), from ``<dest>/<file>``;
* while it is itself staging, the pieces listed in the board ``<dest>.partial/.llmops-staged.pieces.json``,
  which the staging run (:class:`Board`) rewrites as pieces are verified and written: a file still being
  received is served from ``<file>.llmops-part``, only in the pieces the board marks held; a completed file from
  its final name in ``<dest>.partial``. So a node hands a piece on as soon as it has verified it (pipelining).

:class:`PeerServer` (stdlib ``http.server``, one thread per connection; each request's head read by its own
bounded parser, :meth:`_Handler.parse_request`, and each answer's head written in one piece) answers, for each revision ``R`` it was
given (``/r/<name>/<revision>``):

* ``GET R/pieces``: ``piece_size``, ``state`` (``idle``, ``copying``, ``failed``, ``done``, ``complete``),
  ``board_age`` (seconds since the staging run last rewrote its board), ``load`` (transfers in flight) and per
  file ``size``, ``src`` (the source file's ino, mtime_ns, ctime_ns), ``header_sha256``, ``sha256``, ``have``
  (one ``0``/``1`` per piece) and, once this server has sent any of its pieces, ``sent`` (per piece, how many
  transfers of it this server started, ``0``-``9``): a receiver asks a seed first for the pieces nobody got from it
  yet, so a seed's uplink carries each piece about once and the receivers trade the rest. With a query
  (``_stage_fanout_wire.PROTO`` 2) the answer also carries ``epoch``, ``seq`` and ``full``: ``since=<seq>&epoch=<e>``
  gets only the entries changed after that version (the whole list when that cannot say it: a piece or file no
  longer held, another epoch), ``wait=<s>`` holds the request until there is a change (at most ``MAX_LIST_WAIT``;
  one watcher thread per revision looks at the board every ``WATCH_INTERVAL`` while requests wait), ``sent=0``
  leaves the counters out. A bad value gets 400 naming the field; a request without a query gets the list as
  protocol 1 had it;
* ``GET R/digests?file=<path>``: the digests of that file's held pieces (``null`` for the others);
* ``GET R/files/<path>`` with one ``Range: bytes=a-b``: those bytes (206), only when every piece they touch is
  held; otherwise 404 (not held) or 416 (bad range). With ``X-Llmops-Unsent: 1`` (a receiver asking a seed for a
  piece it believes nobody got yet) a range of which this server already started a transfer gets 409 and no
  bytes: the receiver learned that before the next piece list could tell it, and takes the piece from whoever
  received it, so the seed's uplink, which every piece must cross once, carries each piece once.

``<path>`` is the file name's bytes percent-encoded (``_stage_fanout_wire.name_to_url`` and ``name_from_url``), and
JSON carries a name as Python's ``str`` of it, escaped: a name that is not UTF-8 is served like any other.

Every request needs ``Authorization: Bearer <token>``, the per-run token; its sha256 is compared in constant time
with the digest the server was given (the controller gives servers only the digest: the token itself is in no
memory, file, argument or environment of the daemon), and anything else gets 403 and the connection closed.

The network cannot starve it: at most ``MAX_UNAUTHENTICATED`` connections that have not shown the token are
kept (one more closes the oldest of them), each must send its request line and headers within
``HEADER_DEADLINE`` seconds, a kept-alive connection waits at most ``IDLE_TIMEOUT`` for its next request, and at
most ``MAX_CONNECTIONS`` connections with the token are served (more get 503). So peers with the token are
served while any number of idle or byte-a-second connections are open. A path is served
only when it is listed (published marker or board), passes ``_paths`` (relative, no ``..``, no symlink on the
way) and opens as a regular file without following a symlink. Errors name the path, never a header value.

:func:`start` runs the server as a daemon (double fork, ``setsid``, stdio on ``/dev/null``) that holds a
``flock`` on its pid file for its whole life and exits on SIGTERM or after ``lifetime`` seconds; :func:`stop`
ends it, identified by that lock.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.common import _untrusted
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_fanout_wire import UNSENT_HEADER, name_from_url

BOARD = ".llmops-staged.pieces.json"
BOARD_FORMAT = 1
BOARD_HEARTBEAT = 2.0      # a staging run rewrites its board at least this often
SEND_CHUNK = 8 * 1024 * 1024
MAX_BOARD_BYTES = 64 * 1024 * 1024
#: Connections that have shown the token, served at once (a receiver holds about ``2 * read_streams + 1`` to
#: each peer); one more that shows it gets 503 and is closed.
MAX_CONNECTIONS = 1024
#: Connections that have not shown the token yet: past this, the oldest of them is closed when one more comes, so
#: idle or slow connections from anybody never keep a peer with the token out.
MAX_UNAUTHENTICATED = 64
#: Seconds a connection has to send its first request line and headers in full (slow senders are cut off).
HEADER_DEADLINE = 10.0
#: Seconds a kept-alive connection may wait for its next request (receivers poll several times a second).
IDLE_TIMEOUT = 60.0
#: How often the deadlines are checked (seconds).
REAP_INTERVAL = 0.25
#: While receivers wait for a change of a revision's piece list, how often its board is looked at (seconds).
WATCH_INTERVAL = 0.1
#: How long a reading of a revision's filesystem clock (``_clock.filesystem_now``: a file created and removed) is
#: carried forward on this host's monotonic clock before it is read again (seconds). Read at every snapshot, it was
#: a file created and deleted about 5 times a second per revision while receivers waited for a change.
FS_CLOCK_REREAD = 10.0
MAX_LIST_WAIT = _stage_fanout_wire.MAX_LIST_WAIT
#: A request's line and headers together, at most (bytes; a receiver's are under 300): more gets 431 and the
#: connection closed. ``http.server`` allowed 64 KiB per line and 100 lines.
MAX_HEAD_BYTES = 16 * 1024
#: Header lines of a request, at most (a receiver sends 3 or 4).
MAX_HEADERS = 32


class AlreadySent(Exception):
    """A range asked for as unsent (``UNSENT_HEADER``) of which this server started a transfer before."""


class PeerError(Exception):
    """The server could not be started or stopped; ``str()`` names the option and the fix.

    ``option`` (the option's path, such as ``revisions[0].dest``) and ``reason`` (a short machine-readable cause)
    go into the module's failed result (:meth:`fields`).
    """

    def __init__(self, msg, option=None, reason=None):
        super(PeerError, self).__init__(msg)
        self.option = option
        self.reason = reason

    def fields(self):
        """``{"option", "reason"}`` as set, for ``fail_json``."""
        return dict((k, v) for k, v in (("option", self.option), ("reason", self.reason)) if v)


def token_digest(token):
    return hashlib.sha256(token.encode("utf-8")).digest()


def revision_id(name, revision):
    return "%s/%s" % (name, revision)


# ---- the board: what a staging run holds verified --------------------------------------------------
class Board(object):
    """The board of a staging run in ``partial``: files, their trusted piece digests and which pieces are held.

    ``add`` registers a file (identity and digests known so far), ``held`` marks one piece verified and written,
    ``done`` a file complete under its final name. The file is rewritten at most every ``interval`` seconds by a
    background thread (and at least every ``BOARD_HEARTBEAT``), so peers see progress within a fraction of a
    second; ``close`` writes the final state and stops the thread.
    """

    def __init__(self, partial, piece_size, interval=0.2):
        self.path = os.path.join(partial, BOARD)
        self.piece_size = piece_size
        self.interval = interval
        self.state = "copying"
        self.files = {}
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def add(self, rel, f, header_sha256, sha256, digests=None, held=False, done=False):
        n = _marker.piece_count(f["size"], self.piece_size)
        digests = list(digests) if digests is not None else [None] * n
        with self._lock:
            self.files[rel] = {"size": f["size"], "src": [f["ino"], f["mtime_ns"], f["ctime_ns"]],
                               "header_sha256": header_sha256, "sha256": sha256, "digests": digests,
                               "have": [bool(held and d) for d in digests], "done": bool(done)}
        self._dirty.set()

    def held(self, rel, index, digest):
        with self._lock:
            e = self.files[rel]
            e["digests"][index] = digest
            e["have"][index] = True
        self._dirty.set()

    def done(self, rel):
        with self._lock:
            self.files[rel]["done"] = True
        self._dirty.set()

    def doc(self):
        with self._lock:
            files = {}
            for rel, e in self.files.items():
                files[rel] = {"size": e["size"], "src": e["src"], "header_sha256": e["header_sha256"],
                              "sha256": e["sha256"], "done": e["done"],
                              "digests": [d if h else None for d, h in zip(e["digests"], e["have"])]}
            return {"format": BOARD_FORMAT, "piece_size": self.piece_size, "state": self.state, "pid": os.getpid(),
                    "updated": time.time(), "files": files}

    def write(self):
        try:
            _fsutil.atomic_write_json(self.path, self.doc(), mode=0o644, fsync=False, sort_keys=True)
        except OSError:
            pass  # serving onward is best effort; the copy itself never fails over the board

    def start(self):
        self.write()
        self._thread = threading.Thread(target=self._loop, name="stage-board", daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        last = time.monotonic()
        while not self._stop.is_set():
            self._dirty.wait(BOARD_HEARTBEAT)
            if self._stop.is_set():
                break
            wait = self.interval - (time.monotonic() - last)
            if wait > 0:
                self._stop.wait(wait)
            self._dirty.clear()
            self.write()
            last = time.monotonic()

    def close(self, state):
        self.state = state
        self._stop.set()
        self._dirty.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.write()

    def remove(self):
        _stage_layout.try_unlink(self.path)


def _hex_or_none(v):
    return v if _marker.is_sha256(v) else None


def read_board(partial, piece_size, last=None):
    """``(doc, mtime)`` of the board in ``partial`` at ``piece_size``; ``(None, None)`` when absent or not one.

    ``last``, a dict the caller keeps between calls, holds the bytes parsed last time and what they gave: when the
    file holds the same bytes again (a heartbeat rewrite, or a list polled again before anything changed), that
    result is returned without parsing and checking every digest again. The bytes are compared in full, so what
    is returned is always what the file holds now."""
    path = os.path.join(partial, BOARD)
    try:
        raw = _untrusted.read_bytes(path, max_bytes=MAX_BOARD_BYTES, follow=False)
        mtime = os.lstat(path).st_mtime
    except (_untrusted.UntrustedInput, OSError):
        return None, None
    if last is not None and last.get("raw") == raw:
        return last["doc"], mtime
    doc = _parse_board(path, raw, piece_size)
    if last is not None:
        last.update(raw=raw, doc=doc)
    return doc, mtime


def _parse_board(path, raw, piece_size):
    """The checked board document of the bytes ``raw`` read from ``path``, or None."""
    try:
        doc = _untrusted.loads_json(raw, str(path), file=path, max_bytes=MAX_BOARD_BYTES)
    except _untrusted.UntrustedInput:
        return None
    if not isinstance(doc, dict) or doc.get("format") != BOARD_FORMAT or doc.get("piece_size") != piece_size:
        return None
    files = doc.get("files")
    if not isinstance(files, dict):
        return None
    clean = {}
    for rel, e in files.items():
        try:
            _paths.split_relative(rel, "board")
        except _paths.PathEscape:
            continue
        if not isinstance(e, dict) or not isinstance(e.get("size"), int) or not isinstance(e.get("digests"), list):
            continue
        if len(e["digests"]) != _marker.piece_count(e["size"], piece_size):
            continue
        src = e.get("src")
        clean[rel] = {"size": e["size"], "src": src if isinstance(src, list) and len(src) == 3 else None,
                      "header_sha256": _hex_or_none(e.get("header_sha256")), "sha256": _hex_or_none(e.get("sha256")),
                      "digests": [_hex_or_none(d) for d in e["digests"]], "done": e.get("done") is True,
                      "where": "partial"}
    doc["files"] = clean
    return doc


def board_age(partial, mtime, clock=None):
    """Seconds since the staging run last rewrote its board (its ``mtime``), on the clock that wrote it: the
    filesystem of ``partial`` now (``_clock.filesystem_now``) against that mtime (``_clock.age``), never this
    host's ``time.time()``, which another clock (an NFS server's) or a step would skew. None when the filesystem
    cannot say (no file can be created there).

    ``clock``: a :class:`FilesystemClock` of ``partial`` that reads the filesystem's clock at most every
    ``FS_CLOCK_REREAD`` seconds (an :class:`Offer` keeps one); without it the clock is read now."""
    if clock is not None:
        return _clock.age(clock.now(), mtime)
    try:
        return _clock.age(_clock.filesystem_now(partial), mtime)
    except OSError:
        return None


class FilesystemClock(object):
    """The clock of ``directory``'s filesystem, read (``_clock.filesystem_now``) at most every ``reread`` seconds
    and carried forward in between by the monotonic time elapsed since (``_clock.Stopwatch``): still that one
    clock, so a step of this host's wall clock changes nothing; a step of the filesystem's own clock shows within
    ``reread`` seconds. ``now()`` is None while the filesystem cannot say (no file can be created there; it is
    asked again at the next call)."""

    def __init__(self, directory, reread=FS_CLOCK_REREAD):
        self.directory = directory
        self.reread = reread
        self._read = None      # the filesystem's clock at the last reading (None: it could not be read)
        self._since = None     # a Stopwatch started at that reading

    def now(self):
        if self._read is None or self._since.elapsed() >= self.reread:
            try:
                self._read = _clock.filesystem_now(self.directory)
            except OSError:
                self._read = None
            self._since = _clock.Stopwatch()
        return None if self._read is None else self._read + self._since.elapsed()


def _lost(before, now):
    """Some piece held in ``before`` (``"0110"``) is not in ``now`` (as long)."""
    return any(a == "1" and b == "0" for a, b in zip(before, now))


# ---- what one revision offers ----------------------------------------------------------------------
class Offer(object):
    """The verified pieces one node holds of one revision (published marker and board), cached briefly."""

    def __init__(self, dest, piece_size, ttl=0.2):
        self.lay = _stage_layout.Layout(dest)
        self.piece_size = piece_size
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = None
        self._snap = None
        self._marker_key = None
        self._marker = None
        self._sent = {}   # rel -> bytearray: transfers of each piece this server started (up to 9)
        self._sent_version = 0  # bumped with every change of _sent
        self._board_last = {}   # the board's bytes parsed last and their result (read_board)
        self._fs_clock = None   # the clock of the partial's filesystem (FilesystemClock), once there is a board
        self._public = None     # (snapshot, sent version, load, encoded piece list) served last
        # the list's history (protocol 2, see _stage_fanout_wire.PROTO): a version per change of what it lists
        self.epoch = os.urandom(8).hex()
        self.watch_interval = WATCH_INTERVAL
        self._changed = threading.Condition(threading.Lock())  # notified at every new version
        self._seq = 0
        self._seen = (None, None)   # (snapshot, sent version) the versions were last brought up to date with
        self._view = {}         # rel -> (identity, have, sent): the entries as of version _seq
        self._state = None
        self._have_at = {}      # rel -> version of its entry's last change but for ``sent``
        self._sent_at = {}      # rel -> version of its ``sent``'s last change
        self._have_seq = 0      # the last version that changed something but ``sent`` (state included)
        self._sent_seq = 0      # the last version that changed a ``sent``
        self._reset_seq = 0     # the last version that a list of changes cannot say (a piece or file gone)
        self._waiters = 0       # requests held for a change
        self._watcher = None
        self._deltas = {}       # (version, since, sent) -> the encoded changes, for the receivers asking alike

    def snapshot(self):
        with self._lock:
            now = time.monotonic()
            if self._snap is None or now - self._at > self.ttl:
                self._snap = self._build()
                self._at = now
            return self._snap

    def _build(self):
        files, state, age = {}, "idle", None
        ms = self._read_marker()
        if ms is not None and ms.kind == "ok" and not os.path.islink(self.lay.real):
            state = "complete"
            for r in ms.marker.records:
                if r.has_pieces(self.piece_size) and r.damage(self.lay.real) is None:
                    files[r.path] = {"size": r.size, "src": list(r.src[1:]), "header_sha256": r.header_sha256,
                                     "sha256": r.sha256, "digests": list(r.pieces), "done": True, "where": "dest"}
        if not os.path.islink(self.lay.partial):
            board, mtime = read_board(self.lay.partial, self.piece_size, self._board_last)
            if board is not None:
                state = board.get("state") if board.get("state") in ("copying", "failed", "done") else "copying"
                if self._fs_clock is None:
                    self._fs_clock = FilesystemClock(self.lay.partial)
                age = board_age(self.lay.partial, mtime, self._fs_clock)
                files.update(board["files"])
        return {"state": state, "board_age": age, "files": files}

    def _read_marker(self):
        """The published marker, parsed again only when its file changed (the copies are checked every time)."""
        try:
            st = os.lstat(os.path.join(self.lay.real, _marker.MARKER))
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            self._marker_key = self._marker = None
            return None
        if key != self._marker_key:
            self._marker = _marker.read_marker(self.lay.real)
            self._marker_key = key
        return self._marker

    def public_body(self, load):
        """:meth:`public` as the JSON bytes sent, encoded again only when the snapshot, ``sent`` or ``load``
        changed: receivers poll every peer several times a second, mostly for a list that did not change."""
        snap = self.snapshot()
        with self._lock:
            version = self._sent_version
            cached = self._public
        if cached is not None and cached[0] is snap and cached[1] == version and cached[2] == load:
            return cached[3]
        body = json.dumps(self.public(load, snap), sort_keys=True, separators=(",", ":")).encode("utf-8")
        with self._lock:
            self._public = (snap, version, load, body)
        return body

    # ---- the list's versions (protocol 2) ----------------------------------------------------------------
    def refresh(self):
        """Bring the versions up to date with what the snapshot and ``sent`` say now: one new version for
        whatever changed since the last one (waking the requests held for a change). Cheap when nothing did."""
        snap = self.snapshot()
        with self._lock:
            version = self._sent_version
            if self._seen[0] is snap and self._seen[1] == version:
                return
            self._seen = (snap, version)
            sent = dict((rel, bytes(c)) for rel, c in self._sent.items())
        view = {}
        for rel, e in snap["files"].items():
            counts = sent.get(rel)
            view[rel] = ((e["size"], tuple(e["src"] or ()), e["header_sha256"], e["sha256"]),
                         "".join("1" if d else "0" for d in e["digests"]),
                         "".join(str(c) for c in counts) if counts is not None and len(counts) == len(e["digests"])
                         else None)
        with self._changed:
            seq = self._seq + 1
            have = snap["state"] != self._state
            moved = reset = False
            for rel in self._view:
                if rel not in view:
                    reset = True
            for rel, (ident, held, counts) in view.items():
                old = self._view.get(rel)
                if old is None or old[0] != ident or old[1] != held:
                    if old is not None and (old[0] != ident or _lost(old[1], held)):
                        reset = True  # a piece no longer held, or another source file: only a whole list says it
                    self._have_at[rel] = seq
                    have = True
                if old is None or old[2] != counts:
                    self._sent_at[rel] = seq
                    moved = True
            if not (have or moved or reset):
                return
            for rel in [r for r in self._have_at if r not in view]:
                self._have_at.pop(rel, None)
                self._sent_at.pop(rel, None)
            self._seq = seq
            self._view = view
            self._state = snap["state"]
            if have:
                self._have_seq = seq
            if moved:
                self._sent_seq = seq
            if reset:
                self._reset_seq = seq
            self._deltas = {}
            self._changed.notify_all()

    def _relevant(self, since, want_sent):
        """A version after ``since`` changed something a receiver asking with ``want_sent`` reads (lock held)."""
        return (self._have_seq > since or self._reset_seq > since) or (want_sent and self._sent_seq > since)

    def _watch(self):
        """While requests are held for a change, look for one every ``watch_interval`` (one thread per revision,
        however many receivers wait)."""
        while True:
            with self._changed:
                if not self._waiters:
                    self._watcher = None
                    return
            time.sleep(self.watch_interval)
            try:
                self.refresh()
            except Exception:  # pylint: disable=broad-except  # a board unreadable now is read again next time
                pass

    def list_body(self, load, since=None, epoch=None, want_sent=True, wait=0.0):
        """The ``/pieces`` answer as JSON bytes: the whole list, or with ``since`` and this server's ``epoch`` the
        entries changed after version ``since`` (see ``_stage_fanout_wire.PROTO``), held up to ``wait`` seconds
        (at most ``MAX_LIST_WAIT``) until there is one. A ``since`` this history cannot answer with changes
        (another epoch, a version it never gave, before a change a list of changes cannot say) gets the whole list."""
        self.refresh()
        wait = max(0.0, min(float(wait), MAX_LIST_WAIT))
        with self._changed:
            delta = since is not None and epoch == self.epoch and self._reset_seq <= since <= self._seq
            if delta and wait and not self._relevant(since, want_sent):
                deadline = time.monotonic() + wait
                self._waiters += 1
                try:
                    if self._watcher is None:
                        self._watcher = threading.Thread(target=self._watch, name="stage-peer-watch", daemon=True)
                        self._watcher.start()
                    while not self._relevant(since, want_sent):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._changed.wait(left)
                finally:
                    self._waiters -= 1
                delta = self._reset_seq <= since
            seq, state = self._seq, self._state
            if delta:
                key = (seq, since, want_sent)
                files = self._deltas.get(key)
                if files is None:
                    changed = sorted(rel for rel in self._view if self._have_at.get(rel, 0) > since
                                     or (want_sent and self._sent_at.get(rel, 0) > since))
                    files = self._deltas[key] = self._encode_files(changed, want_sent)
            else:
                files = self._encode_files(sorted(self._view), want_sent)
        age = self.snapshot()["board_age"]
        head = {"piece_size": self.piece_size, "state": state, "board_age": age, "load": load,
                "proto": _stage_fanout_wire.PROTO, "epoch": self.epoch, "seq": seq, "full": not delta}
        return json.dumps(head, sort_keys=True, separators=(",", ":")).encode("utf-8")[:-1] + b',"files":' + files + b"}"

    def _encode_files(self, rels, want_sent):
        """The ``files`` object of the entries ``rels`` as of the current version (lock held)."""
        out = {}
        for rel in rels:
            ident, held, counts = self._view[rel]
            e = {"size": ident[0], "src": list(ident[1]), "header_sha256": ident[2], "sha256": ident[3], "have": held}
            if want_sent and counts is not None:
                e["sent"] = counts
            out[rel] = e
        return json.dumps(out, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def public(self, load, snap=None):
        snap = snap if snap is not None else self.snapshot()
        files = {}
        with self._lock:
            sent = dict((rel, bytes(c)) for rel, c in self._sent.items())
        for rel, e in snap["files"].items():
            files[rel] = {"size": e["size"], "src": e["src"], "header_sha256": e["header_sha256"],
                          "sha256": e["sha256"], "have": "".join("1" if d else "0" for d in e["digests"])}
            if rel in sent and len(sent[rel]) == len(e["digests"]):
                files[rel]["sent"] = "".join(str(c) for c in sent[rel])
        return {"piece_size": self.piece_size, "state": snap["state"], "board_age": snap["board_age"],
                "load": load, "files": files}

    def open_range(self, rel, first, last, unsent=False):
        """An open descriptor of ``rel`` for bytes ``first..last`` (inclusive), counted as one transfer of each
        piece they touch (``sent``); raises ``LookupError`` (not held), ``ValueError`` (bad range) or, with
        ``unsent``, :class:`AlreadySent` when a transfer of one of those pieces was started before."""
        e = self.snapshot()["files"].get(rel)
        if e is None:
            raise LookupError("not listed")
        if first > last or last >= e["size"]:
            raise ValueError("range outside the file")
        pieces = range(first // self.piece_size, last // self.piece_size + 1)
        for i in pieces:
            if not e["digests"][i]:
                raise LookupError("piece %d not held" % i)
        if e["where"] == "dest":
            names = [(self.lay.real, rel)]
        elif e["done"]:
            names = [(self.lay.partial, rel)]
        else:  # completed since the board was read: the final name
            names = [(self.lay.partial, rel + _marker.PART_SUFFIX), (self.lay.partial, rel)]
        for root, name in names:
            try:
                path = _paths.contained(root, name, "file")
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except (OSError, _paths.PathEscape):
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size >= last + 1:
                with self._lock:
                    counts = self._sent.setdefault(rel, bytearray(len(e["digests"])))
                    if unsent and any(counts[i] for i in pieces):
                        os.close(fd)
                        raise AlreadySent("sent before")
                    for i in pieces:
                        counts[i] = min(9, counts[i] + 1)
                    self._sent_version += 1
                return fd
            os.close(fd)
        raise LookupError("not on disk")


# ---- the HTTP server --------------------------------------------------------------------------------
class PeerServer(ThreadingHTTPServer):
    """Serves ``offers`` (``{"<name>/<revision>": Offer}``) to holders of the token (see the module docstring)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address, port, token_sha256, offers, max_connections=MAX_CONNECTIONS,
                 max_unauthenticated=MAX_UNAUTHENTICATED, header_deadline=HEADER_DEADLINE, idle_timeout=IDLE_TIMEOUT):
        if not (isinstance(token_sha256, bytes) and len(token_sha256) == 32):
            raise PeerError("token_sha256: must be the 32-byte sha256 digest of the run's token")
        self.token_sha256 = token_sha256
        self.offers = offers
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.header_deadline = header_deadline
        self.idle_timeout = idle_timeout
        self.active = 0
        self.requests = 0
        self.denied = 0
        self.evicted = 0      # connections closed before they showed the token (deadline or crowding)
        self.refused = 0      # connections with the token turned away at the cap (503)
        self._count_lock = threading.Lock()
        self._conns = {}      # socket -> _Conn
        self._reaper_stop = threading.Event()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.address_family = family
        ThreadingHTTPServer.__init__(self, (address, port), _Handler)
        self._reaper = threading.Thread(target=self._reap, name="stage-peer-reaper", daemon=True)
        self._reaper.start()

    def count(self, delta):
        with self._count_lock:
            self.active += delta

    # ---- connections: caps and deadlines ------------------------------------------------------------
    def process_request(self, request, client_address):
        now = time.monotonic()
        with self._count_lock:
            waiting = [c for c in self._conns.values() if not c.authed and not c.killed]
            while len(waiting) >= self.max_unauthenticated:
                oldest = min(waiting, key=lambda c: c.opened)
                waiting.remove(oldest)
                oldest.kill()
                self.evicted += 1
            self._conns[request] = _Conn(request, now, now + self.header_deadline)
        try:
            ThreadingHTTPServer.process_request(self, request, client_address)
        except RuntimeError:  # no thread could be started: this connection is not served
            with self._count_lock:
                self._conns.pop(request, None)
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            ThreadingHTTPServer.process_request_thread(self, request, client_address)
        finally:
            with self._count_lock:
                self._conns.pop(request, None)

    def handle_error(self, request, client_address):
        """A client that hung up before its answer was written (a receiver that ended, was killed or gave up; a
        scanner sending one bad line) is no fault of the server: its ``BrokenPipeError`` or ``ConnectionResetError``
        is dropped instead of printed as a traceback in the server's log (``socketserver``'s ``handle_error``), which
        would bury the lines that matter. Anything else is printed as before."""
        if isinstance(sys.exc_info()[1], (ConnectionError, socket.timeout)):
            return
        ThreadingHTTPServer.handle_error(self, request, client_address)

    def phase(self, sock, phase):
        """``head``: waiting for a request (first one: ``header_deadline``, later ones ``idle_timeout``);
        ``busy``: answering one (no deadline here: a stalled receiver is the handler's send timeout)."""
        with self._count_lock:
            c = self._conns.get(sock)
            if c is None:
                return
            if phase == "busy":
                c.deadline = None
            else:
                c.deadline = time.monotonic() + (self.idle_timeout if c.served else self.header_deadline)
                c.served = True

    def admit(self, sock):
        """The connection showed the token: it no longer counts against ``max_unauthenticated``. False when
        ``max_connections`` are already served."""
        with self._count_lock:
            c = self._conns.get(sock)
            if c is None or c.authed:
                return True
            if sum(1 for x in self._conns.values() if x.authed and not x.killed) >= self.max_connections:
                self.refused += 1
                return False
            c.authed = True
            return True

    def connections(self):
        """``(with the token, without it yet)``: connections open now."""
        with self._count_lock:
            live = [c for c in self._conns.values() if not c.killed]
        return sum(1 for c in live if c.authed), sum(1 for c in live if not c.authed)

    def _reap(self):
        while not self._reaper_stop.wait(REAP_INTERVAL):
            now = time.monotonic()
            with self._count_lock:
                for c in list(self._conns.values()):
                    if not c.killed and c.deadline is not None and now > c.deadline:
                        c.kill()
                        if not c.authed:
                            self.evicted += 1

    def server_close(self):
        self._reaper_stop.set()
        with self._count_lock:
            for c in list(self._conns.values()):
                c.kill()
        ThreadingHTTPServer.server_close(self)


class _Conn(object):
    """One client connection as the server tracks it."""

    __slots__ = ("sock", "opened", "deadline", "authed", "served", "killed")

    def __init__(self, sock, opened, deadline):
        self.sock = sock
        self.opened = opened
        self.deadline = deadline
        self.authed = False
        self.served = False
        self.killed = False

    def kill(self):
        """Close the connection under its handler: a read blocked on it returns at once."""
        self.killed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


_REASONS = {200: "OK", 206: "Partial Content", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 416: "Range Not Satisfiable", 503: "Service Unavailable"}


class _Headers(object):
    """A request's headers as :meth:`_Handler.parse_request` read them: names in lower case, the first of each;
    ``get`` and ``[]`` as ``email.message.Message`` has them (None for a header not sent)."""

    __slots__ = ("_fields",)

    def __init__(self, fields):
        self._fields = fields

    def get(self, name, default=None):
        return self._fields.get(name.lower(), default)

    def __getitem__(self, name):
        return self._fields.get(name.lower())

    def __contains__(self, name):
        return name.lower() in self._fields


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmops-stage-peer"
    sys_version = ""
    timeout = 60

    def log_message(self, *args):  # requests are not logged (nothing a peer sends ends up anywhere)
        return

    def setup(self):
        BaseHTTPRequestHandler.setup(self)
        # an answer is its head and then its body, two writes: without this the body of a small answer (a piece
        # list) waits for the receiver's delayed ACK of the head (Nagle), 40 ms a request
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def handle_one_request(self):
        self.server.phase(self.connection, "head")
        BaseHTTPRequestHandler.handle_one_request(self)

    def parse_request(self):
        """The request line and headers, read and checked here instead of by ``http.server`` (which parses every
        head with the ``email`` package): ``command``, ``path``, ``request_version``, ``close_connection`` and
        ``headers`` (:class:`_Headers`). Bounded: the whole head is at most ``MAX_HEAD_BYTES`` in at most
        ``MAX_HEADERS`` lines (else 431), a line that is no ``name: value`` or a folded one is a 400, and the
        connection is closed after either. No header value is ever quoted back.

        Why: measured with ``benchmarks/fanout_wire_cpu.py`` (cProfile, CPU time of every thread), ``http.server``'s
        parse was a quarter of a piece server's CPU (0.21 of 0.85 CPU-s for 636 requests): a receiver asks every
        peer for its list several times a second."""
        self.command = None
        self.request_version = "HTTP/1.0"  # until the line says otherwise; an error answer has a status line
        self.close_connection = True
        raw = self.raw_requestline
        self.requestline = raw.decode("iso-8859-1").rstrip("\r\n")
        words = self.requestline.split(" ")
        if len(raw) > MAX_HEAD_BYTES:
            self.send_error(414, "request line too long")
            return False
        if len(words) != 3 or not words[0].isalpha() or not words[1].startswith("/"):
            self.send_error(400, "bad request line")
            return False
        if words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(505, "HTTP/1.0 or HTTP/1.1 only")
            return False
        self.command, self.path, self.request_version = words
        headers = {}
        total = len(raw)
        for count in range(MAX_HEADERS + 2):
            line = self.rfile.readline(MAX_HEAD_BYTES + 1 - total)
            total += len(line)
            if line in (b"\r\n", b"\n"):
                break
            if total > MAX_HEAD_BYTES or count > MAX_HEADERS:
                self.send_error(431, "request head over %d bytes or %d lines" % (MAX_HEAD_BYTES, MAX_HEADERS))
                return False
            if not line.endswith(b"\n"):  # the client went away (or the deadline shut the socket) mid-head
                return False
            name, sep, value = line.partition(b":")
            if not sep or not name or b" " in name or b"\t" in name or not name.isascii():
                self.send_error(400, "a header line is not 'name: value'")
                return False
            key = name.decode("ascii").lower()
            if key not in headers:  # the first of a repeated header counts, as http.server's did
                headers[key] = value.strip(b" \t\r\n").decode("iso-8859-1")
        self.headers = _Headers(headers)
        conn = headers.get("connection", "").lower()
        self.close_connection = conn == "close" if self.request_version == "HTTP/1.1" else conn != "keep-alive"
        return True

    def _head(self, code, fields):
        """The answer's status line and headers as bytes, ``fields`` ``[(name, value)]`` then
        ``Connection: close`` where this is the last answer on the connection."""
        out = ["HTTP/1.1 %d %s\r\nServer: %s\r\n" % (code, _REASONS.get(code, ""), self.server_version)]
        out += ["%s: %s\r\n" % kv for kv in fields]
        if self.close_connection:
            out.append("Connection: close\r\n")
        out.append("\r\n")
        return "".join(out).encode("latin-1")

    def _send_json(self, code, doc):
        self._send_body(code, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8"))

    def _send_body(self, code, body):
        """Head and body in one write (one segment for a small answer; ``http.server`` builds the head header by
        header, each with its own formatting of the date)."""
        self.wfile.write(self._head(code, (("Content-Type", "application/json"), ("Content-Length", len(body))))
                         + body)

    def _authorized(self):
        value = self.headers.get("Authorization", "")
        given = value[7:].strip() if value[:7].lower() == "bearer " else ""
        ok = hmac.compare_digest(token_digest(given), self.server.token_sha256)
        if not ok:
            with self.server._count_lock:
                self.server.denied += 1
        return ok and bool(given)

    def do_GET(self):
        self.server.phase(self.connection, "busy")
        with self.server._count_lock:
            self.server.requests += 1
        if not self._authorized():
            self.close_connection = True
            return self._send_json(403, {"error": "forbidden: send the run's token as 'Authorization: Bearer'"})
        if not self.server.admit(self.connection):
            self.close_connection = True
            return self._send_json(503, {"error": "busy: %d peers are served; try again" % self.server.max_connections})
        url = urlsplit(self.path)
        path = name_from_url(url.path)  # a file name's bytes, UTF-8 or not
        if path == "/healthz":
            return self._send_json(200, {"ok": True, "revisions": sorted(self.server.offers)})
        parts = path.split("/", 5)
        # /r/<name>/<revision>/<what>[/<file>]
        if len(parts) < 5 or parts[0] != "" or parts[1] != "r":
            return self._send_json(404, {"error": "unknown path"})
        offer = self.server.offers.get(revision_id(parts[2], parts[3]))
        if offer is None:
            return self._send_json(404, {"error": "revision not served here"})
        what = parts[4]
        if what == "pieces" and len(parts) == 5:
            return self._send_pieces(offer, url.query)
        if what == "digests" and len(parts) == 5:
            rel = (parse_qs(url.query, errors="surrogateescape").get("file") or [""])[0]
            e = offer.snapshot()["files"].get(rel)
            if e is None:
                return self._send_json(404, {"error": "file not listed"})
            return self._send_json(200, {"file": rel, "digests": e["digests"]})
        if what == "files" and len(parts) == 6:
            return self._send_file(offer, parts[5])
        return self._send_json(404, {"error": "unknown path"})

    def _send_pieces(self, offer, query):
        """``/pieces``: without a query the whole list as protocol 1 had it (plus the version fields); with
        ``since``, ``epoch``, ``wait`` and ``sent`` (``_stage_fanout_wire.PROTO``) the changes since a version."""
        if not query:
            return self._send_body(200, offer.public_body(self.server.active))
        q = parse_qs(query, keep_blank_values=True, errors="surrogateescape")
        since, epoch, wait, sent = (q.get(k, [None])[-1] for k in ("since", "epoch", "wait", "sent"))
        if since is not None and not (since.isascii() and since.isdigit() and len(since) <= 16):
            return self._send_json(400, {"error": "since: must be the seq of an earlier answer (digits)"})
        if epoch is not None and not (0 < len(epoch) <= 32 and set(epoch) <= _marker._HEX):
            return self._send_json(400, {"error": "epoch: must be the epoch of an earlier answer (hex digits)"})
        try:
            hold = float(wait) if wait is not None else 0.0
            if not 0 <= hold <= MAX_LIST_WAIT:
                raise ValueError
        except ValueError:
            return self._send_json(400, {"error": "wait: must be 0-%g seconds" % MAX_LIST_WAIT})
        if sent not in (None, "0", "1"):
            return self._send_json(400, {"error": "sent: must be 0 or 1"})
        return self._send_body(200, offer.list_body(self.server.active, int(since) if since is not None else None,
                                                    epoch, sent != "0", hold))

    def do_HEAD(self):
        self.server.phase(self.connection, "busy")
        self.close_connection = True
        self._send_json(405, {"error": "only GET"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD

    def _send_file(self, offer, rel):
        try:
            _paths.split_relative(rel, "file")
        except _paths.PathEscape:
            return self._send_json(404, {"error": "file not listed"})
        rng = self.headers.get("Range", "")
        try:
            unit, _eq, spec = rng.partition("=")
            a, _dash, b = spec.strip().partition("-")
            if unit.strip() != "bytes" or "," in spec:
                raise ValueError
            first, last = int(a), int(b)
        except ValueError:
            return self._send_json(416, {"error": "send one 'Range: bytes=first-last'"})
        try:
            fd = offer.open_range(rel, first, last, unsent=self.headers.get(UNSENT_HEADER, "") == "1")
        except AlreadySent:
            return self._send_json(409, {"error": "%s: a transfer of this range was started before; take it from a "
                                                  "peer that holds it" % rel})
        except LookupError as e:
            return self._send_json(404, {"error": "%s: %s" % (rel, e)})
        except ValueError as e:
            return self._send_json(416, {"error": "%s: %s" % (rel, e)})
        self.server.count(1)
        try:
            n = last - first + 1
            self.wfile.write(self._head(206, (("Content-Type", "application/octet-stream"), ("Content-Length", n),
                                              ("Content-Range", "bytes %d-%d/%d" % (first, last, os.fstat(fd).st_size)))))
            self._sendfile(fd, first, last + 1)
        except OSError:
            self.close_connection = True  # the receiver went away
        finally:
            os.close(fd)
            self.server.count(-1)

    def _sendfile(self, fd, offset, end):
        """Bytes ``offset`` to ``end - 1`` of ``fd`` to the receiver with ``os.sendfile`` (no copy in Python). The
        socket is blocking meanwhile, so the kernel waits for the receiver's window itself (this thread is not woken
        each time the send buffer drains a little); ``SO_SNDTIMEO`` bounds each wait to the handler's ``timeout``
        (a receiver that stops reading costs that, then the connection)."""
        sock = self.connection
        before = sock.gettimeout()
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(self.timeout), 0))
        try:
            while offset < end:
                try:
                    sent = os.sendfile(sock.fileno(), fd, offset, min(SEND_CHUNK, end - offset))
                except BlockingIOError:  # nothing went out within SO_SNDTIMEO
                    raise socket.timeout("send timed out")
                if sent <= 0:
                    break
                offset += sent
        finally:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 0))
                sock.settimeout(before)
            except OSError:
                pass


# ---- the daemon -------------------------------------------------------------------------------------
def pid_path(state_dir, address, port):
    return os.path.join(state_dir, "peer-%s-%d.pid" % (address.replace(":", "_"), port))


def config_digest(address, port, token_sha256, revisions, piece_size):
    doc = {"address": address, "port": port, "token": token_sha256.hex(), "piece_size": piece_size,
           "revisions": sorted(revisions.items())}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()


def running(state_dir, address, port):
    """The pid file's record of the live server for ``address:port`` (its lock is held), else None."""
    path = pid_path(state_dir, address, port)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it: the server is gone
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
        with os.fdopen(os.dup(fd), "rb") as f:
            doc = json.loads(f.read(65536).decode("utf-8") or "{}")
        return doc if isinstance(doc, dict) and isinstance(doc.get("pid"), int) else None
    except ValueError:
        return None
    finally:
        os.close(fd)


def check_revisions(revisions):
    """``{"<name>/<revision>": dest}`` of the ``revisions`` option (``[{name, revision, dest}]``), every entry checked
    before anything starts; :class:`PeerError` names the entry's option (``revisions[<i>].dest``) and the fix.

    ``name`` and ``revision`` are directory names; ``dest`` is what ``model_stage`` would accept as its own ``dest``
    (``_stage_fanout_wire.check_options`` and ``_stage_layout.Layout``: absolute, not the root, naming a
    directory), so the server is never started over a path no staging run writes.
    """
    out = {}
    for i, r in enumerate(revisions):
        for key in ("name", "revision"):
            v = r.get(key)
            if not isinstance(v, str) or not v or "/" in v or v in (".", "..") or "\x00" in v:
                raise PeerError("revisions[%d].%s: must be a directory name (no '/', not '.' or '..')" % (i, key),
                                option="revisions[%d].%s" % (i, key), reason="not_a_directory_name")
        dest = r.get("dest")
        try:
            _stage_fanout_wire.check_options(dest=dest)
            _stage_layout.Layout(dest)
        except (ValueError, _marker.StageError) as e:  # both say "dest: <why and fix>"
            raise PeerError("revisions[%d].%s" % (i, e), option="revisions[%d].dest" % i, reason="bad_dest")
        rid = revision_id(r["name"], r["revision"])
        if rid in out:
            raise PeerError("revisions[%d]: %s is listed twice; list each revision once" % (i, rid),
                            option="revisions[%d]" % i, reason="duplicate_revision")
        out[rid] = os.path.abspath(dest)
    return out


def parse_token_sha256(value):
    """The 32-byte digest from ``token_sha256`` (64 hex digits) or :class:`PeerError` naming the option."""
    if not isinstance(value, str) or len(value.strip()) != 64 or not set(value.strip().lower()) <= set("0123456789abcdef"):
        raise PeerError("token_sha256: must be the sha256 of the run's token as 64 hex digits (the role passes "
                        "model_stage_fanout_token | hash('sha256')); the token itself never goes to the server",
                        option="token_sha256", reason="bad_token_sha256")
    return bytes.fromhex(value.strip().lower())


def start(state_dir, address, port, token_sha256, revisions, piece_size, lifetime, timeout=15.0):
    """Start the server daemon (replacing one on ``address:port`` with another configuration).

    ``token_sha256``: the 32-byte sha256 of the run's token (the server never sees the token itself).
    ``revisions``: ``{"<name>/<revision>": dest}``. Returns ``(changed, record)``.
    """
    tsha = token_sha256
    digest = config_digest(address, port, tsha, revisions, piece_size)
    cur = running(state_dir, address, port)
    if cur is not None and cur.get("config") == digest:
        return False, cur
    if cur is not None:
        stop(state_dir, address, port)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    try:
        offers = dict((rid, Offer(dest, piece_size)) for rid, dest in revisions.items())
    except _marker.StageError as e:  # a dest check_revisions would have refused (a caller that skipped it)
        raise PeerError("revisions: %s" % e, option="revisions", reason="bad_dest")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.chdir("/")  # the task's temporary directory goes away
            _daemon(state_dir, address, port, tsha, offers, digest, lifetime, w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _w, _x = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        raise PeerError("the peer server on %s:%d did not report within %g s" % (address, port, timeout))
    if doc.get("error"):
        raise PeerError(doc["error"])
    return True, doc


def _daemon(state_dir, address, port, tsha, offers, digest, lifetime, w):  # pragma: no cover - child
    def report(doc):
        os.write(w, json.dumps(doc).encode("utf-8"))
        os.close(w)

    try:
        server = PeerServer(address, port, tsha, offers)
    except OSError as e:
        hint = ("another process listens there; stop it or choose another port"
                if e.errno == errno.EADDRINUSE else "use an address of this node")
        report({"error": "address/port: cannot listen on %s:%d (%s); %s" % (address, port, e.strerror, hint)})
        return
    path = pid_path(state_dir, address, port)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    rec = {"pid": os.getpid(), "address": address, "port": server.server_address[1], "config": digest,
           "started": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(rec).encode("utf-8"), 0)
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    os.close(null)

    def shut(*_args):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut)
    signal.signal(signal.SIGINT, shut)
    if lifetime:
        timer = threading.Timer(lifetime, shut)
        timer.daemon = True
        timer.start()
    report(rec)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        try:
            mine, there = os.fstat(fd), os.lstat(path)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def stop(state_dir, address, port, timeout=10.0):
    """Stop the server on ``address:port``; returns the record of the one stopped, or None."""
    cur = running(state_dir, address, port)
    if cur is None:
        _stage_layout.try_unlink(pid_path(state_dir, address, port))
        return None
    pid = cur["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return cur
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running(state_dir, address, port) is None:
            return cur
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return cur
