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
no seed can provide it any more (every seed dropped, failed, or copying without holding a new piece for
``seed_stale`` seconds, or never seen within ``seed_wait`` seconds), or when no seed's entry for the file matches
the source. A file whose pieces are all held gets the same checks as a copy (size, header byte for byte against
the source's, sha256 in ``verify=sha256``: the seed's digest of the whole file when it equals the manifest's, else
a read of the copy), the source's mode and mtime, fsync, its name, and its journal line: resume, publish and the
marker are the copy's.

A seed is waited for by one rule, its progress, never its board's age: its copy moves only when it lists held,
with their digests, pieces of this run it never listed before (``_stage_fanout_wire.CopyProgress``, a high-water
set: a list that shrinks and grows back is no progress). ``seed_stale`` is by default the stall rule of a transfer
applied to the seed's next piece, ``timeout + piece_size / MIN_PEER_RATE`` (``read_rate_limit`` instead of
``MIN_PEER_RATE`` when lower): a seed reading the shared filesystem no slower than that gains a piece within it.
So a seed that lies slowly (a list that oscillates, a copy that never ends, a published state with pieces
missing) keeps this receiver from the shared filesystem at most ``seed_stale`` after its last new piece, and
``seed_wait`` before its first list; each piece of the run and each of its three state steps (first list,
copying, an end) count once, so a seed costs at most ``seed_wait + (pieces + 3) * seed_stale`` in all, the time an
honest seed copying at the stall rule's rate takes.

Every thread of a run (the poll of each peer, the pulling workers) is started by :meth:`Receiver._spawn`: what a
thread raises ends the run with that error (a ``StageError`` naming the thread when it is not one already), so no
thread dies while the others wait for what it would have brought.

Every peer may lie, and lying costs bounded time (the protocol's checks and the requests are
``_stage_fanout_wire``'s). A piece list that is not one, or none within ``timeout``, is a failed try. Transfers
that end in an error answer, break off, stall or ask for a piece the peer listed but does not serve (one try per
piece list) are failed tries too. ``MAX_PEER_TRIES`` failed tries in a row drop the peer; a bad piece, a lie about
digests or a refused token drop it at once. Every seed that lists a piece gives its digest before any byte of the
piece is taken: two seeds that disagree are judged by reading that piece from the shared filesystem
(:meth:`Receiver._judge`), and every seed whose digest differs is dropped with ``lied: true``.

* :class:`Receiver` - :meth:`Receiver.run` receives the files given into ``<dest>.partial``; ``records``,
  ``bytes_from_source``, ``bytes_from_peers``, ``bytes_per_peer``, ``peers_used``, ``bad_pieces_rejected``,
  ``dropped`` say how.
"""
from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
import time
from collections import deque

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify as _verify
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_copy import RawFile, aligned_buffer
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_fanout_wire import (
    DIGESTS_MAX_BYTES, MAX_LIST_WAIT, MAX_PEER_TRIES, MIN_PEER_RATE, PIECES_BYTES_PER_PIECE, PIECES_MAX_BYTES,
    PeerClient, PeerLie, PeerLink, name_to_url, parse_digests, parse_piece_list)
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_progress import SourcedProgress, Throttle
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_progress import human_bytes

# pulls in flight per read stream: a peer's uplink is shared by every receiver, so one transfer gets a fraction
# of it, and filling this node's downlink takes several; reads from src stay at ``streams`` (and the fleet slots)
PEER_STREAMS = 2
#: A peer whose piece list did not change is asked again after twice the wait before, up to this many ``poll``.
POLL_BACKOFF = 4
#: An idle pulling worker other than the first waits at most this many ``poll`` before it looks again unwoken.
IDLE_WAIT = 8
#: Piece lists of a peer that is not a seed (protocol 2) are at least this many ``poll`` apart: every receiver asks
#: every peer, so these lists grow with the square of the fleet, and the pieces they announce are mostly held by
#: other peers as well.
LIST_GAP = 2


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
                 seed_wait=120.0, seed_stale=None, timeout=30.0, max_failures=MAX_PEER_TRIES):
        self.src = src
        self.partial = partial
        self.mode = mode
        self.content = content
        self.links = [PeerLink(p["url"], p.get("seed")) for p in peers]
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
        if seed_stale is None:  # the stall rule of a transfer (MIN_PEER_RATE), for the seed's next piece
            rate = min(MIN_PEER_RATE, read_rate_limit) if read_rate_limit else MIN_PEER_RATE
            seed_stale = timeout + piece_size / float(rate)
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
        self._by_rel = {}
        self._idle = 0   # pulling workers waiting in _pick
        self._t0 = None
        self.wire = PeerClient(token, timeout)
        self._piece_secs = deque(maxlen=16)  # the last peer transfers (s): how long a handed-out piece may take

    # ---- threads -----------------------------------------------------------------------------------
    def _fail(self, error):
        """End the run with ``error``: every worker and wait sees ``_errors`` at once."""
        with self._cond:
            self._errors.append(error)
            self._cond.notify_all()

    def _spawn(self, target, name, *args):
        """Start ``target(*args)`` on a daemon thread of this run whose death is the run's failure: what it raises
        goes to :meth:`_fail` (as a ``StageError`` naming the thread unless it is one of the run's own errors), so
        a thread never dies silently while the workers wait for it."""
        def body():
            try:
                target(*args)
            except (StageError, _safetensors.CheckpointError, OSError) as e:
                self._fail(e)
            except BaseException as e:  # a defect or an input no rule foresaw: named, never a silent dead thread
                self._fail(StageError("fan-out: the %s thread failed (%s: %s); the run is stopped, nothing is "
                                      "published: run again, and report it if it repeats"
                                      % (name, type(e).__name__, e), reason="thread_failed"))
        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        return t

    # ---- peers -----------------------------------------------------------------------------------
    def _drop(self, link, why, lied=False):
        with self._cond:
            if link.alive:
                link.alive = False
                link.lied = lied
                link.why_dropped = why
                self.dropped.append({"url": link.url, "reason": why, "lied": bool(lied), "seed": link.seed})
            self._cond.notify_all()

    def _poll_loop(self, link):
        """Keep ``link``'s piece list up to date. A peer speaking ``_stage_fanout_wire.PROTO`` 2 is asked for the
        changes since the version taken in last, and holds the request until there is one (up to
        :meth:`_list_hold`): a list is sent when something changed, and it says only what did. An answer that
        brought nothing new is followed by ``poll`` seconds before the next request, and two requests are always
        ``poll`` apart (``LIST_GAP`` polls for a peer that is not a seed), so a peer that answers at once with
        nothing (or with noise) costs at most one list per ``poll``. A version 1 peer (no ``seq`` in its answers)
        is asked for its whole list every ``poll`` seconds while the list changes, and after a list that did not,
        twice as long as before, up to ``POLL_BACKOFF`` times ``poll``."""
        wait = self.poll
        while not self._stop.is_set() and link.alive:
            started = time.monotonic()
            hold = 0.0
            try:
                query = "sent=%d" % (1 if link.seed else 0)  # a seed's sent counters spare its uplink; no other's
                asked = None
                relist, link.relist = link.relist, False
                if link.proto == 2 and link.seq is not None and not relist:
                    hold = self._list_hold()
                    asked = (link.epoch, link.seq)
                    query += "&since=%d&epoch=%s&wait=%g" % (link.seq, link.epoch, hold)
                body = self.wire.get_body(link, "/pieces?" + query, self._pieces_limit, hold)
                doc = parse_piece_list(body, self.piece_size, self._pieces_limit, asked)
                new = self._absorb(link, doc)
                link.failures = 0
                link.proto = doc["proto"]
                if doc["proto"] == 2 and not (link.relist and not doc["full"]):
                    link.epoch, link.seq = doc["epoch"], doc["seq"]
                    # a change comes at once from a held request, but lists are at least ``poll`` apart (a
                    # non-seed's ``LIST_GAP`` polls: its news are pieces other peers mostly have too); nothing new is
                    # asked for again after ``poll``
                    gap = self.poll if link.seed else self.poll * LIST_GAP
                    wait = max(0.0, started + gap - time.monotonic()) if new else self.poll
                else:
                    # nothing new (same state, same pieces held): ask again later, up to POLL_BACKOFF times poll
                    wait = self.poll if new else min(wait * 2, self.poll * POLL_BACKOFF)
            except _http.HttpError as e:
                wait = self.poll
                if self._stop.is_set():
                    return  # the run ended under a held request
                if e.status == 403:
                    self._drop(link, "refused this run's token (HTTP 403)")
                    return
                link.failures += 1
                if link.failures >= self.max_failures:
                    self._drop(link, "unreachable after %d tries (%s)" % (
                        link.failures, e.status or ("stalled" if e.timed_out else "no answer")))
                    return
            except PeerLie as e:
                wait = self.poll
                link.failures += 1
                if link.failures >= self.max_failures:
                    self._drop(link, "answered %d times with something that is not a piece list (%s)"
                               % (link.failures, e))
                    return
            if wait:
                self._stop.wait(wait)

    def _list_hold(self):
        """Seconds a peer may hold a request for its piece list until something changed: well within the answer's
        own deadline (``timeout``), at most ``MAX_LIST_WAIT``."""
        return min(MAX_LIST_WAIT, max(0.0, self.timeout / 4.0))

    def _absorb(self, link, doc):
        """Take in a piece list (:func:`parse_piece_list`'s form) from ``link``: the whole list, or (``full``
        false) the entries that changed, the others as they were. Returns whether it listed something it did not
        before (state, or an entry of this run's files)."""
        files = doc["files"]
        full = doc.get("full", True)
        fetch = []
        haves = {}  # the pieces it lists of this run's files, as they are today: its progress, once their digests are in
        with self._cond:
            # the pulling workers are woken only when there is something new to take: a piece list arrives
            # several times a second per peer, and waking every worker for each costs more CPU than the transfers
            state = doc["state"]
            changed = state != link.state
            link.state = state
            link.load = doc["load"]
            link.seen_at = time.monotonic()
            link.lists += 1
            if full:
                states = self._files
            else:
                states = [fs for fs in (self._by_rel.get(rel) for rel in files) if fs is not None]
            for fs in states:
                e = files.get(fs.rel)
                if e is None:
                    changed = changed or fs.rel in link.have
                    link.have.pop(fs.rel, None)
                    continue
                if not self._matches(fs, e):
                    changed = changed or fs.rel in link.have
                    link.have.pop(fs.rel, None)
                    link.mismatch.add(fs.rel)
                    continue
                have = e["have"]
                haves[fs.rel] = have
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
                        link.undigested.add(fs.rel)
            if link.seed:
                fetch = [fs for fs in self._files if fs.rel in link.undigested]
            if changed:
                self._cond.notify()  # one idle worker looks; each that takes a piece wakes the next (_pick)
        for fs in fetch:
            if link.alive:
                self._fetch_digests(link, fs)  # a failure leaves it undigested: asked again with the next list
                link.undigested.discard(fs.rel)
        with self._cond:  # a seed's new pieces count once their digests are in (a silent one raised above)
            link.progress.note(state, haves, time.monotonic())
        return changed

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
        digests = parse_digests(self.wire.get_body(link, "/digests?file=" + name_to_url(fs.rel),
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
            self._cond.notify()  # new digests: one idle worker looks, and wakes the next if it took a piece
        if lies:
            self._drop(link, "lied: " + lies[0], lied=True)
        for i in disputes:
            self._judge(fs, i)

    def _judge(self, fs, i):
        """Seeds disagree on piece ``i`` (marked disputed by the caller): read it from the shared filesystem,
        trust that digest, drop every seed that claimed another one, and fetch the piece again if this node
        holds it under the wrong digest."""
        buf = aligned_buffer(self.piece_size)
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
        """Some seed may still give ``rel``'s pieces this receiver has no other holder for: waiting for it beats
        reading the shared filesystem. One rule, bounded (see the module docstring): a seed not started yet, or a
        published one still reading back its digests, within ``seed_wait`` of the start; any other only while its
        copy moves (``CopyProgress``: a new piece of the run within ``seed_stale``), whatever its state says."""
        now = time.monotonic()
        for link in self.links:
            if not link.seed or not link.alive or rel in link.mismatch or link.state == "failed":
                continue
            if link.state in (None, "idle", "complete") and now - self._t0 < self.seed_wait:
                return True
            # a seed is worth waiting for while the pieces it holds grow, however late its board is rewritten (a
            # loaded host writes it late; the pieces it lists are still new) and whatever its lists do meanwhile
            if link.state in ("copying", "complete", "done") and link.progress.moved_within(self.seed_stale, now):
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
        trade with, never for a piece it sent somebody that another peer lists (that peer trades it: the seed's
        uplink, which every new piece must cross, carries new pieces only), and not for one it sent less than
        :meth:`_dup_after` seconds ago that nobody lists yet: each piece leaves a seed's uplink about once and the
        receivers trade the rest. A piece the seed's last list showed as sent to nobody is asked for on that
        condition (``UNSENT_HEADER``): a seed that sent it since answers 409, and it is then one it sent.
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
                            self._cond.notify()  # there may be more: the next idle worker looks
                            return fs, i, None
                        waiting = True
                if best:
                    fs, i, cands = random.choice(best)
                    link = random.choice(cands)
                    link.inflight += 1
                    fs.inflight.add(i)
                    self._cond.notify()  # there may be more: the next idle worker looks
                    return fs, i, link
                if not waiting:
                    return None  # everything left is in flight
                # one idle worker looks again every ``poll`` (what time alone changes: a seed gone stale, a piece
                # a seed sent long enough ago); the others wait to be woken, by a new piece list or a finished
                # piece, or at the latest IDLE_WAIT polls
                self._idle += 1
                try:
                    self._cond.wait(self.poll if self._idle == 1 else self.poll * IDLE_WAIT)
                finally:
                    self._idle -= 1

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
            elif not others and fs.sent_at[i] is not None and now - fs.sent_at[i] > dup_after:
                usable.append(p)  # sent, and still nobody else lists it: it may never have arrived
        return usable, fresh

    def _dup_after(self):
        """Seconds a piece a seed handed out may take to show up at some peer: three typical transfers, at least
        two seconds (called with the lock held)."""
        if not self._piece_secs:
            return 2.0
        secs = sorted(self._piece_secs)
        return max(2.0, 3 * secs[len(secs) // 2])

    def _worker(self):
        # private, huge-page backed where the kernel has them (``_stage_copy.aligned_buffer``): ``mmap(-1, n)`` is
        # shared memory, whose pages O_DIRECT pins and releases 4 KiB at a time
        buf = aligned_buffer(self.piece_size)
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
                except BaseException:
                    with self._cond:
                        fs.inflight.discard(i)
                    raise  # the run's failure (_spawn)
        finally:
            buf.close()

    # ---- moving a piece ---------------------------------------------------------------------------
    def _span(self, fs, i):
        off = i * self.piece_size
        return off, min(self.piece_size, fs.f["size"] - off)

    def _from_peer(self, fs, i, link, buf, throttle):
        off, n = self._span(fs, i)
        t_piece = time.monotonic()
        # a seed is asked for a piece its last list showed as sent to nobody only on that condition: another
        # receiver may have asked for it since, and its uplink is the one every piece must cross once
        unsent = link.seed and link.sent_count(fs.rel, i) == 0
        try:
            digest = self.wire.get_range(link, fs.rel, off, n, buf, throttle, self.peer_rate_limit, unsent=unsent)
        except (_http.HttpError, ValueError) as e:
            status = getattr(e, "status", None)
            with self._cond:
                link.inflight -= 1
                fs.inflight.discard(i)
                if status == 409 and unsent:  # sent to another receiver since its list: no failure of the seed;
                    link.mark_sent(fs.rel, i, fs.n)  # the piece is asked of whoever lists it (or of the seed
                    if fs.sent_at[i] is None:        # again after _dup_after, as for any piece it sent)
                        fs.sent_at[i] = time.monotonic()
                    self._cond.notify_all()
                    return
                if status == 404:  # not held any more (published meanwhile, or a board race): nothing more is
                    link.have.clear()  # asked of it until its next piece list, a whole one
                    link.relist = True
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
            # a piece held frees no other piece; a file complete may end the run: then every worker looks
            if all(fs.held):
                self._cond.notify_all()
            else:
                self._cond.notify()
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
        self._by_rel = dict((fs.rel, fs) for fs in self._files)
        self._pieces_limit = PIECES_MAX_BYTES + PIECES_BYTES_PER_PIECE * sum(fs.n for fs in self._files)
        if self.board:
            for fs in self._files:
                self.board.add(fs.rel, fs.f, self.content.header_digests.get(fs.rel), None)
        for fs in self._files:
            if fs.n == 0:
                fs.finished = True
                self._finish(fs)
        workers, pollers = [], []
        try:
            pollers += [self._spawn(self._poll_loop, "poll of %s" % link.url, link) for link in self.links]
            workers += [self._spawn(self._worker, "pull %d" % k) for k in range(self.workers)]
            for t in workers:
                t.join()
        finally:
            self._stop.set()
            with self._cond:
                self._cond.notify_all()
            self.wire.shutdown()  # a piece list a peer holds for a change returns now
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
