"""Fan-out staging in one process: a seed records piece digests from src, receivers pull them from peers'
servers, a bad piece is rejected and fetched elsewhere, a dead peer falls back, the token is required."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_progress
from ansible_collections.llmops.serving.tests.lib import stage_synth
from ansible_collections.llmops.serving.tests.lib import fake_peers
from ansible_collections.llmops.serving.tests.lib.refusals import assert_refused

PIECE = 256 * 1024
TOKEN = "fanout-test-token-0123456789abcdef"


@pytest.fixture
def src(tmp_path):
    root = str(tmp_path / "shared" / "m" / "r1")
    stage_synth.write_checkpoint(root, 6 * 1024 * 1024, shards=3, seed=3)
    return root


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _same_tree(a, b):
    names = sorted(n for n in os.listdir(b) if n != _marker.MARKER)
    assert names == sorted(os.listdir(a))
    for n in names:
        assert _sha(os.path.join(a, n)) == _sha(os.path.join(b, n)), n


class Served(object):
    def __init__(self, dest, token=TOKEN):
        self.server = _stage_peer.PeerServer("127.0.0.1", 0, _stage_peer.token_digest(token),
                                             {"m/r1": _stage_peer.Offer(dest, PIECE, ttl=0)})
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d/r/m/r1" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers():
    made = []

    def make(dest, token=TOKEN):
        s = Served(dest, token)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def _seed(src, tmp_path):
    dest = str(tmp_path / "seed" / "m" / "r1")
    r = _stage.stage(src, dest, record_pieces=True, piece_size=PIECE)
    assert r["bytes_from_source"] == r["bytes_total"]
    return dest, r


def test_seed_records_piece_digests_of_the_source(src, tmp_path):
    dest, _r = _seed(src, tmp_path)
    marker = _marker.read_marker(dest).marker
    assert marker.piece_size == PIECE
    for rec in marker.records:
        data = open(os.path.join(src, rec.path), "rb").read()
        assert rec.pieces == [hashlib.sha256(data[i:i + PIECE]).hexdigest() for i in range(0, len(data), PIECE)]


def test_old_marker_gets_pieces_read_back_without_reading_src(src, tmp_path):
    dest = str(tmp_path / "old" / "m" / "r1")
    _stage.stage(src, dest)
    assert all(r.pieces is None for r in _marker.read_marker(dest).marker.records)
    r = _stage.stage(src, dest, record_pieces=True, piece_size=PIECE)
    assert r["changed"] and r["pieces_read_back"] == r["files_total"] and r["bytes_from_source"] == 0
    assert all(rec.has_pieces(PIECE) for rec in _marker.read_marker(dest).marker.records)
    assert not _stage.stage(src, dest, record_pieces=True, piece_size=PIECE)["changed"]


def test_receivers_pull_from_seed_and_each_other_without_reading_src(src, tmp_path, servers):
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    d1 = str(tmp_path / "n1" / "m" / "r1")
    r1 = _stage.stage(src, d1, peers=[{"url": seed.url, "seed": True}], peer_token=TOKEN, piece_size=PIECE,
                      verify="sha256")
    assert r1["bytes_from_source"] == 0 and r1["bytes_from_peers"] == r1["bytes_total"]
    assert r1["peers_used"] == [seed.url] and r1["bad_pieces_rejected"] == 0
    _same_tree(src, d1)
    n1 = servers(d1)
    d2 = str(tmp_path / "n2" / "m" / "r1")
    r2 = _stage.stage(src, d2, peers=[{"url": seed.url, "seed": True}, {"url": n1.url}], peer_token=TOKEN,
                      piece_size=PIECE)
    assert r2["bytes_from_source"] == 0 and r2["bytes_from_peers"] == r2["bytes_total"]
    assert sum(r2["bytes_per_peer"].values()) == r2["bytes_total"]
    assert set(r2["bytes_per_peer"]) == set(r2["peers_used"]) and set(r2["peers_used"]) <= {seed.url, n1.url}
    assert r1["bytes_per_peer"] == {seed.url: r1["bytes_total"]}
    _same_tree(src, d2)
    recs = _marker.read_marker(d2).marker.records
    assert [r.pieces for r in recs] == [r.pieces for r in _marker.read_marker(seed_dest).marker.records]


def _liar(seed_dest, tmp_path, flip="model-00002-of-00003.safetensors", at=PIECE + 5):
    """A peer whose board says it holds every piece verified, with one byte flipped on disk since."""
    dest = str(tmp_path / "liar" / "m" / "r1")
    partial = dest + ".partial"
    shutil.copytree(seed_dest, partial)
    os.unlink(os.path.join(partial, _marker.MARKER))
    with open(os.path.join(partial, flip), "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    board = _stage_peer.Board(partial, PIECE)
    for rec in _marker.read_marker(seed_dest).marker.records:
        st = os.stat(os.path.join(partial, rec.path))
        f = {"size": rec.size, "ino": rec.src[1], "mtime_ns": rec.src[2], "ctime_ns": rec.src[3], "mode": 0o644}
        assert st.st_size == rec.size
        board.add(rec.path, f, rec.header_sha256, rec.sha256, rec.pieces, held=True, done=True)
    board.write()
    return dest


def test_bad_piece_is_rejected_the_liar_dropped_and_the_piece_refetched(src, tmp_path, servers, monkeypatch):
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    liar = servers(_liar(seed_dest, tmp_path))
    # the liar is preferred whenever it holds the piece, and nothing is picked before both piece lists are in,
    # so its bad piece is certainly asked for
    choice = _stage_fanout.random.choice

    def liar_first(items):
        if all(isinstance(p, _stage_fanout_wire.PeerLink) for p in items):
            return sorted(items, key=lambda p: p.seed)[0]
        return choice(items)
    monkeypatch.setattr(_stage_fanout.random, "choice", liar_first)
    monkeypatch.setattr(_stage_fanout, "PEER_STREAMS", 1)  # one pull at a time: the liar is always the choice
    pick = _stage_fanout.Receiver._pick

    def pick_once_both_seen(self):
        while not all(link.seen_at for link in self.links):
            time.sleep(0.01)
        return pick(self)
    monkeypatch.setattr(_stage_fanout.Receiver, "_pick", pick_once_both_seen)
    absorb = _stage_fanout.Receiver._absorb

    def absorb_without_load(self, link, doc):  # a load the liar reported during our own transfer is no reason
        absorb(self, link, dict(doc, load=0))
    monkeypatch.setattr(_stage_fanout.Receiver, "_absorb", absorb_without_load)
    d = str(tmp_path / "n1" / "m" / "r1")
    r = _stage.stage(src, d, peers=[{"url": seed.url, "seed": True}, {"url": liar.url}], peer_token=TOKEN,
                     piece_size=PIECE, read_streams=1)
    assert r["bad_pieces_rejected"] == 1, r
    assert r["peers_dropped"][0]["url"] == liar.url and "bad piece" in r["peers_dropped"][0]["reason"]
    assert r["bytes_from_source"] == 0 and r["bytes_from_peers"] == r["bytes_total"]
    _same_tree(src, d)


def test_liar_claiming_to_be_the_only_seed_cannot_publish_wrong_bytes(src, tmp_path, servers):
    seed_dest, _r = _seed(src, tmp_path)
    liar = servers(_liar(seed_dest, tmp_path))
    d = str(tmp_path / "n1" / "m" / "r1")
    # a broken *non-seed* peer alone: its digests are never used, every piece comes from src
    r = _stage.stage(src, d, peers=[{"url": liar.url}], peer_token=TOKEN, piece_size=PIECE)
    assert r["bytes_from_peers"] == 0 and r["bytes_from_source"] == r["bytes_total"]
    _same_tree(src, d)


def test_dead_seed_falls_back_to_src_under_the_read_limit(src, tmp_path, servers):
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    seed.close()
    d = str(tmp_path / "n1" / "m" / "r1")
    r = _stage.stage(src, d, peers=[{"url": seed.url, "seed": True}], peer_token=TOKEN, piece_size=PIECE,
                     progress_file=str(tmp_path / "p.json"))
    assert r["bytes_from_source"] == r["bytes_total"] and r["bytes_from_peers"] == 0
    assert r["peers_dropped"] and r["peers_dropped"][0]["url"] == seed.url
    _same_tree(src, d)
    prog = json.load(open(str(tmp_path / "p.json")))
    assert prog["bytes_from_source"] == r["bytes_total"] and "from the shared filesystem" in prog["message"]


def test_wrong_token_drops_the_peer(src, tmp_path, servers):
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest, token="another-runs-token-0123456789")
    d = str(tmp_path / "n1" / "m" / "r1")
    r = _stage.stage(src, d, peers=[{"url": seed.url, "seed": True}], peer_token=TOKEN, piece_size=PIECE)
    assert "403" in r["peers_dropped"][0]["reason"] and r["bytes_from_source"] == r["bytes_total"]
    assert TOKEN not in json.dumps(r)


def test_throttle_keeps_the_rate():
    now = [0.0]

    def sleep(s):
        now[0] += s
    t = _stage_progress.Throttle(1000, clock=lambda: now[0], sleep=sleep)
    for _i in range(10):
        t.consume(500)
    assert now[0] == pytest.approx(5.0, abs=0.01)


@pytest.mark.parametrize("bad, option", [({"peers": [{"url": "ftp://x/r/m/r1"}], "peer_token": TOKEN}, "peers[0].url"),
                                         ({"peers": [{"url": "http://u:p@h:1/r/m/r1"}], "peer_token": TOKEN}, "peers[0].url"),
                                         ({"peers": [{"url": "http://h:1/r/m/r1"}]}, "peer_token"),
                                         ({"record_pieces": True, "piece_size": 1000}, "piece_size"),
                                         ({"read_rate_limit": -1}, "read_rate_limit")])
def test_bad_fanout_options_are_refused_before_anything_changes(src, tmp_path, bad, option):
    d = str(tmp_path / "n1" / "m" / "r1")
    with pytest.raises(_stage.StageError) as e:
        _stage.stage(src, d, **bad)
    assert_refused(e.value, option=option)
    assert TOKEN not in str(e.value) and "u:p" not in str(e.value)
    assert not os.path.exists(os.path.dirname(d))


def test_read_rate_limit_caps_each_stream_without_fanout(tmp_path):
    src = str(tmp_path / "shared" / "m" / "r1")
    stage_synth.write_checkpoint(src, 3 * 1024 * 1024, shards=2, seed=5, extra_files=False)
    rate = 2 * 1024 * 1024
    d = str(tmp_path / "n1" / "m" / "r1")
    r = _stage.stage(src, d, read_streams=1, read_rate_limit=rate, fsync=False)
    assert r["bytes_from_source"] == r["bytes_total"] and r["bytes_from_peers"] == 0
    assert r["seconds"] >= 0.8 * r["bytes_total"] / rate
    _same_tree(src, d)


def _rewrite_marker(dest, edit):
    path = os.path.join(dest, _marker.MARKER)
    doc = json.load(open(path))
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_format_2_marker_is_still_a_staged_revision(src, tmp_path):
    dest, _r = _seed(src, tmp_path)

    def to_format_2(doc):
        doc["format"] = 2
        doc.pop("piece_size")
        for e in doc["files"]:
            e.pop("pieces")
    _rewrite_marker(dest, to_format_2)
    ms = _marker.read_marker(dest)
    assert ms.kind == "ok" and all(r.pieces is None for r in ms.marker.records)
    assert not _stage.stage(src, dest)["changed"]  # nothing restaged for want of digests


@pytest.mark.parametrize("edit", [
    lambda doc: doc["files"][0]["pieces"].pop(),                        # one digest short
    lambda doc: doc["files"][0]["pieces"].__setitem__(0, "zz" * 32),    # not hex
    lambda doc: doc.__setitem__("piece_size", 1000),                    # not 4096-aligned
    lambda doc: doc.pop("piece_size"),                                  # pieces without a size
    lambda doc: doc.__setitem__("format", 2),                           # pieces in a format 2 marker
])
def test_malformed_piece_digests_mean_not_staged(src, tmp_path, edit):
    dest, _r = _seed(src, tmp_path)
    _rewrite_marker(dest, edit)
    assert _marker.read_marker(dest).kind == "bad"
    r = _stage.stage(src, dest, record_pieces=True, piece_size=PIECE)
    assert r["changed"] and r["reason"].startswith("not staged")
    assert all(rec.has_pieces(PIECE) for rec in _marker.read_marker(dest).marker.records)
    _same_tree(src, dest)


def test_resume_keeps_the_pieces_of_files_completed_before_the_kill(src, tmp_path):
    dest, _r = _seed(src, tmp_path)
    partial = dest + ".partial"
    os.rename(dest, partial)   # as a run killed just before publishing leaves it: marker written, not renamed
    prev = _marker.partial_records(partial)
    assert prev and all(rec.has_pieces(PIECE) for rec, _source in prev.values())
    r = _stage.stage(src, dest, record_pieces=True, piece_size=PIECE)
    assert r["files_copied"] == 0 and r["bytes_from_source"] == 0 and r["pieces_read_back"] == 0
    _same_tree(src, dest)


def test_journal_lines_carry_the_pieces(tmp_path):
    partial = str(tmp_path / "r1.partial")
    os.makedirs(partial)
    rec = _marker.FileRecord("a.bin", 5000, (1, 2, 3, 4), (5, 5000, 6, 7), "headers", None, None,
                             ["ab" * 32, "cd" * 32], 4096)
    j = _marker.Journal(partial, "/shared/m/r1")
    j.append(rec)
    j.close()
    got, source = _marker.partial_records(partial)["a.bin"]
    assert source == "/shared/m/r1" and got.pieces == rec.pieces and got.piece_size == 4096
    with pytest.raises(ValueError):
        rec.set_pieces(["ab" * 32], 4096)   # 5000 bytes are two 4096-byte pieces


def test_copier_reports_each_piece_once_it_is_written(tmp_path):
    """A seed hands a piece on while the rest of its file is still being copied: ``on_piece`` fires only when
    the piece's bytes are in ``<file>.llmops-part`` and carries the digest of the bytes read from src."""
    src = str(tmp_path / "shared" / "m" / "r1")
    # 16 MiB buffers: a 40 MiB file is 160 pieces written in three buffers, the last one short
    stage_synth.write_checkpoint(src, 40 * 1024 * 1024 + 12345, shards=1, seed=9, extra_files=False)
    partial = str(tmp_path / "n" / "r1.partial")
    os.makedirs(partial)
    seen = []
    before_done = []

    def on_piece(rel, i, digest):
        part = os.path.join(partial, rel + _marker.PART_SUFFIX)
        before_done.append(os.path.exists(part))
        with open(part, "rb") as f:
            f.seek(i * PIECE)
            assert hashlib.sha256(f.read(PIECE)).hexdigest() == digest, (rel, i)
        seen.append((rel, i, digest))
    files, copier = stage_synth.copier(src, partial, "headers", 2, piece=PIECE, on_piece=on_piece)
    copier.run(files)
    for rel, digests in copier.piece_digests.items():
        assert [(r, i, d) for r, i, d in seen if r == rel] == [(rel, i, d) for i, d in enumerate(digests)]
    assert sum(len(d) for d in copier.piece_digests.values()) == len(seen) > 160
    assert all(before_done)  # reported from the part file, before the file got its name


def test_seed_serves_pieces_of_a_file_it_is_still_copying(tmp_path, servers):
    """Pipelining from the seed: while the seed's copy of a file is under way (held back by read_rate_limit),
    its server lists part of that file's pieces held and hands one over, bytes matching the seed's digest."""
    src = str(tmp_path / "shared" / "m" / "r1")
    stage_synth.write_checkpoint(src, 4 * 1024 * 1024, shards=1, seed=11, extra_files=False)
    dest = str(tmp_path / "seed" / "m" / "r1")
    seed = servers(dest)
    done = {}
    t = threading.Thread(target=lambda: done.update(_stage.stage(src, dest, record_pieces=True, piece_size=PIECE,
                                                                 read_streams=1, read_rate_limit=1024 * 1024,
                                                                 fsync=False)))
    t.start()
    partly = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and partly is None and t.is_alive():
            doc = _get(seed.url + "/pieces")
            for rel, e in doc["files"].items():
                if "1" in e["have"] and "0" in e["have"] and rel.endswith(".safetensors"):
                    partly = rel, e["have"].index("1")
            time.sleep(0.05)
        assert partly, "the seed never listed a file with some pieces held and some not"
        rel, i = partly
        digests = _get(seed.url + "/digests?file=" + rel)["digests"]
        body = _get(seed.url + "/files/" + rel, {"Range": "bytes=%d-%d" % (i * PIECE, (i + 1) * PIECE - 1)}, raw=True)
        assert hashlib.sha256(body).hexdigest() == digests[i]
        with open(os.path.join(src, rel), "rb") as f:
            f.seek(i * PIECE)
            assert body == f.read(PIECE)
    finally:
        t.join(60)
    assert done["changed"] and done["bytes_from_source"] == done["bytes_total"]
    _same_tree(src, dest)


def _get(url, headers=None, raw=False):
    h = {"Authorization": "Bearer " + TOKEN}
    h.update(headers or {})
    with urllib.request.urlopen(urllib.request.Request(url, headers=h), timeout=10) as resp:
        body = resp.read()
    return body if raw else json.loads(body)


def test_server_counts_the_pieces_it_sent(src, tmp_path, servers):
    """``/pieces`` says per piece how many transfers this server started, so receivers can leave a seed's
    uplink to pieces nobody got from it yet."""
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    rel = "model-00001-of-00003.safetensors"
    assert "sent" not in _get(seed.url + "/pieces")["files"][rel]
    for rng in ("bytes=0-10", "bytes=%d-%d" % (PIECE - 1, PIECE), "bytes=%d-%d" % (PIECE, 2 * PIECE - 1)):
        _get(seed.url + "/files/" + rel, {"Range": rng}, raw=True)
    sent = _get(seed.url + "/pieces")["files"][rel]["sent"]
    assert sent[:3] == "220" and set(sent[3:]) <= {"0"}


def _status(url, headers):
    try:
        return _get(url, headers, raw=True), 200
    except urllib.error.HTTPError as e:
        return json.loads(e.read()), e.code


def test_a_seed_sends_a_piece_asked_as_unsent_once_and_refuses_it_so_afterwards(src, tmp_path, servers):
    """Receivers see a seed's ``sent`` only with its next list, so two may ask for the same new piece: with the
    unsent header the second gets 409 and no byte, and the count stays one; a piece asked without it (a receiver
    that waited long enough for another holder, or one of an older version) is sent as before."""
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    rel = "model-00001-of-00003.safetensors"
    url = seed.url + "/files/" + rel
    rng = {"Range": "bytes=%d-%d" % (PIECE, 2 * PIECE - 1), _stage_fanout_wire.UNSENT_HEADER: "1"}
    with open(os.path.join(seed_dest, rel), "rb") as f:
        f.seek(PIECE)
        piece = f.read(PIECE)
    assert _status(url, rng) == (piece, 200)
    body, code = _status(url, rng)
    assert code == 409 and "a transfer of this range was started before" in body["error"]
    assert _get(seed.url + "/pieces")["files"][rel]["sent"][:2] == "01"
    assert _status(url, {"Range": rng["Range"]}) == (piece, 200)
    assert _get(seed.url + "/pieces")["files"][rel]["sent"][:2] == "02"
    # a range over a piece sent and one not sent is refused whole
    body, code = _status(url, {"Range": "bytes=0-%d" % PIECE, _stage_fanout_wire.UNSENT_HEADER: "1"})
    assert code == 409 and _get(seed.url + "/pieces")["files"][rel]["sent"][:2] == "02"


def _receiver_of_seed(src, tmp_path, seed, seed_dest, rel):
    """A receiver of ``rel`` whose one peer is ``seed``, as it is before its first pull: the seed's last list
    showed no piece sent."""
    link = _stage_fanout_wire.PeerLink(seed.url, True)
    size = os.path.getsize(os.path.join(seed_dest, rel))
    rx = _stage_fanout.Receiver(src, str(tmp_path / "p"), "headers", None, [], TOKEN, PIECE, 1, None, None, False)
    rx.links = [link]
    rx._t0 = time.monotonic()
    fs = _stage_fanout._FileState({"path": rel, "size": size}, str(tmp_path / "p"), PIECE)
    rx._files = [fs]
    link.sent = {rel: "0" * fs.n}
    return rx, fs, link


def test_a_receiver_told_by_the_seed_that_a_piece_went_to_another_takes_it_elsewhere_without_a_strike(
        src, tmp_path, servers):
    """The 409 is no failure of the seed: the receiver records the piece as sent (so it is asked of whoever
    lists it, or of the seed again after ``_dup_after``), keeps the seed, and holds nothing it did not receive."""
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    rel = "model-00001-of-00003.safetensors"
    _get(seed.url + "/files/" + rel, {"Range": "bytes=0-%d" % (PIECE - 1)}, raw=True)  # another receiver's pull
    rx, fs, link = _receiver_of_seed(src, tmp_path, seed, seed_dest, rel)
    link.inflight = 1
    fs.inflight.add(0)
    buf = bytearray(PIECE)
    try:
        rx._from_peer(fs, 0, link, buf, _stage_progress.Throttle(0))
    finally:
        rx.wire.close(link)
    assert link.alive and link.strikes == 0 and link.inflight == 0
    assert link.sent_count(rel, 0) == 1 and fs.sent_at[0] is not None
    assert not fs.held[0] and 0 not in fs.inflight and rx.bytes_from_peers == 0
    assert not os.path.exists(fs.part)


def test_a_seed_that_answers_409_to_everything_is_dropped_after_the_tries_a_failing_peer_gets(src, tmp_path, servers):
    """A 409 is believed once per piece, for a piece asked as unsent: asked again (now without the header, as a
    piece the seed sent), a 409 is a failed try like any error answer, so a lying seed cannot keep a receiver
    waiting; after ``MAX_PEER_TRIES`` it is dropped and the pieces come from elsewhere."""
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    offer = seed.server.offers["m/r1"]

    def liar(*_args, **_kwargs):
        raise _stage_peer.AlreadySent("always")
    offer.open_range = liar
    rel = "model-00001-of-00003.safetensors"
    rx, fs, link = _receiver_of_seed(src, tmp_path, seed, seed_dest, rel)
    buf = bytearray(PIECE)
    try:
        for i in range(1 + _stage_fanout_wire.MAX_PEER_TRIES):
            link.inflight = 1
            fs.inflight.add(0)
            rx._from_peer(fs, 0, link, buf, _stage_progress.Throttle(0))
            if i == 0:
                assert link.alive and link.strikes == 0 and link.sent_count(rel, 0) == 1
    finally:
        rx.wire.close(link)
    assert not link.alive and "answered HTTP 409" in link.why_dropped
    assert not fs.held[0] and rx.bytes_from_peers == 0


class _FakeLink(_stage_fanout_wire.PeerLink):
    def __init__(self, name, seed, have, sent=None):
        super(_FakeLink, self).__init__("http://%s:1/r/m/r1" % name, seed)
        self.have = {"f": have}
        if sent is not None:
            self.sent = {"f": sent}


def _picker(tmp_path, links, n=6):
    rx = _stage_fanout.Receiver(str(tmp_path), str(tmp_path / "p"), "headers", None, [], TOKEN, PIECE, 4, None,
                                None, False)
    rx.links = links
    rx._t0 = time.monotonic()
    fs = _stage_fanout._FileState({"path": "f", "size": n * PIECE}, str(tmp_path / "p"), PIECE)
    fs.trusted = ["0" * 64] * n
    fs.claims = [dict((link, "0" * 64) for link in links if link.seed) for _i in range(n)]  # the seeds' digests
    rx._files = [fs]
    return rx, fs


def test_receiver_asks_a_seed_only_for_pieces_nobody_got_from_it(tmp_path):
    seed = _FakeLink("seed", True, "111100", "110000")
    peer = _FakeLink("peer", False, "100000")
    seed.state = "copying"
    rx, fs = _picker(tmp_path, [seed, peer])
    rx.poll = 0.02
    now = time.monotonic()
    fs.sent_at[0] = fs.sent_at[1] = now  # as _absorb records it from the seed's "sent"
    first = rx._pick()
    # a piece the seed never sent (2 or 3), from the seed
    assert first[1] in (2, 3) and first[2] is seed
    # the seed is now busy for this receiver (one at a time while there are peers to trade with): piece 0
    # comes from the peer that holds it
    second = rx._pick()
    assert (second[1], second[2]) == (0, peer)
    # piece 1 went to somebody a moment ago, the other new piece waits for the seed: nothing to take
    assert fake_peers.pick_within(rx, 0.3) == "waits"
    seed.inflight = 0
    third = rx._pick()
    assert third[1] == 5 - first[1] and third[2] is seed  # the other never-sent piece first
    seed.inflight = 0
    assert fake_peers.pick_within(rx, 0.3) == "waits"  # piece 1 has not been out long
    fs.sent_at[1] = now - 10
    last = rx._pick()
    assert (last[1], last[2]) == (1, seed)  # out for 10 s and nobody lists it: asked of the seed again


def test_a_piece_the_seed_sent_that_a_peer_lists_comes_from_that_peer_however_busy(tmp_path):
    """Every new piece must cross the seed's uplink, so a piece the seed already sent is traded by a peer that lists
    it, even one far busier than the idle seed and long after the seed sent it; the seed is asked again only once
    nobody else lists it (here: the peer dropped)."""
    seed = _FakeLink("seed", True, "100000", "100000")
    peer = _FakeLink("peer", False, "100000")
    seed.state = "copying"
    peer.load = 5
    rx, fs = _picker(tmp_path, [seed, peer])
    rx.poll = 0.02
    fs.sent_at[0] = time.monotonic() - 10
    got = rx._pick()
    assert (got[1], got[2]) == (0, peer)
    assert fake_peers.pick_within(rx, 0.3) == "waits"  # nothing else is held by anybody
    peer.inflight = 0
    fs.inflight.discard(0)
    peer.alive = False
    again = rx._pick()
    assert (again[1], again[2]) == (0, seed)


def test_receiver_alone_with_a_seed_uses_every_stream_on_it(tmp_path):
    seed = _FakeLink("seed", True, "111111", "000000")
    seed.state = "done"
    rx, fs = _picker(tmp_path, [seed])
    got = [rx._pick() for _k in range(4)]
    assert all(g[2] is seed for g in got) and len({g[1] for g in got}) == 4


def test_receiver_does_not_wait_for_a_fleet_slot_its_peers_make_unneeded(src, tmp_path, servers):
    """While another node holds every fleet read slot (a seed's whole copy), a receiver still reads the source's
    headers (a few KiB, no slot) and takes the revision from its peers, reading no source byte."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots
    seed_dest, _r = _seed(src, tmp_path)
    seed = servers(seed_dest)
    slots_dir = str(tmp_path / "fleet")
    holder = _fleet_slots.FleetSlots(slots_dir, 1, host_id="seed", host_max=1)
    holder.open()
    lease = holder.acquire()
    try:
        d = str(tmp_path / "n1" / "m" / "r1")
        r = _stage.stage(src, d, peers=[{"url": seed.url, "seed": True}], peer_token=TOKEN, piece_size=PIECE,
                         fleet_slots_dir=slots_dir, fleet_read_streams=1, fleet_host_id="n1", lock_timeout=2)
        assert r["bytes_from_source"] == 0 and r["bytes_from_peers"] == r["bytes_total"]
        _same_tree(src, d)
    finally:
        holder.release(lease)
        holder.close()
