# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a supervised background process whose exit status is never masked.

Layout of ``<run_dir>/<name>/``: ``supervisor.py`` (written from SUPERVISOR_SOURCE), ``spec.json`` (what was
started), ``state.json`` (written by the supervisor: running / exited with returncode or signal) and
``<name>.log`` (the process's stdout+stderr, appended across restarts with a banner line).

The supervisor is a small Python parent that runs the command as a direct child in its own session,
forwards SIGTERM/SIGINT to the child's process group, and records the child's real exit status.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

SUPERVISOR_SOURCE = r'''
import json, os, signal, subprocess, sys, time

def write_state(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)

def main():
    state_path, log_path, spec_path = sys.argv[1:4]
    with open(spec_path) as f:
        spec = json.load(f)
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    log = open(log_path, "ab", buffering=0)
    log.write(("==== %s starting: %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                         " ".join(spec["command"]))).encode())
    child = subprocess.Popen(spec["command"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             cwd=spec.get("chdir") or None, env=env, start_new_session=True)
    state = {"state": "running", "pid": child.pid, "supervisor_pid": os.getpid(),
             "started_at": time.time(), "spec_hash": spec["spec_hash"], "returncode": None, "signal": None}
    write_state(state_path, state)
    stop_timeout = float(spec.get("stop_timeout", 60))
    stopping = {"requested": None}

    def on_signal(signum, frame):
        if stopping["requested"] is None:
            stopping["requested"] = time.time()
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        try:
            rc = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if stopping["requested"] and time.time() - stopping["requested"] > stop_timeout:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    try:  # reap anything the engine left in its process group (workers)
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    state.update({"state": "exited", "ended_at": time.time(), "returncode": rc,
                  "signal": (-rc if rc < 0 else None), "stop_requested": stopping["requested"] is not None})
    write_state(state_path, state)
    log.write(("==== %s exited: returncode=%s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rc)).encode())
    sys.exit(0)

main()
'''


class ProcessError(Exception):
    """A failure with a message that names the cause; ``details`` goes into the module result."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.details = details


def spec_hash(command, env, chdir):
    """Stable hash of what is started; env values are hashed, never stored in clear."""
    payload = json.dumps({"command": list(command), "env": sorted((env or {}).items()), "chdir": chdir or ""},
                         sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def paths(run_dir, name):
    base = os.path.join(run_dir, name)
    return {
        "dir": base,
        "supervisor": os.path.join(base, "supervisor.py"),
        "spec": os.path.join(base, "spec.json"),
        "state": os.path.join(base, "state.json"),
        "log": os.path.join(base, "%s.log" % name),
    }


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except OSError as e:
        return e.errno == errno.EPERM
    # A zombie is not alive.
    try:
        with open("/proc/%d/stat" % int(pid)) as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def read_state(run_dir, name):
    """Current state: ``absent`` | ``running`` | ``exited`` (with returncode/signal) | ``lost``."""
    return read_state_file(paths(run_dir, name)["state"])


def read_state_file(path):
    """Like read_state, from the state file's path."""
    try:
        with open(path) as f:
            st = json.load(f)
    except (OSError, ValueError):
        return {"state": "absent"}
    if st.get("state") == "running":
        if pid_alive(st.get("pid")):
            return st
        if pid_alive(st.get("supervisor_pid")):
            return st  # child just exited; the supervisor is about to record it
        st = dict(st, state="lost", returncode=None)
    return st


def log_tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]


def start(run_dir, name, command, env=None, chdir=None, stop_timeout=60, startup_grace=2.0, python=None):
    """Start under a supervisor; fail with the exit status if the command dies within ``startup_grace``."""
    p = paths(run_dir, name)
    os.makedirs(p["dir"], exist_ok=True)
    h = spec_hash(command, env, chdir)
    spec = {"command": list(command), "env": dict(env or {}), "chdir": chdir, "stop_timeout": stop_timeout,
            "spec_hash": h}
    with open(p["supervisor"], "w") as f:
        f.write(SUPERVISOR_SOURCE)
    fd = os.open(p["spec"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # env may hold secrets
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, sort_keys=True)
    try:
        os.unlink(p["state"])
    except FileNotFoundError:
        pass
    subprocess.Popen([python or sys.executable, p["supervisor"], p["state"], p["log"], p["spec"]],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    deadline = time.monotonic() + max(startup_grace, 0.5) + 10
    st = {"state": "absent"}
    while time.monotonic() < deadline:  # wait for the supervisor to record the child
        st = read_state(run_dir, name)
        if st["state"] != "absent":
            break
        time.sleep(0.1)
    if st["state"] == "absent":
        raise ProcessError("%s: the supervisor did not start (see %s)" % (name, p["log"]), log_file=p["log"])
    end = time.monotonic() + startup_grace
    while time.monotonic() < end and st["state"] == "running":
        time.sleep(0.2)
        st = read_state(run_dir, name)
    if st["state"] == "running" and not pid_alive(st.get("pid")):
        # child died; give the supervisor a moment to record the status
        for dummy in range(50):
            time.sleep(0.1)
            st = read_state(run_dir, name)
            if st["state"] != "running":
                break
    if st["state"] != "running":
        raise ProcessError(
            "%s exited during start-up with %s (log: %s)" % (name, describe_exit(st), p["log"]),
            returncode=st.get("returncode"), signal=st.get("signal"), log_file=p["log"], log_tail=log_tail(p["log"]))
    return st


def describe_exit(st):
    if st.get("signal"):
        try:
            return "signal %s (%s)" % (st["signal"], signal.Signals(st["signal"]).name)
        except ValueError:
            return "signal %s" % st["signal"]
    if st.get("state") == "lost":
        return "an unknown status (its supervisor was killed)"
    return "exit status %s" % st.get("returncode")


def stop(run_dir, name, timeout=60):
    """SIGTERM the supervisor (it stops the process group); returns the final state."""
    st = read_state(run_dir, name)
    if st["state"] != "running":
        return st, False
    try:
        os.kill(int(st["supervisor_pid"]), signal.SIGTERM)
    except ProcessLookupError:
        pass
    end = time.monotonic() + timeout + 15
    while time.monotonic() < end:
        st = read_state(run_dir, name)
        if st["state"] != "running":
            return st, True
        time.sleep(0.2)
    for key in ("pid", "supervisor_pid"):
        try:
            os.killpg(int(st[key]), signal.SIGKILL) if key == "pid" else os.kill(int(st[key]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, TypeError, KeyError):
            pass
    return read_state(run_dir, name), True
