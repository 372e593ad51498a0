"""A copying seed is judged by whether its copy moves, not by how late its board file is rewritten: a receiver
waits for a seed whose listed pieces keep growing, however old its board looks (a loaded host rewrites it late,
and a board written late still lists the pieces written meanwhile), and reads the shared filesystem itself once a
seed has held the same pieces for longer than the bound, however fresh its board is."""
from __future__ import annotations

import json
import types

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.tests.lib import fake_peers

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


def _list(held, board_age):
    """The seed's piece list as it comes off the wire: copying, ``held`` pieces of ``f`` held."""
    body = json.dumps({"piece_size": PIECE, "state": "copying", "board_age": board_age, "load": 0,
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


def test_the_copy_moves_on_its_first_list_a_new_state_or_more_pieces_held():
    link = _stage_fanout_wire.PeerLink(SEED, True)
    assert link.copy_moved_within(1.0, 50.0)  # nothing known yet
    files = {"f": {"have": "1100"}, "g": {"have": "10"}}
    link.note_copy("idle", files, 10.0)
    assert link.moved_at == 10.0
    link.note_copy("idle", files, 11.0)
    assert link.moved_at == 10.0 and not link.copy_moved_within(1.0, 11.0)
    link.note_copy("copying", files, 12.0)
    assert link.moved_at == 12.0
    link.note_copy("copying", {"f": {"have": "1110"}, "g": {"have": "10"}}, 13.0)
    assert link.moved_at == 13.0 and link.copy_moved_within(1.0, 13.5)
    link.note_copy("copying", {"f": {"have": "1100"}, "g": {"have": "10"}}, 14.0)  # fewer: no progress
    assert link.moved_at == 13.0
