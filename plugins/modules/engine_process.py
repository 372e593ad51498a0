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
  - One engine per O(name). Runs that start or stop the same O(run_dir)/O(name) take turns (a lock held from
    the check to the spawn, released by the kernel if the run dies), so two concurrent V(started) start one
    engine and the second reports it.
  - The lock is the file C(<run_dir>/<name>/lock), mode 0600, in a directory of mode 0700, so no other local
    user can take it first. A O(run_dir) that belongs to another user than the one running the module (or
    root), or that group or others can write without the sticky bit, and a C(<run_dir>/<name>) or lock file of
    another user, are refused (RV(reason=not_owned)) before anything starts or stops.
  - The engine is found without its run directory. Its environment carries C(LLMOPS_ENGINE_PROCESS) (a hash of
    O(run_dir) and O(name)) and C(LLMOPS_ENGINE_SPEC) (its RV(spec_hash)), its supervisor's command line
    carries the same key, and pids are checked with their start time. When the run directory was deleted or
    the supervisor was killed, the engine is found in C(/proc) (processes of this mount namespace only), a new
    V(started) does not start a second one and V(stopped) still stops it.
  - The command must leave the engine as the foreground process. A shell wrapper (C(bash -c), C(sh -c), a
    script file or a C(#!) script, also behind C(env) or C(nohup)) must end with C(exec ENGINE ...); a pipe
    into C(tee), a background job (C(&), C(nohup ... &)), C(setsid) without C(--wait) or any command after the
    engine (C(; true), C(|| true), C(; exit 0)) is refused before anything starts, because the status recorded
    would be the wrapper's, not the engine's.
options:
  name:
    description:
      - Process name; also the directory under O(run_dir) that holds its state and log.
      - One path component of letters, digits, C(_), C(.) and C(-), not starting with C(.) or C(-) (so
        C(../x), C(/abs), C(a/b), an empty name or C(.) are refused before anything changes).
    type: str
    required: true
  run_dir:
    description: Absolute path of the directory for the supervisor state, the spec and the log.
    type: path
    required: true
  state:
    description:
      - V(started) starts the process unless it is already running with the same spec.
      - V(restarted) always stops and starts it.
      - V(stopped) stops it (SIGTERM to its process group, SIGKILL after O(stop_timeout)); when its supervisor
        was killed, the two signals go to the engine's process group directly.
      - V(status) only reports.
    type: str
    choices: [started, restarted, stopped, status]
    default: started
  command:
    description:
      - Command and arguments (no shell). Required for O(state=started) and O(state=restarted).
      - A shell wrapper is accepted only when the engine is its last command, started with C(exec) (for
        example C([bash, -lc, "source /opt/venv/bin/activate && exec vllm serve ..."])).
      - A credential written here (C(--api-key X), a token-shaped word) is masked in the result, C(spec.json) and
        the log banner, with a warning, but stays readable in the engine's C(/proc/<pid>/cmdline); prefer O(env).
    type: list
    elements: str
  env:
    description:
      - Extra environment variables for the process.
      - The values are C(no_log), so tokens such as C(HF_TOKEN) can be passed here. They never appear in the
        result (its C(invocation) shows the names with masked values), C(-vvv) output, AWX job events, the
        target's journal or error messages, and they reach the engine only through its process environment;
        no file written by this module holds them (C(spec.json) lists the names).
      - Ansible would mask every occurrence of a C(no_log) value in the whole result, so a short setting such as
        C(VLLM_CPU_KVCACHE_SPACE=1) would mask pids and times. The module never returns env values, and keeps
        that result-wide masking for credentials (a name whose last word is C(TOKEN), C(PASSWORD), C(SECRET),
        C(KEY)..., or a value shaped like a Hugging Face or AWS token), in case the engine prints them in the
        log tail.
    type: dict
    default: {}
  chdir:
    description: Working directory of the process.
    type: path
  stop_timeout:
    description:
      - Seconds between SIGTERM and SIGKILL when stopping.
      - A run waits up to O(stop_timeout) + O(startup_grace) + 60 seconds for another run on the same name.
    type: int
    default: 60
  startup_grace:
    description: Seconds to watch a newly started process for an immediate exit.
    type: float
    default: 3.0
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports whether it would start, restart or stop without doing it.
  diff_mode:
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
      HF_TOKEN: "{{ vault_hf_token }}"

- name: Start it through a login shell (the engine is exec'd, so its exit status is the one recorded)
  llmops.serving.engine_process:
    name: vllm
    run_dir: /var/tmp/llmops/run
    command:
      - bash
      - -lc
      - source /opt/vllm/bin/activate && exec vllm serve /mnt/nvme/models/tiny-llama/8f94f6f0fade --port 8000

- name: Stop it
  llmops.serving.engine_process:
    name: vllm
    run_dir: /var/tmp/llmops/run
    state: stopped
"""

RETURN = r"""
state:
  description: V(running), V(exited), V(lost) (supervisor killed, engine gone) or V(absent).
  returned: always
  type: str
pid:
  description: Process id of the engine (the supervisor's direct child, leader of its process group).
  returned: when running
  type: int
supervisor_pid:
  description: Process id of the supervisor that records the engine's exit status.
  returned: when running with its supervisor
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
  description: Hash of command, environment and working directory of the running process (values are hashed,
    never returned).
  returned: when running
  type: str
returncode:
  description: Exit status of the process that ended (negative for a signal), or null when nothing could record it
    (its supervisor was killed).
  returned: when it ended
  type: int
signal:
  description: Signal number that ended the process, as recorded by its supervisor.
  returned: when it ended
  type: int
stop_requested:
  description: The process ended after a stop request (V(stopped), V(restarted) or a changed spec).
  returned: when it ended
  type: bool
supervisor_lost:
  description: The engine runs (or ran) without its supervisor, which was killed, so its exit status is not
    recorded; V(started) leaves it running with a warning, V(restarted) puts it back under a supervisor.
  returned: when running or stopped by this module
  type: bool
recovered:
  description: The running engine was found in C(/proc) by its identity marker, not through the state file
    (the run directory was deleted or rewritten).
  returned: when running
  type: bool
stop_signal:
  description: Last signal this module sent to the engine's process group itself (15 SIGTERM, 9 SIGKILL after
    O(stop_timeout)), when its supervisor was gone.
  returned: when stopped without a supervisor
  type: int
state_file_error:
  description: Why the state file could not be used (not a regular file, over its size or nesting limit, not
    JSON, fields of the wrong type), naming the file; the engine is then found by its identity in C(/proc), so
    V(stopped) still stops it.
  returned: when the state file was refused
  type: str
previous:
  description: The state found before this run (for example the exit status of a process that crashed).
  returned: always
  type: dict
log_tail:
  description: Last lines of the log when the process failed to start.
  returned: on failure
  type: list
  elements: str
reason:
  description: Short code of a refused input (V(bad_name), V(bad_run_dir), V(bad_env),
    V(bad_command), V(masked_exit_status), V(locked), V(not_owned)).
  returned: on failure
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process, _process_command, _process_state


def _warn_state_file(module, st):
    if st.get("state_file_error"):
        module.warn("%s: %s; the engine was looked up by its identity in /proc instead. Remove the state file "
                    "(a running supervisor writes it again)" % (module.params["name"], st["state_file_error"]))


def _warn_about(module, st, files):
    if st.get("state") != "running":
        return
    if st.get("supervisor_lost"):
        module.warn("%s: the engine (pid %s) runs without its supervisor, which was killed, so its exit status "
                    "will not be recorded; state=restarted puts it back under a supervisor (restarts the engine)"
                    % (module.params["name"], st.get("pid")))
    if not os.path.exists(files["log"]) and st.get("pid"):
        module.warn("%s: the log file %s was deleted while the engine runs; its output still goes to the deleted "
                    "file, readable as /proc/%s/fd/1 until the engine stops" % (module.params["name"], files["log"],
                                                                                st["pid"]))


def _public(st):
    return {k: v for k, v in st.items() if k not in ("group", "key")}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            run_dir=dict(type="path", required=True),
            state=dict(type="str", default="started", choices=["started", "restarted", "stopped", "status"]),
            command=dict(type="list", elements="str"),
            env=dict(type="dict", default={}, no_log=True),
            chdir=dict(type="path"),
            stop_timeout=dict(type="int", default=60),
            startup_grace=dict(type="float", default=3.0),
        ),
        required_if=[("state", "started", ["command"]), ("state", "restarted", ["command"])],
        supports_check_mode=True,
    )
    p = module.params
    invocation = {"module_args": dict(p, env=_process.masked_env(p["env"] or {}))}

    def done(**kw):
        module.exit_json(invocation=invocation, **kw)

    def fail(msg, **kw):
        module.fail_json(msg=msg, invocation=invocation, **kw)

    try:
        env = _process.check_env(p["env"])
    except _process_state.ProcessError as e:
        fail(str(e), **e.details)
    # Result-wide masking of a value like "1" would mask pids and times; env values are never returned, so the
    # masking stays only for credential-looking names (an engine may print those into the log tail).
    module.no_log_values.difference_update(v for k, v in env.items() if not _process.mask_everywhere(k, v))
    cmd_secrets, cmd_fields = _process.command_secrets(p["command"])
    module.no_log_values.update(cmd_secrets)
    if cmd_secrets and p["state"] in ("started", "restarted"):
        module.warn("command: a credential is written on the engine's command line (%s); it is masked in the result "
                    "and in the files engine_process writes, but every local user can read it in /proc/<pid>/cmdline; "
                    "pass it in env instead (vLLM reads VLLM_API_KEY, Hugging Face HF_TOKEN)" % ", ".join(cmd_fields))
    try:
        _process_state.check_name(p["name"])
        _process_state.check_run_dir(p["run_dir"])
        _process_state.check_layout(p["run_dir"], p["name"])
        if p["state"] in ("started", "restarted"):
            _process_command.check_command(p["command"], path_env=env.get("PATH", os.environ.get("PATH")), chdir=p["chdir"])
    except _process_state.ProcessError as e:
        fail(str(e), **e.details)
    files = _process_state.paths(p["run_dir"], p["name"])
    result = dict(changed=False, log_file=files["log"], state_file=files["state"])
    wanted = _process.spec_hash(p["command"], env, p["chdir"]) if p["command"] else None

    def plan(before):
        running = before["state"] == "running"
        if p["state"] == "status":
            return None
        if p["state"] == "stopped":
            return "stop" if running else None
        if p["state"] == "restarted" or not running or before.get("spec_hash") != wanted:
            return "start"
        return None

    if p["state"] == "status" or module.check_mode:
        before = _process.locate(p["run_dir"], p["name"])
        action = plan(before)
        _warn_state_file(module, before)
        _warn_about(module, before, files)
        result.update(previous=_public(before), changed=action is not None)
        if action == "start":
            done(**dict(result, state="running"))
        if action == "stop":
            done(**dict(result, state="exited"))
        done(**dict(result, **_public(before)))

    lock_timeout = max(p["stop_timeout"], 0) + max(p["startup_grace"], 0) + 60
    try:
        with _process.NameLock(p["run_dir"], p["name"], timeout=lock_timeout) as lock:
            before = _process.locate(p["run_dir"], p["name"])
            result["previous"] = _public(before)
            _warn_state_file(module, before)
            action = plan(before)
            if action is None:
                _warn_about(module, before, files)
                done(**dict(result, **_public(before)))
            result["changed"] = True
            if action == "stop":
                st = _process.stop(p["run_dir"], p["name"], timeout=p["stop_timeout"])[0]
                done(**dict(result, **_public(st)))
            if before["state"] == "running":
                _process.stop(p["run_dir"], p["name"], timeout=p["stop_timeout"])
            st = _process.start(p["run_dir"], p["name"], p["command"], env=env, chdir=p["chdir"],
                                stop_timeout=p["stop_timeout"], startup_grace=p["startup_grace"], lock=lock)
    except _process_state.ProcessError as e:
        fail(str(e), **dict(result, **e.details))
    done(**dict(result, **_public(st)))


if __name__ == "__main__":
    main()
