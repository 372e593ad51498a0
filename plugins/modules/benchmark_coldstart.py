#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_coldstart
short_description: Prepare and record one engine cold start for the benchmark report
version_added: "0.1.0"
description:
  - O(action=prepare) gets the host ready for a start in O(state) - C(shared_fs) (weights read from the shared
    filesystem), C(nvme) (the staged copy) or C(nvme_kernel_cache) (the staged copy with the restored kernel
    cache) - by dropping O(model_path)'s files from the page cache (C(posix_fadvise DONTNEED) on each file; nothing
    else on the host is touched) and, for the two cold states, creating an empty compile-cache directory under
    O(work_dir) and returning the environment (RV(env)) that points every compile cache of the engine there.
  - O(action=record) joins the start's relative O(timeline) (engine_probe's C(timeline)) with the phases vLLM logged
    for that start in O(log_file) (weight load, engine init, compilation) and adds it to O(coldstart_file), the
    C(coldstart) input of M(llmops.serving.benchmark_report).
options:
  action:
    description: What to do.
    type: str
    choices: [prepare, record]
    required: true
  state:
    description: The cold-start state.
    type: str
    choices: [shared_fs, nvme, nvme_kernel_cache]
    required: true
  model_path:
    description: The revision directory the engine loads in this state (O(action=prepare)).
    type: path
  work_dir:
    description: Where the empty compile caches of the cold states are created (O(action=prepare)).
    type: path
  coldstart_file:
    description: The JSON file the starts are recorded in (O(action=record)).
    type: path
  rep:
    description: The repetition number of this start (O(action=record)).
    type: int
    default: 1
  timeline:
    description: engine_probe's relative C(timeline) of this start (O(action=record)).
    type: dict
  log_file:
    description: The engine's log; the part after its last start banner is parsed (O(action=record)).
    type: path
  started_at:
    description: Epoch seconds of the process start, recorded as is.
    type: float
  details:
    description: Extra facts recorded with the start (model path, cache directory).
    type: dict
    default: {}
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: none
    details: Evicting pages and recording starts only make sense in a real run.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Prepare a start with weights from the shared filesystem and empty compile caches
  llmops.serving.benchmark_coldstart:
    action: prepare
    state: shared_fs
    model_path: /mnt/shared/models/glm/rev1
    work_dir: /var/tmp/llmops/coldstart
  register: prep

- name: Record it
  llmops.serving.benchmark_coldstart:
    action: record
    state: shared_fs
    rep: 1
    timeline: "{{ engine_probe_result.timeline }}"
    log_file: "{{ engine_log_file }}"
    coldstart_file: /var/tmp/llmops/coldstart/coldstart.json
"""

RETURN = r"""
env:
  description: Environment for the engine (O(action=prepare)); empty for C(nvme_kernel_cache).
  returned: always
  type: dict
cache_dir:
  description: The empty compile-cache directory of a cold state, or null.
  returned: always
  type: str
evicted_bytes:
  description: Bytes of O(model_path) dropped from the page cache.
  returned: always
  type: int
entry:
  description: The start as recorded (C(phases), C(total_s), C(marks), C(log)) (O(action=record)).
  returned: always
  type: dict
msg:
  description: What was done, in one line; the bytes evicted and the empty compile caches (O(action=prepare)), or
    the time to the first correct answer with its phases (O(action=record)).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_coldstart, _bench_inputs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", choices=["prepare", "record"], required=True),
            state=dict(type="str", choices=list(_bench_coldstart.STATES), required=True),
            model_path=dict(type="path"),
            work_dir=dict(type="path"),
            coldstart_file=dict(type="path"),
            rep=dict(type="int", default=1),
            timeline=dict(type="dict"),
            log_file=dict(type="path"),
            started_at=dict(type="float"),
            details=dict(type="dict", default={}),
        ),
        required_if=[("action", "prepare", ("model_path", "work_dir")),
                     ("action", "record", ("coldstart_file", "timeline", "log_file"))],
        supports_check_mode=False,
    )
    p = module.params
    try:
        if p["action"] == "prepare":
            out = _bench_coldstart.prepare(p["state"], p["model_path"], p["work_dir"])
            module.exit_json(changed=True, entry=None, msg="%s: evicted %d bytes of %s from the page cache%s"
                             % (p["state"], out["evicted_bytes"], p["model_path"],
                                "; empty compile caches in %s" % out["cache_dir"] if out["cache_dir"] else
                                "; the restored kernel cache applies"), **out)
        entry = _bench_coldstart.record(p["coldstart_file"], p["state"], p["rep"], p["timeline"], p["log_file"],
                                        started_at=p["started_at"], extra={"details": p["details"]})
    except _bench_coldstart.ColdstartError as e:
        module.fail_json(**_bench_inputs.failure(e))
    shown = ", ".join("%s %.1fs" % (k, v) for k, v in entry["phases"].items() if v is not None)
    msg = "%s #%d: first correct answer after %.1fs (%s)" % (p["state"], p["rep"], entry["total_s"], shown)
    module.exit_json(changed=True, entry=entry, env={}, cache_dir=None, evicted_bytes=0, msg=msg)


if __name__ == "__main__":
    main()
