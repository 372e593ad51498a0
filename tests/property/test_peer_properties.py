"""Property-based harness for the fan-out's peers: every peer may lie, and lying costs bounded time.

A receiver stages a small revision from a random set of peers (``tests/lib/fake_peers.py``): honest ones, ones
that list pieces but do not serve them, answer errors, stall, break off, send malformed piece lists (non-ASCII
digits, nesting, absurd counters, wrong types, not JSON, oversized), send flipped bytes, or, as a seed, claim
digests of flipped bytes. After every run the invariants a user relies on are checked:

* the run succeeds (the shared filesystem is always there as the last resort) and ``dest`` is byte-identical to
  the source;
* it took bounded time (``MAX_PEER_TRIES`` tries of at most ``timeout + piece / MIN_PEER_RATE`` per bad peer);
* verified bytes came only from peers that serve bytes at all; no peer that told no lie is reported ``lied``;
* when an honest seed and a lying seed are both there, the liar is dropped and reported ``lied``, the honest
  seed is not dropped.

Every piece list any peer may send is also thrown at the parser: it returns a well-formed list or raises
``PeerLie``, never anything else.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time

from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
from ansible_collections.llmops.serving.tests.lib import fake_peers, stage_synth

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
PIECE = 256 * 1024
TIMEOUT = 1.5        # the receiver's per-request timeout here (30 s in a real run)
TOKEN = fake_peers.TOKEN
# peers whose bytes can be verified at all (the others never get a piece list in, or never deliver); a peer whose
# lists of changes lie gave an honest whole list first, and a protocol 1 peer is an honest one before the upgrade
DELIVERING = ("honest", "lie_bytes", "lie_seed", "oscillate", "v1") + tuple(
    "version:" + k for k in fake_peers.VERSION_LIES)

_TREE = {}


def _tree():
    """One source revision and one seed's staged copy of it, made once per process."""
    if not _TREE:
        root = tempfile.mkdtemp(prefix="llmops-peer-props-")
        src = os.path.join(root, "shared", "m", "r1")
        stage_synth.write_checkpoint(src, 2 * 1024 * 1024, shards=2, seed=11)
        seed = os.path.join(root, "seed", "m", "r1")
        _stage.stage(src, seed, record_pieces=True, piece_size=PIECE, fsync=False)
        _TREE.update(root=root, src=src, seed=seed,
                     listing=json.dumps(_stage_peer.Offer(seed, PIECE, ttl=0).public(0)))
        atexit.register(shutil.rmtree, root, True)
    return _TREE


def _settings(n):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, phases=PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# half of the peers drawn behave one of the ways that move bytes (or fail to), half send a malformed list
behaviours = st.one_of(st.sampled_from([b for b in fake_peers.BEHAVIOURS if not b.startswith("malformed:")]),
                       st.sampled_from([b for b in fake_peers.BEHAVIOURS if b.startswith("malformed:")]))
peer_specs = st.lists(st.tuples(behaviours, st.booleans()), min_size=1, max_size=3)


@_settings(max(4, EXAMPLES // 3))
@given(specs=peer_specs, honest_seed=st.booleans())
@example(specs=[("lie_seed", True), ("stall", False)], honest_seed=True)
@example(specs=[("unserved", True), ("lie_bytes", False), ("errors", False)], honest_seed=True)
def test_lying_peers_cost_bounded_time_and_never_a_wrong_byte(specs, honest_seed):
    tree = _tree()
    if os.environ.get("LLMOPS_PEER_PROPS_TRACE"):
        print("peers:", specs, "honest seed:", honest_seed)
    work = tempfile.mkdtemp(prefix="run-", dir=tree["root"])
    made, links, kinds = [], [], {}
    init = _stage_fanout.Receiver.__init__

    def short(self, *args, **kwargs):
        kwargs["timeout"] = TIMEOUT
        init(self, *args, **kwargs)
    _stage_fanout.Receiver.__init__ = short
    try:
        if honest_seed:
            specs = [("honest", True)] + list(specs)
        for k, (behaviour, seed) in enumerate(specs):
            dest = tree["seed"]
            if behaviour in ("lie_bytes", "lie_seed"):
                seed = seed or behaviour == "lie_seed"
                dest = fake_peers.flipped_copy(tree["seed"], os.path.join(work, "liar%d" % k, "m", "r1"), PIECE,
                                               consistent=behaviour == "lie_seed")
            p = fake_peers.FakePeer(dest, PIECE, behaviour)
            made.append(p)
            links.append({"url": p.url, "seed": seed})
            kinds[p.url] = (behaviour, seed)
        d = os.path.join(work, "n1", "m", "r1")
        t0 = time.monotonic()
        r = _stage.stage(tree["src"], d, peers=links, peer_token=TOKEN, piece_size=PIECE, read_streams=1,
                         fsync=False, verify="headers")
        took = time.monotonic() - t0
    finally:
        _stage_fanout.Receiver.__init__ = init
        for p in made:
            p.close()
    try:
        assert fake_peers.same_tree(tree["src"], d), "dest differs from the source"
        bad = sum(1 for b, _s in kinds.values() if b != "honest")
        bound = bad * _stage_fanout_wire.MAX_PEER_TRIES * (TIMEOUT + PIECE / float(_stage_fanout_wire.MIN_PEER_RATE)) + 20
        assert took < bound, "took %.1f s with %d bad peer(s) (bound %.1f s)" % (took, bad, bound)
        for url in r["bytes_per_peer"]:
            assert kinds[url][0] in DELIVERING, "verified bytes from a %s peer" % kinds[url][0]
        assert r["bytes_from_peers"] + r["bytes_from_source"] == r["bytes_total"]
        dropped = dict((x["url"], x) for x in r["peers_dropped"])
        for url, x in dropped.items():
            if x["lied"]:
                assert kinds[url][0] in fake_peers.LYING, "a %s peer reported as lying" % kinds[url][0]
        honest_seeds = [u for u, (b, s) in kinds.items() if b == "honest" and s]
        for url, (behaviour, seed) in kinds.items():
            if behaviour == "lie_seed" and honest_seeds:
                assert dropped.get(url, {}).get("lied"), "the lying seed was not named: %s" % r["peers_dropped"]
        for url in honest_seeds:
            assert not dropped.get(url, {}).get("lied"), "an honest seed was called a liar"
        assert TOKEN not in json.dumps(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.sampled_from("01\u0660\u0661\u00b2\u2070 9a"), max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20)
FIELDS = ["piece_size", "state", "board_age", "load", "files"]
ENTRY_FIELDS = ["size", "src", "have", "sent", "header_sha256", "sha256"]


@_settings(EXAMPLES * 4)
@given(field=st.sampled_from(FIELDS + ENTRY_FIELDS), value=json_values, raw=st.binary(max_size=64),
       use_raw=st.booleans())
def test_the_piece_list_parser_returns_a_wellformed_list_or_peerlie(field, value, raw, use_raw):
    doc = json.loads(_tree()["listing"])
    if field in FIELDS:
        doc[field] = value
    else:
        for e in doc["files"].values():
            e[field] = value
    try:
        body = raw if use_raw else json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except ValueError:
        return
    try:
        parsed = _stage_fanout_wire.parse_piece_list(body, PIECE)
    except _stage_fanout_wire.PeerLie:
        return
    assert 0 <= parsed["load"] <= _stage_fanout_wire.MAX_PEER_LOAD
    assert parsed["state"] in _stage_fanout_wire.PEER_STATES + (None,)
    for e in parsed["files"].values():
        n = (e["size"] + PIECE - 1) // PIECE
        assert len(e["have"]) == n and set(e["have"]) <= set("01")
        assert e["sent"] is None or (len(e["sent"]) == n and set(e["sent"]) <= set("0123456789"))


# ---- progress: new pieces, never a list that shrinks and grows back --------------------------------------------
N_PIECES = 6
have_strings = st.text(alphabet="01", min_size=N_PIECES, max_size=N_PIECES)
piece_lists = st.lists(st.tuples(st.sampled_from(_stage_fanout_wire.PEER_STATES + (None,)),
                                 st.fixed_dictionaries({"f": have_strings, "g": have_strings})),
                       min_size=1, max_size=30)


@_settings(EXAMPLES * 8)
@given(lists=piece_lists)
def test_a_peers_progress_counts_only_pieces_it_never_listed_before(lists):
    """Over any sequence of piece lists, ``count`` is the number of distinct pieces ever listed held (so it only
    grows), and the copy moves exactly at a list that adds such a piece or raises the state's rank: at most
    ``count + 3`` times in all, so a peer judged by ``moved_within(bound)`` is waited for at most
    ``(count + 3) * bound`` (the bound the receiver states), whatever its lists do."""
    progress = _stage_fanout_wire.CopyProgress()
    seen, rank, before, moves = set(), -1, 0, 0
    for t, (state, haves) in enumerate(lists):
        held = set((rel, i) for rel, have in haves.items() for i, h in enumerate(have) if h == "1")
        new = held - seen
        moved_at = progress.moved_at
        assert progress.note(state, haves, float(t)) == len(new)
        seen |= held
        r = _stage_fanout_wire.STATE_RANK[state]
        assert progress.moved_at == (float(t) if new or r > rank else moved_at)
        moves += progress.moved_at == float(t)
        rank = max(rank, r)
        assert progress.count == len(seen) >= before
        assert moves <= progress.count + 3
        before = progress.count


class _Clock(object):
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@_settings(EXAMPLES * 4)
@given(grow=st.lists(have_strings, min_size=1, max_size=8),
       replay=st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=40),
       step=st.floats(min_value=0.1, max_value=3.0))
def test_a_seed_whose_pieces_stop_growing_is_given_up_within_the_bound(grow, replay, step):
    """A copying seed sends the lists ``grow`` (one every ``step`` seconds), then replays lists it already sent
    (shrinking and growing back, in any order) forever: the receiver waits for it while a list brought a new
    piece less than ``seed_stale`` ago, and never longer, whatever the replayed lists are."""
    bound = 5.0
    clock = _Clock()
    real_time = _stage_fanout.time
    _stage_fanout.time = clock  # the receiver's monotonic clock, driven by the test
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rx = _stage_fanout.Receiver(tmp, os.path.join(tmp, "p"), "headers", _Content(), [{"url": SEED, "seed": True}],
                                        TOKEN, 4096, 1, None, None, False, seed_stale=bound, seed_wait=bound)
            rx._t0 = clock.now
            rx._files = [_stage_fanout._FileState(dict(FILE, path=rel), os.path.join(tmp, "p"), 4096) for rel in ("f", "g")]
            seed = rx.links[0]
            seed.claimed.update(f=set(range(N_PIECES)), g=set(range(N_PIECES)))  # the digests are in
            seen, last_new = set(), None
            sent = [(h, grow[(k + 1) % len(grow)]) for k, h in enumerate(grow)]
            for k in list(range(len(sent))) + [j % len(sent) for j in replay]:
                f, g = sent[k]
                held = set(("f", i) for i, c in enumerate(f) if c == "1") | set(("g", i) for i, c in enumerate(g) if c == "1")
                if held - seen or last_new is None:
                    last_new = clock.now
                seen |= held
                rx._absorb(seed, _copying_list({"f": f, "g": g}))
                assert seed.progress.count == len(seen)
                for rel in ("f", "g"):
                    assert rx._seed_can_provide(rel) == (clock.now - last_new < bound), (clock.now, last_new)
                clock.now += step
            clock.now = last_new + bound  # however the lists go on from here, no new piece: given up
            rx._absorb(seed, _copying_list({"f": sent[0][0], "g": sent[0][1]}))
            assert not rx._seed_can_provide("f") and not rx._seed_can_provide("g")
    finally:
        _stage_fanout.time = real_time


SEED = "http://seed:1/r/m/r1"
FILE = {"size": N_PIECES * 4096, "ino": 7, "mtime_ns": 8, "ctime_ns": 9}


class _Content(object):
    header_digests = {}


def _copying_list(haves):
    body = json.dumps({"piece_size": 4096, "state": "copying", "board_age": 0.1, "load": 0,
                       "files": dict((rel, {"size": FILE["size"], "src": [7, 8, 9], "header_sha256": None,
                                            "sha256": None, "have": have}) for rel, have in haves.items())})
    return _stage_fanout_wire.parse_piece_list(body.encode(), 4096)


# ---- a piece list's history: the changes since any version, applied to that version, are the list of now -----
board_steps = st.lists(st.tuples(st.sampled_from(["hold", "hold", "hold", "lose", "drop", "sent"]),
                                 st.sampled_from(["f", "g"]), st.integers(0, N_PIECES - 1)), min_size=1, max_size=12)


@_settings(EXAMPLES * 2)
@given(steps=board_steps)
def test_changes_since_any_version_rebuild_the_whole_list(steps):
    """Whatever a board does (pieces held, a piece lost, a file dropped and back, transfers served), a receiver that
    took in the list at any earlier version and applies the answer to ``since=<that version>`` (whole or changes)
    holds exactly the whole list of now; a change that cannot be said as one (a piece lost, a file gone) is always
    answered with the whole list; and versions never go back."""
    root = tempfile.mkdtemp(prefix="history-", dir=_tree()["root"])
    try:
        partial = os.path.join(root, "m", "r1.partial")
        os.makedirs(partial)
        board = _stage_peer.Board(partial, 4096)
        files = {}
        for k, rel in enumerate(("f", "g")):
            with open(os.path.join(partial, rel + ".llmops-part"), "wb") as f:
                f.write(b"x" * (N_PIECES * 4096))
            files[rel] = dict(FILE, ino=k)
            board.add(rel, files[rel], None, None)
        board.write()
        offer = _stage_peer.Offer(os.path.join(root, "m", "r1"), 4096, ttl=0)
        taken = []  # (version, whole list as the receiver holds it at that version)
        first = json.loads(offer.list_body(0))
        taken.append((first["seq"], first["files"]))
        last_seq = first["seq"]
        for op, rel, i in steps:
            lost = False
            with board._lock:  # pylint: disable=protected-access
                e = board.files.get(rel)
                if op == "hold" and e is not None:
                    e["have"][i], e["digests"][i] = True, "%064x" % (i + 1)
                elif op == "lose" and e is not None:
                    lost = e["have"][i]
                    e["have"][i] = False
                elif op == "drop":
                    lost = board.files.pop(rel, None) is not None
                    if not lost:
                        board.files[rel] = {"size": files[rel]["size"], "src": [rel == "g", 8, 9], "header_sha256": None,
                                            "sha256": None, "digests": [None] * N_PIECES, "have": [False] * N_PIECES,
                                            "done": False}
            if op == "sent" and e is not None and e["have"][i]:
                os.close(offer.open_range(rel, i * 4096, i * 4096 + 1))
            board.write()
            now = json.loads(offer.list_body(0))
            assert now["full"] and now["seq"] >= last_seq
            last_seq = now["seq"]
            for seq, view in taken:
                answer = json.loads(offer.list_body(0, seq, now["epoch"]))
                assert answer["seq"] == now["seq"]
                if lost and seq < now["seq"]:
                    assert answer["full"], "a lost piece or file said as a change"
                rebuilt = answer["files"] if answer["full"] else dict(view, **answer["files"])
                assert rebuilt == now["files"]
            taken.append((now["seq"], now["files"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
