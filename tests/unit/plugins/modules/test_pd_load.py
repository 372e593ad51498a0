"""The P/D proxy protocol and llmops.serving.pd_load against stand-in engines speaking vLLM's NIXL protocol.

Ports 18110-18113 (stand-in prefill, decode, colocated engine, proxy).
"""
from __future__ import annotations

import http.server
import importlib.util
import json
import os
import threading

import pytest

from ansible_collections.llmops.serving.plugins.modules import pd_load

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
_spec = importlib.util.spec_from_file_location("pd_proxy", os.path.join(ROOT, "roles", "pd_disagg", "files", "pd_proxy.py"))
pd_proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pd_proxy)

PREFILL, DECODE, COLOCATED, PROXY = 18110, 18111, 18112, 18113


def greedy(prompt, n):
    return "".join(reversed(prompt))[:n]


class Engine(http.server.BaseHTTPRequestHandler):
    """Stand-in for a vLLM engine with NixlConnector: role 'prefill', 'decode' or 'colocated'."""
    role = "colocated"
    seen = None
    drop_kv = False
    truncate = False

    def log_message(self, *a):
        pass

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self._send(200, {"data": [{"id": "tiny"}]} if self.path.startswith("/v1/models") else {})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.role, body, dict(self.headers)))
        kv = body.get("kv_transfer_params")
        if self.role == "prefill":
            assert kv and kv["do_remote_decode"] is True
            out = {"choices": [{"text": greedy(body["prompt"], 1), "finish_reason": "length"}]}
            if not self.drop_kv:
                out["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                             "remote_block_ids": [1, 2], "remote_engine_id": "p-engine",
                                             "remote_host": "127.0.0.1", "remote_port": 18150,
                                             "remote_request_id": "r1", "tp_size": 1}
            self._send(200, out)
        elif self.role == "decode":
            if not kv or kv.get("remote_engine_id") != "p-engine":
                self._send(400, {"error": "no kv"})
                return
            if self.truncate:  # promise 1000 bytes, send a few, hang up: an engine dying mid-answer
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"choices": [')
                self.close_connection = True
                return
            self._send(200, {"choices": [{"text": greedy(body["prompt"], body["max_tokens"])}]})
        else:
            self._send(200, {"choices": [{"text": greedy(body["prompt"], body["max_tokens"])}]})


def _serve(server):
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return server


@pytest.fixture
def pair():
    seen = []
    servers = []
    for role, port in (("prefill", PREFILL), ("decode", DECODE), ("colocated", COLOCATED)):
        handler = type("E" + role, (Engine,), {"role": role, "seen": seen, "drop_kv": False, "truncate": False})
        servers.append(_serve(http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)))
    router = pd_proxy.Router(["http://127.0.0.1:%d" % PREFILL], ["http://127.0.0.1:%d" % DECODE])
    servers.append(_serve(pd_proxy.build_server("127.0.0.1", PROXY, router)))
    yield {"seen": seen, "router": router, "prefill_handler": servers[0].RequestHandlerClass,
           "decode_handler": servers[1].RequestHandlerClass}
    for s in servers:
        s.shutdown()
        s.server_close()


def test_prefill_body_follows_the_aibrix_and_vllm_proxy_protocol():
    body = {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True, "stream_options": {"x": 1},
            "min_tokens": 4}
    p = pd_proxy.prefill_body(body)
    assert p["max_tokens"] == 1 and p["stream"] is False
    assert "stream_options" not in p and "min_tokens" not in p
    assert p["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                       "remote_engine_id": None, "remote_block_ids": None,
                                       "remote_host": None, "remote_port": None}
    assert body["max_tokens"] == 64  # the client's request is not modified
    chat = pd_proxy.prefill_body({"messages": [], "max_completion_tokens": 50})
    assert chat["max_completion_tokens"] == 1


def test_pd_load_through_proxy_matches_colocated_and_records_route(run_module, pair):
    r = run_module(pd_load, {"url": "http://127.0.0.1:%d" % PROXY, "model": "tiny",
                             "prompts": ["abcdef", "hello world"], "max_tokens": 4, "repeat": 2,
                             "reference_url": "http://127.0.0.1:%d" % COLOCATED})
    assert not r.get("failed"), r.get("msg")
    assert r["completed"] == 4 and r["all_match"] is True and r["mismatches"] == 0
    assert r["requests"][0]["text"] == "fedc"
    assert r["requests"][0]["route"] == {"prefill-target-pod-ip": "127.0.0.1:%d" % PREFILL,
                                         "target-pod-ip": "127.0.0.1:%d" % DECODE}
    decode_calls = [b for role, b, _h in pair["seen"] if role == "decode"]
    assert len(decode_calls) == 4
    assert decode_calls[0]["kv_transfer_params"]["remote_block_ids"] == [1, 2]
    assert decode_calls[0]["max_tokens"] == 4
    # prefill and decode saw the same request id, for log correlation
    ids = [h.get("X-Request-Id") for role, _b, h in pair["seen"] if role in ("prefill", "decode")]
    assert ids[0] == ids[1]
    assert pair["router"].stats["completed"] == 4 and pair["router"].stats["failed"] == 0


def test_engine_error_is_reported_with_its_answer(run_module, pair):
    r = run_module(pd_load, {"url": "http://127.0.0.1:%d" % PROXY, "model": "tiny", "prompts": ["abcdef"],
                             "max_tokens": 4, "reference_url": "http://127.0.0.1:%d" % DECODE})
    # asking decode directly without kv_transfer_params fails: the error names the URL and the answer
    assert r["failed"] and "POST http://127.0.0.1:%d/v1/completions failed" % DECODE in r["msg"]
    assert "no kv" in r["msg"]


def test_prefill_without_kv_params_is_a_clear_502(run_module, pair):
    pair["prefill_handler"].drop_kv = True
    r = run_module(pd_load, {"url": "http://127.0.0.1:%d" % PROXY, "model": "tiny", "prompts": ["x"]})
    assert r["failed"] and "HTTP Error 502" in r["msg"]
    assert "returned no kv_transfer_params" in r["msg"] and "NixlConnector" in r["msg"]
    assert pair["router"].stats["failed"] == 1


def test_decode_breaking_off_mid_answer_counts_as_failed(pair, capsys):
    from urllib.error import URLError
    from urllib.request import Request, urlopen
    from http.client import HTTPException
    pair["decode_handler"].truncate = True
    req = Request("http://127.0.0.1:%d/v1/completions" % PROXY, method="POST",
                  data=json.dumps({"model": "tiny", "prompt": "abc", "max_tokens": 2}).encode(),
                  headers={"Content-Type": "application/json"})
    with pytest.raises((URLError, HTTPException, ConnectionError)):
        with urlopen(req, timeout=10) as resp:
            resp.read()
    stats = pair["router"].stats
    assert stats["completed"] == 0 and stats["failed"] == 1
    assert "broke off" in stats["last_error"] and "127.0.0.1:%d" % DECODE in stats["last_error"]


def test_proxy_health_and_models(pair):
    from urllib.request import urlopen
    with urlopen("http://127.0.0.1:%d/health" % PROXY) as resp:
        assert json.loads(resp.read())["status"] == "ok"
    with urlopen("http://127.0.0.1:%d/v1/models" % PROXY) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "tiny"


def test_bad_options_name_the_field(run_module):
    r = run_module(pd_load, {"url": "127.0.0.1:8000", "model": "m", "prompts": ["x"]})
    assert r["failed"] and r["msg"].startswith("url: '127.0.0.1:8000' is not an http(s):// URL")
    r = run_module(pd_load, {"url": "http://x", "model": "m", "prompts": ["x"], "repeat": 0})
    assert r["failed"] and r["msg"].startswith("repeat: must be >= 1")
