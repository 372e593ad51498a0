# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the fan-out's wire protocol as a receiver speaks it, and its distrust of
every answer.

Every peer may lie, and lying costs bounded time. A piece list is read under ``_untrusted.loads_json`` (a size
cap of ``PIECES_MAX_BYTES`` plus a few bytes per piece, ``PIECES_MAX_DEPTH``, finite numbers) and checked field by
field (:func:`parse_piece_list`: ``have`` and ``sent`` are ASCII digits, counters in range, types exact); a digest
list likewise (:func:`parse_digests`). An answer that is not what the protocol says is a :class:`PeerLie`, whose
message says what is wrong and never quotes it. A piece list not in within ``timeout``, and a transfer not in
within ``timeout + size / MIN_PEER_RATE`` (however the bytes trickle: :class:`_Watchdog` shuts the socket down),
have stalled. ``MAX_PEER_TRIES`` failed tries in a row drop a peer (the receiver counts them on its
:class:`PeerLink`).

Peers are spoken to over one persistent HTTP/1.1 connection per stream and peer (:class:`PeerClient`, spoken on
the socket itself by :class:`_Conn`, a bounded reader of the piece servers' answers: a 64 MiB piece per request,
and piece lists, are the data plane: a new connection and TLS context per request, as ``_http.open_response``
makes, costs more than the transfer on a loaded host, and ``http.client`` parsed every answer's head with the
``email`` package). Every request's whole-answer deadline
is kept by the process's one deadline thread (:class:`_Watchdog`), a piece's bytes are read from the socket in
``RECV_CHUNK`` chunks (the thread woken once per chunk, not per packet) and hashed in place. Piece lists are
versioned (:data:`PROTO`): a receiver asks for the changes since the version it holds, and the peer holds the request
until there is one; a version that goes back, or changes under the version asked from, is a lie like any other.
Failures are ``_http.HttpError``, whose messages name the URL without credentials; the token is only ever a header.

A file name is a path's bytes, not necessarily UTF-8: on this side of the kernel it is the ``str`` Python decodes it
to (``os.fsdecode``, undecodable bytes as lone surrogates), in JSON that ``str`` escaped (``\\udcXX``, which
``json`` reads back), and in a URL its bytes percent-encoded (:func:`name_to_url`, read back by
:func:`name_from_url`), so a name that is not UTF-8 travels like any other instead of failing to encode.

* :func:`parse_piece_list`, :func:`parse_digests` - a peer's ``/pieces`` and ``/digests`` answers, checked;
* :func:`check_peer_url`, :func:`check_options` - the options that shape the protocol, refused before anything is
  prepared;
* :class:`CopyProgress` - the one rule of whether a peer's own copy moves: new pieces of the run, never a list that
  shrinks and grows back;
* :class:`PeerLink` - one peer as a receiver sees it (its last piece list, its failures, its :class:`CopyProgress`);
* :func:`name_to_url`, :func:`name_from_url` - a file name in a request path or query, byte for byte (names need not
  be UTF-8);
* :class:`PeerClient` - the requests: a bounded body (:meth:`PeerClient.get_body`), a piece hashed as it comes in
  (:meth:`PeerClient.get_range`).
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import os
import socket
import threading
import time
from urllib.parse import quote, unquote, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, loads_json
from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker

_HEX = _marker._HEX
socket_timeout = TimeoutError
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
#: Where each state stands in a peer's own copy: idle (nothing yet), copying, then an end. A copy moves forward
#: only; a state that goes back to an earlier rank is no progress (:class:`CopyProgress`).
STATE_RANK = {None: 0, "idle": 0, "copying": 1, "failed": 2, "done": 2, "complete": 2}
#: Largest piece: a piece is one buffer per pulling worker.
MAX_PIECE_SIZE = 1024 * 1024 * 1024
#: A piece's bytes are taken from the socket this many at a time: the receiving thread is woken once per chunk
#: (``SO_RCVLOWAT``), not once per packet, and hashes each chunk as it is in.
RECV_CHUNK = 512 * 1024
#: The piece-list protocol this side speaks. 1: every ``/pieces`` answer is the whole list (no ``seq``). 2: an
#: answer carries ``epoch`` (the server's list history: a restarted server starts another one) and ``seq`` (its
#: list's version in that epoch, never going down); a request with ``since=<seq>&epoch=<epoch>`` gets only the
#: files whose entry changed after that version (``full: false``), or the whole list (``full: true``) when a
#: change cannot be said that way (a piece or file no longer held, another source identity, another epoch); with
#: ``wait=<s>`` the server holds it until something changed (at most ``MAX_LIST_WAIT``); ``sent=0`` leaves out the
#: ``sent`` counters and their changes (a receiver reads them only from seeds). A version 1 server ignores the
#: query and answers the whole list, which a receiver takes as such (a fleet mid-upgrade mixes both).
PROTO = 2
#: Longest a server holds a ``/pieces`` request for a change (seconds); a receiver asks for at most this.
MAX_LIST_WAIT = 10.0
#: A piece request with this header set to ``1`` asks for the piece only if the server never started sending it
#: (else 409 and no bytes): a receiver asks a seed so for pieces the seed's last list showed as sent to nobody.
#: A server that does not know the header sends the piece; a receiver that does not send it gets the piece.
UNSENT_HEADER = "X-Llmops-Unsent"
#: The body of an answer that is not the piece (409), at most: read so that the connection carries the next.
REFUSAL_MAX_BYTES = 4096
#: ``seq`` is a JSON integer below this (exact in every JSON reader); ``epoch`` at most this many hex digits.
MAX_SEQ = 2 ** 53
MAX_EPOCH_CHARS = 32


def name_to_url(rel):
    """``rel`` (a relative file name as ``os.fsdecode`` gives it) percent-encoded from its bytes, ``/`` kept: the
    peer's server reads it back with :func:`name_from_url`. ``urllib.parse.quote`` of the ``str`` itself encodes
    UTF-8 strictly and raises on a name that is not UTF-8."""
    return quote(os.fsencode(rel), safe="/")


def name_from_url(text):
    """A file name from its percent-encoded form in a request path or query (:func:`name_to_url`'s inverse):
    bytes that are not UTF-8 come back as the lone surrogates ``os.fsdecode`` gives them."""
    return unquote(text, encoding="utf-8", errors="surrogateescape")


class PeerLie(ValueError):
    """A peer's answer that is not what the protocol says; ``str()`` says what is wrong, never quotes it."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _hex64(v, what):
    if v is None:
        return None
    if not _marker.is_sha256(v):
        raise PeerLie("%s is not a sha256 (64 lowercase hex digits)" % what)
    return v


def parse_piece_list(body, piece_size, max_bytes=PIECES_MAX_BYTES, asked=None):
    """The ``/pieces`` answer ``body`` (bytes) of a peer, checked field by field; raises :class:`PeerLie`.

    Parsed with ``_untrusted.loads_json`` (``max_bytes``, ``PIECES_MAX_DEPTH``, finite numbers). Returns
    ``{"state", "board_age", "load", "proto", "epoch", "seq", "full", "files": {rel: {"size", "src",
    "header_sha256", "sha256", "have", "sent"}}}``; ``have`` is ASCII ``0``/``1`` per piece, ``sent`` ASCII
    ``0``-``9`` per piece or None. ``board_age`` is checked like every field but judges nothing: a seed is judged by
    the pieces it holds (:class:`CopyProgress`).

    ``asked``: ``(epoch, since)`` when the request asked for the changes after ``since`` (:data:`PROTO` 2), else
    None. An answer without ``seq`` is a version 1 peer's whole list (``proto`` 1, ``full``). A version 2 answer
    is a lie when it is a list of changes nobody asked for, of another epoch than asked, or goes back: a ``seq``
    below ``since`` in the same epoch (a replay of an older list), or changes under the very ``seq`` asked from
    (nothing changes without a new version).
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
    seq, epoch, full = _parse_version(doc, asked, bool(out))
    return {"state": state, "board_age": age, "load": load, "files": out, "proto": 1 if seq is None else 2,
            "epoch": epoch, "seq": seq, "full": full}


def _parse_version(doc, asked, changes):
    """``(seq, epoch, full)`` of a piece list (``(None, None, True)``: a version 1 peer's); :class:`PeerLie` when
    the version fields are malformed or contradict the request (see :func:`parse_piece_list`)."""
    if "seq" not in doc:
        return None, None, True
    seq, epoch, full = doc.get("seq"), doc.get("epoch"), doc.get("full")
    if not _is_int(seq) or not 0 <= seq < MAX_SEQ:
        raise PeerLie("seq is not a list version (an integer 0-%d)" % (MAX_SEQ - 1))
    if not isinstance(epoch, str) or not 0 < len(epoch) <= MAX_EPOCH_CHARS or not set(epoch) <= _HEX:
        raise PeerLie("epoch is not 1-%d lowercase hex digits" % MAX_EPOCH_CHARS)
    if not isinstance(full, bool):
        raise PeerLie("full is not true or false")
    if asked is None:
        if not full:
            raise PeerLie("it answered a request for its whole list with a list of changes")
        return seq, epoch, full
    a_epoch, since = asked
    if not full and epoch != a_epoch:
        raise PeerLie("it answered with changes of another epoch than asked (a restarted server sends its whole "
                      "list)")
    if epoch == a_epoch and seq < since:
        raise PeerLie("its list version went backwards (%d after %d)" % (seq, since))
    if not full and seq == since and changes:
        raise PeerLie("it sent changes under the version asked from (%d): a change comes with a new version" % seq)
    return seq, epoch, full


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
        _stage_layout.check_dest(dest)
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


class _Deadlines(object):
    """The one thread that fires every :class:`_Watchdog` of this process at its deadline: a request costs a heap
    entry, not a thread of its own (a piece list or a piece is asked for many times a second per receiver)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap = []
        self._order = itertools.count()
        self._thread = None

    def add(self, wd, at):
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._order), wd))
            if self._thread is None or not self._thread.is_alive():  # none yet, or this is a forked child
                self._thread = threading.Thread(target=self._loop, name="fanout-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is wd:
                self._cond.notify()

    def _loop(self):
        while True:
            due = []
            with self._cond:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].cancelled or self._heap[0][0] <= now):
                    wd = heapq.heappop(self._heap)[2]
                    if not wd.cancelled:
                        due.append(wd)
                if not due:
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            for wd in due:
                try:
                    wd.fire()
                except Exception:  # pylint: disable=broad-except  # the next deadlines still fire
                    pass


_DEADLINES = _Deadlines()


class _Watchdog(object):
    """Shuts ``conn``'s socket down ``seconds`` from now unless cancelled: a read blocked on a peer that
    trickles bytes then returns at once (``fired`` says why)."""

    def __init__(self, conn, seconds):
        self.fired = False
        self.cancelled = False
        self._conn = conn
        _DEADLINES.add(self, time.monotonic() + seconds)

    def fire(self):
        if self.cancelled:
            return
        self.fired = True
        sock = getattr(self._conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self):
        self.cancelled = True


class CopyProgress(object):
    """Whether a peer's own copy moves, by one rule: it moves when it lists held a piece of this run it never listed
    before, or when its state moves forward (:data:`STATE_RANK`; its first list counts as a step forward).

    What it has listed held is kept as a high-water set per file, so a list that shrinks and grows back again adds
    nothing, and a board rewritten on time without a new piece is no progress either. Each piece of the run, and
    each of the three steps of its state (first list, copying, an end), counts once: a peer judged by
    ``moved_within(seconds, now)`` keeps a receiver waiting at most ``seconds`` after it last moved, and at most
    ``(pieces of the run + 3) * seconds`` in all, the time an honest copy gaining one piece every ``seconds`` takes;
    whatever its lists do meanwhile. ``count`` is the number of distinct pieces it has listed held, and never goes
    down.
    """

    def __init__(self):
        self.pieces = {}        # rel -> int whose bit i is set once piece i was listed held
        self.count = 0
        self.rank = -1          # the highest STATE_RANK seen (-1: no list yet)
        self.moved_at = None    # when it last moved (the caller's monotonic clock)

    def note(self, state, haves, now):
        """Take in one list: ``state`` and ``haves`` (``{rel: "0110"}``, only the files of this run whose entry
        matches the source) at ``now``. Returns how many pieces it listed held for the first time."""
        new = 0
        for rel, have in haves.items():
            if "1" not in have:
                continue
            bits = int(have[::-1], 2)  # bit i is piece i
            seen = self.pieces.get(rel, 0)
            gain = bits & ~seen
            if gain:
                new += bin(gain).count("1")
                self.pieces[rel] = seen | bits
        rank = STATE_RANK.get(state, 0)
        if new or rank > self.rank:
            self.moved_at = now
        self.rank = max(self.rank, rank)
        self.count += new
        return new

    def moved_within(self, seconds, now):
        """It moved less than ``seconds`` before ``now`` (True before any list: nothing is known yet)."""
        return self.moved_at is None or now - self.moved_at < seconds


class PeerLink(object):
    """One peer as a receiver sees it: its last piece list, its failures, and whether its own copy moves."""

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
        self.have = {}             # rel -> "0101" as last seen
        self.sent = {}             # rel -> "0120": transfers of each piece a seed's server started
        self.entries = {}          # rel -> its /pieces entry
        self.bytes = 0
        self.bad = 0
        self.seen_at = None
        self.mismatch = set()      # files whose entry here is not today's source file
        self.claimed = {}          # rel -> indices of the pieces whose digest this (seed) peer gave
        self.progress = CopyProgress()  # whether its own copy moves (new pieces of the run)
        self.proto = None          # the piece-list protocol it answered with (1 or 2; None before its first list)
        self.epoch = None          # its list history and the version taken in last (protocol 2)
        self.seq = None
        self.undigested = set()    # files it lists pieces of whose digests are not in yet (a seed)
        self.relist = False        # its next piece list is asked for whole (a piece it listed was not served)

    def holds(self, rel, i):
        h = self.have.get(rel)
        return h is not None and i < len(h) and h[i] == "1"

    def sent_count(self, rel, i):
        c = self.sent.get(rel)
        return int(c[i]) if c is not None and i < len(c) else 0

    def mark_sent(self, rel, i, n):
        """Piece ``i`` (of ``n``) of ``rel`` was sent by this peer to somebody (its 409 said so before its list)."""
        c = self.sent.get(rel)
        c = c if c is not None and len(c) == n else "0" * n
        if c[i] == "0":
            self.sent[rel] = c[:i] + "1" + c[i + 1:]


#: An answer's status line and headers, at most (bytes; a piece server's are under 200): more is a broken answer.
MAX_ANSWER_HEAD = 16 * 1024
#: Header lines of an answer, at most.
MAX_ANSWER_HEADERS = 32
#: Bodies this long or longer are read under ``SO_RCVLOWAT`` (below it, one wake-up more costs less than the two
#: ``setsockopt`` calls).
LOWAT_FROM = 64 * 1024


class _BadAnswer(Exception):
    """An answer that is not HTTP as the piece servers speak it (``str()`` says what, never quotes it)."""


class _Conn(object):
    """One persistent HTTP/1.1 connection to a peer, spoken to directly on its socket.

    The piece servers answer every request with a status line, a few headers and a ``Content-Length`` body; this
    writes a request in one ``sendall`` and reads an answer's head with a few ``recv`` calls and a split, where
    ``http.client`` made a file object per answer and parsed every head with the ``email`` package: measured
    with ``benchmarks/fanout_wire_cpu.py`` (cProfile, CPU time of every thread), its head parsing was about 40 % of
    a receiver's request CPU (0.17 of 0.43 CPU-s for 636 requests). Bounded: a head over ``MAX_ANSWER_HEAD`` bytes
    or ``MAX_ANSWER_HEADERS`` lines, a status line that is not ``HTTP/1.x <3 digits>``, a ``Content-Length``
    that is not digits, or a body sent chunked, is a :class:`_BadAnswer`; the whole answer's deadline is the
    caller's watchdog, which shuts ``sock`` down.
    """

    __slots__ = ("host", "port", "timeout", "sock", "rest", "used", "status", "length", "will_close")

    def __init__(self, host, port, timeout):
        self.host = host
        self.port = port
        self.timeout = timeout
        self.sock = None
        self.rest = b""        # bytes received after the answer's head: the start of its body
        self.used = False      # an answer was read whole on it (a kept-alive connection the peer may have closed)
        self.status = None
        self.length = None     # the answer's Content-Length, None when it has none (its body ends at EOF)
        self.will_close = True

    def send(self, request):
        if self.sock is None:
            sock = socket.create_connection((self.host, self.port), self.timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.sock = sock
        self.sock.sendall(request)

    def read_head(self):
        """Read the answer's status line and headers: ``status``, ``length``, ``will_close``, ``rest``."""
        sock = self.sock
        data = b""
        while True:
            chunk = sock.recv(MAX_ANSWER_HEAD)
            if not chunk:
                raise ConnectionResetError("the peer closed the connection %s" % (
                    "before answering" if not data else "in the middle of the answer's head"))
            data += chunk
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(data) > MAX_ANSWER_HEAD:
                raise _BadAnswer("the answer's head is over %d bytes" % MAX_ANSWER_HEAD)
        if end > MAX_ANSWER_HEAD:
            raise _BadAnswer("the answer's head is over %d bytes" % MAX_ANSWER_HEAD)
        lines = data[:end].split(b"\r\n")
        if len(lines) > MAX_ANSWER_HEADERS + 1:
            raise _BadAnswer("the answer has over %d header lines" % MAX_ANSWER_HEADERS)
        words = lines[0].split(b" ", 2)
        if (len(words) < 2 or words[0] not in (b"HTTP/1.1", b"HTTP/1.0") or len(words[1]) != 3
                or not words[1].isdigit()):
            raise _BadAnswer("the answer's status line is not HTTP/1.x and a status")
        length, conn, chunked = None, b"", False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise _BadAnswer("a header line of the answer is not 'name: value'")
            name = name.lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit() or len(value) > 15 or (length is not None and int(value) != length):
                    raise _BadAnswer("the answer's Content-Length is not one byte count")
                length = int(value)
            elif name == b"connection":
                conn = value.lower()
            elif name == b"transfer-encoding" and value.lower() != b"identity":
                chunked = True
        if chunked:
            raise _BadAnswer("the answer's body is sent chunked; the piece servers send a Content-Length")
        self.status = int(words[1])
        self.length = length
        self.will_close = (conn == b"close" or length is None
                           or (words[0] == b"HTTP/1.0" and conn != b"keep-alive"))
        self.rest = data[end + 4:]

    def read_into(self, mv, n, h=None, throttle=None):
        """Up to ``n`` bytes of the body into ``mv`` (what came with the head first), each chunk hashed into ``h``
        and counted by ``throttle`` as it is in; returns the bytes read (fewer: the peer closed the connection).

        Bytes are taken from the socket in ``RECV_CHUNK`` chunks under ``SO_RCVLOWAT`` (bodies of ``LOWAT_FROM``
        bytes or more): the kernel wakes this thread once a whole chunk is there, never waiting for more than is
        still to come, not at every packet. The one loop for a piece and for a piece list."""
        got = min(len(self.rest), n)
        if got:
            mv[:got] = self.rest[:got]
            self.rest = self.rest[got:]
            if h is not None:
                with mv[:got] as chunk:
                    h.update(chunk)
            if throttle is not None:
                throttle.consume(got)
        sock = self.sock
        low = 1
        try:
            while got < n:
                want = min(RECV_CHUNK, n - got)
                lowat = want if want >= LOWAT_FROM else 1
                if lowat != low:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
                    low = lowat
                with mv[got:got + want] as target:
                    k = sock.recv_into(target)
                if not k:
                    break
                if h is not None:
                    with mv[got:got + k] as chunk:
                        h.update(chunk)
                got += k
                if throttle is not None:
                    throttle.consume(k)
        finally:
            if low != 1:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)  # the next answer's head: any byte
                except OSError:
                    pass
        return got

    def read_body(self, limit):
        """The body, at most ``limit + 1`` bytes (one more than allowed: the caller tells an answer over its limit);
        the rest of a longer one stays unread (the caller closes the connection)."""
        n = limit + 1 if self.length is None else min(self.length, limit + 1)
        buf = bytearray(n)
        with memoryview(buf) as mv:
            got = self.read_into(mv, n)
        del buf[got:]
        return bytes(buf)

    def whole(self, got):
        """An answer of which ``got`` body bytes were read was read whole and the connection may carry the next."""
        return not self.will_close and self.length == got and not self.rest

    def close(self):
        sock, self.sock = self.sock, None
        self.rest = b""
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


class PeerClient(object):
    """A receiver's requests to its peers: one persistent connection per thread and peer (:class:`_Conn`), every
    request with the run's ``token``, every answer within its time (``timeout`` for a body, more for a piece, see
    :meth:`get_range`) or the connection is shut down under it."""

    def __init__(self, token, timeout):
        self.token = token
        self.timeout = timeout
        self._local = threading.local()
        self._open = set()       # every connection open now, of every thread (for :meth:`shutdown`)
        self._open_lock = threading.Lock()
        self._shut = False

    def shutdown(self):
        """Shut every open connection down, and make no request any more: a request held by a peer (a piece list
        waiting for a change) returns at once, so a run that ended does not wait for it."""
        with self._open_lock:
            self._shut = True
            conns = list(self._open)
        for conn in conns:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def headers(self):
        return {"Authorization": "Bearer " + self.token}

    def request(self, link, path, headers, seconds):
        """GET ``path`` (below the peer's revision URL) on this thread's connection to ``link``; ``(conn,
        watchdog)`` (the answer's head read, its body not; the watchdog shuts the connection down ``seconds`` after
        the request started, so a peer that trickles bytes cannot hold this thread: cancel it once the body is
        read). Transport failures and answers that are not HTTP are ``_http.HttpError`` without a status."""
        conns = self._local.__dict__.setdefault("conns", {})
        url = link.url + path
        host = "[%s]" % link.host if ":" in link.host else link.host  # an IPv6 address in brackets
        head = "".join(["GET %s HTTP/1.1\r\nHost: %s:%d\r\n" % (link.base + path, host, link.port)]
                       + ["%s: %s\r\n" % kv for kv in headers.items()] + ["\r\n"]).encode("latin-1")
        for attempt in (0, 1):
            conn = conns.get(link.url)
            if conn is None:
                conn = _Conn(link.host, link.port, self.timeout)
                with self._open_lock:
                    if self._shut:
                        raise _http.HttpError("GET", url, "the run ended")
                    self._open.add(conn)
                conns[link.url] = conn
            reused = conn.used
            wd = _Watchdog(conn, seconds)
            try:
                conn.send(head)
                conn.read_head()
                return conn, wd
            except (OSError, _BadAnswer) as e:
                wd.cancel()
                self._forget(conn)
                conns.pop(link.url, None)
                timed_out = wd.fired or isinstance(e, socket_timeout)
                # a kept-alive connection the peer closed meanwhile is retried once on a new one
                if attempt or not reused or timed_out or isinstance(e, (ConnectionRefusedError, _BadAnswer)):
                    why = ("no answer within %g s" % seconds) if wd.fired else (str(e) or type(e).__name__)
                    raise _http.HttpError("GET", url, why, timed_out=timed_out,
                                          refused=isinstance(e, ConnectionRefusedError))
        raise AssertionError("unreachable")

    def _forget(self, conn):
        conn.close()
        with self._open_lock:
            self._open.discard(conn)

    def close(self, link):
        conn = self._local.__dict__.get("conns", {}).pop(link.url, None)
        if conn is not None:
            self._forget(conn)

    def _done(self, link, conn, got, wd):
        """After an answer's body: keep the connection for the next request only when the answer was read whole
        in time and the peer keeps it."""
        if wd.fired or not conn.whole(got):
            self.close(link)
        else:
            conn.used = True

    def get_body(self, link, path, limit, hold=0.0):
        """The body of a 200 answer to ``GET path``, at most ``limit`` bytes (else :class:`PeerLie`), all of it
        within ``timeout`` seconds (plus ``hold``, the seconds the request lets the peer wait for a change)."""
        seconds = self.timeout + hold
        conn, wd = self.request(link, path, self.headers(), seconds)
        try:
            if conn.length is not None and conn.length > limit:
                body = None  # not read: the answer is over its limit whatever it says
            else:
                body = conn.read_body(limit)
        except OSError as e:
            self.close(link)
            late = wd.fired or isinstance(e, socket_timeout)  # whichever of the two deadlines came first
            why = "no whole answer within %g s" % seconds if late else (str(e) or type(e).__name__)
            raise _http.HttpError("GET", link.url + path, "the answer broke off: %s" % why, timed_out=late)
        finally:
            wd.cancel()
        self._done(link, conn, -1 if body is None else len(body), wd)
        if wd.fired:
            raise _http.HttpError("GET", link.url + path, "no whole answer within %g s" % seconds,
                                  timed_out=True)
        if conn.status != 200:
            raise _http.HttpError("GET", link.url + path, "HTTP %d" % conn.status, status=conn.status)
        if body is None or len(body) > limit:
            raise PeerLie("the answer is over the %d-byte limit for it" % limit)
        if conn.length is not None and len(body) != conn.length:
            raise _http.HttpError("GET", link.url + path, "the answer broke off: %d of %d bytes"
                                  % (len(body), conn.length))
        return body

    def get_range(self, link, rel, off, n, buf, throttle, rate_limit=0, unsent=False):
        """Bytes ``off`` to ``off + n - 1`` of ``rel`` from ``link`` into ``buf``, hashed as they come in, at most
        ``rate_limit`` bytes/s (``throttle``; 0: no limit); returns their sha256. All of it within ``timeout +
        n / min(MIN_PEER_RATE, rate_limit)`` seconds, else it stalled: ``_http.HttpError`` (``timed_out``), as
        for an answer that is not 206, breaks off or is not ``n`` bytes. ``unsent``: only if the peer never started
        sending it (``UNSENT_HEADER``); a 409 then is ``_http.HttpError`` with ``status`` 409, the connection kept."""
        path = "/files/" + name_to_url(rel)
        headers = self.headers()
        headers["Range"] = "bytes=%d-%d" % (off, off + n - 1)
        if unsent:
            headers[UNSENT_HEADER] = "1"
        h = hashlib.sha256()
        got = 0
        rate = min(MIN_PEER_RATE, rate_limit) if rate_limit else MIN_PEER_RATE
        seconds = self.timeout + n / float(rate)
        conn, wd = self.request(link, path, headers, seconds)
        try:
            if conn.status == 409 and unsent:
                # sent to somebody already: the short refusal is read so that the connection carries the next
                if conn.length is None or conn.length > REFUSAL_MAX_BYTES:
                    self.close(link)
                else:
                    try:
                        self._done(link, conn, len(conn.read_body(conn.length)), wd)
                    except OSError:
                        self.close(link)
                raise _http.HttpError("GET", link.url + path, "HTTP 409: sent to another peer before", status=409)
            if conn.status != 206:
                self.close(link)
                raise _http.HttpError("GET", link.url + path, "HTTP %d, not 206 with the range" % conn.status,
                                      status=conn.status)
            if conn.length != n:  # a body of another length (or to the end of the connection) is not the piece
                self.close(link)
                raise _http.HttpError("GET", link.url + path, "sent %s bytes for a %d-byte piece" % (
                    "an unknown number of" if conn.length is None else conn.length, n))
            try:
                with memoryview(buf) as mv:
                    got = conn.read_into(mv, n, h, throttle)
                if got != n:
                    self.close(link)
                    raise _http.HttpError("GET", link.url + path, "stalled: %d of %d bytes within %g s" % (
                        got, n, seconds) if wd.fired else "sent %d bytes for a %d-byte piece" % (got, n),
                        timed_out=wd.fired)
            except OSError as e:
                self.close(link)
                late = wd.fired or isinstance(e, socket_timeout)  # whichever of the two deadlines came first
                raise _http.HttpError("GET", link.url + path, "the transfer broke off: %s" % (
                    ("stalled within %g s" % seconds) if late else (e or type(e).__name__)),
                    timed_out=late)
        finally:
            wd.cancel()
        self._done(link, conn, got, wd)
        if wd.fired:
            raise _http.HttpError("GET", link.url + path, "stalled: %d of %d bytes within %g s" % (got, n, seconds),
                                  timed_out=True)
        return h.hexdigest()
