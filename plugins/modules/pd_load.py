#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: pd_load
short_description: Send a fixed greedy load through a prefill/decode router and compare it with a colocated engine
version_added: "0.1.0"
description:
  - Sends each of O(prompts) O(repeat) times to C(<url>/v1/completions) at temperature 0 with O(max_tokens).
  - With O(reference_url) it asks that engine (a colocated one serving the same model) each prompt once and
    reports, per request, whether the P/D answer is the same text.
  - Records the route headers the router returns (C(prefill-target-pod-ip), C(target-pod-ip), ...), the
    latency of each request, and writes progress (requests done, rate, ETA) to stderr.
  - Fails only when a request fails (HTTP error or an answer without text); mismatches are reported in
    RV(all_match) and RV(mismatches) so the caller can write its evidence before failing.
options:
  url:
    description:
      - Base URL of the P/D router (the AIBrix gateway or the collection's P/D proxy).
      - Credentials in the URL (C(user:password@)) are refused here and in O(reference_url); send them as an
        C(Authorization) header in O(headers), which is C(no_log).
    type: str
    required: true
  model:
    description: Served model name sent as the request's C(model).
    type: str
    required: true
  prompts:
    description: Prompts of the load.
    type: list
    elements: str
    required: true
  max_tokens:
    description: Tokens to generate per request.
    type: int
    default: 16
  repeat:
    description: How many times the whole prompt list is sent.
    type: int
    default: 1
  reference_url:
    description: Base URL of a colocated engine whose greedy answers the P/D answers must equal.
    type: str
  headers:
    description: Extra request headers, for example C(routing-strategy=pd) for the AIBrix gateway.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds each request's whole answer may take, a deadline for the answer rather than for each read (a router
        that trickles its answer cannot stretch it); an answer over 8 MiB is refused while it is read.
    type: float
    default: 120.0
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: none
    details: Sending the load is the point; the task is skipped in check mode.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Fixed load through the AIBrix gateway with the pd strategy
  llmops.serving.pd_load:
    url: http://aibrix-gateway.example
    model: glm-5.2-fp8
    headers:
      routing-strategy: pd
    prompts: ["Explain KV cache transfer in one sentence."]
    repeat: 16
    max_tokens: 64
  register: load
"""

RETURN = r"""
requests:
  description: One entry per request with C(prompt), C(round), C(text), C(seconds), C(route) and, when
    compared, C(reference) and C(match).
  returned: always
  type: list
  elements: dict
completed:
  description: Requests answered.
  returned: always
  type: int
elapsed_s:
  description: Seconds for the whole load.
  returned: always
  type: float
request_rate:
  description: Requests per second.
  returned: always
  type: float
p50_s:
  description: Median request latency in seconds.
  returned: always
  type: float
max_s:
  description: Slowest request in seconds.
  returned: always
  type: float
compared:
  description: Whether O(reference_url) was used.
  returned: always
  type: bool
all_match:
  description: Every P/D answer equals the colocated answer (null when not compared).
  returned: always
  type: bool
mismatches:
  description: Number of P/D answers that differ from the colocated one.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.transport import _pd_load


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            prompts=dict(type="list", elements="str", required=True),
            max_tokens=dict(type="int", default=16, no_log=False),
            repeat=dict(type="int", default=1),
            reference_url=dict(type="str"),
            headers=dict(type="dict", default={}, no_log=True),
            timeout=dict(type="float", default=120.0),
        ),
        supports_check_mode=False,
    )
    _http.refuse_url_credentials(module, dict.fromkeys(
        ("url", "reference_url"), "send them as an Authorization header in headers (no_log)"))
    p = module.params
    if not p["prompts"]:
        module.fail_json(msg="prompts: at least one prompt is needed")
    for opt in ("max_tokens", "repeat"):
        if p[opt] < 1:
            module.fail_json(msg="%s: must be >= 1 (got %d)" % (opt, p[opt]))
    for opt in ("url", "reference_url"):
        if p[opt] and not p[opt].startswith(("http://", "https://")):
            module.fail_json(msg="%s: %r is not an http(s):// URL" % (opt, p[opt]))
    try:
        result = _pd_load.run(p["url"], p["model"], p["prompts"], max_tokens=p["max_tokens"],
                              repeat=p["repeat"], reference_url=p["reference_url"],
                              headers={str(k): str(v) for k, v in p["headers"].items()}, timeout=p["timeout"])
    except _pd_load.LoadError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
