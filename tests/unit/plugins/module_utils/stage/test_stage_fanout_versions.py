"""Piece lists of protocol 2 (``_stage_fanout_wire.PROTO``): a receiver asks for what changed since the version it
took in last and the server holds the request until something did. The history's rules (a version per change,
whole lists for what a list of changes cannot say, another epoch after a restart), the receiver's distrust of it (a
version that goes back, changes under an old version, another epoch, a list over the cap: a failed try each, the
peer dropped after ``MAX_PEER_TRIES``), and a fleet mid-upgrade (protocol 1 peers served and read) are pinned here."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_fanout_wire import PeerLie, parse_piece_list
from ansible_collections.llmops.serving.tests.lib import fake_peers, stage_synth

PIECE = 8192
BIG = 256 * 1024


def _board(tmp_path, names=("a.bin", "b.bin"), pieces=4):
    """A partial build with a board of ``names`` (``pieces`` pieces each, none held yet) and an Offer over it."""
    dest = tmp_path / "n" / "m" / "r1"
    partial = str(dest) + ".partial"
    os.makedirs(partial)
    board = _stage_peer.Board(partial, PIECE)
    data = {}
    for k, name in enumerate(names):
        data[name] = os.urandom(pieces * PIECE)
        with open(os.path.join(partial, name + ".llmops-part"), "wb") as f:
            f.write(data[name])
        f = {"size": pieces * PIECE, "ino": 100 + k, "mtime_ns": 1, "ctime_ns": 2, "mode": 0o644}
        board.add(name, f, None, None)
    board.write()
    return board, _stage_peer.Offer(str(dest), PIECE, ttl=0), data


def _hold(board, name, i, data):
    board.held(name, i, hashlib.sha256(data[name][i * PIECE:(i + 1) * PIECE]).hexdigest())
    board.write()


def _doc(offer, since=None, epoch=None, sent=True, wait=0.0):
    asked = (epoch, since) if since is not None else None
    return parse_piece_list(offer.list_body(0, since, epoch, sent, wait), PIECE, asked=asked)


# ---- the server's history -------------------------------------------------------------------------------
def test_a_list_of_changes_holds_only_what_changed_since_the_version_asked(tmp_path):
    board, offer, data = _board(tmp_path)
    first = _doc(offer)
    assert first["proto"] == 2 and first["full"] and set(first["files"]) == {"a.bin", "b.bin"}
    unchanged = _doc(offer, first["seq"], first["epoch"])
    assert not unchanged["full"] and unchanged["files"] == {} and unchanged["seq"] == first["seq"]
    _hold(board, "b.bin", 2, data)
    delta = _doc(offer, first["seq"], first["epoch"])
    assert not delta["full"] and delta["seq"] > first["seq"] and list(delta["files"]) == ["b.bin"]
    assert delta["files"]["b.bin"]["have"] == "0010"
    # each version's changes, applied in turn to the first whole list, give the whole list of now
    _hold(board, "a.bin", 0, data)
    later = _doc(offer, delta["seq"], delta["epoch"])
    assert list(later["files"]) == ["a.bin"]
    view = dict(first["files"], **delta["files"])
    view.update(later["files"])
    assert dict((r, e["have"]) for r, e in view.items()) == \
        dict((r, e["have"]) for r, e in _doc(offer)["files"].items()) == {"a.bin": "1000", "b.bin": "0010"}


def test_what_a_list_of_changes_cannot_say_comes_as_the_whole_list(tmp_path):
    board, offer, data = _board(tmp_path)
    _hold(board, "a.bin", 1, data)
    v = _doc(offer)
    # another epoch (a restarted server), a version it never gave: the whole list
    assert _doc(offer, v["seq"], "ab" * 8)["full"]
    assert json.loads(offer.list_body(0, v["seq"] + 5, v["epoch"]))["full"]  # (a receiver would call it a lie)
    # a piece no longer held, and a file no longer listed, cannot be said as a change: the whole list, to
    # every receiver still at an older version
    with board._lock:  # pylint: disable=protected-access
        board.files["a.bin"]["have"][1] = False
        del board.files["b.bin"]
    board.write()
    whole = _doc(offer, v["seq"], v["epoch"])
    assert whole["full"] and whole["seq"] > v["seq"] and set(whole["files"]) == {"a.bin"}
    assert whole["files"]["a.bin"]["have"] == "0000"
    assert not _doc(offer, whole["seq"], whole["epoch"])["full"]  # from the new version on: changes again


def test_a_held_request_returns_at_the_change_and_at_the_end_of_its_wait(tmp_path):
    board, offer, data = _board(tmp_path)
    offer.watch_interval = 0.02
    v = _doc(offer)
    out = {}
    t = threading.Thread(target=lambda: out.update(doc=_doc(offer, v["seq"], v["epoch"], wait=30.0)), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive() and not out  # held: nothing changed
    _hold(board, "a.bin", 3, data)
    t.join(10)  # the change ends it, long before the 30 s it may wait
    assert not t.is_alive() and list(out["doc"]["files"]) == ["a.bin"] and out["doc"]["seq"] > v["seq"]
    # nothing changes: the answer comes at the end of the wait, with no changes and the same version
    quiet = _doc(offer, out["doc"]["seq"], v["epoch"], wait=0.2)
    assert quiet["files"] == {} and quiet["seq"] == out["doc"]["seq"] and not quiet["full"]


def test_sent_counters_are_left_out_and_wake_nobody_for_a_receiver_that_does_not_read_them(tmp_path):
    board, offer, data = _board(tmp_path)
    _hold(board, "a.bin", 0, data)
    v = _doc(offer, sent=False)
    os.close(offer.open_range("a.bin", 0, PIECE - 1))  # one transfer served: a.bin's sent counter changes
    for_seed = _doc(offer, v["seq"], v["epoch"], sent=True)
    assert for_seed["files"]["a.bin"]["sent"] == "1000"
    other = _doc(offer, v["seq"], v["epoch"], sent=False, wait=0.2)
    assert other["files"] == {}
    assert "sent" not in json.loads(offer.list_body(0, want_sent=False))["files"]["a.bin"]
    assert json.loads(offer.list_body(0, want_sent=True))["files"]["a.bin"]["sent"] == "1000"


@pytest.mark.parametrize("query, field", [("since=-1", "since"), ("since=1e3", "since"), ("epoch=XYZ", "epoch"),
                                          ("wait=nan", "wait"), ("wait=11", "wait"), ("sent=2", "sent")])
def test_a_request_with_a_bad_version_field_is_refused_naming_it(tmp_path, query, field):
    board, offer, _data = _board(tmp_path)
    peer = fake_peers.FakePeer(str(tmp_path / "n" / "m" / "r1"), PIECE)
    try:
        status, body = _get(peer, "/pieces?" + query)
    finally:
        peer.close()
    assert status == 400 and json.loads(body)["error"].startswith(field + ":")


def _get(peer, path):
    port = peer.server.server_address[1]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/r/m/r1" + path, headers={"Authorization": "Bearer " + fake_peers.TOKEN})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


# ---- the receiver's distrust ----------------------------------------------------------------------------
def _answer(**over):
    doc = {"piece_size": PIECE, "state": "copying", "load": 0, "proto": 2, "epoch": "0123456789abcdef", "seq": 7,
           "full": False, "files": {"a.bin": {"size": PIECE, "src": [1, 2, 3], "have": "1"}}}
    doc.update(over)
    return json.dumps(doc).encode("utf-8")


@pytest.mark.parametrize("over, asked, why", [
    ({"seq": 6}, ("0123456789abcdef", 7), "went backwards (6 after 7)"),
    ({"seq": 6, "full": True}, ("0123456789abcdef", 7), "went backwards"),
    ({}, ("0123456789abcdef", 7), "under the version asked from"),
    ({"epoch": "ffff"}, ("0123456789abcdef", 3), "another epoch"),
    ({}, None, "whole list with a list of changes"),
    ({"seq": -1, "full": True}, None, "seq is not a list version"),
    ({"seq": 2 ** 53, "full": True}, None, "seq is not a list version"),
    ({"seq": True, "full": True}, None, "seq is not a list version"),
    ({"epoch": "", "full": True}, None, "epoch is not"),
    ({"epoch": "AB", "full": True}, None, "epoch is not"),
    ({"epoch": "a" * 33, "full": True}, None, "epoch is not"),
    ({"full": 1}, None, "full is not true or false"),
])
def test_a_version_that_lies_is_no_piece_list(over, asked, why):
    with pytest.raises(PeerLie) as e:
        parse_piece_list(_answer(**over), PIECE, asked=asked)
    assert why in str(e.value)


def test_a_protocol_1_answer_is_a_whole_list_and_a_restart_is_a_new_history():
    v1 = json.loads(_answer())
    for k in ("proto", "epoch", "seq", "full"):
        v1.pop(k)
    doc = parse_piece_list(json.dumps(v1).encode(), PIECE, asked=("0123456789abcdef", 7))
    assert doc["proto"] == 1 and doc["full"] and doc["seq"] is None
    # another epoch with the whole list: a restarted server, whatever its version
    doc = parse_piece_list(_answer(epoch="ffff", seq=0, full=True), PIECE, asked=("0123456789abcdef", 7))
    assert doc["full"] and doc["seq"] == 0


@pytest.fixture
def fleet(tmp_path):
    src = str(tmp_path / "shared" / "m" / "r1")
    stage_synth.write_checkpoint(src, 1024 * 1024, shards=2, seed=5)
    seed_dest = str(tmp_path / "seed" / "m" / "r1")
    _stage.stage(src, seed_dest, record_pieces=True, piece_size=BIG)
    made = []

    def peer(behaviour="honest"):
        p = fake_peers.FakePeer(seed_dest, BIG, behaviour)
        made.append(p)
        return p
    yield src, peer
    for p in made:
        p.close()


def _stage_from(src, tmp_path, links):
    d = str(tmp_path / "n1" / "m" / "r1")
    return _stage.stage(src, d, peers=links, peer_token=fake_peers.TOKEN, piece_size=BIG, read_streams=1,
                        fsync=False), d


@pytest.mark.parametrize("kind, why", [("backwards", "went backwards (0 after 1)"),
                                       ("same_seq", "under the version asked from"),
                                       ("other_epoch", "another epoch"), ("oversized", "over the")])
def test_a_seed_whose_lists_of_changes_lie_is_dropped_after_max_tries(fleet, tmp_path, monkeypatch, kind, why):
    """The only seed answers its first (whole) list honestly and every list of changes with a lie: three failed
    tries in a row drop it, it is asked nothing more, and the shared filesystem serves the rest."""
    src, peer = fleet
    bad = peer("version:" + kind)
    init = _stage_fanout.Receiver.__init__

    def slow(self, *args, **kwargs):  # lists come quickly, pieces slowly: the lies are seen before the end
        kwargs.update(poll=0.05, peer_rate_limit=256 * 1024)
        init(self, *args, **kwargs)
    monkeypatch.setattr(_stage_fanout.Receiver, "__init__", slow)
    r, d = _stage_from(src, tmp_path, [{"url": bad.url, "seed": True}])
    assert fake_peers.same_tree(src, d)
    assert [x["url"] for x in r["peers_dropped"]] == [bad.url]
    reason = r["peers_dropped"][0]["reason"]
    assert "not a piece list" in reason and why in reason and not r["peers_dropped"][0]["lied"]
    assert "%d times" % _stage_fanout_wire.MAX_PEER_TRIES in reason and "xxxx" not in reason
    assert bad.server.lists == _stage_fanout_wire.MAX_PEER_TRIES + 1  # its first, whole, list and three lies


# ---- a fleet mid-upgrade --------------------------------------------------------------------------------
def test_a_protocol_1_peer_is_read_as_before(fleet, tmp_path):
    src, peer = fleet
    old = peer("v1")
    r, d = _stage_from(src, tmp_path, [{"url": old.url, "seed": True}])
    assert fake_peers.same_tree(src, d)
    assert r["bytes_from_source"] == 0 and r["peers_used"] == [old.url] and not r["peers_dropped"]


def test_a_protocol_1_receiver_gets_the_whole_list_it_knows(fleet):
    _src, peer = fleet
    p = peer()
    status, body = _get(p, "/pieces")  # what a receiver before protocol 2 asks
    doc = json.loads(body)
    assert status == 200 and "seq" not in doc and "full" not in doc and doc["files"]
    parsed = parse_piece_list(body, BIG)
    assert parsed["proto"] == 1 and all(e["sent"] is None for e in parsed["files"].values())


# ---- a piece's bytes, read from the socket in chunks ------------------------------------------------------
class _NoThrottle(object):
    def consume(self, n):
        pass


@pytest.fixture
def large(tmp_path):
    """A peer serving one file of 2 pieces of 3 MiB (larger than ``RECV_CHUNK``, so read in chunks), the last one
    short and of an odd size."""
    piece = 3 * 1024 * 1024
    assert piece > 2 * _stage_fanout_wire.RECV_CHUNK
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(piece + piece // 2 + 7)
    (src / "w.bin").write_bytes(data)
    st = os.stat(str(src / "w.bin"))
    f = {"path": "w.bin", "size": len(data), "ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
         "mode": 0o644}
    where = fake_peers.board_copy(str(src), [f], str(tmp_path / "p" / "m" / "r1"), piece)
    made = []

    def peer(behaviour="honest"):
        p = fake_peers.FakePeer(where, piece, behaviour)
        made.append(p)
        return p
    yield piece, data, peer
    for p in made:
        p.close()


def test_a_large_piece_comes_whole_hashed_and_the_connection_serves_the_next_request(large):
    piece, data, peer = large
    p = peer()
    client = _stage_fanout_wire.PeerClient(fake_peers.TOKEN, 5.0)
    link = _stage_fanout_wire.PeerLink(p.url, True)
    buf = bytearray(piece)
    for i, n in ((0, piece), (1, len(data) - piece), (0, piece)):
        digest = client.get_range(link, "w.bin", i * piece, n, buf, _NoThrottle())
        assert bytes(buf[:n]) == data[i * piece:i * piece + n]
        assert digest == hashlib.sha256(data[i * piece:i * piece + n]).hexdigest()
    # the same kept-alive connection answered all three and then a piece list: the chunked read left it clean
    body = client.get_body(link, "/pieces?sent=1", _stage_fanout_wire.PIECES_MAX_BYTES)
    assert parse_piece_list(body, piece)["files"]["w.bin"]["have"] == "11"
    conns = client._local.conns  # pylint: disable=protected-access
    assert list(conns) == [link.url] and p.server.requests == 4


@pytest.mark.parametrize("behaviour, why", [("truncated", "sent 1572864 bytes for a 3145728-byte piece"),
                                            ("stall", "stalled")])
def test_a_large_piece_that_breaks_off_or_stalls_is_a_failed_transfer(large, behaviour, why):
    piece, _data, peer = large
    p = peer(behaviour)
    client = _stage_fanout_wire.PeerClient(fake_peers.TOKEN, 1.0)
    link = _stage_fanout_wire.PeerLink(p.url, False)
    with pytest.raises(_stage_fanout_wire._http.HttpError) as e:  # pylint: disable=protected-access
        client.get_range(link, "w.bin", 0, piece, bytearray(piece), _NoThrottle())
    assert why in str(e.value) and e.value.timed_out == (behaviour == "stall")
