# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: receiving a revision piece by piece from peers, the shared filesystem being
the last resort.

The chain of trust. A *seed* stages from the shared filesystem and records the sha256 of every piece from the
bytes it read there (``_stage_copy.Copier(piece_size=...)``, marker format 3). A receiver accepts a piece only
when its sha256 equals the digest a **seed** published for it, and a seed's digests for a file only when the
seed's entry has the identity the receiver itself reads on the shared filesystem: same size, same source inode,
mtime and ctime, same safetensors header digest. Which peers are seeds is the controller's word (``peers[].seed``,
set by the role from the inventory), and every request carries the run's token. Digests from other peers are
never used: any peer can be the source of bytes, none of digests. A lying or broken peer therefore costs a
refetch (``bad_pieces_rejected``; the peer is dropped), never a wrong byte in ``dest``.

:class:`Receiver` runs ``PEER_STREAMS * streams`` workers (at most ``streams`` of them reading src at once).
Each takes the next piece not yet held for which a digest is trusted and some live peer holds it, from the least
loaded of those peers (its reported transfers plus this receiver's; a seed's uplink is spared the pieces it already
sent, see :meth:`Receiver._pick`), reads it into an aligned buffer while hashing it, compares, and writes it in
place with O_DIRECT (``_stage_copy.RawFile``) into ``<file>.llmops-part`` in ``<dest>.partial``; it then marks
it held on the board (``_stage_peer.Board``), so this node's own server hands it on at once. A piece is read from
the shared filesystem itself (under the fleet read slots, at most ``read_rate_limit`` bytes/s per stream) only when
no seed can provide it any more (every seed dropped, failed, or silent for ``seed_stale`` seconds, or never seen within
``seed_wait`` seconds), or when no seed's entry for the file matches the source. A file whose pieces are all held
gets the same checks as a copy (size, header byte for byte against the source's, sha256 in ``verify=sha256``:
the seed's digest of the whole file when it equals the manifest's, else a read of the copy), the source's mode
and mtime, fsync, its name, and its journal line: resume, publish and the marker are the copy's.

Every peer may lie, and lying costs bounded time. A piece list is read under ``_untrusted.loads_json`` (a size
cap of ``PIECES_MAX_BYTES`` plus a few bytes per piece, ``PIECES_MAX_DEPTH``, finite numbers) and checked field by
field (:func:`parse_piece_list`: ``have`` and ``sent`` are ASCII digits, counters in range, types exact); one that
is not, or none within ``timeout``, is a failed try. Transfers that end in an error answer, break off, stall (not
in within ``timeout + size / MIN_PEER_RATE``, however the bytes trickle) or ask for a piece the peer listed but
does not serve (one try per piece list) are failed tries too. ``MAX_PEER_TRIES`` failed tries in a row drop the
peer; a bad piece, a lie about digests or a refused token drop it at once. Every seed that lists a piece gives its
digest before any byte of the piece is taken: two seeds that disagree are judged by reading that piece from the
shared filesystem (:meth:`Receiver._judge`), and every seed whose digest differs is dropped with ``lied: true``.

Peers are spoken to over one persistent ``http.client`` connection per stream and peer (a 64 MiB piece per
request, and a piece list four times a second per peer, are the data plane: a new connection and TLS context per
request, as ``_http.open_response`` makes, costs more than the transfer on a loaded host). Failures are
``_http.HttpError``, whose messages name the URL without credentials; the token is only ever a header.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import math
import mmap
import os
import random
import socket
import threading
import time
from collections import deque
from urllib.parse import quote, unquote, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_progress
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_copy import RawFile
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_progress import human_bytes
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, loads_json

_HEX = _marker._HEX
socket_timeout = TimeoutError
# pulls in flight per read stream: a peer's uplink is shared by every receiver, so one transfer gets a fraction
# of it, and filling this node's downlink takes several; reads from src stay at ``streams`` (and the fleet slots)
PEER_STREAMS = 2
#: A peer is dropped after this many failed tries in a row: piece lists that are no answer or not a piece list,
#: or transfers that end in an error answer, break off, stall, or ask for a piece it lists but does not serve.
#: A bad piece, a lie about digests or a refused token drops it at once.
MAX_PEER_TRIES = 3
#: Slowest rate a transfer may keep: a piece not in within ``timeout + size / MIN_PEER_RATE`` seconds has
#: stalled (however the bytes trickle in), and a piece list not in within ``timeout`` seconds likewise.
MIN_PEER_RATE = 4 * 1024 * 1024
#: A ``/pieces`` answer: at most this many bytes plus ``PIECES_BYTES_PER_PIECE`` per piece of the files
#: received (the ``have`` and ``sent`` strings), nested at most ``PIECES_MAX_DEPTH`` levels (answer, files,
#: entry, ``src``).
PIECES_MAX_BYTES = 4 * 1024 * 1024
PIECES_BYTES_PER_PIECE = 4
PIECES_MAX_DEPTH = 4
#: A ``/digests`` answer: this much plus 80 bytes per piece of the file (``"<64 hex>",``).
DIGESTS_MAX_BYTES = 64 * 1024
#: Largest ``load`` (transfers in flight) a peer may report; a peer's server admits far fewer connections.
MAX_PEER_LOAD = 4096
PEER_STATES = ("idle", "copying", "failed", "done", "complete")
#: Largest piece: a piece is one buffer per pulling worker.
MAX_PIECE_SIZE = 1024 * 1024 * 1024


class PeerLie(ValueError):
    """A peer's answer that is not what the protocol says; ``str()`` says what is wrong, never quotes it."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _hex64(v, what):
    if v is None:
        return None
    if not isinstance(v, str) or len(v) != 64 or not set(v) <= _HEX:
        raise PeerLie("%s is not a sha256 (64 lowercase hex digits)" % what)
    return v


def parse_piece_list(body, piece_size, max_bytes=PIECES_MAX_BYTES):
    """The ``/pieces`` answer ``body`` (bytes) of a peer, checked field by field; raises :class:`PeerLie`.

    Parsed with ``_untrusted.loads_json`` (``max_bytes``, ``PIECES_MAX_DEPTH``, finite numbers). Returns
    ``{"state", "board_age", "load", "files": {rel: {"size", "src", "header_sha256", "sha256", "have",
    "sent"}}}``; ``have`` is ASCII ``0``/``1`` per piece, ``sent`` ASCII ``0``-``9`` per piece or None.
    """
    try:
        doc = loads_json(body, "the piece list", max_depth=PIECES_MAX_DEPTH, max_bytes=max_bytes)
    except UntrustedInput as e:
        raise PeerLie(str(e))
    if not isinstance(doc, dict):
        raise PeerLie("the piece list is not a JSON object")
    if not _is_int(doc.get("piece_size")) or doc["piece_size"] != piece_size:
        raise PeerLie("the piece list is not at this run's piece size (%d)" % piece_size)
    state = doc.get("state")
    if state is not None and state not in PEER_STATES:
        raise PeerLie("state is not one of %s" % ", ".join(PEER_STATES))
    age = doc.get("board_age")
    if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float)) or not 0 <= age < 1e9):
        raise PeerLie("board_age is not a number of seconds")
    load = doc.get("load", 0)
    if not _is_int(load) or not 0 <= load <= MAX_PEER_LOAD:
        raise PeerLie("load is not a count of transfers (0-%d)" % MAX_PEER_LOAD)
    files = doc.get("files", {})
    if not isinstance(files, dict):
        raise PeerLie("files is not an object")
    out = {}
    for rel, e in files.items():
        what = "files[%d]" % len(out)
        if not isinstance(e, dict):
            raise PeerLie("%s is not an object" % what)
        size = e.get("size")
        if not _is_int(size) or size < 0:
            raise PeerLie("%s.size is not a byte count" % what)
        src = e.get("src")
        if not (isinstance(src, list) and len(src) == 3 and all(_is_int(x) and x >= 0 for x in src)):
            raise PeerLie("%s.src is not [ino, mtime_ns, ctime_ns]" % what)
        n = _marker.piece_count(size, piece_size)
        have = e.get("have")
        if not isinstance(have, str) or len(have) != n or not set(have) <= set("01"):
            raise PeerLie("%s.have is not one ASCII 0 or 1 per piece" % what)
        sent = e.get("sent")
        if sent is not None and (not isinstance(sent, str) or len(sent) != n or not set(sent) <= set("0123456789")):
            raise PeerLie("%s.sent is not one ASCII digit per piece" % what)
        out[rel] = {"size": size, "src": list(src), "have": have, "sent": sent,
                    "header_sha256": _hex64(e.get("header_sha256"), what + ".header_sha256"),
                    "sha256": _hex64(e.get("sha256"), what + ".sha256")}
    return {"state": state, "board_age": age, "load": load, "files": out}


def parse_digests(body, n):
    """The ``/digests`` answer of a file of ``n`` pieces: a list of ``n`` sha256 or None; raises :class:`PeerLie`."""
    try:
        doc = loads_json(body, "the digest list", max_depth=2, max_bytes=DIGESTS_MAX_BYTES + 80 * n)
    except UntrustedInput as e:
        raise PeerLie(str(e))
    digests = doc.get("digests") if isinstance(doc, dict) else None
    if not isinstance(digests, list) or len(digests) != n:
        raise PeerLie("the digest list does not hold one entry per piece")
    return [_hex64(d, "digests[%d]" % i) for i, d in enumerate(digests)]


def check_peer_url(url, field):
    """``url`` as ``http://<host>:<port>/r/<name>/<revision>`` or :class:`ValueError` naming ``field``."""
    fix = "write it as http://<address>:<port>/r/<name>/<revision> (the role builds it)"
    if not isinstance(url, str) or not url.strip():
        raise ValueError("%s: must be a URL; %s" % (field, fix))
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ValueError("%s: holds whitespace or control characters; %s" % (field, fix))
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "http":
        raise ValueError("%s: the piece servers speak plain http:// only; %s" % (field, fix))
    netloc = rest.split("/", 1)[0]
    if "@" in netloc:
        raise ValueError("%s: holds credentials (user@ or user:password@); the token goes in peer_token" % field)
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        raise ValueError("%s: the port is not a number 1-65535; %s" % (field, fix))
    if not u.hostname:
        raise ValueError("%s: has no host; %s" % (field, fix))
    if port is None or not 0 < port < 65536:
        raise ValueError("%s: needs an explicit port 1-65535; %s" % (field, fix))
    if u.query or u.fragment or "?" in url or "#" in url:
        raise ValueError("%s: must not have a query or fragment; %s" % (field, fix))
    parts = u.path.rstrip("/").split("/")
    if len(parts) != 4 or parts[:2] != ["", "r"] or any(unquote(p) in ("", ".", "..") or "/" in unquote(p)
                                                        for p in parts[2:]):
        raise ValueError("%s: the path must be /r/<name>/<revision>; %s" % (field, fix))
    return url


def check_options(piece_size=None, peers=None, peer_token=None, fleet_slots_dir=None, fleet_stale_seconds=None,
                  dest=None):
    """Refuse options that shape the fan-out protocol before anything is prepared; ``ValueError`` names the
    option and the fix. ``piece_size`` None: no pieces this run (not checked)."""
    if dest is not None:
        if not isinstance(dest, str) or not dest or "\x00" in dest:
            raise ValueError("dest: must be a path; set it to <dest root>/<name>/<revision> on node-local storage")
        if not os.path.isabs(dest):
            raise ValueError("dest: %s is relative; give an absolute path under the node-local dest root" % dest)
        if os.path.realpath(dest) == "/":  # "//", "/.", "/x/.." and a link to / are all the root
            raise ValueError("dest: must not be the root directory; use <dest root>/<name>/<revision>")
    if piece_size is not None:
        if not _marker.valid_piece_size(piece_size) or piece_size > MAX_PIECE_SIZE:
            raise ValueError("piece_size: must be a positive multiple of %d bytes up to %d (1 GiB) (got %r); use "
                             "e.g. 67108864 (64 MiB), the same on every node"
                             % (_marker.PIECE_ALIGN, MAX_PIECE_SIZE, piece_size))
    peers = list(peers or [])
    seen = set()
    for i, peer in enumerate(peers):
        if not isinstance(peer, dict):
            raise ValueError("peers[%d]: must be a mapping {url, seed}" % i)
        url = check_peer_url(peer.get("url"), "peers[%d].url" % i)
        if not isinstance(peer.get("seed", False), (bool, type(None))):
            raise ValueError("peers[%d].seed: must be true or false" % i)
        key = url.rstrip("/")
        if key in seen:
            raise ValueError("peers[%d].url: is listed twice; list each peer once" % i)
        seen.add(key)
    if peers:
        if not isinstance(peer_token, str) or not peer_token:
            raise ValueError("peer_token: required with peers (the run's token the peers' servers expect)")
        if len(peer_token) < 16 or any(c.isspace() or not c.isprintable() or ord(c) > 126 for c in peer_token):
            raise ValueError("peer_token: must be at least 16 printable ASCII characters without spaces; use "
                             "the run's generated token")
    if fleet_slots_dir and fleet_stale_seconds is not None:
        v = fleet_stale_seconds
        least = _fleet_slots.MIN_STALE_SECONDS
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not least <= v <= 86400:
            raise ValueError("fleet_stale_seconds: must be %g-86400 seconds (got %r): a lease refreshed every %g s "
                             "must not be taken over while its holder lives; the default is 60"
                             % (least, v, _fleet_slots.HEARTBEAT))


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


class SourcedProgress(_stage_progress.Progress):
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


class _Watchdog(object):
    """Shuts ``conn``'s socket down ``seconds`` from now unless cancelled: a read blocked on a peer that
    trickles bytes then returns at once (``fired`` says why)."""

    def __init__(self, conn, seconds):
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):
        self.fired = True
        sock = getattr(self._conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self):
        self._timer.cancel()


class PeerLink(object):
    """One peer as this receiver sees it."""

    def __init__(self, url, seed):
        self.url = url.rstrip("/")
        u = urlsplit(self.url)
        self.host = u.hostname
        self.port = u.port or 80
        self.base = u.path
        self.seed = bool(seed)
        self.alive = True
        self.why_dropped = None
        self.failures = 0          # piece lists in a row that were no answer or not a piece list
        self.strikes = 0           # transfers in a row that failed (error answer, break, stall, not served)
        self.lists = 0             # piece lists taken in from it
        self.unserved_at = None    # ``lists`` when a piece it listed was last not served
        self.lied = False
        self.inflight = 0
        self.load = 0
        self.state = None          # the peer's last /pieces "state"
        self.board_age = None
        self.have = {}             # rel -> "0101" as last seen
        self.sent = {}             # rel -> "0120": transfers of each piece a seed's server started
        self.entries = {}          # rel -> its /pieces entry
        self.bytes = 0
        self.bad = 0
        self.seen_at = None
        self.mismatch = set()      # files whose entry here is not today's source file
        self.claimed = {}          # rel -> indices of the pieces whose digest this (seed) peer gave

    def holds(self, rel, i):
        h = self.have.get(rel)
        return h is not None and i < len(h) and h[i] == "1"

    def sent_count(self, rel, i):
        c = self.sent.get(rel)
        return int(c[i]) if c is not None and i < len(c) else 0


class _FileState(object):
    def __init__(self, f, partial, piece_size):
        self.f = f
        self.rel = f["path"]
        self.n = _marker.piece_count(f["size"], piece_size)
        self.trusted = [None] * self.n      # digests from a seed whose entry matches the source
        self.digests = [None] * self.n      # digests of the pieces held
        self.held = [False] * self.n
        self.inflight = set()
        self.excluded = [set() for _i in range(self.n)]
        self.sent_at = [None] * self.n      # when a seed was first seen to have sent the piece to some peer
        self.claims = [dict() for _i in range(self.n)]  # seeds' digests: {PeerLink: sha256}
        self.disputed = set()               # pieces whose seeds disagree, being judged on the shared filesystem
        self.judged = [False] * self.n      # trusted[i] is the shared filesystem's own digest
        self.final = _paths.contained(partial, self.rel, "src")
        self.part = self.final + _marker.PART_SUFFIX
        self.created = False
        self.seed_sha256 = None
        self.source_only = False
        self.finished = False
        self.direct = True


class Receiver(object):
    """Pulls ``files`` from ``peers`` into ``partial`` (see the module docstring)."""

    def __init__(self, src, partial, mode, content, peers, token, piece_size, streams, slots, progress, do_fsync,
                 direct_io=True, journal=None, board=None, peer_rate_limit=0, read_rate_limit=0, poll=0.25,
                 seed_wait=120.0, seed_stale=15.0, timeout=30.0, max_failures=MAX_PEER_TRIES):
        self.src = src
        self.partial = partial
        self.mode = mode
        self.content = content
        self.links = [PeerLink(p["url"], p.get("seed")) for p in peers]
        self.token = token
        self.piece_size = piece_size
        self.streams = max(1, streams)
        self.workers = PEER_STREAMS * self.streams
        self._src_streams = threading.BoundedSemaphore(self.streams)
        self.slots = slots
        self.progress = progress
        self.do_fsync = do_fsync
        self.direct_io = direct_io
        self.journal = journal
        self.board = board
        self.peer_rate_limit = peer_rate_limit
        self.read_rate_limit = read_rate_limit
        self.poll = poll
        self.seed_wait = seed_wait
        self.seed_stale = seed_stale
        self.timeout = timeout
        self.max_failures = max_failures
        self.records = {}
        self.bytes_from_source = 0
        self.bytes_from_peers = 0
        self.bad_pieces_rejected = 0
        self.pieces_judged = 0
        self.direct_files = 0
        self.dropped = []
        self._pieces_limit = PIECES_MAX_BYTES
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._errors = []
        self._files = []
        self._t0 = None
        self._local = threading.local()
        self._piece_secs = deque(maxlen=16)  # the last peer transfers (s): how long a handed-out piece may take

    # ---- peers -----------------------------------------------------------------------------------
    def _headers(self):
        return {"Authorization": "Bearer " + self.token}

    def _request(self, link, path, headers, seconds):
        """GET ``path`` (below the peer's revision URL) on this thread's connection to ``link``; ``(response,
        watchdog)`` (status read, body not; the watchdog shuts the connection down ``seconds`` after the request
        started, so a peer that trickles bytes cannot hold this thread: cancel it once the body is read).
        Transport failures are ``_http.HttpError`` without a status."""
        conns = self._local.__dict__.setdefault("conns", {})
        url = link.url + path
        for attempt in (0, 1):
            conn = conns.get(link.url)
            if conn is None:
                conn = conns[link.url] = http.client.HTTPConnection(link.host, link.port, timeout=self.timeout)
            wd = _Watchdog(conn, seconds)
            try:
                conn.request("GET", link.base + path, headers=headers)
                return conn.getresponse(), wd
            except (OSError, http.client.HTTPException) as e:
                wd.cancel()
                conn.close()
                conns.pop(link.url, None)
                timed_out = wd.fired or isinstance(e, socket_timeout)
                # a kept-alive connection the peer closed meanwhile is retried once on a new one
                if attempt or timed_out or isinstance(e, ConnectionRefusedError):
                    why = ("no answer within %g s" % seconds) if wd.fired else (str(e) or type(e).__name__)
                    raise _http.HttpError("GET", url, why, timed_out=timed_out,
                                          refused=isinstance(e, ConnectionRefusedError))
        raise AssertionError("unreachable")

    def _close_conn(self, link):
        conn = self._local.__dict__.get("conns", {}).pop(link.url, None)
        if conn is not None:
            conn.close()

    def _get_body(self, link, path, limit):
        """The body of a 200 answer to ``GET path``, at most ``limit`` bytes (else :class:`PeerLie`), all of it
        within ``timeout`` seconds."""
        resp, wd = self._request(link, path, self._headers(), self.timeout)
        try:
            body = resp.read(limit + 1)
        except (OSError, http.client.HTTPException) as e:
            self._close_conn(link)
            why = "no whole answer within %g s" % self.timeout if wd.fired else (str(e) or type(e).__name__)
            raise _http.HttpError("GET", link.url + path, "the answer broke off: %s" % why, timed_out=wd.fired)
        finally:
            wd.cancel()
        if wd.fired or not resp.isclosed():
            self._close_conn(link)  # the rest of an answer not read is no start for the next request
        if wd.fired:
            raise _http.HttpError("GET", link.url + path, "no whole answer within %g s" % self.timeout,
                                  timed_out=True)
        if resp.status != 200:
            raise _http.HttpError("GET", link.url + path, "HTTP %d" % resp.status, status=resp.status)
        if len(body) > limit:
            raise PeerLie("the answer is over the %d-byte limit for it" % limit)
        return body

    def _drop(self, link, why, lied=False):
        with self._cond:
            if link.alive:
                link.alive = False
                link.lied = lied
                link.why_dropped = why
                self.dropped.append({"url": link.url, "reason": why, "lied": bool(lied), "seed": link.seed})
            self._cond.notify_all()

    def _poll_loop(self, link):
        while not self._stop.is_set() and link.alive:
            try:
                body = self._get_body(link, "/pieces", self._pieces_limit)
                self._absorb(link, parse_piece_list(body, self.piece_size, self._pieces_limit))
                link.failures = 0
            except _http.HttpError as e:
                if e.status == 403:
                    self._drop(link, "refused this run's token (HTTP 403)")
                    return
                link.failures += 1
                if link.failures >= self.max_failures:
                    self._drop(link, "unreachable after %d tries (%s)" % (
                        link.failures, e.status or ("stalled" if e.timed_out else "no answer")))
                    return
            except PeerLie as e:
                link.failures += 1
                if link.failures >= self.max_failures:
                    self._drop(link, "answered %d times with something that is not a piece list (%s)"
                               % (link.failures, e))
                    return
            except (StageError, _safetensors.CheckpointError) as e:  # judging a dispute could not read src
                with self._cond:
                    self._errors.append(e)
                    self._cond.notify_all()
                return
            self._stop.wait(self.poll)

    def _absorb(self, link, doc):
        """Take in a piece list (:func:`parse_piece_list`'s form) from ``link``."""
        files = doc["files"]
        fetch = []
        with self._cond:
            # the pulling workers are woken only when there is something new to take: a piece list arrives
            # several times a second per peer, and waking every worker for each costs more CPU than the transfers
            state = doc["state"]
            changed = state != link.state
            link.state = state
            link.board_age = doc["board_age"]
            link.load = doc["load"]
            link.seen_at = time.monotonic()
            link.lists += 1
            for fs in self._files:
                e = files.get(fs.rel)
                if e is None:
                    link.have.pop(fs.rel, None)
                    continue
                if not self._matches(fs, e):
                    link.have.pop(fs.rel, None)
                    link.mismatch.add(fs.rel)
                    continue
                have = e["have"]
                changed = changed or link.have.get(fs.rel) != have
                link.have[fs.rel] = have
                link.entries[fs.rel] = e
                sent = e.get("sent") if link.seed else None  # only a seed's uplink is spared
                if sent is not None:
                    link.sent[fs.rel] = sent
                    now = time.monotonic()
                    for i, c in enumerate(sent):
                        if c != "0" and fs.sent_at[i] is None:
                            fs.sent_at[i] = now
                if link.seed:
                    claimed = link.claimed.get(fs.rel, ())
                    if any(h == "1" and i not in claimed for i, h in enumerate(have)):
                        fetch.append(fs)
            if changed:
                self._cond.notify_all()
        for fs in fetch:
            if link.alive:
                self._fetch_digests(link, fs)

    def _matches(self, fs, e):
        """The peer's entry describes today's source file (size, inode, mtime, ctime, header digest)."""
        f = fs.f
        if e.get("size") != f["size"] or e.get("src") != [f["ino"], f["mtime_ns"], f["ctime_ns"]]:
            return False
        mine = self.content.header_digests.get(fs.rel)
        return not (mine and e.get("header_sha256") not in (None, mine))

    def _fetch_digests(self, link, fs):
        """Take a seed's digests of ``fs``'s pieces. The first seed's digest of a piece is trusted; a seed that
        gives another one starts a dispute the shared filesystem settles (:meth:`_judge`)."""
        digests = parse_digests(self._get_body(link, "/digests?file=" + quote(fs.rel, safe=""),
                                               DIGESTS_MAX_BYTES + 80 * fs.n), fs.n)
        e = link.entries.get(fs.rel) or {}
        disputes, lies = [], []
        with self._cond:
            have = link.have.get(fs.rel) or ""
            silent = [i for i, h in enumerate(have) if h == "1" and i < fs.n and digests[i] is None]
            if silent:
                raise PeerLie("it lists %s piece %d held but gives no digest for it" % (fs.rel, silent[0]))
            claimed = link.claimed.setdefault(fs.rel, set())
            for i, d in enumerate(digests):
                if d is None:
                    continue
                before = fs.claims[i].get(link)
                if before is not None:
                    if before != d:
                        lies.append("gave two digests of %s piece %d" % (fs.rel, i))
                    continue
                claimed.add(i)
                fs.claims[i][link] = d
                if fs.judged[i]:
                    if d != fs.trusted[i]:
                        lies.append("its digest of %s piece %d is not the shared filesystem's" % (fs.rel, i))
                elif fs.trusted[i] is None and i not in fs.disputed:
                    fs.trusted[i] = d
                elif fs.trusted[i] != d and i not in fs.disputed:
                    fs.disputed.add(i)
                    disputes.append(i)
            sha = e.get("sha256")
            if isinstance(sha, str) and fs.seed_sha256 is None:
                fs.seed_sha256 = sha
            self._cond.notify_all()
        if lies:
            self._drop(link, "lied: " + lies[0], lied=True)
        for i in disputes:
            self._judge(fs, i)

    def _judge(self, fs, i):
        """Seeds disagree on piece ``i`` (marked disputed by the caller): read it from the shared filesystem,
        trust that digest, drop every seed that claimed another one, and fetch the piece again if this node
        holds it under the wrong digest."""
        buf = mmap.mmap(-1, self.piece_size)
        try:
            digest, _n = self._read_source(fs, i, buf, Throttle(self.read_rate_limit))
        except BaseException:
            with self._cond:
                fs.disputed.discard(i)
                self._cond.notify_all()
            raise
        finally:
            buf.close()
        with self._cond:
            fs.trusted[i] = digest
            fs.judged[i] = True
            fs.disputed.discard(i)
            self.pieces_judged += 1
            liars = [p for p, d in fs.claims[i].items() if d != digest]
            wrong = fs.held[i] and fs.digests[i] != digest
            if wrong and not fs.finished:
                fs.held[i] = False  # taken again, against the shared filesystem's digest
            self._cond.notify_all()
        for p in liars:
            self._drop(p, "lied: its digest of %s piece %d is not the shared filesystem's (the seeds disagreed; "
                          "the shared filesystem settled it)" % (fs.rel, i), lied=True)
        if wrong and fs.finished:
            _stage_layout.try_unlink(fs.final)
            raise StageError("fan-out: %s was completed from a seed whose digest of piece %d the shared filesystem "
                             "contradicts (%s); the copy is removed: run again" % (
                                 fs.rel, i, ", ".join(p.url for p in liars)))

    def _seed_can_provide(self, rel):
        """Some seed may still give ``rel``'s digests: waiting for it beats reading the shared filesystem."""
        now = time.monotonic()
        for link in self.links:
            if not link.seed or not link.alive or rel in link.mismatch:
                continue
            if link.state in ("complete", "done") and rel in link.have:
                return True
            # a published seed still reading back the digests of a copy staged without them lists it later
            if link.state == "complete" and now - self._t0 < self.seed_wait:
                return True
            if link.state == "copying" and (link.board_age is None or link.board_age < self.seed_stale):
                return True
            if link.state in (None, "idle") and now - self._t0 < self.seed_wait:
                return True
        return False

    # ---- choosing work -----------------------------------------------------------------------------
    def _pick(self):
        """The next ``(file, piece, peer)`` to move (``peer`` None: from src), or None when nothing is left.

        The candidates are the first pieces still missing (a window of ``8 * streams``, in file order, so files
        complete one after another), each with the live peers that hold it. Every holder's uplink is shared by all
        receivers, so the piece taken is the one whose least loaded holder is least loaded (its reported transfers
        plus this receiver's); among equals the one the fewest peers hold, then a piece a seed never sent anybody,
        then at random. A seed is asked at most one piece at a time per receiver while other peers are there to
        trade with, and not for a piece it sent somebody less than :meth:`_dup_after` seconds ago that nobody else
        lists yet: each piece leaves a seed's uplink about once and the receivers trade the rest.
        """
        window = 8 * self.streams
        with self._cond:
            while True:
                if self._errors or self._stop.is_set():
                    return None
                open_files = [fs for fs in self._files if not all(fs.held)]
                if not open_files:
                    return None
                traders = any(p.alive and not p.seed for p in self.links)
                seed_cap = 1 if traders else self.workers
                dup_after = self._dup_after()
                now = time.monotonic()
                waiting = False
                best, best_key, seen = [], None, 0
                for fs in open_files:
                    if seen >= window:
                        break
                    seeds_on = self._seed_can_provide(fs.rel)
                    for i in range(fs.n):
                        if fs.held[i] or i in fs.inflight:
                            continue
                        if i in fs.disputed:  # the shared filesystem is being asked which seed is right
                            waiting = True
                            continue
                        if any(p.seed and p.alive and p.holds(fs.rel, i) and p not in fs.claims[i] for p in self.links):
                            waiting = True  # every seed listing the piece gives its digest first: disputes
                            continue        # are settled before a byte of it is taken
                        if fs.trusted[i] is not None and not fs.source_only:
                            holders = [p for p in self.links if p.alive and p.holds(fs.rel, i)
                                       and p not in fs.excluded[i]]
                            if holders:
                                seen += 1
                                usable, fresh = self._usable(fs, i, holders, seed_cap, dup_after, now)
                                if usable:
                                    low = min(p.load + p.inflight for p in usable)
                                    key = (low, len(holders), not fresh)
                                    cands = [p for p in usable if p.load + p.inflight == low]
                                    if best_key is None or key < best_key:
                                        best, best_key = [(fs, i, cands)], key
                                    elif key == best_key:
                                        best.append((fs, i, cands))
                                else:
                                    waiting = True
                                if seen >= window:
                                    break
                                continue
                        if not best and (fs.source_only or not seeds_on):
                            fs.inflight.add(i)
                            return fs, i, None
                        waiting = True
                if best:
                    fs, i, cands = random.choice(best)
                    link = random.choice(cands)
                    link.inflight += 1
                    fs.inflight.add(i)
                    return fs, i, link
                if not waiting:
                    return None  # everything left is in flight
                self._cond.wait(self.poll)

    @staticmethod
    def _usable(fs, i, holders, seed_cap, dup_after, now):
        """The holders of piece ``i`` this receiver may ask now, and whether a seed among them never sent it."""
        others = any(not p.seed for p in holders)
        usable, fresh = [], False
        for p in holders:
            if not p.seed:
                usable.append(p)
                continue
            if p.inflight >= seed_cap:
                continue
            if p.sent_count(fs.rel, i) == 0:
                usable.append(p)
                fresh = True
            elif others or (fs.sent_at[i] is not None and now - fs.sent_at[i] > dup_after):
                usable.append(p)
        return usable, fresh

    def _dup_after(self):
        """Seconds a piece a seed handed out may take to show up at some peer: three typical transfers, at least
        two seconds (called with the lock held)."""
        if not self._piece_secs:
            return 2.0
        secs = sorted(self._piece_secs)
        return max(2.0, 3 * secs[len(secs) // 2])

    def _worker(self):
        buf = mmap.mmap(-1, self.piece_size)
        src_throttle = Throttle(self.read_rate_limit)
        peer_throttles = {}
        try:
            while True:
                job = self._pick()
                if job is None:
                    with self._cond:
                        if self._errors or self._stop.is_set() or all(all(fs.held) for fs in self._files):
                            return
                        self._cond.wait(self.poll)
                    continue
                fs, i, link = job
                try:
                    if link is None:
                        self._from_source(fs, i, buf, src_throttle)
                    else:
                        t = peer_throttles.setdefault(link.url, Throttle(self.peer_rate_limit))
                        self._from_peer(fs, i, link, buf, t)
                    with self._cond:
                        last = all(fs.held) and not fs.finished
                        if last:
                            fs.finished = True
                    if last:
                        self._finish(fs)
                except BaseException as e:
                    with self._cond:
                        fs.inflight.discard(i)
                        self._errors.append(e)
                        self._cond.notify_all()
                    return
        finally:
            buf.close()

    # ---- moving a piece ---------------------------------------------------------------------------
    def _span(self, fs, i):
        off = i * self.piece_size
        return off, min(self.piece_size, fs.f["size"] - off)

    def _from_peer(self, fs, i, link, buf, throttle):
        off, n = self._span(fs, i)
        path = "/files/" + quote(fs.rel)
        headers = self._headers()
        headers["Range"] = "bytes=%d-%d" % (off, off + n - 1)
        h = hashlib.sha256()
        got = 0
        t_piece = time.monotonic()
        rate = min(MIN_PEER_RATE, self.peer_rate_limit) if self.peer_rate_limit else MIN_PEER_RATE
        seconds = self.timeout + n / float(rate)
        try:
            resp, wd = self._request(link, path, headers, seconds)
            try:
                if resp.status != 206:
                    resp.read(64 * 1024)
                    self._close_conn(link)
                    raise _http.HttpError("GET", link.url + path, "HTTP %d, not 206 with the range" % resp.status,
                                          status=resp.status)
                try:
                    with memoryview(buf) as mv:
                        while got < n:
                            with mv[got:n] as target:
                                k = resp.readinto(target)
                            if not k:
                                break
                            with mv[got:got + k] as chunk:
                                h.update(chunk)
                            got += k
                            throttle.consume(k)
                    if got != n or resp.read(1):
                        self._close_conn(link)
                        raise _http.HttpError("GET", link.url + path, "stalled: %d of %d bytes within %g s" % (
                            got, n, seconds) if wd.fired else "sent %d bytes for a %d-byte piece" % (got, n),
                            timed_out=wd.fired)
                except (OSError, http.client.HTTPException) as e:
                    self._close_conn(link)
                    raise _http.HttpError("GET", link.url + path, "the transfer broke off: %s" % (
                        ("stalled within %g s" % seconds) if wd.fired else (e or type(e).__name__)),
                        timed_out=wd.fired)
            finally:
                wd.cancel()
        except (_http.HttpError, ValueError) as e:
            status = getattr(e, "status", None)
            with self._cond:
                link.inflight -= 1
                fs.inflight.discard(i)
                if status == 404:  # not held any more (published meanwhile, or a board race): nothing more is
                    link.have.clear()  # asked of it until its next piece list
                    # one strike per piece list: the pulls a list started in parallel are one try, and a seed
                    # publishing for a moment is not a peer that lists what it does not serve
                    if link.unserved_at != link.lists:
                        link.unserved_at = link.lists
                        link.strikes += 1
                else:
                    link.strikes += 1
                strikes = link.strikes
                self._cond.notify_all()
            if status == 403:
                self._drop(link, "refused this run's token (HTTP 403)")
            elif strikes >= self.max_failures:
                if status == 404:
                    what = "listed pieces it did not serve (HTTP 404)"
                elif status:
                    what = "answered HTTP %s" % status
                else:
                    what = "stalled" if getattr(e, "timed_out", False) else "broke off"
                self._drop(link, "%d transfers in a row failed, the last one %s" % (strikes, what))
            return
        digest = h.hexdigest()
        if digest != fs.trusted[i]:
            self._settle(fs, i, link)
        with self._cond:
            link.inflight -= 1
            if digest == fs.trusted[i]:
                self._piece_secs.append(time.monotonic() - t_piece)
                link.strikes = 0
                ok, quiet = True, False
            else:
                ok, quiet = False, i in fs.disputed
                fs.inflight.discard(i)
                if not quiet:
                    link.bad += 1
                    self.bad_pieces_rejected += 1
                    fs.excluded[i].add(link)
                self._cond.notify_all()
        if not ok:
            if not quiet:
                self._drop(link, "lied: sent a bad piece (%s piece %d: sha256 differs from the %s)" % (
                    fs.rel, i, "shared filesystem's" if fs.judged[i] else "seed's"), lied=True)
            return
        self._write(fs, i, buf, n)
        with self._cond:
            link.bytes += n
            self.bytes_from_peers += n
        self._held(fs, i, digest, n, peer=True)

    def _settle(self, fs, i, link):
        """A seed sent piece ``i`` with another digest than the trusted one: if its own digest of the piece is
        that other one, the seeds disagree and the shared filesystem judges (:meth:`_judge`); if its digest is
        the trusted one, its bytes contradict its own word (judged by the caller, no read needed)."""
        if not link.seed:
            return  # digests come from seeds only: a non-seed's bytes are checked against them, nothing more
        with self._cond:
            known = link in fs.claims[i]
        if not known:
            try:
                self._fetch_digests(link, fs)
            except (_http.HttpError, PeerLie):
                return
        with self._cond:
            claim = fs.claims[i].get(link)
            start = (claim is not None and claim != fs.trusted[i] and not fs.judged[i]
                     and i not in fs.disputed)
            if start:
                fs.disputed.add(i)
        if start:
            self._judge(fs, i)

    def _read_source(self, fs, i, buf, throttle):
        """Read piece ``i`` of ``fs`` from the shared filesystem into ``buf``; ``(sha256, length)``."""
        off, n = self._span(fs, i)
        src_path = os.path.join(self.src, fs.rel)
        self._src_streams.acquire()
        lease = None
        try:
            lease = self.slots.acquire() if self.slots else None
            fin = RawFile(src_path, os.O_RDONLY, self.direct_io)
            try:
                _verify.check_unchanged(src_path, os.fstat(fin.fd), fs.f, "since it was listed")
                got = 0
                with memoryview(buf) as mv:
                    while got < n:
                        with mv[got:n] as target:
                            k = fin.read_at(target, off + got)
                        if k <= 0:
                            raise _safetensors.CheckpointError(src_path, "file ended early at byte %d of %d"
                                                               % (off + got, fs.f["size"]))
                        got += min(k, n - got)
                        throttle.consume(k)
                    with mv[:n] as chunk:
                        digest = hashlib.sha256(chunk).hexdigest()
            finally:
                fin.close()
        except OSError as e:
            raise StageError("read of %s (piece %d) failed: %s" % (src_path, i, e))
        finally:
            if lease:
                self.slots.release(lease)
            self._src_streams.release()
        return digest, n

    def _from_source(self, fs, i, buf, throttle):
        digest, n = self._read_source(fs, i, buf, throttle)
        # the shared filesystem is the authority: its bytes stand even where a seed claimed another digest
        self._write(fs, i, buf, n)
        with self._cond:
            self.bytes_from_source += n
        self._held(fs, i, digest, n, peer=False)

    def _ensure_part(self, fs):
        with self._cond:
            if fs.created:
                return
            os.makedirs(os.path.dirname(fs.part), exist_ok=True)
            fd = os.open(fs.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                if fs.f["size"]:
                    try:
                        os.posix_fallocate(fd, 0, fs.f["size"])
                    except OSError as e:
                        if e.errno == errno.ENOSPC:
                            raise
                        os.ftruncate(fd, fs.f["size"])
            finally:
                os.close(fd)
            fs.created = True

    def _write(self, fs, i, buf, n):
        self._ensure_part(fs)
        off = i * self.piece_size
        out = RawFile(fs.part, os.O_WRONLY | os.O_NOFOLLOW, self.direct_io)
        try:
            with memoryview(buf) as mv:
                with mv[:n] as chunk:
                    out.write_at(chunk, off)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise StageError("no space left on device while writing %s (%s); free space on the dest "
                                 "filesystem or stage elsewhere" % (fs.final, human_bytes(fs.f["size"])))
            raise
        finally:
            out.close()
        fs.direct = fs.direct and out.went_direct

    def _held(self, fs, i, digest, n, peer):
        with self._cond:
            fs.digests[i] = digest
            fs.held[i] = True
            fs.inflight.discard(i)
            self._cond.notify_all()
        if self.board:
            self.board.held(fs.rel, i, digest)
        if isinstance(self.progress, SourcedProgress):
            self.progress.add(n, peer=peer)
        else:
            self.progress.add(n)

    # ---- a complete file -----------------------------------------------------------------------------
    def _finish(self, fs):
        f, rel = fs.f, fs.rel
        src_path = os.path.join(self.src, rel)
        self._ensure_part(fs)
        try:
            if self.do_fsync:
                fd = os.open(fs.part, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _verify.check_unchanged(src_path, os.stat(src_path), f, "while it was being staged")
            size = os.path.getsize(fs.part)
            if size != f["size"]:
                raise _safetensors.CheckpointError(fs.part, "copy is %d bytes, source is %d" % (size, f["size"]))
            if self.mode in ("headers", "sha256") and rel in self.content.headers:
                _verify.check_copy_header(fs.part, size, self.content.headers[rel])
            sha = None
            want = self.content.sums.get(rel) if self.mode == "sha256" else None
            if want:
                from_seed = all(d == t for d, t in zip(fs.digests, fs.trusted))
                sha = want if (from_seed and fs.seed_sha256 == want) else _fsutil.sha256_file(fs.part)
                if sha != want:
                    raise _safetensors.CheckpointError(
                        src_path, "checksum mismatch: sha256 %s, manifest says %s" % (sha, want))
            os.chmod(fs.part, f["mode"] | 0o400)
            os.utime(fs.part, ns=(f["mtime_ns"], f["mtime_ns"]))
            os.rename(fs.part, fs.final)
        except BaseException:
            _stage_layout.try_unlink(fs.part)
            raise
        rec = _marker.FileRecord(rel, f["size"], _verify.ident(f), _marker.copy_stat(os.lstat(fs.final)),
                                 self.content.level(rel, self.mode), self.content.header_digests.get(rel), sha,
                                 list(fs.digests), self.piece_size)
        with self._cond:
            self.records[rel] = rec
            if fs.direct and self.direct_io and fs.n:
                self.direct_files += 1
        if self.journal:
            self.journal.append(rec)
        if self.board:
            self.board.done(rel)
        self.progress.add(files=1)

    # ---- the run ---------------------------------------------------------------------------------------
    def run(self, files):
        self._t0 = time.monotonic()
        self._files = [_FileState(f, self.partial, self.piece_size) for f in sorted(files, key=lambda x: x["path"])]
        self._pieces_limit = PIECES_MAX_BYTES + PIECES_BYTES_PER_PIECE * sum(fs.n for fs in self._files)
        if self.board:
            for fs in self._files:
                self.board.add(fs.rel, fs.f, self.content.header_digests.get(fs.rel), None)
        for fs in self._files:
            if fs.n == 0:
                fs.finished = True
                self._finish(fs)
        pollers = [threading.Thread(target=self._poll_loop, args=(link,), name="stage-peer-poll", daemon=True)
                   for link in self.links]
        workers = [threading.Thread(target=self._worker, name="stage-peer-pull", daemon=True)
                   for _i in range(self.workers)]
        for t in pollers + workers:
            t.start()
        try:
            for t in workers:
                t.join()
        finally:
            self._stop.set()
            with self._cond:
                self._cond.notify_all()
            for t in pollers:
                t.join(timeout=self.timeout + 1)
        if self._errors:
            for fs in self._files:
                if not fs.finished:
                    _stage_layout.try_unlink(fs.part)
            raise self._errors[0]
        missing = [fs.rel for fs in self._files if not fs.finished]
        if missing:
            raise StageError("fan-out: %d file(s) were not completed (%s); run again" % (len(missing), missing[0]))

    @property
    def bytes_per_peer(self):
        return dict((link.url, link.bytes) for link in self.links if link.bytes)

    @property
    def peers_used(self):
        return sorted(self.bytes_per_peer)
