#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_report
short_description: Build a serving benchmark's report (JSON, Markdown, PNG) from its saved rounds
version_added: "0.1.0"
description:
  - Reads the plan and the rounds saved in O(out_dir) (by M(llmops.serving.benchmark_round)), groups the measured
    rounds into cells (one per target x concurrency x length pair; warm-up rounds are left out), computes per
    cell the pooled p95, the mean of the per-round p95s, a bootstrap 95 % interval and the unstable flag, and with
    two targets the A/B difference per metric with its interval and a verdict (C(differs) or C(cannot tell)).
  - Writes C(<out_dir>/report.json) (versioned schema), C(report.md) (with a "what this does not prove" section
    generated from the data) and the PNG plots beside them. A run that stopped early (C(stopped.json)) is
    reported as such, with the rounds done so far.
  - With O(coldstart_file) (written by the cold-start mode) the report holds the engine start timelines
    instead of, or beside, the serving cells.
requirements:
  - matplotlib, for the PNG plots; without it the report is written without plots and says so in its caveats
    (install it on the benchmark client host, where the report is written; the collection's meta/host-requirements.txt lists it)
options:
  out_dir:
    description: The benchmark directory (C(plan.json), C(rounds/)); the report is written there.
    type: path
    required: true
  unstable_threshold:
    description: A cell is unstable when its rounds' p95s spread more than this fraction of their mean.
    type: float
    default: 0.2
  n_boot:
    description: Bootstrap resamples for the intervals.
    type: int
    default: 2000
  rng_seed:
    description: Seed of the bootstrap (one input and one seed give one report).
    type: int
    default: 0
  coldstart_file:
    description: JSON file of cold-start measurements (C({states:[{state, reps:[{phases, total_s, marks}]}]})).
    type: path
  meta:
    description: Extra facts recorded in the report (for example the command and the machine).
    type: dict
    default: {}
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: partial
    details: Builds the report and returns its summary without writing files.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Write report.json, report.md and the plots
  llmops.serving.benchmark_report:
    out_dir: /var/tmp/llmops/bench
    meta:
      command: ansible-playbook -i inventories/fleet playbooks/benchmark.yml
  register: report
"""

RETURN = r"""
report_file:
  description: C(<out_dir>/report.json).
  returned: always
  type: str
files:
  description: Every file written (JSON, Markdown, PNGs).
  returned: always
  type: list
  elements: str
cells:
  description: Number of cells in the report.
  returned: always
  type: int
unstable_cells:
  description: Cells flagged unstable.
  returned: always
  type: int
failed_requests:
  description: Failed requests over every measured round (counted, never dropped).
  returned: always
  type: int
stopped:
  description: Where the run stopped early, or null.
  returned: always
  type: dict
caveats:
  description: The report's "what this does not prove" lines.
  returned: always
  type: list
  elements: str
comparisons:
  description: The A/B lines (C(metric), C(concurrency), C(delta_ms), C(delta_ci95), C(verdict)), when two targets.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_assemble, _bench_inputs, _bench_render


def main():
    module = AnsibleModule(
        argument_spec=dict(
            out_dir=dict(type="path", required=True),
            unstable_threshold=dict(type="float", default=0.2),
            n_boot=dict(type="int", default=2000),
            rng_seed=dict(type="int", default=0),
            coldstart_file=dict(type="path"),
            meta=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        report = _bench_assemble.build_report(p["out_dir"], p["meta"], unstable_threshold=p["unstable_threshold"],
                                              n_boot=p["n_boot"], rng_seed=p["rng_seed"],
                                              coldstart_file=p["coldstart_file"])
        files = [] if module.check_mode else _bench_render.write(report, p["out_dir"])
    except _bench_inputs.BenchError as e:
        module.fail_json(**_bench_inputs.failure(e))
    except ValueError as e:
        module.fail_json(msg="cannot build the report from %s: %s" % (p["out_dir"], e))
    if any(c.get("code") == _bench_render.NO_PLOTS[0] for c in report.get("caveats") or []):
        module.warn("the report has no plots: matplotlib is not installed on the host that runs benchmark_report "
                    "(pip install matplotlib); report.md says so in its caveats")
    cells = report.get("cells") or []
    keys = ("metric", "concurrency", "input_len", "output_len", "target_a", "target_b", "a", "b", "delta_ms",
            "delta_ci95", "verdict")
    comps = [dict((k, c.get(k)) for k in keys) for c in report.get("comparisons") or []]
    module.exit_json(changed=bool(files), report_file="%s/report.json" % p["out_dir"].rstrip("/"),
                     files=sorted(files or []), cells=len(cells),
                     unstable_cells=sum(1 for c in cells if c.get("unstable")),
                     failed_requests=sum(int(c.get("failed") or 0) for c in cells),
                     stopped=report.get("stopped"), caveats=[c["text"] for c in report.get("caveats") or []],
                     comparisons=comps)


if __name__ == "__main__":
    main()
