"""The piece server under a hostile network: idle and slow connections never keep a peer with the token out,
slow senders and idle connections are cut off, and the server is given only the token's digest."""
from __future__ import annotations

import hashlib
import http.client
import os
import resource
import socket
import struct
import threading
import time

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer

PIECE = 8192
TOKEN = "t0ken-for-this-run-0123456789"
ROLE_TASKS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "..", "..", "roles", "model_stage", "tasks")


def _serve(tmp_path, **caps):
    dest = tmp_path / "nvme" / "m" / "r1"
    dest.mkdir(parents=True)
    data = os.urandom(3 * PIECE)
    (dest / "a.bin").write_bytes(data)
    st = os.lstat(str(dest / "a.bin"))
    digests = [hashlib.sha256(data[i:i + PIECE]).hexdigest() for i in range(0, len(data), PIECE)]
    rec = _marker.FileRecord("a.bin", st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns),
                             _marker.copy_stat(st), "headers", None, None, digests, PIECE)
    _marker.write_marker(str(dest), "/shared/m/r1", "headers", [rec])
    server = _stage_peer.PeerServer("127.0.0.1", 0, _stage_peer.token_digest(TOKEN),
                                    {"m/r1": _stage_peer.Offer(str(dest), PIECE, ttl=0)}, **caps)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    return server, data


@pytest.fixture
def served(tmp_path):
    made = []

    def make(**caps):
        server, data = _serve(tmp_path, **caps)
        made.append(server)
        return server, server.server_address[1], data
    yield make
    for server in made:
        server.shutdown()
        server.server_close()


def _range(port, first, last, token=TOKEN, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": "Bearer " + token, "Range": "bytes=%d-%d" % (first, last)}
        c.request("GET", "/r/m/r1/files/a.bin", headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _closed_within(sock, seconds):
    """True when the server closes ``sock`` within ``seconds`` (EOF or reset)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if not sock.recv(4096):
                return True
        except socket.timeout:
            return False
        except OSError:
            return True


def _raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip("needs %d open files, the hard limit is %d (ulimit -n)" % (need, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def test_a_real_peer_is_served_while_a_thousand_idle_and_slow_connections_are_open(served):
    _raise_nofile(2600)  # the idle clients here and the server's ends of them, in this one process
    server, port, data = served()
    idle, slow, stop = [], [], threading.Event()
    try:
        for _i in range(1000):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(s)
        for _i in range(20):
            slow.append(socket.create_connection(("127.0.0.1", port), timeout=5))

        def drip():  # one byte a second on each slow connection, a request that never ends
            line = b"GET /r/m/r1/pieces HTTP/1.1\r\nX-Pad: " + b"a" * 100
            k = 0
            while not stop.wait(1.0):
                for s in slow:
                    try:
                        s.send(line[k % len(line):k % len(line) + 1])
                    except OSError:
                        pass
                k += 1
        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        time.sleep(1.5)
        t0 = time.monotonic()
        status, body = _range(port, PIECE, 2 * PIECE - 1, timeout=5)
        took = time.monotonic() - t0
        assert status == 206 and body == data[PIECE:2 * PIECE]
        assert took < 3.0, took
        with_token, without = server.connections()
        assert without <= _stage_peer.MAX_UNAUTHENTICATED
        # the server holds a thread and a descriptor for only those: not one per connection that was opened
        assert threading.active_count() < 4 * _stage_peer.MAX_UNAUTHENTICATED, threading.active_count()
        assert server.evicted >= 1020 - _stage_peer.MAX_UNAUTHENTICATED
    finally:
        stop.set()
        for s in idle + slow:
            s.close()


def test_a_slow_sender_is_cut_off_at_the_header_deadline(served):
    server, port, data = served(header_deadline=0.5)
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        t0 = time.monotonic()
        for b in b"GET /r/m/r1/pie":
            try:
                s.send(bytes([b]))
            except OSError:
                break
            time.sleep(0.1)
        assert _closed_within(s, 3.0)
        assert time.monotonic() - t0 < 3.5
    finally:
        s.close()
    assert _range(port, 0, 9)[0] == 206  # others are still served


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(served):
    server, port, data = served(idle_timeout=0.5)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/r/m/r1/pieces", headers={"Authorization": "Bearer " + TOKEN})
    r = c.getresponse()
    assert r.status == 200 and r.read()
    assert server.connections() == (1, 0)
    time.sleep(1.2)
    assert server.connections() == (0, 0)
    c.close()


def test_connections_with_the_token_are_capped_and_the_rest_told_busy(served):
    server, port, data = served(max_connections=2)
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for _i in range(3)]
    try:
        statuses = []
        for c in conns:
            c.request("GET", "/r/m/r1/pieces", headers={"Authorization": "Bearer " + TOKEN})
            r = c.getresponse()
            r.read()
            statuses.append(r.status)
        assert statuses == [200, 200, 503] and server.refused == 1
    finally:
        for c in conns:
            c.close()


def test_a_wrong_token_closes_the_connection(served):
    server, port, data = served()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"GET /r/m/r1/pieces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong-token-0123456789\r\n\r\n")
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        assert got.startswith(b"HTTP/1.1 403") and TOKEN.encode() not in got
    finally:
        s.close()


def test_the_server_takes_only_a_digest():
    with pytest.raises(_stage_peer.PeerError, match="token_sha256"):
        _stage_peer.PeerServer("127.0.0.1", 0, TOKEN, {})
    for bad in (TOKEN, "", "g" * 64, "ab" * 31):
        with pytest.raises(_stage_peer.PeerError) as e:
            _stage_peer.parse_token_sha256(bad)
        assert "token_sha256" in str(e.value) and (not bad or bad not in str(e.value))
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert _stage_peer.parse_token_sha256(digest.upper()) == _stage_peer.token_digest(TOKEN)


def test_the_role_gives_the_servers_only_the_digest_and_the_receivers_the_token():
    """The token reaches model_stage (receivers) only; model_stage_peer gets its sha256."""
    tasks = {}
    for name in os.listdir(ROLE_TASKS):
        with open(os.path.join(ROLE_TASKS, name)) as f:
            tasks[name] = yaml.safe_load(f) or []
    servers, receivers = [], []

    def walk(items):
        for t in items:
            for key in ("block", "rescue", "always"):
                walk(t.get(key, []))
            if "llmops.serving.model_stage_peer" in t:
                servers.append(t["llmops.serving.model_stage_peer"])
            if "llmops.serving.model_stage" in t:
                receivers.append(t["llmops.serving.model_stage"])
    for items in tasks.values():
        walk(items)
    started = [a for a in servers if a.get("state", "started") == "started"]
    assert started and all("token" not in a for a in servers)
    for a in started:
        assert a["token_sha256"].replace(" ", "") == "{{model_stage_fanout_token|hash('sha256')}}"
        assert all("model_stage_fanout_token" not in str(v) for k, v in a.items() if k != "token_sha256")
    assert receivers and any("model_stage_fanout_token" in str(a.get("peer_token")) for a in receivers)


# ---- the request head, read by the server's own bounded parser --------------------------------------------------
def _exchange(port, raw, timeout=5):
    """Send ``raw``, read until the server closes the connection (or ``timeout``); the bytes it answered."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(raw)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return got + b"<open>"
            if not chunk:
                return got
            got += chunk
    finally:
        s.close()


@pytest.mark.parametrize("raw, status", [
    # a head over MAX_HEAD_BYTES, in one header or in many
    (b"GET /r/m/r1/pieces HTTP/1.1\r\nX-Pad: " + b"p" * (_stage_peer.MAX_HEAD_BYTES + 10) + b"\r\n\r\n", b"431"),
    (b"GET /r/m/r1/pieces HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(_stage_peer.MAX_HEADERS + 5))
     + b"\r\n", b"431"),
    (b"GET /r/m/r1/pieces HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
    (b"GET /r/m/r1/pieces HTTP/1.1\r\nX-A: 1\r\n folded: continuation\r\n\r\n", b"400"),
    (b"GET /r/m/r1/pieces HTTP/1.1\r\nBad Name: 1\r\n\r\n", b"400"),
    (b"GET /r/m/r1/pieces\r\n\r\n", b"400"),
    (b"GET r/m/r1/pieces HTTP/1.1\r\n\r\n", b"400"),
    (b"GET /r/m/r1/pieces HTTP/2.0\r\n\r\n", b"505"),
])
def test_a_malformed_or_oversized_head_is_refused_and_the_connection_closed(served, raw, status):
    server, port, _data = served()
    got = _exchange(port, raw + b"GET /r/m/r1/pieces HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n" % TOKEN.encode())
    assert got.startswith(b"HTTP/1.1 " + status + b" "), got[:100]
    assert b"HTTP/1.1 200" not in got and not got.endswith(b"<open>")  # closed: the request after it is not read
    assert b"p" * 100 not in got and b"folded" not in got and b"no colon" not in got  # nothing sent is quoted


def test_the_head_parser_keeps_http_semantics(served):
    server, port, data = served()
    auth = b"Authorization: Bearer %s\r\n" % TOKEN.encode()
    # HTTP/1.1 keeps the connection: two requests, two answers, then Connection: close ends it
    got = _exchange(port, b"GET /r/m/r1/files/a.bin HTTP/1.1\r\nrange:  bytes=0-9 \r\n" + auth + b"\r\n"
                    + b"GET /r/m/r1/files/a.bin HTTP/1.1\r\nRANGE: bytes=10-19\r\nConnection: close\r\n" + auth
                    + b"\r\n")
    first, _sep, rest = got.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 206 ") and b"Content-Length: 10" in first and b"Connection" not in first
    assert rest[:10] == data[:10]
    second, _sep, body = rest[10:].partition(b"\r\n\r\n")
    assert second.startswith(b"HTTP/1.1 206 ") and b"Connection: close" in second and body == data[10:20]
    # HTTP/1.0 closes after one answer unless asked to keep it; a repeated header: the first counts
    got = _exchange(port, b"GET /r/m/r1/pieces HTTP/1.0\r\n" + auth + b"Authorization: Bearer wrong-token-000000\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in got and not got.endswith(b"<open>")
    got = _exchange(port, b"GET /r/m/r1/pieces HTTP/1.0\r\nConnection: keep-alive\r\n" + auth + b"\r\n", timeout=1)
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"<open>")
    # a token in a malformed head is never echoed, and a wrong one still gets 403
    got = _exchange(port, b"GET /r/m/r1/pieces HTTP/1.1\r\nAuthorization: Bearer not-the-token-0123\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 403 ") and b"not-the-token" not in got
    assert server.requests == 5


def test_a_client_that_hangs_up_leaves_no_traceback_in_the_log(served, capsys):
    """A client that sends a bad line and resets the connection at once (a scanner, a killed receiver) made the
    server's refusal hit a closed socket, and ``socketserver`` printed a BrokenPipeError traceback for each into the
    server's log. Now such a hang-up is dropped; a real peer is served after it."""
    dummy_server, port, data = served()
    for dummy in range(20):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.sendall(b"BAD\r\n\r\n")
        s.close()
    time.sleep(0.5)
    assert _range(port, 0, PIECE - 1) == (206, data[:PIECE])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception occurred during processing" not in err, err[-2000:]
