"""Peers that lie in every way cost bounded time: a peer that lists pieces but does not serve them, answers
errors, stalls, breaks off or sends malformed piece lists is dropped after MAX_PEER_TRIES tries and the pieces
come from elsewhere (the shared filesystem last); two seeds that disagree are judged by the shared filesystem and
the liar is named; options that shape the protocol are refused before anything is prepared."""
from __future__ import annotations

import json
import math
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.tests.lib import fake_peers, stage_synth

PIECE = 256 * 1024
TOKEN = fake_peers.TOKEN
TIMEOUT = 1.0  # the receiver's per-request timeout here (30 s in a real run)


@pytest.fixture
def src(tmp_path):
    root = str(tmp_path / "shared" / "m" / "r1")
    stage_synth.write_checkpoint(root, 2 * 1024 * 1024, shards=2, seed=5)
    return root


@pytest.fixture
def seed_dest(src, tmp_path):
    dest = str(tmp_path / "seed" / "m" / "r1")
    _stage.stage(src, dest, record_pieces=True, piece_size=PIECE)
    return dest


@pytest.fixture
def peers():
    made = []

    def make(dest, behaviour="honest"):
        p = fake_peers.FakePeer(dest, PIECE, behaviour)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


@pytest.fixture
def quick(monkeypatch):
    """Receivers with a short request timeout, so that a stall costs a second, not half a minute."""
    init = _stage_fanout.Receiver.__init__

    def short(self, *args, **kwargs):
        kwargs["timeout"] = TIMEOUT
        init(self, *args, **kwargs)
    monkeypatch.setattr(_stage_fanout.Receiver, "__init__", short)


def _prefer(monkeypatch, url):
    """Whenever the receiver chooses among peers, the one at ``url`` (so that the misbehaving one is asked)."""
    choice = _stage_fanout.random.choice

    def pick(items):
        if items and all(isinstance(p, _stage_fanout_wire.PeerLink) for p in items):
            for p in items:
                if p.url == url:
                    return p
        return choice(items)
    monkeypatch.setattr(_stage_fanout.random, "choice", pick)
    absorb = _stage_fanout.Receiver._absorb

    def absorb_without_load(self, link, doc):  # its own reported load is no reason to pass it over
        return absorb(self, link, dict(doc, load=0))
    monkeypatch.setattr(_stage_fanout.Receiver, "_absorb", absorb_without_load)


def _stage_from(src, tmp_path, links, **kw):
    d = str(tmp_path / "n1" / "m" / "r1")
    t0 = time.monotonic()
    r = _stage.stage(src, d, peers=links, peer_token=TOKEN, piece_size=PIECE, read_streams=1, fsync=False, **kw)
    return r, d, time.monotonic() - t0


@pytest.mark.parametrize("behaviour, why", [("unserved", "did not serve"), ("errors", "HTTP 500"),
                                            ("stall", "stalled"), ("truncated", "broke off")])
def test_a_peer_that_does_not_deliver_is_dropped_after_max_tries(src, tmp_path, seed_dest, peers, quick,
                                                                 monkeypatch, behaviour, why):
    seed = peers(seed_dest)
    bad = peers(seed_dest, behaviour)
    _prefer(monkeypatch, bad.url)
    # a 404 counts once per piece list (several pulls from one list are one try): slow the run down enough for
    # MAX_PEER_TRIES lists to come in before the seed has sent everything
    slow = {"peer_rate_limit": 512 * 1024} if behaviour == "unserved" else {}
    r, d, took = _stage_from(src, tmp_path, [{"url": seed.url, "seed": True}, {"url": bad.url}], **slow)
    assert fake_peers.same_tree(src, d)
    dropped = dict((x["url"], x) for x in r["peers_dropped"])
    assert list(dropped) == [bad.url], r["peers_dropped"]
    assert why in dropped[bad.url]["reason"] and not dropped[bad.url]["lied"]
    # bounded: MAX_PEER_TRIES tries in a row, each at most one pull per worker (PEER_STREAMS per read stream)
    tries = bad.server.transfers
    assert _stage_fanout_wire.MAX_PEER_TRIES <= tries <= _stage_fanout_wire.MAX_PEER_TRIES * _stage_fanout.PEER_STREAMS
    assert r["bytes_from_peers"] == r["bytes_total"] and r["bytes_per_peer"] == {seed.url: r["bytes_total"]}
    assert took < 3 * (TIMEOUT + PIECE / float(_stage_fanout_wire.MIN_PEER_RATE)) + 10


@pytest.mark.parametrize("kind", sorted(fake_peers.MALFORMED) + sorted(fake_peers.RAW))
def test_a_seed_with_malformed_piece_lists_is_dropped_and_src_read(src, tmp_path, seed_dest, peers, quick, kind):
    bad = peers(seed_dest, "malformed:" + kind)
    r, d, took = _stage_from(src, tmp_path, [{"url": bad.url, "seed": True}])
    assert fake_peers.same_tree(src, d)
    assert [x["url"] for x in r["peers_dropped"]] == [bad.url]
    reason = r["peers_dropped"][0]["reason"]
    assert "not a piece list" in reason and "%d times" % _stage_fanout_wire.MAX_PEER_TRIES in reason
    assert r["bytes_from_source"] == r["bytes_total"] and took < 10
    assert "\\u06" not in json.dumps(r) and "xxxx" not in reason  # the answer is never quoted


def test_a_seed_that_stalls_its_piece_list_is_dropped(src, tmp_path, seed_dest, peers, quick):
    bad = peers(seed_dest, "stall_list")
    r, d, took = _stage_from(src, tmp_path, [{"url": bad.url, "seed": True}])
    assert fake_peers.same_tree(src, d) and r["bytes_from_source"] == r["bytes_total"]
    assert "stalled" in r["peers_dropped"][0]["reason"]
    assert took < _stage_fanout_wire.MAX_PEER_TRIES * (TIMEOUT + 1) + 5


@pytest.mark.parametrize("liar_first", [True, False])
def test_seeds_that_disagree_are_judged_by_the_shared_filesystem(src, tmp_path, seed_dest, peers, liar_first):
    honest = peers(seed_dest)
    liar = peers(fake_peers.flipped_copy(seed_dest, str(tmp_path / "liar" / "m" / "r1"), PIECE, consistent=True),
                 "lie_seed")
    links = [{"url": honest.url, "seed": True}, {"url": liar.url, "seed": True}]
    r, d, _took = _stage_from(src, tmp_path, links[::-1] if liar_first else links)
    assert fake_peers.same_tree(src, d)
    assert [(x["url"], x["lied"], x["seed"]) for x in r["peers_dropped"]] == [(liar.url, True, True)]
    assert "shared filesystem" in r["peers_dropped"][0]["reason"]
    assert r["bytes_from_peers"] + r["bytes_from_source"] == r["bytes_total"]


def test_piece_list_parser_refuses_every_malformed_list(seed_dest):
    offer = fake_peers._stage_peer.Offer(seed_dest, PIECE, ttl=0)
    good = offer.public(0)
    parsed = _stage_fanout_wire.parse_piece_list(json.dumps(good).encode(), PIECE)
    assert parsed["state"] == "complete" and set(parsed["files"]) == set(good["files"])
    for kind, edit in sorted(fake_peers.MALFORMED.items()):
        body = json.dumps(edit(json.loads(json.dumps(good))), ensure_ascii=False).encode("utf-8")
        with pytest.raises(_stage_fanout_wire.PeerLie):
            _stage_fanout_wire.parse_piece_list(body, PIECE)
    for kind, raw in sorted(fake_peers.RAW.items()):
        with pytest.raises(_stage_fanout_wire.PeerLie):
            _stage_fanout_wire.parse_piece_list(raw % {b"ps": PIECE}, PIECE)
    with pytest.raises(_stage_fanout_wire.PeerLie):  # another run's piece size
        _stage_fanout_wire.parse_piece_list(json.dumps(good).encode(), 2 * PIECE)


def test_digest_list_parser():
    ok = ["a" * 64, None]
    assert _stage_fanout_wire.parse_digests(json.dumps({"digests": ok}).encode(), 2) == ok
    for bad in ({"digests": ok[:1]}, {"digests": ["A" * 64, None]}, {"digests": ["\u0661" * 64, None]},
                {"digests": [["a" * 64], None]}, {"digests": [1, None]}, [ok], {"digests": "aa"},
                {"digests": ["a" * 64 + "\n", None]}, {"digests": ["a" * 63, None]}, {"digests": ["a" * 65, None]},
                {"digests": ["g" * 64, None]}):
        with pytest.raises(_stage_fanout_wire.PeerLie):
            _stage_fanout_wire.parse_digests(json.dumps(bad).encode(), 2)


URL = "http://10.0.0.2:18700/r/m/r1"


@pytest.mark.parametrize("kw, field", [
    ({"piece_size": 0, "record_pieces": True}, "piece_size"),
    ({"piece_size": 4097, "record_pieces": True}, "piece_size"),
    ({"piece_size": 2 ** 31, "record_pieces": True}, "piece_size"),
    ({"piece_size": True, "record_pieces": True}, "piece_size"),
    ({"peers": [{"url": "http://u:p@10.0.0.2:18700/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "https://10.0.0.2:18700/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://10.0.0.2/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://10.0.0.2:0/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://10.0.0.2:99999/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://10.0.0.2:x/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://:18700/r/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://10.0.0.2:18700/m/r1"}]}, "peers[0].url"),
    ({"peers": [{"url": "http://10.0.0.2:18700/r/../r1"}]}, "peers[0].url"),
    ({"peers": [{"url": URL + "?a=1"}]}, "peers[0].url"),
    ({"peers": [{"url": " " + URL}]}, "peers[0].url"),
    ({"peers": [{"url": URL}, {"url": URL + "/"}]}, "peers[1].url"),
    ({"peers": [{"url": URL, "seed": "yes"}]}, "peers[0].seed"),
    ({"peers": ["http://10.0.0.2:18700/r/m/r1"]}, "peers[0]"),
    ({"peers": [{"url": URL}], "peer_token": None}, "peer_token"),
    ({"peers": [{"url": URL}], "peer_token": "short"}, "peer_token"),
    ({"peers": [{"url": URL}], "peer_token": "a token with spaces in it"}, "peer_token"),
    ({"fleet_slots_dir": "SLOTS", "fleet_read_streams": 2, "fleet_stale_seconds": 1}, "fleet_stale_seconds"),
    ({"fleet_slots_dir": "SLOTS", "fleet_read_streams": 2, "fleet_stale_seconds": math.nan}, "fleet_stale_seconds"),
    ({"fleet_slots_dir": "SLOTS", "fleet_read_streams": 2, "fleet_stale_seconds": math.inf}, "fleet_stale_seconds"),
])
def test_protocol_options_are_refused_before_anything_is_prepared(src, tmp_path, kw, field):
    kw = dict(kw)
    if kw.get("fleet_slots_dir") == "SLOTS":
        kw["fleet_slots_dir"] = str(tmp_path / "slots")
    if "peers" in kw:
        kw.setdefault("peer_token", TOKEN)
    dest = tmp_path / "nvme" / "m" / "r1"
    with pytest.raises(_stage.StageError) as e:
        _stage.stage(src, str(dest), **kw)
    msg = str(e.value)
    assert msg.startswith(field + ":"), msg
    assert "p@" not in msg and TOKEN not in msg
    assert not (tmp_path / "nvme").exists() and not (tmp_path / "slots").exists()


def test_a_relative_or_root_dest_is_refused(tmp_path):
    (tmp_path / "to-root").symlink_to("/")
    # the root however it is spelt: "//" (which normpath keeps), "/.", "/x/..", a link to /
    for dest, word in (("models/m/r1", "relative"), ("/", "root"), ("//", "root"), ("/.", "root"), ("/tmp/..", "root"),
                       (str(tmp_path / "to-root"), "root")):
        with pytest.raises(ValueError, match="dest: .*" + word):
            _stage_fanout_wire.check_options(dest=dest)
