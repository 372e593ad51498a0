"""A seed is judged by whether its copy moves, not by how late its board file is rewritten: a receiver waits for a
seed that keeps listing pieces it never listed before, however old its board looks (a loaded host rewrites it late,
and a board written late still lists the pieces written meanwhile), and reads the shared filesystem itself once a
seed has listed no new piece for longer than the bound, however fresh its board is and however its list shrinks
and grows back meanwhile: a seed that lies slowly costs bounded time."""
from __future__ import annotations

import json
import os
import threading
import time
import types

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.tests.lib import fake_peers, stage_synth

PIECE = 4096
N = 8
BOUND = 5.0
TOKEN = "fanout-test-token-0123456789abcdef"
SEED = "http://seed:1/r/m/r1"
FILE = {"path": "f", "size": N * PIECE, "ino": 7, "mtime_ns": 8, "ctime_ns": 9}


class _Clock(object):
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(_stage_fanout, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


def _receiver(tmp_path, clock):
    """A receiver of one file of N pieces from one seed, which has given the digests of every piece it lists."""
    rx = _stage_fanout.Receiver(str(tmp_path), str(tmp_path / "p"), "headers", types.SimpleNamespace(header_digests={}),
                                [{"url": SEED, "seed": True}], TOKEN, PIECE, 1, None, None, False, seed_stale=BOUND)
    rx.poll = 0.02
    rx._t0 = clock.now
    fs = _stage_fanout._FileState(FILE, str(tmp_path / "p"), PIECE)
    rx._files = [fs]
    seed = rx.links[0]
    seed.claimed["f"] = set(range(N))  # no /digests request: the digests are in
    return rx, fs, seed


def _list(held, board_age, state="copying"):
    """The seed's piece list as it comes off the wire: ``state``, ``held`` pieces of ``f`` held."""
    body = json.dumps({"piece_size": PIECE, "state": state, "board_age": board_age, "load": 0,
                       "files": {"f": {"size": FILE["size"], "src": [7, 8, 9], "header_sha256": None, "sha256": None,
                                       "have": "1" * held + "0" * (N - held)}}})
    return _stage_fanout_wire.parse_piece_list(body.encode(), PIECE)


def _receive_held(fs, held):
    """This receiver already holds the pieces the seed lists: only the ones the seed has yet to copy are left."""
    for i in range(held):
        fs.held[i] = True


def test_a_seed_whose_pieces_grow_is_waited_for_however_late_its_board_is_rewritten(tmp_path, clock):
    rx, fs, _seed = _receiver(tmp_path, clock)
    for step in range(1, N):
        # each list comes 4 s after the last (within the bound) with one more piece, from a board 60 s and more old
        rx._absorb(rx.links[0], _list(step, board_age=60.0 + 4 * step))
        assert rx._seed_can_provide("f"), "a seed whose copy moves was given up at step %d" % step
        clock.now += 4.0
    _receive_held(fs, N - 1)
    assert fake_peers.pick_within(rx, 0.3) == "waits"  # the last piece: from the seed once it has it, not from src


def test_a_seed_that_holds_the_same_pieces_past_the_bound_is_given_up_however_fresh_its_board(tmp_path, clock):
    rx, fs, seed = _receiver(tmp_path, clock)
    rx._absorb(seed, _list(3, board_age=0.1))
    _receive_held(fs, 3)
    while clock.now - rx._t0 < BOUND - 1:
        clock.now += 1.0
        rx._absorb(seed, _list(3, board_age=0.1))  # its board rewritten on time, the same three pieces
        assert rx._seed_can_provide("f")
    assert fake_peers.pick_within(rx, 0.3) == "waits"
    clock.now += 1.0
    rx._absorb(seed, _list(3, board_age=0.1))
    assert not rx._seed_can_provide("f")
    fs_, i, link = rx._pick()
    assert (fs_, i, link) == (fs, 3, None)  # the next piece from the shared filesystem
    fs.inflight.clear()
    # its copy moves again: it is waited for again
    rx._absorb(seed, _list(4, board_age=0.1))
    assert rx._seed_can_provide("f")


def test_a_seed_that_falls_silent_is_given_up_after_the_bound(tmp_path, clock):
    rx, _fs, seed = _receiver(tmp_path, clock)
    rx._absorb(seed, _list(2, board_age=0.1))
    clock.now += BOUND - 0.5
    assert rx._seed_can_provide("f")
    clock.now += 1.0  # no piece list came in meanwhile (its last one stays the newest the receiver has)
    assert not rx._seed_can_provide("f")


def test_the_default_bound_is_the_stall_rule_of_a_transfer_for_the_seeds_next_piece(tmp_path):
    def bound(**kw):
        return _stage_fanout.Receiver(str(tmp_path), str(tmp_path / "p"), "headers", None, [], TOKEN, 64 << 20, 1,
                                      None, None, False, **kw).seed_stale
    rate = _stage_fanout_wire.MIN_PEER_RATE
    assert bound() == 30.0 + (64 << 20) / float(rate)
    assert bound(timeout=10.0) == 10.0 + (64 << 20) / float(rate)
    assert bound(read_rate_limit=1 << 20) == 30.0 + 64  # a seed held to 1 MiB/s a stream takes 64 s a piece
    assert bound(read_rate_limit=64 << 20) == 30.0 + (64 << 20) / float(rate)
    assert bound(seed_stale=7.0) == 7.0


def test_the_copy_moves_on_its_first_list_a_state_step_forward_or_a_piece_never_listed_before():
    progress = _stage_fanout_wire.CopyProgress()
    assert progress.moved_within(1.0, 50.0)  # nothing known yet
    files = {"f": "1100", "g": "10"}
    assert progress.note("idle", files, 10.0) == 3 and progress.moved_at == 10.0
    progress.note("idle", files, 11.0)
    assert progress.moved_at == 10.0 and not progress.moved_within(1.0, 11.0)
    progress.note("copying", files, 12.0)
    assert progress.moved_at == 12.0
    assert progress.note("copying", {"f": "1110", "g": "10"}, 13.0) == 1
    assert progress.moved_at == 13.0 and progress.moved_within(1.0, 13.5)
    progress.note("copying", {"f": "1100", "g": "10"}, 14.0)  # fewer: no progress
    assert progress.note("copying", {"f": "1110", "g": "10"}, 15.0) == 0  # and back again: none either
    assert progress.moved_at == 13.0 and progress.count == 4
    progress.note("idle", {"f": "1110", "g": "10"}, 16.0)  # a state going back is no step forward
    progress.note("copying", {"f": "1110", "g": "10"}, 17.0)
    assert progress.moved_at == 13.0
    progress.note("complete", {"f": "1110", "g": "10"}, 18.0)
    assert progress.moved_at == 18.0


def test_a_seed_whose_list_shrinks_and_grows_back_is_given_up_after_the_bound(tmp_path, clock):
    rx, fs, seed = _receiver(tmp_path, clock)
    rx._absorb(seed, _list(3, board_age=0.1))
    _receive_held(fs, 3)
    last_new = clock.now
    while clock.now - last_new < 3 * BOUND:
        clock.now += 1.0
        held = 2 if int(clock.now) % 2 else 3  # shrinks, grows back, forever
        rx._absorb(seed, _list(held, board_age=0.1))
        assert seed.progress.count == 3
        assert rx._seed_can_provide("f") == (clock.now - last_new < BOUND), clock.now - last_new
    fs_, i, link = rx._pick()
    assert (fs_, i, link) == (fs, 3, None)  # the next piece from the shared filesystem


def test_a_published_seed_that_lists_a_file_with_pieces_missing_is_waited_for_at_most_the_bound(tmp_path, clock):
    rx, fs, seed = _receiver(tmp_path, clock)
    rx.seed_wait = BOUND
    rx._absorb(seed, _list(3, board_age=0.1, state="complete"))  # published, yet pieces 3.. are not listed
    _receive_held(fs, 3)
    assert rx._seed_can_provide("f")
    for _step in range(int(BOUND)):
        clock.now += 1.0
        rx._absorb(seed, _list(3, board_age=0.1, state="complete"))
    assert not rx._seed_can_provide("f")
    fs_, i, link = rx._pick()
    assert (fs_, i, link) == (fs, 3, None)


@pytest.fixture
def src(tmp_path):
    root = str(tmp_path / "shared" / "m" / "r1")
    stage_synth.write_checkpoint(root, 2 * 1024 * 1024, shards=2, seed=5)
    return root


def test_a_seed_whose_list_oscillates_forever_costs_at_most_the_bound_over_the_wire(src, tmp_path, monkeypatch):
    """The real receiver and a real piece server whose copy never ends (``oscillate``): the run completes from
    the shared filesystem within ``seed_stale`` of the seed's last new piece, plus the transfers."""
    piece = 256 * 1024
    seed_dest = str(tmp_path / "seed" / "m" / "r1")
    _stage.stage(src, seed_dest, record_pieces=True, piece_size=piece, fsync=False)
    init = _stage_fanout.Receiver.__init__
    stale = 1.0

    def short(self, *args, **kwargs):
        kwargs.update(timeout=1.0, seed_stale=stale)
        init(self, *args, **kwargs)
    monkeypatch.setattr(_stage_fanout.Receiver, "__init__", short)
    seed = fake_peers.FakePeer(seed_dest, piece, "oscillate")
    out, d = {}, str(tmp_path / "n1" / "m" / "r1")

    def run():
        out["result"] = _stage.stage(src, d, peers=[{"url": seed.url, "seed": True}], peer_token=TOKEN,
                                     piece_size=piece, read_streams=1, fsync=False)
    try:
        t0 = time.monotonic()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        budget = stale + 6.0  # the bound, plus reading 2 MiB and the seed's two pieces a file (took 1.4 s here)
        t.join(budget)
        took = time.monotonic() - t0
        assert not t.is_alive(), "an oscillating seed kept the receiver waiting past %g s" % budget
    finally:
        seed.close()
    r = out["result"]
    assert fake_peers.same_tree(src, d) and took < budget
    assert seed.server.lists >= 3  # it did oscillate meanwhile
    assert r["bytes_from_source"] > 0 and r["bytes_from_peers"] + r["bytes_from_source"] == r["bytes_total"]
    assert os.path.isdir(d)
