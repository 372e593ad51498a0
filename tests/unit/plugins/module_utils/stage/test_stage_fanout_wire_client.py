"""A receiver reads its peers' answers itself (``_stage_fanout_wire._Conn``, not ``http.client``): every answer is
bounded (its head in size and lines, its body by the caller's limit and ``Content-Length``, the whole of it by
the request's deadline), an answer that is not HTTP as the piece servers speak it is a failed try, and a
kept-alive connection the peer closed meanwhile is retried once on a new one."""
from __future__ import annotations

import hashlib
import socket
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_fanout_wire import PeerClient, PeerLie, PeerLink

TOKEN = "wire-client-token-0123456789abcdef"


class _Scripted(object):
    """A TCP server that reads one request head per answer and sends the scripted bytes; ``close`` after an answer
    closes the connection. Records every request head it read."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.heads = []
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = "http://127.0.0.1:%d/r/m/r1" % self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.answers:
            try:
                c, _addr = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with c:
                while self.answers:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        head += chunk
                    if not head:
                        break
                    self.heads.append(head)
                    answer, close = self.answers.pop(0)
                    try:
                        c.sendall(answer)
                    except OSError:
                        break
                    if close:
                        break
                else:  # the last answer sent and the connection kept: held open until the client goes
                    c.settimeout(10)
                    try:
                        c.recv(1)
                    except OSError:
                        pass

    def close(self):
        self.answers = []
        self.sock.close()


@pytest.fixture
def scripted():
    made = []

    def make(*answers):
        s = _Scripted(answers)
        made.append(s)
        return s, PeerClient(TOKEN, 2.0), PeerLink(s.url, True)
    yield make
    for s in made:
        s.close()


def _ok(body, extra=b""):
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_a_kept_alive_connection_carries_the_next_request_and_one_the_peer_closed_is_retried(scripted):
    s, client, link = scripted((_ok(b'{"a":1}'), False), (_ok(b'{"b":2}'), True), (_ok(b'{"c":3}'), True))
    assert client.get_body(link, "/pieces?sent=1", 1000) == b'{"a":1}'
    assert client.get_body(link, "/pieces?sent=1", 1000) == b'{"b":2}'  # the same connection, then closed there
    assert client.get_body(link, "/pieces?sent=1", 1000) == b'{"c":3}'  # a new one
    assert s.connections == 2
    head = s.heads[0].decode("latin-1")
    assert head.startswith("GET /r/m/r1/pieces?sent=1 HTTP/1.1\r\n") and "Authorization: Bearer %s\r\n" % TOKEN in head


@pytest.mark.parametrize("answer, why", [
    (b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * (_stage_fanout_wire.MAX_ANSWER_HEAD + 10) + b"\r\n\r\n",
     "head is over"),
    (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(_stage_fanout_wire.MAX_ANSWER_HEADERS + 2))
     + b"Content-Length: 0\r\n\r\n", "header lines"),
    (b"SPDY/9 200 OK\r\nContent-Length: 2\r\n\r\n{}", "status line"),
    (b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}", "status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n{}", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "chunked"),
    (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "not 'name: value'"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", "closed the connection"),
])
def test_an_answer_that_is_not_http_as_the_servers_speak_it_is_a_failed_try(scripted, answer, why):
    _s, client, link = scripted((answer, True))
    with pytest.raises(_http.HttpError) as e:
        client.get_body(link, "/pieces", 1000)
    assert why in str(e.value) and e.value.status is None and not e.value.timed_out
    assert "p" * 50 not in str(e.value) and TOKEN not in str(e.value)


def test_a_body_over_the_limit_is_a_lie_and_is_not_read(scripted):
    _s, client, link = scripted((b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n" + b"x" * 10, False))
    with pytest.raises(PeerLie, match="over the 1000-byte limit"):
        client.get_body(link, "/pieces", 1000)
    assert not client._local.conns  # pylint: disable=protected-access  # the rest is not read: closed


def test_a_body_to_the_end_of_the_connection_is_read_up_to_the_limit(scripted):
    _s, client, link = scripted((b"HTTP/1.0 200 OK\r\n\r\n" + b"{}", True),
                                (b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 2000, True))
    assert client.get_body(link, "/pieces", 1000) == b"{}"
    with pytest.raises(PeerLie, match="over the 1000-byte limit"):
        client.get_body(link, "/pieces", 1000)


def test_a_body_shorter_than_its_length_broke_off_and_an_error_answer_keeps_its_status(scripted):
    _s, client, link = scripted((b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", True),
                                (b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\n{}", False))
    with pytest.raises(_http.HttpError, match="broke off: 2 of 100 bytes"):
        client.get_body(link, "/pieces", 1000)
    with pytest.raises(_http.HttpError) as e:
        client.get_body(link, "/pieces", 1000)
    assert e.value.status == 503


def test_a_piece_of_another_length_is_refused_before_its_bytes_are_read(scripted):
    _s, client, link = scripted((b"HTTP/1.1 206 Partial Content\r\nContent-Length: 7\r\n\r\n" + b"x" * 7, False))
    with pytest.raises(_http.HttpError, match="sent 7 bytes for a 8-byte piece"):
        client.get_range(link, "a.bin", 0, 8, bytearray(8), _NoThrottle())


def test_a_head_that_trickles_is_cut_off_at_the_deadline(scripted):
    s, client, link = scripted((b"HTTP/1.1 200 OK\r\n", False))  # the head never ends; the socket stays open
    client.timeout = 0.5
    with pytest.raises(_http.HttpError) as e:
        client.get_body(link, "/pieces", 1000)
    assert e.value.timed_out
    s.close()


class _NoThrottle(object):
    def consume(self, n):
        pass


def _piece(body):
    return b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\nContent-Range: bytes 0-%d/%d\r\n\r\n%s" % (
        len(body), len(body) - 1, len(body), body)


def test_a_piece_asked_as_unsent_that_the_seed_sent_before_is_a_409_and_the_connection_carries_the_next(scripted):
    """A seed answers 409 to a piece asked with the unsent header once it started a transfer of it (another
    receiver asked first): no byte of the piece comes, the refusal says so with its status, and the kept-alive
    connection carries the next request (the seed's server starts a thread per connection)."""
    refusal = b'{"error":"a.bin: a transfer of this range was started before"}'
    s, client, link = scripted(
        (b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(refusal), refusal), False),
        (_piece(b"abcd"), False))
    buf = bytearray(4)
    with pytest.raises(_http.HttpError) as e:
        client.get_range(link, "a.bin", 0, 4, buf, _NoThrottle(), unsent=True)
    assert e.value.status == 409 and "sent to another peer before" in str(e.value)
    assert bytes(buf) == b"\0" * 4
    assert client.get_range(link, "a.bin", 0, 4, buf, _NoThrottle()) == hashlib.sha256(b"abcd").hexdigest()
    assert s.connections == 1
    first, second = (h.decode("latin-1") for h in s.heads)
    assert "%s: 1\r\n" % _stage_fanout_wire.UNSENT_HEADER in first
    assert _stage_fanout_wire.UNSENT_HEADER not in second


def test_a_409_to_a_piece_not_asked_as_unsent_is_an_error_answer_like_any_other(scripted):
    s, client, link = scripted((b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\n\r\n{}", False), (_piece(b"abcd"), False))
    with pytest.raises(_http.HttpError) as e:
        client.get_range(link, "a.bin", 0, 4, bytearray(4), _NoThrottle())
    assert e.value.status == 409 and "not 206" in str(e.value)
    client.get_range(link, "a.bin", 0, 4, bytearray(4), _NoThrottle())
    assert s.connections == 2  # closed after the unexpected answer, as for any other
