#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_probe
short_description: Prove an OpenAI-compatible engine or gateway serves correct answers
version_added: "0.1.0"
description:
  - Runs a list of checks in order against O(base_url), retrying transient failures (connection refused,
    timeouts, HTTP 502/503/504, a 404 while a route settles) until O(deadline) seconds have passed.
  - A wrong answer, an unknown model, or an engine process that exited (see O(process_state_file)) fails at
    once with the reason.
  - Records a timeline (port open, /health 200, model listed, first correct response) relative to O(since).
  - Used directly against an engine and again through a gateway such as AIBrix.
requirements:
  - jsonschema, optional, for C(json_schema) checks (without it a strict subset of JSON Schema is checked)
options:
  base_url:
    description:
      - Base URL, for example C(http://127.0.0.1:8000) or the gateway's address.
      - Credentials in the URL (C(user:password@)) are refused; send them as an C(Authorization) header in
        O(headers), which is C(no_log).
    type: str
    required: true
  model:
    description: Served model name; sent as the request's C(model) and looked up in C(/v1/models).
    type: str
    required: true
  headers:
    description: Extra request headers (for example C(routing-strategy) or an authorization header).
    type: dict
    default: {}
  target:
    description:
      - What O(base_url) is. V(engine) is the engine, its Service or its pod.
      - V(aibrix_gateway) is an AIBrix v0.7.0 gateway. It has no C(/health) route, so C(health) and C(cancel) checks
        are refused before anything is sent (check C(/health) against the Service or pod), and an HTTP 404 is an
        answer (no route for the path), not a route still settling.
    type: str
    choices: [engine, aibrix_gateway]
    default: engine
  deadline:
    description:
      - Seconds to keep retrying transient failures, for all checks together.
      - No request outlives it, each one's O(timeout) is cut to the time left; V(0) tries each check once, each
        request within its O(timeout).
    type: int
    default: 600
  interval:
    description: Seconds between retries.
    type: float
    default: 2.0
  timeout:
    description:
      - Seconds each request's whole answer may take (headers and body), a deadline rather than a limit on each
        read, so a server that trickles its answer a byte at a time cannot stretch it; never past O(deadline).
      - An answer over 8 MiB is refused while it is read (a retried failure, like no answer).
    type: float
    default: 60.0
  since:
    description: Epoch seconds the timeline is measured from (for example the process start); default is the probe start.
    type: float
  process_state_file:
    description:
      - State file of a process started by M(llmops.serving.engine_process). When the process has exited the
        probe stops waiting and fails with its exit status.
    type: path
  checks:
    description:
      - Checks to run, in order. Each is a dict with C(type) and type-specific keys.
      - C(health) GET C(/health) answers 200.
      - C(models) C(/v1/models) lists O(model).
      - C(completion) and C(chat) send C(prompt) (or C(messages)) at C(temperature) 0 with C(max_tokens) and compare
        with C(expect) (exact), C(expect_regex) or C(expect_token_ids); C(reasoning=true) warns when
        C(max_tokens) is below 512 and fails when the reasoning consumed the whole budget.
      - C(json_schema) requests C(response_format) json_schema with C(schema) and validates the parsed output.
      - C(tool_call) offers C(tools) (C(tool_choice), default C(required)); the called function must exist,
        match C(expect_function) when given, and its arguments must parse and validate.
      - C(stream) reads server-sent events until C([DONE]) within C(stream_timeout) (a deadline for the whole stream,
        at most 8 MiB and lines of at most 1 MiB) and records TTFT.
      - C(cancel) drops a stream after its first chunk; C(/health) must still answer 200.
      - C(route) sends a completion without the C(model) header and requires the response headers AIBrix v0.7.0's
        gateway plugin sets for the routing in force (C(gateway_rsp_headers.go)) - C(request-id) and
        C(x-went-into-req-headers) always; C(routing-strategy), C(target-pod) and C(target-pod-ip) only when a
        routing strategy picked a pod (a C(routing-strategy) request header, or C(routing_strategy) - the strategy
        the pods' C(model.aibrix.ai/config) profile or the gateway's C(ROUTING_ALGORITHM) applies); the
        C(prefill-target-pod) pair too under C(pd). C(header) requires that one header instead; C(expect_regex)
        matches its value.
      - Optional keys for all C(name), C(body) (extra request fields), C(endpoint) (C(chat) for streams), C(seed),
        C(headers) (request headers of this check only) and C(model_header) (send C(model) = O(model), the header
        AIBrix's per-model HTTPRoute matches on).
    type: list
    elements: dict
    default: [{type: health}, {type: models}]
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
attributes:
  check_mode:
    details: Only sends requests (and reads O(process_state_file)); runs the same in check mode.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Wait for one correct greedy answer (the readiness that counts)
  llmops.serving.engine_probe:
    base_url: http://127.0.0.1:8000
    model: glm-5.2-fp8-vllm
    deadline: 3600
    checks:
      - type: health
      - type: models
      - type: chat
        prompt: "Reply with exactly FP8_OK"
        expect: FP8_OK
        max_tokens: 16

- name: The same model through the AIBrix gateway, with routing evidence
  llmops.serving.engine_probe:
    base_url: http://aibrix-gateway.example:80
    model: glm-5.2-fp8-vllm
    target: aibrix_gateway
    checks:
      - type: models
      - type: chat
        prompt: "Reply with exactly FP8_OK"
        expect: FP8_OK
        max_tokens: 16
        model_header: true
      - type: route
        routing_strategy: least-request
      - type: stream
        prompt: Count to five.
        max_tokens: 32
        stream_timeout: 60
"""

RETURN = r"""
checks:
  description: One result per check that ran, with C(ok), C(attempts), C(seconds) and type-specific fields
    (C(text), C(token_ids), C(ttft_ms), C(value) of a route header, ...).
  returned: always
  type: list
  elements: dict
timeline:
  description: Seconds from O(since) to C(port_open), C(health), C(models), C(first_correct).
  returned: always
  type: dict
  sample: {port_open: 41.2, health: 58.9, models: 59.0, first_correct: 59.3}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.engine import _probe, _process_state


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            headers=dict(type="dict", default={}, no_log=True),
            deadline=dict(type="int", default=600),
            interval=dict(type="float", default=2.0),
            timeout=dict(type="float", default=60.0),
            since=dict(type="float"),
            process_state_file=dict(type="path"),
            checks=dict(type="list", elements="dict", default=[{"type": "health"}, {"type": "models"}]),
            target=dict(type="str", choices=list(_probe.TARGETS), default="engine"),
        ),
        supports_check_mode=True,
    )
    _http.refuse_url_credentials(module, {"base_url": "send them as an Authorization header in headers (no_log)"})
    p = module.params
    try:
        _probe.validate_checks(p["checks"], p["target"])
    except ValueError as e:
        module.fail_json(msg=str(e))
    if p["deadline"] < 0:
        module.fail_json(msg="deadline: must be >= 0 seconds")

    def exited():
        if not p["process_state_file"]:
            return None
        st = _process_state.read_state_file(p["process_state_file"])
        if st["state"] in ("exited", "lost"):
            return "the engine process exited with %s" % _process_state.describe_exit(st)
        return None

    ok, results, timeline, warnings, msg = _probe.run(
        p["base_url"], p["model"], p["checks"], headers=p["headers"], deadline=p["deadline"],
        interval=p["interval"], timeout=p["timeout"], since=p["since"], process_exited=exited, target=p["target"])
    for w in warnings:
        module.warn(w)
    if not ok:
        module.fail_json(msg=msg, checks=results, timeline=timeline)
    module.exit_json(changed=False, msg=msg, checks=results, timeline=timeline)


if __name__ == "__main__":
    main()
