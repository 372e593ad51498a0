# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: readiness that means a correct answer, not an open port.

Transient failures (connection refused, timeouts, 502/503/504, 404 on /health while a route settles) are
retried until the deadline; a wrong answer, an unknown model or a dead engine process fail at once.

Through an AIBrix v0.7.0 gateway (``target="aibrix_gateway"``) the checks follow its route table
(vllm-project/aibrix v0.7.0, ``config/gateway/gateway-plugin/gateway-plugin.yaml`` and
``pkg/plugins/gateway/gateway_rsp_headers.go``):

* there is no ``/health`` route (Envoy answers 404 to an unmatched path), so a ``health`` check is refused
  before anything is sent: check ``/health`` against the Service or the pod;
* ``model_header: true`` sends the header ``model: <model>``, which the per-model HTTPRoute ``<model>-router``
  matches on;
* a ``route`` check without ``header`` requires exactly the headers the gateway plugin sets for the routing in
  force: ``request-id`` and ``x-went-into-req-headers`` on every request it processed, and ``routing-strategy``,
  ``target-pod``, ``target-pod-ip`` only when a routing strategy picked a pod (the request's
  ``routing-strategy`` header, or ``routing_strategy``: the one the pods' ``model.aibrix.ai/config`` profile or
  the gateway's ``ROUTING_ALGORITHM`` applies), plus ``prefill-target-pod``/``prefill-target-pod-ip`` for ``pd``
  (``pkg/plugins/gateway/algorithms/pd_disaggregation.go``). It never sends the ``model`` header: a request
  matched by the per-model route directly bypasses the plugin and carries none of them.

Every request goes through ``_http`` with a deadline for the whole answer: the smaller of its ``timeout`` and the
time left before the probe's ``deadline`` (an engine that trickles its answer a byte a second cannot keep the
probe past either), and a stream is read under ``stream_timeout`` as a deadline for all of it. Messages quote an
answer only through ``_untrusted.excerpt``.
"""
from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import urlparse

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _http, _timeline
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, excerpt, loads_json

CHECK_TYPES = ("health", "models", "completion", "chat", "json_schema", "tool_call", "stream", "cancel", "route")
TARGETS = ("engine", "aibrix_gateway")
#: Response headers AIBrix v0.7.0's gateway plugin sets on every request it processed (gateway_rsp_headers.go).
PLUGIN_HEADERS = ("request-id", "x-went-into-req-headers")
#: ... and when a routing strategy picked a pod (``routerCtx.HasRouted()``).
ROUTED_HEADERS = ("routing-strategy", "target-pod", "target-pod-ip")
#: ... and under ``pd`` (pd_disaggregation.go, ``ctx.RespHeaders``).
PD_HEADERS = ("prefill-target-pod", "prefill-target-pod-ip")
REASONING_MIN_TOKENS = 512
TRANSIENT_STATUS = (404, 408, 425, 429, 502, 503, 504)


class Transient(Exception):
    """Worth retrying until the deadline. ``cut``: the request's own timeout was cut short by the probe's
    deadline and it got no answer within what was left, which says nothing about the server."""

    def __init__(self, msg, cut=False):
        super().__init__(msg)
        self.cut = cut


class CheckFailed(Exception):
    """Definitive: retrying will not help."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


class Expired(Exception):
    """:func:`retry` gave up: the deadline passed while the attempts kept failing transiently."""

    def __init__(self, last, attempts):
        super().__init__(last)
        self.last = last
        self.attempts = attempts


class Exited(Exception):
    """:func:`retry` gave up: the process whose answer is awaited is dead (the message says how)."""

    def __init__(self, msg, attempts):
        super().__init__(msg)
        self.msg = msg
        self.attempts = attempts


def retry(attempt, end, interval=2.0, process_exited=None, on_retry=None):
    """Call ``attempt()`` until it returns; returns ``(its value, attempts made)``.

    :class:`Transient` is retried every ``interval`` seconds until ``end`` (a ``time.monotonic()`` deadline),
    then :class:`Expired` carries the last error. After each failed attempt ``process_exited()`` (when given)
    may return a message: the wait ends at once with :class:`Exited`. :class:`CheckFailed` propagates with
    ``attempts`` set. ``on_retry(attempts, last)`` is called before each wait.
    """
    attempts = 0
    last = None
    while True:
        attempts += 1
        try:
            return attempt(), attempts
        except Transient as e:
            if not (e.cut and last):
                last = str(e)
            elif "(then" not in last:
                # the attempt the deadline cut short proves nothing; the last real answer is the reason
                last = "%s (then the deadline cut the next attempt short: %s)" % (last, e)
            dead = process_exited() if process_exited else None
            if dead:
                raise Exited(dead, attempts)
            if time.monotonic() + interval > end:
                raise Expired(last, attempts)
            if on_retry is not None:
                on_retry(attempts, last)
            time.sleep(interval)
        except CheckFailed as e:
            e.attempts = attempts
            raise


class Http(object):
    """The probe's requests to ``base_url``: each one's whole answer within its ``timeout`` and, with ``end`` (a
    ``time.monotonic()`` deadline), before ``end``."""

    def __init__(self, base_url, headers=None, timeout=60.0, transient_status=TRANSIENT_STATUS, end=None):
        self.base = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.transient_status = transient_status
        self.end = end

    def _headers(self, extra):
        return dict(self.headers, **(extra or {}))

    def _timeout(self, method, path, timeout):
        """The deadline of one request: ``timeout`` (else the probe's), cut to the time left before ``end``;
        returns (seconds, whether the deadline cut it)."""
        timeout = timeout or self.timeout
        if self.end is None:
            return timeout, False
        left = self.end - time.monotonic()
        if left <= 0:
            raise Transient("%s %s: not sent, the probe's deadline has passed" % (method, path), cut=True)
        return min(timeout, left), left < timeout

    def request(self, method, path, payload=None, timeout=None, transient_status=None, headers=None):
        """Return (status, headers, text); raise Transient on retryable transport errors."""
        transient_status = self.transient_status if transient_status is None else transient_status
        seconds, cut = self._timeout(method, path, timeout)
        try:
            resp = _http.request(method, self.base + path, payload=payload, headers=self._headers(headers),
                                 timeout=seconds)
            return resp.status, resp.headers, resp.text
        except _http.HttpError as e:
            if e.status is None:
                raise Transient("%s %s: %s" % (method, path, e.reason), cut=cut)
            if e.status in transient_status and "does not exist" not in e.body:
                raise Transient("HTTP %d from %s: %s" % (e.status, path, excerpt(e.body, 300)))
            return e.status, e.headers, e.body

    def open_stream(self, path, payload, timeout, headers=None):
        """The open ``_http.Stream`` of a streamed answer: its headers and every event within ``timeout`` (cut to
        the probe's deadline)."""
        seconds, cut = self._timeout("POST", path, timeout)
        try:
            return _http.open_response("POST", self.base + path, payload=payload, headers=self._headers(headers),
                                       timeout=seconds)
        except _http.HttpError as e:
            if e.status is None:
                raise Transient("POST %s: %s" % (path, e.reason), cut=cut)
            if e.status in self.transient_status:
                raise Transient("HTTP %d from %s: %s" % (e.status, path, excerpt(e.body, 300)))
            raise CheckFailed("HTTP %d from %s: %s" % (e.status, path, excerpt(e.body, 500)), status=e.status)


def port_open(base_url, timeout=2.0):
    u = urlparse(base_url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _json(status, body, path):
    """An answer's JSON under the untrusted-input rules (size, nesting, finite numbers)."""
    try:
        doc = loads_json(body, "%s answered HTTP %s with a body that" % (path, status))
    except UntrustedInput as e:
        shown = ": %s" % excerpt(body, 300) if e.limit in ("syntax", "encoding") else ""
        raise CheckFailed(str(e) + shown)
    if not isinstance(doc, dict):
        raise CheckFailed("%s answered HTTP %s with JSON that is not an object: %s" % (path, status, excerpt(body, 300)))
    return doc


def _check_headers(check, model):
    """The request headers of one check: its ``headers``, and ``model: <model>`` with ``model_header``."""
    extra = dict((str(k), str(v)) for k, v in (check.get("headers") or {}).items())
    if check.get("model_header"):
        extra["model"] = model
    return extra


def _fail_on_status(status, body, path, model):
    if status == 200:
        return
    if status in (400, 404) and "does not exist" in body:
        raise CheckFailed("model %r is not served at %s (HTTP %d): %s" % (model, path, status, excerpt(body, 300)),
                          status=status)
    raise CheckFailed("%s answered HTTP %d: %s" % (path, status, excerpt(body, 500)), status=status)


def _match(check, text, token_ids=None):
    """Compare output with expect / expect_regex / expect_token_ids; raise CheckFailed on mismatch."""
    if check.get("expect") is not None and text != check["expect"]:
        raise CheckFailed("output %s != expected %r" % (excerpt(text, 300), check["expect"]), output=text)
    if check.get("expect_regex") and not re.search(check["expect_regex"], text or "", re.S):
        raise CheckFailed("output %s does not match /%s/" % (excerpt(text, 300), check["expect_regex"]), output=text)
    if check.get("expect_token_ids") is not None:
        if token_ids is None:
            raise CheckFailed("the server returned no token_ids (needs a vLLM that supports return_token_ids)")
        if list(token_ids) != list(check["expect_token_ids"]):
            raise CheckFailed("token ids %s != expected %s" % (list(token_ids), list(check["expect_token_ids"])),
                              output=text, token_ids=list(token_ids))


def _gen_body(check, model):
    body = {"model": model, "temperature": check.get("temperature", 0.0),
            "max_tokens": int(check.get("max_tokens") or 16)}
    if check.get("seed") is not None:
        body["seed"] = check["seed"]
    body.update(check.get("body") or {})
    return body


def _messages(check):
    if check.get("messages"):
        return check["messages"]
    return [{"role": "user", "content": check.get("prompt") or "Say OK."}]


def _check_health(http, check, model, warnings):
    status, dummy, body = http.request("GET", check.get("path") or "/health", headers=_check_headers(check, model))
    if status != 200:
        raise Transient("/health answered HTTP %d" % status)
    return {"status": status}


def _check_models(http, check, model, warnings):
    path = check.get("path") or "/v1/models"
    status, dummy, body = http.request("GET", path, headers=_check_headers(check, model))
    if status != 200:
        raise CheckFailed("%s answered HTTP %d: %s" % (path, status, excerpt(body, 300)))
    data = _json(status, body, path).get("data")
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if model not in ids:
        raise CheckFailed("%s does not list %r; it serves %s. The served name, the request's model and the "
                          "AIBrix label model.aibrix.ai/name must be identical." % (path, model, excerpt(ids, 300)),
                          models=ids)
    return {"models": ids}


def _first_choice(doc, path):
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckFailed("%s answered without choices: %s" % (path, excerpt(json.dumps(doc), 300)))
    return choices[0]


def _check_completion(http, check, model, warnings):
    body = _gen_body(check, model)
    body["prompt"] = check.get("prompt") or "Hello"
    if check.get("expect_token_ids") is not None:
        body["return_token_ids"] = True
    t0 = time.monotonic()
    status, headers, text = http.request("POST", "/v1/completions", body, headers=_check_headers(check, model))
    _fail_on_status(status, text, "/v1/completions", model)
    choice = _first_choice(_json(status, text, "/v1/completions"), "/v1/completions")
    out = {"text": choice.get("text"), "finish_reason": choice.get("finish_reason"),
           "token_ids": choice.get("token_ids"), "latency_ms": round((time.monotonic() - t0) * 1000, 1),
           "headers": _route_headers(headers)}
    _match_from(check, out, out["token_ids"])
    return out


def _match_from(check, out, token_ids=None):
    """:func:`_match` on an answer; a wrong one's failure keeps the headers that name the pod that gave it."""
    try:
        _match(check, out["text"], token_ids)
    except CheckFailed as e:
        e.details.setdefault("headers", out["headers"])
        raise


def _reasoning_warn(check, warnings):
    if check.get("reasoning") and int(check.get("max_tokens") or 16) < REASONING_MIN_TOKENS:
        warnings.append(
            "check %r: max_tokens=%s is small for a reasoning model; the reasoning can consume the whole budget "
            "and leave the answer empty (use >= %d)" % (check.get("name"), check.get("max_tokens"), REASONING_MIN_TOKENS))


def _chat(http, check, model, body_extra=None):
    body = _gen_body(check, model)
    body["messages"] = _messages(check)
    body.update(body_extra or {})
    t0 = time.monotonic()
    status, headers, text = http.request("POST", "/v1/chat/completions", body, headers=_check_headers(check, model))
    _fail_on_status(status, text, "/v1/chat/completions", model)
    choice = _first_choice(_json(status, text, "/v1/chat/completions"), "/v1/chat/completions")
    msg = choice.get("message") or {}
    content = msg.get("content")
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if not content and reasoning and choice.get("finish_reason") == "length" and not body_extra:
        raise CheckFailed("the reasoning used the whole max_tokens budget (%s) and the answer is empty; raise "
                          "max_tokens (>= %d) for reasoning models" % (body["max_tokens"], REASONING_MIN_TOKENS),
                          reasoning_content=reasoning[:500])
    return msg, choice, headers, round((time.monotonic() - t0) * 1000, 1)


def _check_chat(http, check, model, warnings):
    _reasoning_warn(check, warnings)
    msg, choice, headers, ms = _chat(http, check, model)
    out = {"text": msg.get("content"), "reasoning_content": msg.get("reasoning_content") or msg.get("reasoning"),
           "finish_reason": choice.get("finish_reason"), "latency_ms": ms, "headers": _route_headers(headers)}
    _match_from(check, out)
    return out


def validate_schema(instance, schema, path="$"):
    """Validate with jsonschema when installed, else a strict subset (type/properties/required/enum/items)."""
    try:
        import jsonschema  # pylint: disable=import-outside-toplevel

        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(instance), key=lambda e: list(e.path))
        # jsonschema's message quotes the instance whole: it is the engine's output, so only its start is shown
        return ["%s: %s" % ("/".join(str(p) for p in e.path) or "$", e.message if len(e.message) <= 300
                            else "%s fails the schema's %r rule" % (excerpt(e.instance, 80), e.validator))
                for e in errors]
    except ImportError:
        pass
    errs = []
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
             "boolean": bool, "null": type(None)}
    t = schema.get("type")
    if t and not isinstance(instance, types.get(t, object)) or (t in ("integer", "number") and isinstance(instance, bool)):
        return ["%s: %s is not of type %s" % (path, excerpt(instance, 80), t)]
    if "enum" in schema and instance not in schema["enum"]:
        errs.append("%s: %s is not one of %s" % (path, excerpt(instance, 80), schema["enum"]))
    if isinstance(instance, dict):
        for req in schema.get("required", []):
            if req not in instance:
                errs.append("%s: %r is a required property" % (path, req))
        for k, sub in (schema.get("properties") or {}).items():
            if k in instance:
                errs += validate_schema(instance[k], sub, "%s/%s" % (path, k))
        if schema.get("additionalProperties") is False:
            extra = set(instance) - set(schema.get("properties") or {})
            if extra:
                errs.append("%s: unexpected properties %s" % (path, excerpt(sorted(extra), 200)))
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            errs += validate_schema(item, schema["items"], "%s/%d" % (path, i))
    return errs


def _check_json_schema(http, check, model, warnings):
    schema = check.get("schema")
    if not isinstance(schema, dict):
        raise CheckFailed("json_schema check needs 'schema' (a JSON schema object)")
    rf = {"type": "json_schema", "json_schema": {"name": check.get("schema_name") or "probe", "schema": schema,
                                                 "strict": True}}
    msg, choice, headers, ms = _chat(http, check, model, {"response_format": rf})
    content = msg.get("content") or ""
    try:
        doc = loads_json(content, "json_schema: the output")
    except UntrustedInput as e:
        raise CheckFailed("%s: %s" % (e, excerpt(content, 300)), output=content)
    errors = validate_schema(doc, schema)
    if errors:
        raise CheckFailed("json_schema: the output does not validate: %s" % "; ".join(errors[:5]), output=content)
    return {"output": doc, "finish_reason": choice.get("finish_reason"), "latency_ms": ms}


def _check_tool_call(http, check, model, warnings):
    tools = check.get("tools")
    if not tools:
        raise CheckFailed("tool_call check needs 'tools' (OpenAI function tool definitions)")
    choice_opt = check.get("tool_choice") or "required"
    msg, choice, headers, ms = _chat(http, check, model, {"tools": tools, "tool_choice": choice_opt})
    calls = msg.get("tool_calls") or []
    if not calls and choice.get("finish_reason") == "length":
        raise CheckFailed("tool_call: the answer hit max_tokens (%s) before the tool call was complete; raise "
                          "max_tokens" % check.get("max_tokens"))
    if not calls:
        raise CheckFailed("tool_call: no tool_calls in the answer (content: %s); is the engine started with a tool "
                          "call parser (vLLM --enable-auto-tool-choice --tool-call-parser ...)?"
                          % excerpt(msg.get("content") or "", 200))
    fn = calls[0].get("function") or {}
    name = fn.get("name")
    shown = excerpt(name, 80)
    if check.get("expect_function") and name != check["expect_function"]:
        raise CheckFailed("tool_call: called %s, expected %r" % (shown, check["expect_function"]))
    try:
        args = loads_json(fn.get("arguments") or "{}", "tool_call: the argument text of %s" % shown)
    except UntrustedInput as e:
        raise CheckFailed("%s: %s" % (e, excerpt(fn.get("arguments"), 300)))
    spec = next((t.get("function", {}) for t in tools if t.get("function", {}).get("name") == name), None)
    if spec is None:
        raise CheckFailed("tool_call: called %s, which is not among the offered tools" % shown)
    errors = validate_schema(args, spec.get("parameters") or {})
    if errors:
        raise CheckFailed("tool_call: arguments of %s do not validate: %s" % (shown, "; ".join(errors[:5])))
    return {"function": name, "arguments": args, "latency_ms": ms}


def _stream_request(check, model):
    chat = check.get("endpoint") == "chat"
    body = _gen_body(check, model)
    body["stream"] = True
    if chat:
        body["messages"] = _messages(check)
        return "/v1/chat/completions", body, chat
    body["prompt"] = check.get("prompt") or "Hello"
    return "/v1/completions", body, chat


def _sse_events(resp, timeout):
    """Yield decoded `data:` payloads of the ``_http.Stream`` ``resp``; raise CheckFailed when its deadline
    (``timeout`` seconds for the whole stream) passes first, or when it breaks off or sends a line that is too
    long."""
    while True:
        try:
            line = resp.readline()
        except _http.HttpError as e:
            if e.timed_out:
                raise CheckFailed("stream: no [DONE] within stream_timeout (%g s, a deadline for the whole stream): "
                                  "a teardown hang, or a server that trickles its events" % timeout)
            raise CheckFailed("stream: %s" % e.reason)
        if not line:
            return
        line = line.decode("utf-8", "replace").strip()
        if line.startswith("data:"):
            yield line[5:].strip()


def _delta_text(event, chat):
    try:
        doc = loads_json(event, "stream: an event")
    except UntrustedInput as e:
        raise CheckFailed("%s: %s" % (e, excerpt(event, 200)))
    if not isinstance(doc, dict):
        raise CheckFailed("stream: an event is not a JSON object: %s" % excerpt(event, 200))
    if "error" in doc:
        raise CheckFailed("stream: the server sent an error event: %s" % excerpt(json.dumps(doc["error"]), 300))
    ch = (doc.get("choices") or [{}])[0]
    if chat:
        d = ch.get("delta") or {}
        return d.get("content") or ""
    return ch.get("text") or ""


def _check_stream(http, check, model, warnings):
    path, body, chat = _stream_request(check, model)
    timeout = float(check.get("stream_timeout") or 60)
    t0 = time.monotonic()
    resp = http.open_stream(path, body, timeout, _check_headers(check, model))
    parts, ttft, chunks, done = [], None, 0, False
    try:
        for ev in _sse_events(resp, timeout):
            if ev == "[DONE]":
                done = True
                break
            text = _delta_text(ev, chat)
            chunks += 1
            if text and ttft is None:
                ttft = time.monotonic() - t0
            parts.append(text)
    finally:
        resp.close()
    if not done:
        raise CheckFailed("stream: the connection closed without [DONE] after %d chunks" % chunks)
    text = "".join(parts)
    _match(check, text)
    return {"text": text, "chunks": chunks, "ttft_ms": round((ttft or 0) * 1000, 1),
            "total_ms": round((time.monotonic() - t0) * 1000, 1)}


def _check_cancel(http, check, model, warnings):
    path, body, chat = _stream_request(check, model)
    body["max_tokens"] = int(check.get("max_tokens") or 64)
    t0 = time.monotonic()
    timeout = float(check.get("stream_timeout") or 60)
    resp = http.open_stream(path, body, timeout, _check_headers(check, model))
    try:
        first = None
        for ev in _sse_events(resp, timeout):
            first = ev
            break
    finally:
        resp.close()  # drop the client connection mid-stream
    if first is None:
        raise CheckFailed("cancel: the stream ended before a first chunk")

    def healthy():
        status, dummy, dummy2 = http.request("GET", "/health", timeout=5)
        if status != 200:
            raise Transient("HTTP %d" % status)

    try:
        retry(healthy, time.monotonic() + float(check.get("recover_timeout") or 10), 0.5)
    except Expired as e:
        raise CheckFailed("cancel: /health did not answer 200 after the client dropped a stream (%s)" % e.last)
    return {"first_chunk_ms": round((time.monotonic() - t0) * 1000, 1), "health_after_cancel": 200}


def _route_headers(headers):
    return dict((k, v) for k, v in headers.items()
                if k in ("target-pod", "target-pod-ip", "prefill-target-pod", "prefill-target-pod-ip",
                         "routing-strategy", "request-id", "x-went-into-req-headers"))


def route_strategy(check, headers):
    """The routing strategy AIBrix applies to a route check's request: its ``routing-strategy`` header (the
    check's own, then the probe's), else the check's ``routing_strategy`` (the pods' profile or the gateway's
    ``ROUTING_ALGORITHM``); None when no strategy picks a pod."""
    for source in (check.get("headers") or {}, headers or {}):
        for k, v in source.items():
            if str(k).lower() == "routing-strategy" and str(v).strip():
                return str(v).strip()
    return check.get("routing_strategy") or None


def expected_route_headers(strategy):
    """The response headers AIBrix v0.7.0 sets on a request its gateway plugin processed under ``strategy``
    (``gateway_rsp_headers.go``: ``target-pod``/``target-pod-ip``/``routing-strategy`` only when a strategy
    picked a pod; ``pd_disaggregation.go``: the prefill pod's too)."""
    expected = list(PLUGIN_HEADERS)
    if strategy:
        expected += list(ROUTED_HEADERS)
    if strategy == "pd":
        expected += list(PD_HEADERS)
    return expected


def _check_route(http, check, model, warnings):
    body = _gen_body(check, model)
    body["prompt"] = check.get("prompt") or "Hello"
    extra = dict((str(k), str(v)) for k, v in (check.get("headers") or {}).items())
    status, headers, text = http.request("POST", "/v1/completions", body, headers=extra)
    _fail_on_status(status, text, "/v1/completions", model)
    strategy = route_strategy(check, http.headers)
    wanted = [check["header"].lower()] if check.get("header") else expected_route_headers(strategy)
    missing = [h for h in wanted if h not in headers]
    if missing:
        why = ("routing strategy %r" % strategy) if strategy else "no routing strategy"
        raise CheckFailed("route: the answer lacks %s (got %s); under %s AIBrix v0.7.0's gateway plugin sets %s, so "
                          "the request did not go through it (a model header sends it straight to <model>-router)"
                          % (", ".join(missing), sorted(headers), why, ", ".join(wanted)), headers=_route_headers(headers))
    header = wanted[-1] if not check.get("header") else wanted[0]
    if strategy and not check.get("header") and headers.get("routing-strategy") != strategy:
        raise CheckFailed("route: the gateway routed with %s, not %r" % (excerpt(headers.get("routing-strategy"), 80), strategy),
                          headers=_route_headers(headers))
    if check.get("expect_regex") and not re.search(check["expect_regex"], headers[header]):
        raise CheckFailed("route: %s=%s does not match /%s/" % (header, excerpt(headers[header], 120), check["expect_regex"]))
    return {"header": header, "value": headers[header], "headers": _route_headers(headers), "strategy": strategy}


CHECKS = {
    "health": _check_health, "models": _check_models, "completion": _check_completion, "chat": _check_chat,
    "json_schema": _check_json_schema, "tool_call": _check_tool_call, "stream": _check_stream,
    "cancel": _check_cancel, "route": _check_route,
}
#: The timeline stage (``_timeline.STAGES``) a passing check of each type reaches.
MILESTONE = {"health": "health_ok", "models": "model_listed", "completion": "first_correct_response",
             "chat": "first_correct_response"}


def validate_checks(checks, target="engine"):
    """Raise ValueError naming the bad entry before anything is sent."""
    if target not in TARGETS:
        raise ValueError("target: must be one of %s (got %r)" % (", ".join(TARGETS), target))
    for i, c in enumerate(checks):
        if not isinstance(c, dict) or c.get("type") not in CHECK_TYPES:
            raise ValueError("checks[%d]: 'type' must be one of %s (got %r)"
                             % (i, ", ".join(CHECK_TYPES), c.get("type") if isinstance(c, dict) else c))
        if target == "aibrix_gateway" and (c["type"] in ("health", "cancel")):
            raise ValueError(
                "checks[%d]: a %s check GETs /health, and AIBrix v0.7.0's gateway has no /health route (Envoy "
                "answers 404 to an unmatched path); check /health against the engine's Service or pod (a probe with "
                "target=engine) and keep models, chat and route checks for the gateway" % (i, c["type"]))
        if c.get("headers") is not None and not isinstance(c.get("headers"), dict):
            raise ValueError("checks[%d].headers: must be a dict of request headers" % i)
        if c.get("expect_regex"):
            try:
                re.compile(c["expect_regex"])
            except re.error as e:
                raise ValueError("checks[%d].expect_regex: invalid regular expression: %s" % (i, e))
        if c["type"] == "json_schema" and not isinstance(c.get("schema"), dict):
            raise ValueError("checks[%d]: a json_schema check needs 'schema' (a dict)" % i)
        if c["type"] == "tool_call" and not c.get("tools"):
            raise ValueError("checks[%d]: a tool_call check needs 'tools'" % i)


def run(base_url, model, checks, headers=None, deadline=600, interval=2.0, timeout=60.0, since=None,
        process_exited=None, target="engine"):
    """Run checks in order. Returns (ok, results, timeline, warnings, msg).

    ``process_exited`` is a callable returning a message when the engine process is known dead. ``target``
    ``aibrix_gateway``: 404 is an answer, not a route settling (AIBrix has no route for the path).
    """
    gateway_transient = tuple(s for s in TRANSIENT_STATUS if s != 404)
    end = time.monotonic() + deadline
    # deadline 0 tries each check once: its requests have their own timeout, there is nothing left to cut them to
    http = Http(base_url, headers, timeout, gateway_transient if target == "aibrix_gateway" else TRANSIENT_STATUS,
                end=end if deadline > 0 else None)
    took = _clock.Stopwatch()  # probe_seconds: a duration, on the monotonic clock
    start_wall = time.time()
    origin = since if since is not None else start_wall
    marks = _timeline.Recorder()
    warnings = []
    results = []

    def attempt(fn, check):
        if "port_open" not in marks and port_open(base_url, timeout=max(0.05, min(2.0, end - time.monotonic()))):
            marks.mark("port_open")
        return fn(http, check, model, warnings)

    for i, check in enumerate(checks):
        name = check.get("name") or "%s-%d" % (check["type"], i)
        fn = CHECKS[check["type"]]
        t0 = time.monotonic()
        try:
            out, attempts = retry(lambda fn=fn, c=dict(check, name=name): attempt(fn, c), end, interval,
                                  process_exited)
        except Exited as e:
            results.append(dict(name=name, type=check["type"], ok=False, attempts=e.attempts, error=e.msg))
            return False, results, _timeline.relative(marks.marks, origin), warnings, "%s: %s" % (name, e.msg)
        except Expired as e:
            results.append(dict(name=name, type=check["type"], ok=False, attempts=e.attempts, error=e.last))
            return (False, results, _timeline.relative(marks.marks, origin), warnings,
                    "%s: still failing when the deadline (%ss) passed: %s" % (name, deadline, e.last))
        except CheckFailed as e:
            res = dict(name=name, type=check["type"], ok=False, attempts=e.attempts, error=str(e))
            res.update(e.details)
            results.append(res)
            return False, results, _timeline.relative(marks.marks, origin), warnings, "%s: %s" % (name, e)
        res = dict(name=name, type=check["type"], ok=True, attempts=attempts, seconds=round(time.monotonic() - t0, 3))
        res.update(out)
        results.append(res)
        if check["type"] in MILESTONE:
            marks.mark("port_open")
            marks.mark(MILESTONE[check["type"]])
    timeline = _timeline.relative(marks.marks, origin)
    timeline["probe_seconds"] = round(took.elapsed(), 3)
    return True, results, timeline, warnings, "all %d checks passed" % len(results)
