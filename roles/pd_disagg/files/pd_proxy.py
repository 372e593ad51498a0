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
answered by a decode engine; ``GET /proxy/stats`` returns request counts and timings as JSON.
"""
from __future__ import annotations

import argparse
import http.client
import http.server
import itertools
import json
import sys
import threading
import time
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
        conn.request(method, path, body=body, headers=headers or {})
        return conn, conn.getresponse()


class PdError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


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
    def __init__(self, prefill, decode, prefill_timeout=30.0, decode_timeout=600.0, rewrite_remote_host=False):
        self.prefill = [Backend(u) for u in prefill]
        self.decode = [Backend(u) for u in decode]
        if not self.prefill or not self.decode:
            raise ValueError("at least one --prefill and one --decode backend are required")
        self._p = itertools.cycle(self.prefill)
        self._d = itertools.cycle(self.decode)
        self.prefill_timeout = prefill_timeout
        self.decode_timeout = decode_timeout
        self.rewrite_remote_host = rewrite_remote_host
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "completed": 0, "failed": 0, "prefill_s": 0.0, "decode_s": 0.0,
                      "last_error": ""}

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

    def run_prefill(self, backend, path, body, request_id):
        payload = json.dumps(prefill_body(body)).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        t0 = time.monotonic()
        try:
            conn, resp = backend.request("POST", path, payload, headers, timeout=self.prefill_timeout)
            data = resp.read()
            conn.close()
        except OSError as e:
            raise PdError(502, "prefill %s failed after %.1fs (prefill timeout %ss): %s"
                          % (backend.addr, time.monotonic() - t0, self.prefill_timeout, e))
        self.count(prefill_s=time.monotonic() - t0)
        if resp.status != 200:
            raise PdError(resp.status, "prefill %s answered %d: %s"
                          % (backend.addr, resp.status, data[:500].decode("utf-8", "replace")))
        try:
            answer = json.loads(data)
        except ValueError:
            raise PdError(502, "prefill %s answered non-JSON: %r" % (backend.addr, data[:200]))
        kv = answer.get("kv_transfer_params")
        if not kv:
            finish = [c.get("finish_reason") for c in answer.get("choices", [])]
            raise PdError(502, "prefill %s returned no kv_transfer_params (finish_reason %s); is the "
                               "engine started with --kv-transfer-config NixlConnector?" % (backend.addr, finish))
        if self.rewrite_remote_host:
            kv = dict(kv, remote_host=backend.host)
        return kv


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    router = None  # set by serve()

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), fmt % args))

    def _json(self, status, obj, headers=None):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message):
        self._json(status, {"error": {"code": status, "message": message, "type": "pd_proxy"}})

    def do_GET(self):  # noqa: N802 - http.server API
        r = self.router
        if self.path == "/health":
            bad = []
            for b in r.prefill + r.decode:
                try:
                    conn, resp = b.request("GET", "/health", timeout=5)
                    resp.read()
                    conn.close()
                    if resp.status != 200:
                        bad.append("%s: HTTP %d" % (b.addr, resp.status))
                except OSError as e:
                    bad.append("%s: %s" % (b.addr, e))
            if bad:
                self._error(503, "unhealthy backends: " + "; ".join(bad))
            else:
                self._json(200, {"status": "ok", "prefill": [b.url for b in r.prefill],
                                 "decode": [b.url for b in r.decode]})
            return
        if self.path == "/proxy/stats":
            with r.lock:
                self._json(200, dict(r.stats))
            return
        if self.path.rstrip("/") == "/v1/models":
            _p, d = r.pick()
            try:
                conn, resp = d.request("GET", "/v1/models", timeout=10)
                data = resp.read()
                conn.close()
            except OSError as e:
                self._error(502, "decode %s: %s" % (d.addr, e))
                return
            self.send_response(resp.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._error(404, "not found: %s" % self.path)

    def do_POST(self):  # noqa: N802 - http.server API
        r = self.router
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in PD_PATHS:
            self._error(404, "not found: %s (P/D routes %s)" % (path, ", ".join(PD_PATHS)))
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
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
            self._error(e.status, e.message)
            return
        payload = json.dumps(decode_body(body, kv)).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        t0 = time.monotonic()
        try:
            conn, resp = d.request("POST", path, payload, headers, timeout=r.decode_timeout)
        except OSError as e:
            msg = "decode %s failed: %s" % (d.addr, e)
            r.count(failed=1, last_error=msg)
            self._error(502, msg)
            return
        route = {"prefill-target-pod-ip": p.addr, "target-pod-ip": d.addr, "x-request-id": request_id}
        ok = resp.status == 200
        recorded = []

        def done():
            # recorded before the client sees the end of the answer, so /proxy/stats read right after an
            # answer always includes it
            recorded.append(True)
            r.count(decode_s=time.monotonic() - t0, completed=1 if ok else 0, failed=0 if ok else 1)

        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
            for k, v in route.items():
                self.send_header(k, v)
            if body.get("stream"):
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                done()
                self.wfile.write(b"0\r\n\r\n")
            else:
                data = resp.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                done()
                self.wfile.write(data)
        except (OSError, http.client.HTTPException) as e:
            if not recorded:  # decode broke off mid-answer: the client got a truncated answer
                r.count(failed=1, last_error="decode %s broke off: %s" % (d.addr, e))
            raise
        finally:
            conn.close()


def build_server(host, port, router):
    handler = type("BoundHandler", (Handler,), {"router": router})
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill", action="append", required=True, help="prefill engine URL (repeatable)")
    ap.add_argument("--decode", action="append", required=True, help="decode engine URL (repeatable)")
    ap.add_argument("--prefill-timeout", type=float, default=30.0,
                    help="seconds a prefill may take (AIBrix's AIBRIX_PREFILL_REQUEST_TIMEOUT is 30)")
    ap.add_argument("--decode-timeout", type=float, default=600.0)
    ap.add_argument("--rewrite-remote-host", action="store_true",
                    help="replace kv_transfer_params.remote_host with the prefill host (as AIBrix does)")
    args = ap.parse_args(argv)
    try:
        router = Router(args.prefill, args.decode, args.prefill_timeout, args.decode_timeout,
                        args.rewrite_remote_host)
    except ValueError as e:
        ap.error(str(e))
    server = build_server(args.host, args.port, router)
    sys.stderr.write("pd_proxy listening on %s:%d prefill=%s decode=%s\n"
                     % (args.host, args.port, args.prefill, args.decode))
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
