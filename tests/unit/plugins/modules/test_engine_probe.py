"""engine_probe against an in-process OpenAI-compatible fake: retry semantics and every check kind."""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe, _process, _process_state
from ansible_collections.llmops.serving.plugins.modules import engine_probe


class Fake(object):
    def __init__(self):
        self.unavailable_until = 0.0
        self.text = "FP8_OK"
        self.token_ids = [11, 12, 13]
        self.chat_content = "FP8_OK"
        self.reasoning = None
        self.finish = "stop"
        self.stream_done = True
        self.route_header = None
        self.tool_args = '{"city": "Paris"}'
        self.requests = []


def _handler(fake):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, obj, extra=None):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if time.time() < fake.unavailable_until:
                return self._send(503, {"error": "loading"})
            if self.path == "/health":
                return self._send(200, {})
            if self.path == "/v1/models":
                return self._send(200, {"data": [{"id": "glm-5.2-fp8-vllm"}]})
            return self._send(404, {})

        def do_POST(self):
            if time.time() < fake.unavailable_until:
                return self._send(503, {"error": "loading"})
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(req)
            if req["model"] != "glm-5.2-fp8-vllm":
                return self._send(404, {"error": {"message": "The model `%s` does not exist." % req["model"]}})
            hdr = {"target-pod": fake.route_header} if fake.route_header else {}
            if req.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for piece in ("FP8", "_OK"):
                    self.wfile.write(("data: %s\n\n" % json.dumps({"choices": [{"text": piece}]})).encode())
                    self.wfile.flush()
                    time.sleep(0.05)
                if fake.stream_done:
                    self.wfile.write(b"data: [DONE]\n\n")
                else:
                    time.sleep(3)
                return
            if self.path == "/v1/completions":
                return self._send(200, {"choices": [{"text": fake.text, "token_ids": fake.token_ids,
                                                     "finish_reason": "length"}]}, hdr)
            msg = {"role": "assistant", "content": fake.chat_content}
            if fake.reasoning:
                msg["reasoning_content"] = fake.reasoning
            if "tools" in req:
                msg = {"role": "assistant", "content": None, "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": fake.tool_args}}]}
            if "response_format" in req:
                msg["content"] = '{"answer": "yes"}'
            return self._send(200, {"choices": [{"message": msg, "finish_reason": fake.finish}]}, hdr)

    return H


@pytest.fixture
def server():
    fake = Fake()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    fake.url = "http://127.0.0.1:%d" % srv.server_address[1]
    yield fake
    srv.shutdown()


def _probe_args(server, checks, **kw):
    a = {"base_url": server.url, "model": "glm-5.2-fp8-vllm", "checks": checks, "deadline": 20, "interval": 0.2}
    a.update(kw)
    return a


def test_retries_while_loading_then_records_timeline(run_module, server):
    server.unavailable_until = time.time() + 1.0
    r = run_module(engine_probe, _probe_args(server, [
        {"type": "health"}, {"type": "models"}, {"type": "completion", "prompt": "x", "expect": "FP8_OK"}]))
    assert not r.get("failed"), r["msg"]
    assert r["checks"][0]["attempts"] > 1
    assert set(r["timeline"]) >= {"port_open", "health", "models", "first_correct"}
    assert r["timeline"]["health"] <= r["timeline"]["first_correct"]


def test_wrong_answer_fails_at_once(run_module, server):
    t0 = time.time()
    r = run_module(engine_probe, _probe_args(server, [{"type": "completion", "prompt": "x", "expect": "FP8_NO"}]))
    assert r["failed"] and "'FP8_OK' != expected 'FP8_NO'" in r["msg"]
    assert r["checks"][0]["attempts"] == 1 and time.time() - t0 < 5


def test_expect_token_ids_and_regex(run_module, server):
    ok = run_module(engine_probe, _probe_args(server, [
        {"type": "completion", "prompt": "x", "expect_token_ids": [11, 12, 13], "expect_regex": "^FP8"}]))
    assert not ok.get("failed")
    assert server.requests[-1]["return_token_ids"] is True and server.requests[-1]["temperature"] == 0
    bad = run_module(engine_probe, _probe_args(server, [{"type": "completion", "expect_token_ids": [11, 12]}]))
    assert bad["failed"] and "token ids" in bad["msg"]


def test_unknown_model_fails_fast(run_module, server):
    r = run_module(engine_probe, _probe_args(server, [{"type": "models"}], model="glm-5.2-fp8"))
    assert r["failed"] and "does not list 'glm-5.2-fp8'" in r["msg"] and "glm-5.2-fp8-vllm" in r["msg"]
    r = run_module(engine_probe, _probe_args(server, [{"type": "completion"}], model="nope"))
    assert r["failed"] and "is not served" in r["msg"]


def test_server_down_until_deadline(run_module):
    t0 = time.time()
    r = run_module(engine_probe, {"base_url": "http://127.0.0.1:9", "model": "m", "deadline": 2, "interval": 0.5})
    assert r["failed"] and "deadline (2s)" in r["msg"]
    assert 1.0 < time.time() - t0 < 10


def test_dead_process_stops_the_wait(run_module, tmp_path):
    st = None
    try:
        _process.start(str(tmp_path), "eng", [sys.executable, "-c", "import time,sys; time.sleep(1); sys.exit(3)"],
                       startup_grace=0.1)
    finally:
        st = _process_state.paths(str(tmp_path), "eng")["state"]
    t0 = time.time()
    r = run_module(engine_probe, {"base_url": "http://127.0.0.1:9", "model": "m", "deadline": 120,
                                  "interval": 0.3, "process_state_file": st})
    assert r["failed"] and "exited with exit status 3" in r["msg"]
    assert time.time() - t0 < 30


def test_reasoning_budget(run_module, server):
    server.chat_content = ""
    server.reasoning = "Let me think step by step..."
    server.finish = "length"
    r = run_module(engine_probe, _probe_args(server, [{"type": "chat", "prompt": "2+2?", "max_tokens": 128,
                                                       "reasoning": True}]))
    assert r["failed"] and "reasoning used the whole max_tokens budget (128)" in r["msg"]
    assert any("max_tokens=128 is small" in w for w in r["warnings"])


def test_json_schema_and_tool_call(run_module, server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = run_module(engine_probe, _probe_args(server, [
        {"type": "json_schema", "prompt": "yes?", "schema": schema},
        {"type": "tool_call", "prompt": "weather", "tools": tools, "expect_function": "get_weather"}]))
    assert not r.get("failed"), r["msg"]
    assert r["checks"][0]["output"] == {"answer": "yes"}
    assert r["checks"][1]["arguments"] == {"city": "Paris"}
    assert server.requests[-2]["response_format"]["json_schema"]["schema"] == schema
    server.tool_args = '{"town": "Paris"}'
    r = run_module(engine_probe, _probe_args(server, [{"type": "tool_call", "tools": tools}]))
    assert r["failed"] and "do not validate" in r["msg"]
    server.tool_args = '{"city": "Par'
    r = run_module(engine_probe, _probe_args(server, [{"type": "tool_call", "tools": tools}]))
    assert r["failed"] and "the argument text of 'get_weather' is not JSON" in r["msg"]


def test_stream_done_and_teardown_hang(run_module, server):
    r = run_module(engine_probe, _probe_args(server, [{"type": "stream", "prompt": "x", "expect": "FP8_OK"}]))
    assert not r.get("failed"), r["msg"]
    assert r["checks"][0]["chunks"] == 2 and r["checks"][0]["ttft_ms"] > 0
    server.stream_done = False
    r = run_module(engine_probe, _probe_args(server, [{"type": "stream", "prompt": "x", "stream_timeout": 1}]))
    assert r["failed"] and "[DONE]" in r["msg"]


def test_cancel_then_health(run_module, server):
    r = run_module(engine_probe, _probe_args(server, [{"type": "cancel", "prompt": "x"}]))
    assert not r.get("failed"), r["msg"]
    assert r["checks"][0]["health_after_cancel"] == 200


def test_route_header(run_module, server):
    # an engine reached directly sets none of the gateway plugin's headers
    r = run_module(engine_probe, _probe_args(server, [{"type": "route"}]))
    assert r["failed"] and "lacks request-id, x-went-into-req-headers" in r["msg"] and "no routing strategy" in r["msg"]
    r = run_module(engine_probe, _probe_args(server, [{"type": "route", "header": "target-pod"}]))
    assert r["failed"] and "lacks target-pod" in r["msg"]
    server.route_header = "glm-vllm-7d9f-abcde"
    r = run_module(engine_probe, _probe_args(server, [{"type": "route", "header": "target-pod",
                                                       "expect_regex": "^glm-vllm-"}]))
    assert not r.get("failed") and r["checks"][0]["value"] == "glm-vllm-7d9f-abcde"


def test_bad_checks_are_refused_before_sending(run_module, server):
    r = run_module(engine_probe, _probe_args(server, [{"type": "helth"}]))
    assert r["failed"] and r["msg"].startswith("checks[0]: 'type' must be one of")
    r = run_module(engine_probe, _probe_args(server, [{"type": "completion", "expect_regex": "("}]))
    assert r["failed"] and "checks[0].expect_regex" in r["msg"]
    assert server.requests == []


def test_subset_validator_without_jsonschema():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert _probe.validate_schema({"n": 3}, schema) == []
    assert _probe.validate_schema({"n": "3"}, schema)
    assert _probe.validate_schema({}, schema)


# ---- an engine that trickles its answer: the probe ends at its deadline ----------------------------------- #

class _Trickle(BaseHTTPRequestHandler):
    """Every answer's headers at once, then its body a byte a second (the health answer of a wedged engine)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802 - http.server API
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "120")
        self.end_headers()
        try:
            for i in range(120):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1.0)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def trickle():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("check", [{"type": "health"}, {"type": "models"}])
def test_a_trickled_answer_ends_the_probe_at_its_deadline(run_module, trickle, check):
    """timeout 3 s, deadline 5 s: a byte a second never trips a per-read timeout, so the old probe waited for the
    whole 120-byte answer (and again on each retry); now each answer has 3 s in all and nothing outlives 5 s."""
    from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang

    t0 = time.monotonic()
    box = no_hang(lambda: run_module(engine_probe, {"base_url": trickle, "model": "m", "checks": [check],
                                                    "timeout": 3, "deadline": 5, "interval": 0.5}), timeout=15)
    took = time.monotonic() - t0
    r = box["value"]
    assert r["failed"] and "still failing when the deadline (5s) passed" in r["msg"], r["msg"]
    assert "(timed out" in r["msg"] or "deadline has passed" in r["msg"], r["msg"]
    assert took < 5 + 1.5


def test_a_huge_wrong_answer_is_quoted_only_in_part(run_module, server):
    server.text = "x" * (5 * 1024 * 1024)
    r = run_module(engine_probe, _probe_args(server, [{"type": "completion", "prompt": "x", "expect": "FP8_OK"}]))
    assert r["failed"] and "(the first 300 of %d characters) != expected 'FP8_OK'" % len(server.text) in r["msg"]
    assert len(r["msg"]) < 1000


# ---- an attempt the deadline cut short does not hide the server's last real answer ------------------------- #

def test_an_attempt_cut_short_by_the_deadline_keeps_the_last_real_answer_as_the_reason():
    """A 404 retried to the deadline: the final attempt has only what is left of the deadline (here a few ms on a
    busy host) and gets no answer in it. That says nothing about the server; the reason stays the 404."""
    answers = iter([_probe.Transient("HTTP 404 from /health: not found"),
                    _probe.Transient("GET /health: no answer within 0.01s (timed out)", cut=True)])

    def attempt():
        raise next(answers)

    with pytest.raises(_probe.Expired) as e:
        _probe.retry(attempt, time.monotonic() + 0.15, interval=0.1)
    assert e.value.last.startswith("HTTP 404 from /health: not found"), e.value.last
    assert "the deadline cut the next attempt short: GET /health: no answer within 0.01s" in e.value.last
    assert e.value.attempts == 2


def test_a_full_length_timeout_is_the_reason_and_only_a_cut_one_is_marked(tmp_path):
    """A server that accepts and never answers: an attempt with its whole timeout is a real reason (not cut); the
    same request with less of the deadline left than its timeout is marked cut."""
    import socket

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)  # connections complete in the backlog; nothing ever answers
    try:
        url = "http://127.0.0.1:%d" % lsock.getsockname()[1]
        whole = _probe.Http(url, timeout=0.2, end=time.monotonic() + 30)
        with pytest.raises(_probe.Transient) as e:
            whole.request("GET", "/health")
        assert not e.value.cut and "GET /health" in str(e.value)
        short = _probe.Http(url, timeout=5, end=time.monotonic() + 0.2)
        with pytest.raises(_probe.Transient) as e:
            short.request("GET", "/health")
        assert e.value.cut
        with pytest.raises(_probe.Transient) as e:
            short.request("GET", "/health")  # the deadline has passed: not sent at all
        assert e.value.cut and "not sent" in str(e.value)
    finally:
        lsock.close()
