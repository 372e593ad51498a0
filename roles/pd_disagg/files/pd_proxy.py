# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prefill/decode router for vLLM NixlConnector pairs (standard library only).

Speaks the protocol of AIBrix's ``pd`` routing strategy and of vLLM's P/D proxy:

1. POST the request to a prefill engine with ``max_tokens=1`` (and ``max_completion_tokens=1``),
   ``stream=false``, no ``stream_options``/``min_tokens``, and
   ``kv_transfer_params={"do_remote_decode": true, "do_remote_prefill": false, ...null}``.
2. Take ``kv_transfer_params`` from the prefill response (present only when prefill stopped on the
   length cap) and, optionally, overwrite ``remote_host`` with the prefill host as AIBrix does.
3. POST the original request plus those params to a decode engine, which pulls the KV over NIXL and
   generates; its answer (streamed or not) goes back to the client.

Response headers name the engines used: ``prefill-target-pod-ip`` and ``target-pod-ip`` (decode),
as AIBrix v0.7 does. ``GET /health`` is 200 only when every backend is healthy; ``GET /v1/models`` is
answered by a decode engine; ``GET /proxy/stats`` returns request counts and timings as JSON, and ``GET /metrics``
the same counters in Prometheus text format (``llmops_pd_proxy_*``), so a scraper that reaches the front (AIBrix
scrapes port 8000 of a pod without a ``model.aibrix.ai/metric-port`` label) gets an answer, not a 404 stream.

Serving rules (each a command-line option):

* The listen backlog is ``--backlog`` (2048, uvicorn's default, which vLLM's API server uses; Linux caps
  it at ``net.core.somaxconn``), so a burst of new connections queues instead of being dropped or reset.
* A client has ``--request-timeout`` seconds (30) from the first byte of a request to send all of it
  (request line, headers and body): a slow or half-sent request is answered 408 and closed. A new
  connection may stay silent as long, a kept-alive one ``--keep-alive-timeout`` seconds (5, as vLLM), and
  a client that stops reading its answer for ``--request-timeout`` seconds is dropped.
* Request bodies: ``Content-Length`` (digits only; repeated values must agree, else 400), or
  ``Transfer-Encoding: chunked`` (decoded; any other transfer coding is 501, both headers together
  400). A POST with neither is 411. A body over ``--max-body-bytes`` (32 MiB) is 413.
* A backend that is unreachable, resets, times out or answers something that is not HTTP, or not the
  JSON the proxy needs, gives a 502 naming the backend; once a streamed answer has started, a backend
  breaking off ends the stream without its last chunk, so the client sees it as truncated.
* Every request that reached the proxy is counted once in ``/proxy/stats``: ``received``, by
  ``outcomes`` (completed, backend_failed, bad_gateway, broke_off, bad_request, length_required,
  too_large, timeout, not_found, not_implemented, unhealthy, served, client_gone, internal_error) and
  by answered ``status``. ``requests``/``completed``/``failed`` count the P/D requests forwarded.
"""
from __future__ import annotations

import argparse
import http.client
import http.server
import io
import itertools
import json
import re
import socket
import sys
import threading
import time
import traceback
import uuid
from urllib.parse import urlsplit

PD_PATHS = ("/v1/completions", "/v1/chat/completions")
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

DEFAULT_BACKLOG = 2048
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_LINE = 65536  # request line, chunk-size line or trailer line (http.server's request-line limit)
MAX_TRAILERS = 100  # http.client's header-count limit
LINGER_S = 2.0  # at most this long (and at most LINGER_BYTES) draining a refused request before closing
LINGER_BYTES = 64 * 1024 * 1024

_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")

OUTCOME_BY_STATUS = {200: "served", 400: "bad_request", 404: "not_found", 408: "timeout", 411: "length_required",
                     413: "too_large", 414: "too_large", 431: "too_large", 500: "internal_error",
                     501: "not_implemented", 502: "bad_gateway", 503: "unhealthy", 505: "not_implemented"}


class Backend:
    """One engine base URL, e.g. ``http://10.0.0.12:8000``."""

    def __init__(self, url):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError("backend %r: expected http://HOST:PORT" % url)
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port

    @property
    def addr(self):
        return "%s:%d" % (self.host, self.port)

    def request(self, method, path, body=None, headers=None, timeout=30.0):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise


class PdError(Exception):
    def __init__(self, status, message, outcome="bad_gateway"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.outcome = outcome


class Reject(Exception):
    """A request refused before it was forwarded; the connection is closed after the answer."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def _why(e):
    """An exception as text for an error message: its type when it says nothing else."""
    text = str(e)
    return "%s: %s" % (type(e).__name__, text) if text else type(e).__name__


def read_capped(resp, limit):
    """The whole body of a backend answer; ValueError past ``limit`` bytes, http.client.IncompleteRead when the
    backend closed before the Content-Length it declared (``read(n)`` alone returns the short body silently)."""
    data = resp.read(limit + 1)
    if len(data) > limit:
        raise ValueError("answer larger than %d bytes" % limit)
    if resp.length:  # declared bytes still missing: the connection ended early
        raise http.client.IncompleteRead(data, resp.length)
    return data


def _no_constants(name):
    raise ValueError("%s is not valid JSON" % name)


def parse_json_object(raw):
    """Strict JSON object from bytes: ValueError for anything else (NaN/Infinity and nesting bombs too)."""
    try:
        obj = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("JSON nested too deeply")
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def prefill_body(body):
    """The request sent to prefill: one token, not streamed, asking prefill to keep the KV for decode."""
    out = dict(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out or "messages" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out["kv_transfer_params"] = dict(PREFILL_PARAMS)
    return out


def decode_body(body, kv_params):
    out = dict(body)
    out["kv_transfer_params"] = kv_params
    return out


class Router:
    def __init__(self, prefill, decode, prefill_timeout=30.0, decode_timeout=600.0, rewrite_remote_host=False,
                 max_answer_bytes=DEFAULT_MAX_BODY_BYTES):
        self.prefill = [Backend(u) for u in prefill]
        self.decode = [Backend(u) for u in decode]
        if not self.prefill or not self.decode:
            raise ValueError("at least one --prefill and one --decode backend are required")
        self._p = itertools.cycle(self.prefill)
        self._d = itertools.cycle(self.decode)
        self.prefill_timeout = prefill_timeout
        self.decode_timeout = decode_timeout
        self.rewrite_remote_host = rewrite_remote_host
        self.max_answer_bytes = max_answer_bytes
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "completed": 0, "failed": 0, "prefill_s": 0.0, "decode_s": 0.0,
                      "last_error": "", "connections": 0, "received": 0, "outcomes": {}, "status": {}}

    def pick(self):
        with self.lock:
            return next(self._p), next(self._d)

    def count(self, **kw):
        with self.lock:
            for k, v in kw.items():
                if k == "last_error":
                    self.stats[k] = v
                else:
                    self.stats[k] += v

    def record(self, outcome, status=None):
        """One request's fate: every request that reached the proxy is recorded exactly once."""
        with self.lock:
            st = self.stats
            st["received"] += 1
            st["outcomes"][outcome] = st["outcomes"].get(outcome, 0) + 1
            if status:
                key = str(status)
                st["status"][key] = st["status"].get(key, 0) + 1

    def snapshot(self):
        with self.lock:
            out = dict(self.stats)
            out["outcomes"] = dict(out["outcomes"])
            out["status"] = dict(out["status"])
            return out

    def prometheus_text(self):
        """The counters of :meth:`snapshot` in Prometheus text exposition format 0.0.4."""
        st = self.snapshot()
        lines = []

        def family(name, kind, helptext, samples):
            lines.append("# HELP %s %s" % (name, helptext))
            lines.append("# TYPE %s %s" % (name, kind))
            for labels, value in samples:
                shown = ",".join('%s="%s"' % (k, str(v).replace("\\", "\\\\").replace('"', '\\"'))
                                 for k, v in sorted(labels.items()))
                lines.append("%s%s %s" % (name, "{%s}" % shown if shown else "", repr(float(value))))

        family("llmops_pd_proxy_received_total", "counter", "Requests that reached the proxy.",
               [({}, st["received"])])
        family("llmops_pd_proxy_outcomes_total", "counter", "Requests by how they ended.",
               [({"outcome": k}, v) for k, v in sorted(st["outcomes"].items())])
        family("llmops_pd_proxy_responses_total", "counter", "Answers by HTTP status.",
               [({"status": k}, v) for k, v in sorted(st["status"].items())])
        family("llmops_pd_proxy_pd_requests_total", "counter", "Prefill/decode requests forwarded, by result.",
               [({"result": "forwarded"}, st["requests"]), ({"result": "completed"}, st["completed"]),
                ({"result": "failed"}, st["failed"])])
        family("llmops_pd_proxy_phase_seconds_total", "counter", "Seconds spent waiting on each phase's engine.",
               [({"phase": "prefill"}, st["prefill_s"]), ({"phase": "decode"}, st["decode_s"])])
        family("llmops_pd_proxy_connections_total", "counter", "Client connections accepted.",
               [({}, st["connections"])])
        return "\n".join(lines) + "\n"

    def run_prefill(self, backend, path, body, request_id):
        payload = json.dumps(prefill_body(body)).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        t0 = time.monotonic()
        try:
            conn, resp = backend.request("POST", path, payload, headers, timeout=self.prefill_timeout)
            try:
                data = read_capped(resp, self.max_answer_bytes)
            finally:
                conn.close()
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise PdError(502, "prefill %s failed after %.1fs (prefill timeout %ss): %s"
                          % (backend.addr, time.monotonic() - t0, self.prefill_timeout, _why(e)))
        self.count(prefill_s=time.monotonic() - t0)
        if resp.status != 200:
            status = resp.status if 400 <= resp.status <= 599 else 502
            raise PdError(status, "prefill %s answered %d: %s"
                          % (backend.addr, resp.status, data[:500].decode("utf-8", "replace")), "backend_failed")
        try:
            answer = parse_json_object(data)
        except ValueError as e:
            raise PdError(502, "prefill %s answered invalid JSON (%s): %r" % (backend.addr, e, data[:200]))
        kv = answer.get("kv_transfer_params")
        if not kv or not isinstance(kv, dict):
            choices = answer.get("choices")
            finish = [c.get("finish_reason") for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
            raise PdError(502, "prefill %s returned no kv_transfer_params object (finish_reason %s); is the "
                               "engine started with --kv-transfer-config NixlConnector?" % (backend.addr, finish))
        if self.rewrite_remote_host:
            kv = dict(kv, remote_host=backend.host)
        return kv


class _DeadlineReader(io.RawIOBase):
    """The client socket as a raw stream whose reads all end by the handler's ``deadline``.

    A per-read timeout alone lets a client trickle one byte at a time forever; this bounds the whole
    request instead."""

    def __init__(self, sock, handler):
        super().__init__()
        self._sock = sock
        self._handler = handler

    def readable(self):
        return True

    def readinto(self, b):
        deadline = self._handler.deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("request deadline passed")
            self._sock.settimeout(left)
        return self._sock.recv_into(b)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    router = None  # set by build_server()
    request_timeout = DEFAULT_REQUEST_TIMEOUT
    keep_alive_timeout = DEFAULT_KEEP_ALIVE_TIMEOUT
    max_body_bytes = DEFAULT_MAX_BODY_BYTES

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), fmt % args))

    # ---- connection and request framing ---------------------------------------------------------

    def setup(self):
        super().setup()
        self.rfile.close()  # replaced by one whose reads honour the request deadline
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))
        self.deadline = None
        self.served = 0
        self.router.count(connections=1)

    def _begin(self):
        self.recorded = False
        self.answered = None  # status of the final answer once its headers went out
        self.linger = False
        self.framing = None
        self.command = None
        self.requestline = ""
        self.request_version = self.default_request_version

    def _record(self, outcome, status=None):
        if not self.recorded:
            self.recorded = True
            self.router.record(outcome, status)

    def handle_one_request(self):
        self._begin()
        idle = self.request_timeout if self.served == 0 else self.keep_alive_timeout
        self.deadline = time.monotonic() + idle
        try:
            while True:  # RFC 9112 2.2: ignore empty lines before a request line
                first = self.rfile.peek(2)[:2]
                if first[:1] not in (b"\r", b"\n"):
                    break
                self.rfile.read(2 if first == b"\r\n" else 1)
        except (OSError, ValueError):
            first = b""
        if not first:  # closed, or silent past its idle time: not a request
            self.close_connection = True
            return
        self.deadline = time.monotonic() + self.request_timeout
        try:
            self.raw_requestline = self.rfile.readline(MAX_LINE + 1)
            if len(self.raw_requestline) > MAX_LINE:
                self.requestline = ""
                self.send_error(414, "request line longer than %d bytes" % MAX_LINE)
                return
            if not self.parse_request():
                self._record("bad_request")  # parse_request answered already when it could
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(501, "method %s is not supported (GET and POST are)" % self.command)
                return
            method()
            self.wfile.flush()
        except socket.timeout:
            self.close_connection = True
            if self.answered is None:
                self.send_error(408, "request not complete within %gs of its first byte (pd_proxy "
                                     "--request-timeout)" % self.request_timeout)
            else:
                self._record("client_gone", self.answered)
        except ConnectionError:
            self.close_connection = True
            self._record("client_gone", self.answered)
        except Exception:  # noqa: BLE001 - the client gets a 500 rather than a dropped connection
            self.close_connection = True
            sys.stderr.write(traceback.format_exc())
            if self.answered is None:
                try:
                    self._error(500, "internal error in pd_proxy (see its log)", close=True)
                except OSError:
                    pass
            self._record("internal_error", self.answered)
        finally:
            self.deadline = None
            self._record("client_gone", self.answered)
            self.served += 1
            if self.close_connection and self.linger:
                self._drain()

    def _drain(self):
        """Read and drop what the client still sends for a refused request (bounded), so closing does
        not reset the connection before the client has read the answer."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            end = time.monotonic() + min(LINGER_S, self.request_timeout)
            got = 0
            while got < LINGER_BYTES:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.connection.settimeout(left)
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
        except OSError:
            pass

    def send_response(self, code, message=None):
        if code >= 200:
            self.answered = code
            self.connection.settimeout(self.request_timeout)  # a client that stops reading is dropped
        super().send_response(code, message)

    def send_error(self, code, message=None, explain=None):
        """Errors found by http.server (bad request line, too many headers) and by this proxy, as JSON."""
        if self.request_version == "HTTP/0.9":  # unparsable request line: answer with a status line anyway
            self.request_version = "HTTP/1.0"
        self._error(code, message or self.responses.get(code, ("error",))[0], close=True)

    def parse_request(self):
        if not super().parse_request():
            return False
        problem = self._header_problem()
        if problem:
            self.close_connection = True
            self.send_error(400, problem)
            return False
        return True

    def _header_problem(self):
        """A header line http.client could not parse ends the header block there: the headers after it would
        be silently dropped (a Content-Length among them), so such a request is refused (RFC 9112 5.1)."""
        if self.headers.defects or self.headers.get_payload():
            return "malformed header line (a field name must be followed directly by a colon, RFC 9112 5.1)"
        return None

    def handle_expect_100(self):
        try:
            if self._header_problem():
                raise Reject(400, self._header_problem())
            self.framing = self._framing()
        except Reject as e:
            self._error(e.status, e.message, close=True)
            return False
        return super().handle_expect_100()

    def _framing(self):
        """How the body is delimited: ("length", n), ("chunked", None) or ("none", 0); Reject if invalid."""
        te = self.headers.get_all("Transfer-Encoding") or []
        cl = self.headers.get_all("Content-Length") or []
        if te:
            if self.request_version == "HTTP/1.0":
                raise Reject(400, "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1); send Content-Length")
            if cl:
                raise Reject(400, "both Transfer-Encoding and Content-Length sent (RFC 9112 6.1); send one")
            codings = [c.strip().lower() for h in te for c in h.split(",") if c.strip()]
            if codings == ["chunked"]:
                return ("chunked", None)
            if "chunked" in codings[:-1] or not codings:
                raise Reject(400, "Transfer-Encoding %r: chunked must be applied once, last" % ", ".join(te))
            raise Reject(501, "Transfer-Encoding %r is not supported; send the body as-is with Content-Length "
                              "or Transfer-Encoding: chunked" % ", ".join(te))
        if cl:
            values = [v.strip() for h in cl for v in h.split(",")]
            if not all(_DIGITS.fullmatch(v) for v in values):
                raise Reject(400, "Content-Length %r is not a number of bytes" % ", ".join(cl)[:100])
            values = {v.lstrip("0") or "0" for v in values}
            if len(values) > 1:
                raise Reject(400, "conflicting Content-Length values %r" % ", ".join(cl)[:100])
            value = values.pop()
            if len(value) > 18 or int(value) > self.max_body_bytes:
                raise Reject(413, "body of %s bytes is larger than pd_proxy --max-body-bytes %d"
                                  % (value[:30], self.max_body_bytes))
            return ("length", int(value))
        if self.command == "POST":
            raise Reject(411, "POST without Content-Length or Transfer-Encoding: chunked")
        return ("none", 0)

    def _read_body(self):
        """The request body, read within the request deadline; Reject for a malformed or oversized one."""
        kind, n = self.framing or self._framing()
        if kind == "chunked":
            return self._read_chunked()
        if not n:
            return b""
        data = self.rfile.read(n)
        if len(data) < n:
            raise ConnectionAbortedError("client closed after %d of %d body bytes" % (len(data), n))
        return data

    def _read_chunked(self):
        parts, total = [], 0
        while True:
            line = self._chunk_line("chunk-size")
            size = line.split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size) or len(size) > 16:
                raise Reject(400, "chunked body: invalid chunk size %r" % size[:20])
            size = int(size, 16)
            if size == 0:
                break
            total += size
            if total > self.max_body_bytes:
                raise Reject(413, "chunked body larger than pd_proxy --max-body-bytes %d" % self.max_body_bytes)
            data = self.rfile.read(size + 2)
            if len(data) < size + 2:
                raise ConnectionAbortedError("client closed inside a chunk")
            if data[-2:] != b"\r\n":
                raise Reject(400, "chunked body: a chunk is longer than its size or not followed by CRLF")
            parts.append(data[:-2])
        for _i in range(MAX_TRAILERS + 1):
            if self._chunk_line("trailer") in (b"\r\n", b"\n"):
                return b"".join(parts)
        raise Reject(431, "chunked body: more than %d trailer lines" % MAX_TRAILERS)

    def _chunk_line(self, what):
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise Reject(400, "chunked body: %s line longer than %d bytes" % (what, MAX_LINE))
        if not line.endswith(b"\n"):
            raise ConnectionAbortedError("client closed inside a chunked body")
        return line

    def _body_or_reject(self):
        """The body, or None after answering a Reject (and closing, as the framing is lost)."""
        try:
            raw = self._read_body()
        except Reject as e:
            self._error(e.status, e.message, close=True)
            return None
        self.deadline = None  # the whole request is in: what follows is bounded by backend timeouts
        return raw

    # ---- answers ------------------------------------------------------------------------------

    def _json(self, status, obj, headers=None, outcome=None, close=False):
        data = json.dumps(obj).encode()
        # recorded before any of the answer leaves, so /proxy/stats read after an answer always includes it
        self._record(outcome or OUTCOME_BY_STATUS.get(status, "served" if status < 400 else "bad_request"), status)
        if close:
            self.close_connection = True
            self.linger = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message, outcome=None, close=False):
        self.log_error("%d %s", status, message)
        self._json(status, {"error": {"code": status, "message": message, "type": "pd_proxy"}},
                   outcome=outcome, close=close)

    def do_GET(self):  # noqa: N802 - http.server API
        r = self.router
        if self._body_or_reject() is None:
            return
        path = self.path.split("?", 1)[0]
        if path == "/health":
            bad = []
            for b in r.prefill + r.decode:
                try:
                    conn, resp = b.request("GET", "/health", timeout=5)
                    try:
                        read_capped(resp, 1 << 20)
                    finally:
                        conn.close()
                    if resp.status != 200:
                        bad.append("%s: HTTP %d" % (b.addr, resp.status))
                except (OSError, http.client.HTTPException, ValueError) as e:
                    bad.append("%s: %s" % (b.addr, _why(e)))
            if bad:
                self._error(503, "unhealthy backends: " + "; ".join(bad))
            else:
                self._json(200, {"status": "ok", "prefill": [b.url for b in r.prefill],
                                 "decode": [b.url for b in r.decode]})
            return
        if path == "/proxy/stats":
            self._record("served", 200)  # the answer counts itself
            self._json(200, r.snapshot())
            return
        if path == "/metrics":
            self._record("served", 200)  # the answer counts itself
            data = r.prometheus_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if path.rstrip("/") == "/v1/models":
            _p, d = r.pick()
            try:
                conn, resp = d.request("GET", "/v1/models", timeout=10)
                try:
                    data = read_capped(resp, r.max_answer_bytes)
                finally:
                    conn.close()
                if resp.status == 200:
                    parse_json_object(data)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self._error(502, "decode %s /v1/models: %s" % (d.addr, _why(e)))
                return
            self.send_response(resp.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self._record("served" if resp.status == 200 else "backend_failed", resp.status)
            self.end_headers()
            self.wfile.write(data)
            return
        self._error(404, "not found: %s" % path)

    def do_POST(self):  # noqa: N802 - http.server API
        r = self.router
        path = self.path.split("?", 1)[0]
        raw = self._body_or_reject()
        if raw is None:
            return
        if path not in PD_PATHS:
            self._error(404, "not found: %s (P/D routes %s)" % (path, ", ".join(PD_PATHS)))
            return
        try:
            body = parse_json_object(raw or b"{}")
        except ValueError as e:
            self._error(400, "invalid JSON body: %s" % e)
            return
        r.count(requests=1)
        request_id = self.headers.get("X-Request-Id") or str(uuid.uuid4())
        p, d = r.pick()
        try:
            kv = r.run_prefill(p, path, body, request_id)
        except PdError as e:
            r.count(failed=1, last_error=e.message)
            self._error(e.status, e.message, outcome=e.outcome)
            return
        self._decode(d, p, path, body, kv, request_id)

    def _decode(self, d, p, path, body, kv, request_id):
        r = self.router
        payload = json.dumps(decode_body(body, kv)).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        stream = bool(body.get("stream"))
        t0 = time.monotonic()

        def fail(status, msg, outcome="bad_gateway"):
            r.count(failed=1, last_error=msg)
            self._error(status, msg, outcome=outcome)

        try:
            conn, resp = d.request("POST", path, payload, headers, timeout=r.decode_timeout)
        except (OSError, http.client.HTTPException) as e:
            fail(502, "decode %s failed: %s" % (d.addr, _why(e)))
            return
        try:
            ok = resp.status == 200
            route = {"prefill-target-pod-ip": p.addr, "target-pod-ip": d.addr, "x-request-id": request_id}
            ctype = resp.getheader("Content-Type", "application/json")
            if not stream:
                # buffered whole (its JSON is checked before it is sent on): capped like a prefill answer
                try:
                    data = read_capped(resp, r.max_answer_bytes)
                except ValueError as e:
                    fail(502, "decode %s: %s (pd_proxy --max-body-bytes); raise the limit or lower max_tokens"
                         % (d.addr, e))
                    return
                except (OSError, http.client.HTTPException) as e:
                    fail(502, "decode %s broke off mid-answer: %s" % (d.addr, _why(e)))
                    return
                if ok:
                    try:
                        parse_json_object(data)
                    except ValueError as e:
                        fail(502, "decode %s answered invalid JSON (%s): %r" % (d.addr, e, data[:200]))
                        return
                self.send_response(resp.status)
                self.send_header("Content-Type", ctype)
                for k, v in route.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self._done(ok, resp.status, t0)
                self.end_headers()
                self.wfile.write(data)
                return
            chunked = self.request_version >= "HTTP/1.1"
            self.send_response(resp.status)
            self.send_header("Content-Type", ctype)
            for k, v in route.items():
                self.send_header(k, v)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:  # an HTTP/1.0 client: the end of the answer is the end of the connection
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            # a streamed answer is passed on as it comes, at most 64 KiB held at a time (never buffered whole,
            # so --max-body-bytes does not cut a long generation); decode_timeout bounds each read
            while True:
                try:
                    chunk = resp.read1(65536)
                    if not chunk and resp.length:  # Content-Length promised more than came
                        raise http.client.IncompleteRead(b"", resp.length)
                except (OSError, http.client.HTTPException) as e:
                    # the answer has started: end it without its last chunk so the client sees truncation
                    msg = "decode %s broke off mid-answer: %s" % (d.addr, _why(e))
                    self.log_error("%s", msg)
                    r.count(failed=1, last_error=msg)
                    self._record("broke_off", resp.status)
                    self.close_connection = True
                    return
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                self.wfile.flush()
            self._done(ok, resp.status, t0)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        finally:
            conn.close()

    def _done(self, ok, status, t0):
        # recorded before the client sees the end of the answer, so /proxy/stats read right after an
        # answer always includes it (and, for a buffered answer, before any of it leaves)
        self.router.count(decode_s=time.monotonic() - t0, completed=1 if ok else 0, failed=0 if ok else 1)
        self._record("completed" if ok else "backend_failed", status)


class ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, backlog=DEFAULT_BACKLOG):
        self.request_queue_size = backlog  # read by server_activate()'s listen()
        super().__init__(address, handler)


def build_server(host, port, router, backlog=DEFAULT_BACKLOG, request_timeout=DEFAULT_REQUEST_TIMEOUT,
                 keep_alive_timeout=DEFAULT_KEEP_ALIVE_TIMEOUT, max_body_bytes=DEFAULT_MAX_BODY_BYTES):
    handler = type("BoundHandler", (Handler,), {"router": router, "request_timeout": request_timeout,
                                                "keep_alive_timeout": keep_alive_timeout,
                                                "max_body_bytes": max_body_bytes})
    return ProxyServer((host, port), handler, backlog)


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError("must be > 0, got %s" % text)
        return value
    return parse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port, logged)")
    ap.add_argument("--prefill", action="append", required=True, help="prefill engine URL (repeatable)")
    ap.add_argument("--decode", action="append", required=True, help="decode engine URL (repeatable)")
    ap.add_argument("--prefill-timeout", type=_positive(float), default=30.0,
                    help="seconds a prefill may take (AIBrix v0.7.0's install sets AIBRIX_PREFILL_REQUEST_TIMEOUT=60)")
    ap.add_argument("--decode-timeout", type=_positive(float), default=600.0)
    ap.add_argument("--rewrite-remote-host", action="store_true",
                    help="replace kv_transfer_params.remote_host with the prefill host (as AIBrix does)")
    ap.add_argument("--backlog", type=_positive(int), default=DEFAULT_BACKLOG,
                    help="listen backlog: connections queued before accept (Linux caps it at net.core.somaxconn)")
    ap.add_argument("--request-timeout", type=_positive(float), default=DEFAULT_REQUEST_TIMEOUT,
                    help="seconds a client may take to send a whole request, from its first byte")
    ap.add_argument("--keep-alive-timeout", type=_positive(float), default=DEFAULT_KEEP_ALIVE_TIMEOUT,
                    help="seconds an idle kept-alive client connection stays open")
    ap.add_argument("--max-body-bytes", type=_positive(int), default=DEFAULT_MAX_BODY_BYTES,
                    help="largest request body accepted (413 above); also caps prefill and /v1/models answers")
    args = ap.parse_args(argv)
    try:
        router = Router(args.prefill, args.decode, args.prefill_timeout, args.decode_timeout,
                        args.rewrite_remote_host, max_answer_bytes=args.max_body_bytes)
    except ValueError as e:
        ap.error(str(e))
    server = build_server(args.host, args.port, router, backlog=args.backlog, request_timeout=args.request_timeout,
                          keep_alive_timeout=args.keep_alive_timeout, max_body_bytes=args.max_body_bytes)
    sys.stderr.write("pd_proxy listening on %s:%d prefill=%s decode=%s\n"
                     % (server.server_address[0], server.server_address[1], args.prefill, args.decode))
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
