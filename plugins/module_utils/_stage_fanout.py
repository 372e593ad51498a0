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

Peers are spoken to over one persistent ``http.client`` connection per stream and peer (a 64 MiB piece per
request, and a piece list four times a second per peer, are the data plane: a new connection and TLS context per
request, as ``_http.open_response`` makes, costs more than the transfer on a loaded host). Failures are
``_http.HttpError``, whose messages name the URL without credentials; the token is only ever a header.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import json
import mmap
import os
import random
import threading
import time
from collections import deque
from urllib.parse import quote, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils import _http
from ansible_collections.llmops.serving.plugins.module_utils import _paths
from ansible_collections.llmops.serving.plugins.module_utils import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils import _stage_progress
from ansible_collections.llmops.serving.plugins.module_utils import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils._stage_copy import RawFile
from ansible_collections.llmops.serving.plugins.module_utils._stage_marker import StageError
from ansible_collections.llmops.serving.plugins.module_utils._stage_progress import human_bytes

_HEX = _marker._HEX
_stage_peer_limit = 64 * 1024 * 1024   # most bytes of a JSON answer read from a peer
socket_timeout = TimeoutError
# pulls in flight per read stream: a peer's uplink is shared by every receiver, so one transfer gets a fraction
# of it, and filling this node's downlink takes several; reads from src stay at ``streams`` (and the fleet slots)
PEER_STREAMS = 2


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
        self.failures = 0
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
                 seed_wait=120.0, seed_stale=15.0, timeout=30.0, max_failures=3):
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
        self.direct_files = 0
        self.dropped = []
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

    def _request(self, link, path, headers):
        """GET ``path`` (below the peer's revision URL) on this thread's connection to ``link``; the response
        (status read, body not). Transport failures are ``_http.HttpError`` without a status."""
        conns = self._local.__dict__.setdefault("conns", {})
        url = link.url + path
        for attempt in (0, 1):
            conn = conns.get(link.url)
            if conn is None:
                conn = conns[link.url] = http.client.HTTPConnection(link.host, link.port, timeout=self.timeout)
            try:
                conn.request("GET", link.base + path, headers=headers)
                return conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conns.pop(link.url, None)
                # a kept-alive connection the peer closed meanwhile is retried once on a new one
                if attempt or isinstance(e, (ConnectionRefusedError, socket_timeout)):
                    raise _http.HttpError("GET", url, str(e) or type(e).__name__,
                                          timed_out=isinstance(e, socket_timeout),
                                          refused=isinstance(e, ConnectionRefusedError))
        raise AssertionError("unreachable")

    def _close_conn(self, link):
        conn = self._local.__dict__.get("conns", {}).pop(link.url, None)
        if conn is not None:
            conn.close()

    def _get_json(self, link, path):
        resp = self._request(link, path, self._headers())
        try:
            body = resp.read(_stage_peer_limit)
        except (OSError, http.client.HTTPException) as e:
            self._close_conn(link)
            raise _http.HttpError("GET", link.url + path, "the answer broke off: %s" % (e or type(e).__name__))
        if resp.status != 200:
            raise _http.HttpError("GET", link.url + path, "HTTP %d" % resp.status, status=resp.status)
        return json.loads(body.decode("utf-8"))

    def _drop(self, link, why):
        with self._cond:
            if link.alive:
                link.alive = False
                link.why_dropped = why
                self.dropped.append({"url": link.url, "reason": why})
            self._cond.notify_all()

    def _poll_loop(self, link):
        while not self._stop.is_set() and link.alive:
            try:
                doc = self._get_json(link, "/pieces")
                self._absorb(link, doc)
                link.failures = 0
            except _http.HttpError as e:
                if e.status == 403:
                    self._drop(link, "refused this run's token (HTTP 403)")
                    return
                link.failures += 1
                if link.failures >= self.max_failures:
                    self._drop(link, "unreachable (%s)" % (e.status or "no answer"))
                    return
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
                link.failures += 1
                if link.failures >= self.max_failures:
                    self._drop(link, "answers /pieces with something that is not a piece list")
                    return
            self._stop.wait(self.poll)

    def _absorb(self, link, doc):
        if not isinstance(doc, dict) or doc.get("piece_size") != self.piece_size:
            raise ValueError("piece size")
        files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
        fetch = []
        with self._cond:
            # the pulling workers are woken only when there is something new to take: a piece list arrives
            # several times a second per peer, and waking every worker for each costs more CPU than the transfers
            state = doc.get("state") if isinstance(doc.get("state"), str) else None
            changed = state != link.state
            link.state = state
            age = doc.get("board_age")
            link.board_age = age if isinstance(age, (int, float)) and not isinstance(age, bool) else None
            load = doc.get("load")
            link.load = load if isinstance(load, int) and not isinstance(load, bool) else 0
            link.seen_at = time.monotonic()
            for fs in self._files:
                e = files.get(fs.rel)
                if not isinstance(e, dict):
                    link.have.pop(fs.rel, None)
                    continue
                if not self._matches(fs, e):
                    link.have.pop(fs.rel, None)
                    link.mismatch.add(fs.rel)
                    continue
                have = e.get("have")
                if not isinstance(have, str) or len(have) != fs.n:
                    continue
                changed = changed or link.have.get(fs.rel) != have
                link.have[fs.rel] = have
                link.entries[fs.rel] = e
                sent = e.get("sent") if link.seed else None  # only a seed's uplink is spared
                if isinstance(sent, str) and len(sent) == fs.n and sent.isdigit():
                    link.sent[fs.rel] = sent
                    now = time.monotonic()
                    for i, c in enumerate(sent):
                        if c != "0" and fs.sent_at[i] is None:
                            fs.sent_at[i] = now
                if link.seed and any(h == "1" and fs.trusted[i] is None for i, h in enumerate(have)):
                    fetch.append(fs)
            if changed:
                self._cond.notify_all()
        for fs in fetch:
            self._fetch_digests(link, fs)

    def _matches(self, fs, e):
        """The peer's entry describes today's source file (size, inode, mtime, ctime, header digest)."""
        f = fs.f
        if e.get("size") != f["size"] or e.get("src") != [f["ino"], f["mtime_ns"], f["ctime_ns"]]:
            return False
        mine = self.content.header_digests.get(fs.rel)
        return not (mine and e.get("header_sha256") not in (None, mine))

    def _fetch_digests(self, link, fs):
        doc = self._get_json(link, "/digests?file=" + quote(fs.rel, safe=""))
        digests = doc.get("digests") if isinstance(doc, dict) else None
        if not isinstance(digests, list) or len(digests) != fs.n:
            raise ValueError("digests")
        e = link.entries.get(fs.rel) or {}
        with self._cond:
            for i, d in enumerate(digests):
                if isinstance(d, str) and len(d) == 64 and set(d) <= _HEX and fs.trusted[i] is None:
                    fs.trusted[i] = d
            sha = e.get("sha256")
            if isinstance(sha, str) and fs.seed_sha256 is None:
                fs.seed_sha256 = sha
            self._cond.notify_all()

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
        try:
            resp = self._request(link, path, headers)
            if resp.status != 206:
                resp.read(_stage_peer_limit)
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
                    raise _http.HttpError("GET", link.url + path, "sent %d bytes for a %d-byte piece" % (got, n))
            except (OSError, http.client.HTTPException) as e:
                self._close_conn(link)
                raise _http.HttpError("GET", link.url + path, "the transfer broke off: %s" % (e or type(e).__name__))
        except (_http.HttpError, ValueError) as e:
            status = getattr(e, "status", None)
            with self._cond:
                link.inflight -= 1
                fs.inflight.discard(i)
                if status == 404:  # not held any more (published meanwhile, or a board race): ask again later
                    h_ = link.have.get(fs.rel)
                    if h_ is not None:
                        link.have[fs.rel] = h_[:i] + "0" + h_[i + 1:]
                self._cond.notify_all()
            if status == 403:
                self._drop(link, "refused this run's token (HTTP 403)")
            elif status != 404:
                self._drop(link, "broke off a transfer (%s)" % (status or type(e).__name__))
            return
        digest = h.hexdigest()
        if got != n or digest != fs.trusted[i]:
            with self._cond:
                link.inflight -= 1
                link.bad += 1
                self.bad_pieces_rejected += 1
                fs.inflight.discard(i)
                fs.excluded[i].add(link)
            self._drop(link, "sent a bad piece (%s piece %d: %s)" % (
                fs.rel, i, "sha256 differs from the seed's" if got == n else "%d of %d bytes" % (got, n)))
            return
        with self._cond:
            self._piece_secs.append(time.monotonic() - t_piece)
            link.inflight -= 1
        self._write(fs, i, buf, n)
        with self._cond:
            link.bytes += n
            self.bytes_from_peers += n
        self._held(fs, i, digest, n, peer=True)

    def _from_source(self, fs, i, buf, throttle):
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
