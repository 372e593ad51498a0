"""The fan-out peer server: token, listed files only, byte ranges within held pieces, no escape."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import threading
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer

PIECE = 8192
TOKEN = "t0ken-for-this-run-0123456789"


def _digests(data):
    return [hashlib.sha256(data[i:i + PIECE]).hexdigest() for i in range(0, len(data), PIECE)]


def _fdict(path, size):
    st = os.stat(path)
    return {"path": os.path.basename(path), "size": size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "dev": st.st_dev, "mode": 0o644}


@pytest.fixture
def served(tmp_path):
    """A published revision (one file with pieces, one without) and a partial build with a board."""
    dest = tmp_path / "nvme" / "m" / "r1"
    dest.mkdir(parents=True)
    data = os.urandom(3 * PIECE + 100)
    (dest / "a.bin").write_bytes(data)
    (dest / "old.bin").write_bytes(b"x" * 10)
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(str(tmp_path / "secret.txt"), str(dest / "link.bin"))
    recs = []
    for name, pieces in (("a.bin", _digests(data)), ("old.bin", None)):
        st = os.lstat(str(dest / name))
        recs.append(_marker.FileRecord(name, st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns),
                                       _marker.copy_stat(st), "headers", None, None, pieces,
                                       PIECE if pieces else None))
    _marker.write_marker(str(dest), "/shared/m/r1", "headers", recs)
    server = _stage_peer.PeerServer("127.0.0.1", 0, _stage_peer.token_digest(TOKEN),
                                    {"m/r1": _stage_peer.Offer(str(dest), PIECE, ttl=0)})
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield {"port": server.server_address[1], "dest": str(dest), "data": data, "server": server, "tmp": tmp_path}
    server.shutdown()
    server.server_close()


def get(port, path, token=TOKEN, rng=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    if rng:
        headers["Range"] = rng
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


def test_no_token_or_a_wrong_one_is_403(served):
    for token in (None, "", "wrong-token-0123456789", TOKEN[:-1]):
        status, body = get(served["port"], "/r/m/r1/pieces", token=token)
        assert status == 403, token
        assert TOKEN not in body.decode()
    status, _body = get(served["port"], "/r/m/r1/files/a.bin", token=None, rng="bytes=0-9")
    assert status == 403
    assert served["server"].denied >= 5


def test_pieces_lists_only_files_with_digests(served):
    status, body = get(served["port"], "/r/m/r1/pieces")
    assert status == 200
    doc = json.loads(body)
    assert doc["state"] == "complete" and doc["piece_size"] == PIECE
    assert sorted(doc["files"]) == ["a.bin"]            # old.bin has no pieces, link.bin is not listed
    assert doc["files"]["a.bin"]["have"] == "1111"
    status, body = get(served["port"], "/r/m/r1/digests?file=a.bin")
    assert json.loads(body)["digests"] == _digests(served["data"])


def test_range_requests_return_exactly_those_bytes(served):
    data = served["data"]
    for first, last in ((0, 0), (5, PIECE + 7), (3 * PIECE, len(data) - 1), (0, len(data) - 1)):
        status, body = get(served["port"], "/r/m/r1/files/a.bin", rng="bytes=%d-%d" % (first, last))
        assert status == 206
        assert body == data[first:last + 1]
    assert get(served["port"], "/r/m/r1/files/a.bin", rng="bytes=0-%d" % len(data))[0] == 416
    assert get(served["port"], "/r/m/r1/files/a.bin")[0] == 416
    assert get(served["port"], "/r/m/r1/files/a.bin", rng="bytes=0-1,4-5")[0] == 416


def test_no_escape_and_only_listed_files(served):
    for path in ("/r/m/r1/files/old.bin", "/r/m/r1/files/link.bin", "/r/m/r1/files/../../secret.txt",
                 "/r/m/r1/files/%2e%2e/%2e%2e/secret.txt", "/r/m/r1/files//etc/passwd",
                 "/r/m/r1/files/" + _marker.MARKER, "/r/m/r2/pieces", "/r/m/../secret.txt", "/etc/passwd"):
        status, body = get(served["port"], path, rng="bytes=0-3")
        assert status == 404, path
        assert b"outside" not in body


def test_a_copy_changed_after_publish_is_not_served(served):
    with open(os.path.join(served["dest"], "a.bin"), "r+b") as f:
        f.write(b"Z")
    status, body = get(served["port"], "/r/m/r1/pieces")
    assert json.loads(body)["files"] == {}
    assert get(served["port"], "/r/m/r1/files/a.bin", rng="bytes=0-3")[0] == 404


def test_board_pieces_are_served_only_once_held(served, tmp_path):
    partial = served["dest"] + ".partial"
    os.makedirs(partial)
    data = os.urandom(2 * PIECE)
    part = os.path.join(partial, "b.bin" + _marker.PART_SUFFIX)
    with open(part, "wb") as f:
        f.write(data)
    board = _stage_peer.Board(partial, PIECE)
    board.add("b.bin", _fdict(part, len(data)), None, None)
    board.held("b.bin", 1, _digests(data)[1])
    board.write()
    doc = json.loads(get(served["port"], "/r/m/r1/pieces")[1])
    assert doc["state"] == "copying" and doc["files"]["b.bin"]["have"] == "01"
    assert get(served["port"], "/r/m/r1/files/b.bin", rng="bytes=0-10")[0] == 404
    assert get(served["port"], "/r/m/r1/files/b.bin", rng="bytes=%d-%d" % (PIECE - 1, PIECE))[0] == 404
    status, body = get(served["port"], "/r/m/r1/files/b.bin", rng="bytes=%d-%d" % (PIECE, 2 * PIECE - 1))
    assert status == 206 and body == data[PIECE:]
    # a file completed since: served from its final name
    os.rename(part, os.path.join(partial, "b.bin"))
    board.held("b.bin", 0, _digests(data)[0])
    board.done("b.bin")
    board.write()
    status, body = get(served["port"], "/r/m/r1/files/b.bin", rng="bytes=0-%d" % (2 * PIECE - 1))
    assert status == 206 and body == data


def test_a_receiver_slower_than_the_sender_gets_the_whole_range(tmp_path):
    # a peer on a slower link drains its socket slowly: the server's send buffer fills and sendfile on the
    # (timeout, hence non-blocking) socket raises EAGAIN; the response must wait for the receiver, not end early
    dest = tmp_path / "nvme" / "m" / "r1"
    dest.mkdir(parents=True)
    data = os.urandom(4 * 1024 * 1024)
    (dest / "big.bin").write_bytes(data)
    st = os.lstat(str(dest / "big.bin"))
    rec = _marker.FileRecord("big.bin", st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns),
                             _marker.copy_stat(st), "headers", None, None, _digests(data), PIECE)
    _marker.write_marker(str(dest), "/shared/m/r1", "headers", [rec])
    server = _stage_peer.PeerServer("127.0.0.1", 0, _stage_peer.token_digest(TOKEN),
                                    {"m/r1": _stage_peer.Offer(str(dest), PIECE, ttl=0)})
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.connect(("127.0.0.1", server.server_address[1]))
        sock.sendall(("GET /r/m/r1/files/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                      "Range: bytes=0-%d\r\nConnection: close\r\n\r\n" % (TOKEN, len(data) - 1)).encode())
        time.sleep(0.5)  # the server fills every buffer between it and us, then must wait
        raw = bytearray()
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
        sock.close()
    finally:
        server.shutdown()
        server.server_close()
    head, _sep, body = bytes(raw).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 206 " in head.split(b"\r\n")[0]
    assert len(body) == len(data) and body == data


@pytest.mark.parametrize("step", [365 * 86400.0, -365 * 86400.0])
def test_the_board_age_is_read_on_the_filesystem_clock_whatever_this_hosts_clock_says(served, monkeypatch, step):
    """Before: the board's mtime against ``time.time()``; this host's clock a year ahead gave a board a year old,
    a year behind an age of 0. Now the filesystem's own clock (``_clock.filesystem_now``), which stamped the mtime."""
    partial = served["dest"] + ".partial"
    os.makedirs(partial)
    board = _stage_peer.Board(partial, PIECE)
    board.write()
    path = os.path.join(partial, _stage_peer.BOARD)
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime - 30))  # last rewritten 30 s ago
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + step)
    snap = _stage_peer.Offer(served["dest"], PIECE, ttl=0).snapshot()
    assert snap["state"] == "copying" and 29.0 <= snap["board_age"] < 90.0, snap["board_age"]
    assert os.listdir(partial) == [_stage_peer.BOARD]  # reading the clock leaves nothing behind


def test_the_filesystem_clock_is_read_once_per_reread_and_carried_forward(served, monkeypatch):
    """Before: every snapshot of a revision with a board created and deleted a file to read the filesystem's clock
    (about 5 a second while receivers waited). Now once per ``FS_CLOCK_REREAD``, carried forward on the monotonic
    clock in between; a filesystem that cannot say is asked again at the next snapshot."""
    partial = served["dest"] + ".partial"
    os.makedirs(partial)
    _stage_peer.Board(partial, PIECE).write()
    path = os.path.join(partial, _stage_peer.BOARD)
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime - 30))
    reads = []
    real = _stage_peer._clock.filesystem_now

    def counted(directory):
        reads.append(directory)
        if len(reads) == 1:
            raise OSError("read-only for a moment")
        return real(directory)
    monkeypatch.setattr(_stage_peer._clock, "filesystem_now", counted)
    offer = _stage_peer.Offer(served["dest"], PIECE, ttl=0)
    assert offer.snapshot()["board_age"] is None and len(reads) == 1
    ages = [offer.snapshot()["board_age"] for _i in range(20)]
    assert len(reads) == 2 and all(29.0 <= a < 60.0 for a in ages) and ages == sorted(ages), ages
    offer._fs_clock.reread = 0.0  # pylint: disable=protected-access
    assert 29.0 <= offer.snapshot()["board_age"] < 60.0 and len(reads) == 3
