#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_process
short_description: Run an inference engine as a supervised background process with its real exit status
version_added: "0.1.0"
description:
  - Starts O(command) under a small supervisor that records the process id, appends stdout/stderr to a log
    file and writes the process's real exit status (or signal) when it ends, so a crash is never reported
    as success.
  - Idempotent, the process is left alone when it is running with the same command, environment and
    working directory; it is restarted when any of them changed.
  - Fails with the exit status and the log tail when the process dies within O(startup_grace) seconds.
options:
  name:
    description: Process name; also the directory under O(run_dir) that holds its state and log.
    type: str
    required: true
  run_dir:
    description: Directory for the supervisor state, the spec and the log.
    type: path
    required: true
  state:
    description:
      - V(started) starts the process unless it is already running with the same spec.
      - V(restarted) always stops and starts it.
      - V(stopped) stops it (SIGTERM to its process group, SIGKILL after O(stop_timeout)).
      - V(status) only reports.
    type: str
    choices: [started, restarted, stopped, status]
    default: started
  command:
    description: Command and arguments (no shell). Required for O(state=started) and O(state=restarted).
    type: list
    elements: str
  env:
    description: Extra environment variables for the process. Values are never returned.
    type: dict
    default: {}
  chdir:
    description: Working directory of the process.
    type: path
  stop_timeout:
    description: Seconds between SIGTERM and SIGKILL when stopping.
    type: int
    default: 60
  startup_grace:
    description: Seconds to watch a newly started process for an immediate exit.
    type: float
    default: 3.0
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reports whether it would start, restart or stop without doing it.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in diff mode).
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Start vLLM on the staged model
  llmops.serving.engine_process:
    name: vllm
    run_dir: /var/tmp/llmops/run
    command:
      - /opt/vllm/bin/python
      - -m
      - vllm.entrypoints.openai.api_server
      - --model
      - /mnt/nvme/models/tiny-llama/8f94f6f0fade
      - --port
      - "8000"
    env:
      VLLM_CPU_KVCACHE_SPACE: "1"

- name: Stop it
  llmops.serving.engine_process:
    name: vllm
    run_dir: /var/tmp/llmops/run
    state: stopped
"""

RETURN = r"""
state:
  description: V(running), V(exited), V(lost) (supervisor killed) or V(absent).
  returned: always
  type: str
pid:
  description: Process id of the engine (the supervisor's direct child).
  returned: when running
  type: int
started_at:
  description: Epoch seconds when the current process was started.
  returned: when running
  type: float
log_file:
  description: Path of the process log.
  returned: always
  type: str
state_file:
  description: Path of the supervisor's state file (C(engine_probe) reads it to stop waiting on a dead process).
  returned: always
  type: str
spec_hash:
  description: Hash of command, environment and working directory of the running process.
  returned: when running
  type: str
returncode:
  description: Exit status of the process that ended (negative for a signal), or null.
  returned: when it ended
  type: int
previous:
  description: The state found before this run (for example the exit status of a process that crashed).
  returned: always
  type: dict
log_tail:
  description: Last lines of the log when the process failed to start.
  returned: on failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils import _process


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            run_dir=dict(type="path", required=True),
            state=dict(type="str", default="started", choices=["started", "restarted", "stopped", "status"]),
            command=dict(type="list", elements="str"),
            env=dict(type="dict", default={}),
            chdir=dict(type="path"),
            stop_timeout=dict(type="int", default=60),
            startup_grace=dict(type="float", default=3.0),
        ),
        required_if=[("state", "started", ["command"]), ("state", "restarted", ["command"])],
        supports_check_mode=True,
    )
    p = module.params
    env = {str(k): str(v) for k, v in (p["env"] or {}).items()}
    files = _process.paths(p["run_dir"], p["name"])
    before = _process.read_state(p["run_dir"], p["name"])
    result = dict(changed=False, previous=before, log_file=files["log"], state_file=files["state"])
    wanted = _process.spec_hash(p["command"], env, p["chdir"]) if p["command"] else None
    running = before["state"] == "running"

    if p["state"] == "status":
        module.exit_json(**dict(result, **before))

    if p["state"] == "stopped":
        if running:
            result["changed"] = True
            if not module.check_mode:
                before = _process.stop(p["run_dir"], p["name"], timeout=p["stop_timeout"])[0]
        module.exit_json(**dict(result, **before))

    need_start = p["state"] == "restarted" or not running or before.get("spec_hash") != wanted
    if not need_start:
        module.exit_json(**dict(result, **before))
    result["changed"] = True
    if module.check_mode:
        module.exit_json(**dict(result, state="running" if not running else before["state"]))
    if running:
        _process.stop(p["run_dir"], p["name"], timeout=p["stop_timeout"])
    try:
        st = _process.start(p["run_dir"], p["name"], p["command"], env=env, chdir=p["chdir"],
                            stop_timeout=p["stop_timeout"], startup_grace=p["startup_grace"])
    except _process.ProcessError as e:
        module.fail_json(msg=str(e), **dict(result, **e.details))
    module.exit_json(**dict(result, **st))


if __name__ == "__main__":
    main()
