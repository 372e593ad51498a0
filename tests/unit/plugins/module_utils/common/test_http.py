"""_http against a real loopback server: JSON GET/POST, timeouts, answers that are not JSON or break off, error
statuses, and URLs whose credentials and query string never reach an error message."""
from __future__ import annotations

import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _http

SECRET = "hunter2-SECRET-TOKEN"


class _Handler(BaseHTTPRequestHandler):
    seen = []

    def log_message(self, *a):
        pass

    def _send(self, status, data, ctype="application/json", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server API
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"data": [{"id": "glm"}]}).encode(), extra={"X-Route": "pod-a"})
        if self.path == "/metrics":
            return self._send(200, b"vllm:num_requests_running 0\n", "text/plain")
        if self.path == "/slow":
            time.sleep(2)
            return self._send(200, b"{}")
        if self.path == "/loading":
            return self._send(503, b'{"error": "model is loading"}')
        if self.path == "/broken":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"choices": [')
            self.close_connection = True
            return None
        return self._send(404, b'{"error": "no such route"}')

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers.get("Content-Type"), self.headers.get("Authorization"), body))
        doc = json.loads(body)
        return self._send(200, json.dumps({"echo": doc, "n": len(doc)}).encode())


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    _Handler.seen = []
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_get_json_and_headers(server):
    assert _http.get_json(server + "/v1/models") == {"data": [{"id": "glm"}]}
    resp = _http.request("GET", server + "/v1/models")
    assert resp.status == 200 and resp.headers["x-route"] == "pod-a"
    assert _http.get_text(server + "/metrics") == "vllm:num_requests_running 0\n"


def test_post_json_sends_json_with_its_content_type(server):
    out = _http.post_json(server + "/v1/completions", {"prompt": "héllo", "max_tokens": 4},
                          headers={"Authorization": "Bearer t"})
    assert out == {"echo": {"prompt": "héllo", "max_tokens": 4}, "n": 2}
    path, ctype, auth, raw = _Handler.seen[-1]
    assert (path, ctype, auth) == ("/v1/completions", "application/json", "Bearer t")
    assert json.loads(raw) == {"prompt": "héllo", "max_tokens": 4}


def test_timeout_is_a_timed_out_error_without_status(server):
    t0 = time.monotonic()
    with pytest.raises(_http.HttpError) as e:
        _http.get_json(server + "/slow", timeout=0.3)
    assert time.monotonic() - t0 < 1.5
    assert e.value.status is None and e.value.timed_out and not e.value.refused
    assert "no answer within 0.3s" in str(e.value) and str(e.value).startswith("GET %s/slow failed" % server)


def test_an_answer_that_is_not_json_names_status_and_shows_its_start(server):
    with pytest.raises(_http.HttpError) as e:
        _http.get_json(server + "/metrics")
    assert e.value.status == 200
    assert "is not JSON" in str(e.value) and "vllm:num_requests_running" in str(e.value)


def test_error_status_keeps_the_answer(server):
    with pytest.raises(_http.HttpError) as e:
        _http.get_json(server + "/loading")
    err = e.value
    assert err.status == 503 and err.body == '{"error": "model is loading"}'
    assert str(err) == 'GET %s/loading failed: HTTP Error 503: Service Unavailable: \'{"error": "model is loading"}\'' % server


def test_an_answer_that_breaks_off_is_no_answer(server):
    with pytest.raises(_http.HttpError) as e:
        _http.get_json(server + "/broken", timeout=5)
    assert e.value.status is None and "broke off" in str(e.value)


def test_connection_refused_is_no_answer(free_port):
    with pytest.raises(_http.HttpError) as e:
        _http.get_json("http://127.0.0.1:%d/health" % free_port(), timeout=2)
    assert e.value.status is None and e.value.refused and not e.value.timed_out
    assert "refused" in str(e.value).lower()


@pytest.mark.parametrize("path", ["/nope", "/loading"])
def test_credentials_and_query_never_reach_the_message(server, path):
    port = int(server.rsplit(":", 1)[1])
    url = "http://scrape:%s@127.0.0.1:%d%s?token=%s" % (SECRET, port, path, SECRET)
    with pytest.raises(_http.HttpError) as e:
        _http.get_text(url)
    assert e.value.url == "http://***@127.0.0.1:%d%s?***" % (port, path)
    assert str(e.value).startswith("GET http://***@127.0.0.1:%d%s?*** failed: HTTP Error" % (port, path))
    assert SECRET not in str(e.value) and SECRET not in e.value.reason and SECRET not in repr(e.value.args)


def test_unreachable_url_with_credentials_is_redacted(free_port):
    url = "http://admin:%s@127.0.0.1:%d/metrics?key=%s" % (SECRET, free_port(), SECRET)
    with pytest.raises(_http.HttpError) as e:
        _http.get_text(url, timeout=2)
    assert SECRET not in str(e.value) and "***@127.0.0.1" in str(e.value)


def test_redact_removes_url_credentials_and_query_values_from_any_text():
    url = "https://u:%s@metrics.example:9400/m?a=1&token=%s#frag" % (SECRET, SECRET)
    text = "nonnumeric port: '%s@metrics.example:9400' while opening %s" % (SECRET, url)
    out = _http.redact(text, url)
    assert SECRET not in out
    assert "https://***@metrics.example:9400/m?***" in out
    assert _http.shown_url("http://[::1]:8000/x") == "http://[::1]:8000/x"
    assert _http.shown_url("http://[::1") == "the URL given"


def test_an_injected_opener_is_called_like_open_url():
    seen = {}

    def opener(url, **kw):
        seen.update(kw, url=url)
        return io.BytesIO(b'{"ok": true}')

    assert _http.post_json("http://10.0.0.9:8000/v1/x", {"a": 1}, timeout=7, opener=opener) == {"ok": True}
    assert seen["url"] == "http://10.0.0.9:8000/v1/x" and seen["method"] == "POST" and seen["timeout"] == 7
    assert json.loads(seen["data"]) == {"a": 1} and seen["headers"]["Content-Type"] == "application/json"


def test_probe_retries_an_answer_that_breaks_off(server):
    """An engine dying mid-answer is transient for engine_probe (retried until the deadline), not a traceback."""
    from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe

    with pytest.raises(_probe.Transient, match="broke off"):
        _probe.Http(server, timeout=5).request("GET", "/broken")
    assert _probe.Http(server).request("GET", "/loading", transient_status=())[0] == 503


# ---- bounded answers: a deadline for the whole answer, a cap while reading --------------------------------- #

class _Hostile(BaseHTTPRequestHandler):
    """Answers that never end on their own: trickled a byte a second (headers or body), endless, or a stream of
    events without [DONE]."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _trickle(self, data, every=1.0):
        for i in range(len(data)):
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()
            time.sleep(every)

    def do_GET(self):  # noqa: N802 - http.server API
        try:
            if self.path == "/trickle-body":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "60")
                self.end_headers()
                self.wfile.flush()
                self._trickle(b'{"data": [' + b" " * 49 + b"]}")
            elif self.path == "/trickle-headers":
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                self._trickle(b"X-Slow: " + b"a" * 60 + b"\r\n")
            elif self.path in ("/endless", "/metrics"):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                line = b'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 1\n' * 1024
                while True:
                    self.wfile.write(line)
            elif self.path == "/endless-error":
                self.send_response(503)
                self.end_headers()
                while True:
                    self.wfile.write(b"x" * 65536)
            elif self.path == "/events":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                while True:
                    self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
                    self.wfile.flush()
                    time.sleep(0.2)
            elif self.path == "/long-line":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"data: " + b"y" * (2 * 1024 * 1024) + b"\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what the tests expect


@pytest.fixture
def hostile():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


SLACK = 1.0


def _timed(fn, limit):
    """``(error raised by fn, seconds)``; fails (rather than hangs) when fn has not returned within ``limit``."""
    from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang

    t0 = time.monotonic()
    box = no_hang(fn, timeout=limit)
    return box.get("error"), time.monotonic() - t0


@pytest.mark.parametrize("path", ["/trickle-body", "/trickle-headers"])
def test_a_trickled_answer_ends_at_the_deadline_not_a_read_timeout_later(hostile, path):
    """A byte a second never trips a per-read timeout of 1.5 s: the old client read for a minute. The timeout is a
    deadline for the whole answer (headers or body)."""
    err, took = _timed(lambda: _http.get_json(hostile + path, timeout=1.5), 1.5 + SLACK + 2)
    assert isinstance(err, _http.HttpError) and err.timed_out and err.status is None, err
    assert took < 1.5 + SLACK
    assert "within 1.5s (timed out" in err.reason


def test_an_endless_body_is_refused_at_the_cap_while_reading(hostile):
    err, took = _timed(lambda: _http.get_text(hostile + "/endless", timeout=20, max_bytes=1024 * 1024), 15)
    assert isinstance(err, _http.HttpError) and not isinstance(err, MemoryError), err
    assert err.too_large and err.status is None and not err.timed_out
    assert "over the 1048576-byte limit for it (max_bytes)" in err.reason
    assert took < 5


def test_metrics_answers_are_capped_by_default(hostile):
    from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom

    err, dummy = _timed(lambda: _prom.fetch_text(hostile + "/metrics", timeout=30), 25)
    assert isinstance(err, _http.HttpError) and err.too_large, err
    assert "over the %d-byte limit" % _http.MAX_METRICS_BYTES in err.reason


def test_an_endless_error_answer_keeps_its_status_and_only_the_start_of_its_body(hostile):
    err, took = _timed(lambda: _http.get_text(hostile + "/endless-error", timeout=20), 15)
    assert isinstance(err, _http.HttpError) and err.status == 503, err
    assert len(err.body) <= _http.MAX_ERROR_BYTES and len(str(err)) < 500
    assert took < 5


def test_a_stream_is_read_under_its_deadline(hostile):
    def read_events():
        with _http.open_response("GET", hostile + "/events", timeout=1.2) as stream:
            return sum(1 for dummy in stream)

    err, took = _timed(read_events, 1.2 + SLACK + 2)
    assert isinstance(err, _http.HttpError) and err.timed_out, err
    assert "did not end within 1.2s" in err.reason and took < 1.2 + SLACK


def test_a_stream_line_over_the_line_cap_is_refused(hostile):
    def read_line():
        with _http.open_response("GET", hostile + "/long-line", timeout=10) as stream:
            return stream.readline()

    err, dummy = _timed(read_line, 8)
    assert isinstance(err, _http.HttpError) and err.too_large, err
    assert "a line of over %d bytes" % _http.MAX_LINE_BYTES in err.reason


def test_an_answer_that_is_not_json_is_quoted_only_in_part():
    big = b"<" + b"x" * (5 * 1024 * 1024)

    def opener(url, **kw):
        return io.BytesIO(big)

    with pytest.raises(_http.HttpError) as e:
        _http.get_json("http://10.0.0.9:8000/v1/models", opener=opener)
    assert len(str(e.value)) < 600 and "(the first 120 of %d bytes)" % len(big) in str(e.value)


def test_an_error_answer_is_quoted_escaped_and_short():
    """An error body's control characters (a terminal escape, a forged log line) are escaped, and only its start
    is shown."""
    def opener(url, **kw):
        from urllib.error import HTTPError

        raise HTTPError(url, 500, "Internal Server Error", {}, io.BytesIO(b"\x1b[2Jboom\nFAKE LOG LINE " + b"z" * 10000))

    with pytest.raises(_http.HttpError) as e:
        _http.get_text("http://10.0.0.9:8000/x", opener=opener)
    assert e.value.status == 500 and "\x1b" not in str(e.value) and "\n" not in str(e.value)
    assert "'\\x1b[2Jboom\\nFAKE LOG LINE zzz" in str(e.value) and len(str(e.value)) < 500
