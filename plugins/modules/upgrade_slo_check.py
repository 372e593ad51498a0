#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade_slo_check
short_description: Check the upgrade's SLO gate, and judge B's benchmark round against A's on the same prompts
version_added: "0.1.0"
description:
  - Without O(a_dir) and O(b_dir) it checks O(slo) (the role variable C(upgrade_slo)) and returns it completed
    with the defaults (RV(settings)); an unknown key or a bad value fails, naming C(upgrade_slo.<key>) and the fix,
    before anything changes. An empty O(slo) is the gate off (RV(enabled) false).
  - With O(a_dir) and O(b_dir), each the run directory of one side's round (written by
    M(llmops.serving.benchmark_plan) and M(llmops.serving.benchmark_round) from RV(settings), one target, one
    fixed-rate measured round), it reads both measured rounds and judges B against A. The limits are the B/A
    ratios of p95 TTFT and p95 TPOT (at most), of the client's goodput (at least; only with a goodput SLO),
    absolute p95s on B, and B's failed requests.
  - Refuses to compare (RV(verdict) C(refused)) rounds that are not one measurement - their prompts' token-ID
    digests differ or one is missing, or their rate, lengths, seed or size differ - and a baseline A with more
    failed requests than C(max_failed_requests). Failed requests are counted honestly - a sample that failed,
    the round's own count, and a planned request the client left no result of.
  - The module does not fail for a breach or a refusal; RV(passed) says whether B met every limit and RV(msg)
    names each limit that does not hold, with B's and A's figures and the limit. A round that could not be
    measured (the target stopped answering, the client failed) or a run directory that cannot be read fails.
options:
  slo:
    description:
      - The SLO gate, C(upgrade_slo) of the C(llmops.serving.upgrade) role - C(requests), C(rate), C(prompt_tokens),
        C(max_tokens), C(seed), C(warmup), C(timeout), C(ttft_p95_ratio), C(tpot_p95_ratio), C(ttft_p95_ms),
        C(tpot_p95_ms), C(goodput), C(goodput_min_ratio), C(max_failed_requests). See the role's defaults for what
        each means and its default.
    type: dict
    default: {}
  a_dir:
    description: The run directory of A's round (its C(plan.json) and C(rounds/)). Give it with O(b_dir).
    type: path
  b_dir:
    description: The run directory of B's round, run from the same settings. Give it with O(a_dir).
    type: path
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Check upgrade_slo before anything changes
  llmops.serving.upgrade_slo_check:
    slo: "{{ upgrade_slo }}"
  register: upgrade_slo_checked

- name: Judge B's round against A's
  llmops.serving.upgrade_slo_check:
    slo: "{{ upgrade_slo }}"
    a_dir: /var/tmp/llmops/upgrade-slo/tiny-llama/rev-b/a
    b_dir: /var/tmp/llmops/upgrade-slo/tiny-llama/rev-b/b
  register: upgrade_slo_verdict

- name: Fail naming the limit B breached
  ansible.builtin.fail:
    msg: "{{ upgrade_slo_verdict.msg }}"
  when: not upgrade_slo_verdict.passed
"""

RETURN = r"""
enabled:
  description: Whether O(slo) turns the gate on (any key given).
  returned: always
  type: bool
settings:
  description: O(slo) completed with the defaults (empty when the gate is off).
  returned: always
  type: dict
  sample: {requests: 32, rate: 2.0, prompt_tokens: 256, max_tokens: 128, seed: 1, warmup: 1, timeout: 600.0,
           ttft_p95_ratio: 1.5, tpot_p95_ratio: 1.25, ttft_p95_ms: null, tpot_p95_ms: null, goodput: [],
           goodput_min_ratio: 0.9, max_failed_requests: 0}
round:
  description: The round in words (empty when the gate is off).
  returned: always
  type: str
passed:
  description: B met every limit (null without O(a_dir) and O(b_dir)).
  returned: always
  type: bool
verdict:
  description: C(pass), C(breach), C(refused) (the rounds cannot be compared), or null without the run directories.
  returned: always
  type: str
reason:
  description: C(slo_breach), C(rounds_differ), C(no_prompt_digest), C(prompts_differ), C(baseline_failed), or null.
  returned: always
  type: str
limits:
  description: One per limit judged - C(name) (C(upgrade_slo.<key>)), C(key), C(limit), C(a) and C(b) (the
    figures compared), C(measured) (the ratio, or B's figure), C(unit), C(passed), C(msg).
  returned: when judged
  type: list
  elements: dict
breached:
  description: The keys of the limits that did not hold.
  returned: when judged
  type: list
  elements: str
a:
  description: A's figures - C(requests), C(completed), C(failed), C(unsampled), C(p50_ttft_ms), C(p95_ttft_ms),
    C(p50_tpot_ms), C(p95_tpot_ms), C(goodput), C(duration_s), C(digest), C(first_error).
  returned: when judged
  type: dict
b:
  description: B's figures, as RV(a).
  returned: when judged
  type: dict
line:
  description: The comparison in one line.
  returned: when judged
  type: str
msg:
  description: The settings in words; after judging, each breached limit (B's figure, A's, the limit) or why the
    rounds cannot be compared, or that B met every limit.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs, _bench_slo, _bench_slo_judge


def main():
    module = AnsibleModule(
        argument_spec=dict(
            slo=dict(type="dict", default={}),
            a_dir=dict(type="path"),
            b_dir=dict(type="path"),
        ),
        required_together=[("a_dir", "b_dir")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        settings = _bench_slo.check_settings(p["slo"])
    except _bench_inputs.BenchError as e:
        module.fail_json(option=e.field, **_bench_inputs.failure(e))
    out = {"changed": False, "enabled": bool(settings), "settings": settings, "passed": None, "verdict": None,
           "reason": None,
           "round": _bench_slo.round_line(settings) if settings else ""}
    if p["a_dir"] is None:
        module.exit_json(msg="SLO gate: %s" % (out["round"] or "off (upgrade_slo is empty)"), **out)
    if not settings:
        module.fail_json(msg="slo: empty, so there is no limit to judge A's and B's rounds by; give upgrade_slo",
                         reason="bad_input", option="slo")
    sides = {}
    try:
        for side, key in (("A", "a_dir"), ("B", "b_dir")):
            rec, problem = _bench_slo_judge.read_side(p[key], side)
            if problem:
                failure = dict(out)
                failure.update(msg="upgrade_slo: %s" % problem, reason="round_not_measured", option=key)
                module.fail_json(**failure)
            sides[side] = rec
        verdict = _bench_slo_judge.judge(sides["A"], sides["B"], settings)
    except _bench_inputs.BenchError as e:
        module.fail_json(**dict(out, **_bench_inputs.failure(e)))
    except ValueError as e:
        failure = dict(out)
        failure.update(msg="upgrade_slo: a round cannot be judged: %s" % e, reason="bad_file")
        module.fail_json(**failure)
    out.update(verdict)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
