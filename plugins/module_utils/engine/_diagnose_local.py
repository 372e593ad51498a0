# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: why a local ``engine_process`` engine is not serving.

* :func:`local_facts` - the engine's state file, spec and latest run's log (``_process_state``), ``/proc``
  (injectable ``proc_root``: stopped members, who holds the port) and one ``GET /health``.
* :func:`diagnose_local` - pure: those facts in, findings and the verdict out.
"""
from __future__ import annotations

import os
import re
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock, _http, _process_run
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process, _process_state
from ansible_collections.llmops.serving.plugins.module_utils.engine._diagnose import (
    ADDR_IN_USE, PLAUSIBLE_START_SECONDS, analyse_log, classify_exit, command_facts, exception_evidence, finding,
    fmt_s, kv_transfer_finding, progress_text, result,
)
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, open_regular

LOG_TAIL_BYTES = 512 * 1024


# --------------------------------------------------------------------------------------------- #
# Local: an engine_process engine
# --------------------------------------------------------------------------------------------- #

def current_run_log(path, max_bytes=LOG_TAIL_BYTES):
    """The log of the latest start: engine_process appends every start to one file after a ``==== ... starting:``
    banner line (see _process.SUPERVISOR_SOURCE)."""
    try:
        # the shared reader's open: a FIFO, device or socket at the log's path is refused without blocking
        with open_regular(path, "engine log") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes).decode("utf-8", "replace")
    except (OSError, UntrustedInput):
        return None
    banners = [m.start() for m in re.finditer(r"^==== \S+ starting: ", data, re.M)]
    return data[banners[-1]:] if banners else data


def proc_stat(pid, proc_root="/proc"):
    """``{state, pgrp, comm}`` of ``pid`` from ``/proc/<pid>/stat`` (proc(5)), or None."""
    try:
        with open("%s/%d/stat" % (proc_root, int(pid))) as f:
            data = f.read()
        comm = data[data.index("(") + 1:data.rindex(")")]
        rest = data.rsplit(")", 1)[1].split()
        return {"state": rest[0], "pgrp": int(rest[2]), "comm": comm}
    except (OSError, ValueError, IndexError, TypeError):
        return None


def stopped_members(pid, proc_root="/proc"):
    """Processes of the engine's group in state ``T``/``t`` (stopped by SIGSTOP/SIGTSTP or a tracer, proc(5))."""
    out = [{"pid": p, "state": st["state"], "comm": st["comm"]}
           for p, st in _process_run.group_members(pid, proc_root, read_stat=proc_stat, leader=True) if st["state"] in ("T", "t")]
    return sorted(out, key=lambda x: x["pid"] != pid)


def port_holders(port, proc_root="/proc"):
    """Processes listening on TCP ``port``: ``/proc/net/tcp{,6}`` rows in state 0A (LISTEN, include/net/tcp_states.h),
    their socket inodes matched to ``/proc/<pid>/fd`` links ``socket:[inode]``."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open("%s/net/%s" % (proc_root, table)) as f:
                next(f, None)
                for row in f:
                    cols = row.split()
                    if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except (OSError, ValueError, IndexError):
            continue
    if not inodes:
        return []
    holders = []
    try:
        pids = [d for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return []
    for pid in pids:
        fd_dir = "%s/%s/fd" % (proc_root, pid)
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                st = proc_stat(int(pid), proc_root) or {}
                holders.append({"pid": int(pid), "comm": st.get("comm", "?"), "port": port})
                break
    return sorted(holders, key=lambda h: h["pid"])


def probe_health(host, port, timeout):
    """One ``GET /health`` (through ``_http``): ``{"result": ok|refused|no_answer|status|error, "status": N, "seconds": s}``."""
    if host in (None, "", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    t0 = time.monotonic()
    try:
        status = _http.request("GET", "http://%s:%d/health" % (host, port), timeout=timeout).status
    except _http.HttpError as e:
        if e.status is not None:
            status = e.status
        elif e.refused:
            return {"result": "refused", "seconds": time.monotonic() - t0}
        elif e.timed_out:
            return {"result": "no_answer", "seconds": time.monotonic() - t0}
        else:
            return {"result": "error", "error": e.reason, "seconds": time.monotonic() - t0}
    return {"result": "ok" if status == 200 else "status", "status": status, "seconds": time.monotonic() - t0}


def local_facts(run_dir, name, proc_root="/proc", health_timeout=5.0):
    """What the ``engine_process`` files, ``/proc`` and ``GET /health`` say about ``run_dir/name``.

    Raises :class:`_process_state.ProcessError` for a ``name`` or ``run_dir`` that cannot name an engine.
    """
    _process_state.check_name(name)
    _process_state.check_run_dir(run_dir)
    p = _process_state.paths(run_dir, name)
    st = _process.locate(run_dir, name, proc_root)
    spec = _process_state.read_json_object(p["spec"]) or {}
    cmd = command_facts(spec.get("command") or [])
    log = current_run_log(p["log"])
    facts = {"name": name, "run_dir": run_dir, "state": st, "command": cmd, "log_file": p["log"],
             "log": log, "model_missing": None, "stopped": [], "health": None, "port_holders": []}
    model = cmd.get("model")
    if model and os.path.isabs(model) and not os.path.exists(model):
        facts["model_missing"] = model
    if st.get("state") == "running" and st.get("pid"):
        facts["stopped"] = stopped_members(int(st["pid"]), proc_root)
        if not facts["stopped"] and cmd.get("port"):
            facts["health"] = probe_health(cmd.get("host"), cmd["port"], health_timeout)
    elif st.get("state") in ("exited", "lost") and cmd.get("port") and log and ADDR_IN_USE.search(log):
        facts["port_holders"] = port_holders(cmd["port"], proc_root)
    facts["ages"] = engine_ages(st, p["state"], proc_root)
    return facts


def engine_ages(st, state_path, proc_root="/proc"):
    """``{running_s, ended_ago_s, ran_s}`` of the engine whose state is ``st`` (``_process.locate``), each from
    one clock (``_clock``), None where unknown; never this process's ``time.time()`` against a time the
    supervisor wrote, which a clock stepped in between would turn into an engine "loading for a year" (hung) or
    for a negative time.

    * ``running_s`` (running): ``_clock.process_age`` of the engine's ``pid_start``, the kernel's time since boot
      against the process's start.
    * ``ended_ago_s`` (ended): the state file, which the supervisor writes when the engine ends, its mtime against
      the filesystem's clock now (``_clock.filesystem_now`` of its directory).
    * ``ran_s`` (ended): ``ended_at`` against ``started_at``, two readings of the supervisor's one clock
      (``_clock.age``: a step back in between is 0, not a negative time).
    """
    out = {"running_s": None, "ended_ago_s": None, "ran_s": None}
    if st.get("state") == "running":
        out["running_s"] = _clock.process_age(st.get("pid_start"), proc_root)
    elif st.get("ended_at"):
        try:
            out["ended_ago_s"] = _clock.age(_clock.filesystem_now(os.path.dirname(state_path)),
                                            os.lstat(state_path).st_mtime)
        except OSError:
            pass
        number = (int, float)
        if isinstance(st.get("started_at"), number) and isinstance(st["ended_at"], number):
            out["ran_s"] = _clock.age(st["ended_at"], st["started_at"])
    return out


def diagnose_local(facts):
    """Findings for one local engine from :func:`local_facts`; its ages are ``facts["ages"]``
    (:func:`engine_ages`), unknown where absent."""
    st = facts["state"]
    ages = facts.get("ages") or {}
    obj = "engine %s (%s)" % (facts["name"], os.path.join(facts["run_dir"], facts["name"]))
    logf = analyse_log(facts.get("log") or "")
    where = "log %s" % facts["log_file"]
    cmd = facts["command"]
    state = st.get("state")
    if state == "absent":
        return result([finding("not_running", obj, [
            "no engine %s under %s: engine_process has no state for it and no such process runs"
            % (facts["name"], facts["run_dir"])],
            "Start it (llmops.serving.engine_process state=started) or check run_dir and name.")])
    if state in ("exited", "lost"):
        if st.get("stop_requested"):
            return result([finding("stopped", obj, ["the engine was stopped on request (%s)" % _process_state.describe_exit(st)],
                                   "Start it again when needed.")])
        what = "the engine"
        if state == "lost":
            what += " (its supervisor was killed, so nothing recorded how it ended)"
        rc = st.get("returncode")
        sig = st.get("signal") or (-rc if rc is not None and rc < 0 else None)
        f = classify_exit(what, obj, rc if rc is not None and rc >= 0 else None, sig, logf, where, model_missing_path=facts.get("model_missing"),
                          port_holders=facts.get("port_holders"), port=cmd.get("port"))
        if st.get("ended_at"):
            f["evidence"].append("it ended %s ago, %s after its start" % (
                fmt_s(ages.get("ended_ago_s")), fmt_s(ages.get("ran_s"))))
        return result([f])
    # running: how long, on the kernel's clock since boot (unknown: never judged hung by its age)
    elapsed = ages.get("running_s")
    if facts.get("stopped"):
        ev = ["pid %s (%s) is in state %s (stopped): it received SIGSTOP/SIGTSTP or is held by a debugger, so it "
              "answers nothing" % (s["pid"], s["comm"], s["state"]) for s in facts["stopped"][:3]]
        return result([finding("engine_hung", obj, ev,
                               "Resume it with `kill -CONT %s` (or stop and start it: llmops.serving.engine_process "
                               "state=restarted)." % facts["stopped"][0]["pid"])])
    health = facts.get("health") or {}
    port = cmd.get("port")
    findings = []
    if health.get("result") == "ok":
        findings.append(finding("healthy", obj, ["GET /health on port %s answered 200 in %.2f s (pid %s, up %s)" % (
            port, health["seconds"], st.get("pid"), fmt_s(elapsed))], "Nothing to fix."))
        kv = kv_transfer_finding(obj, logf, where)
        if kv:
            findings.append(kv)
        if logf["tracebacks"]:
            findings.append(finding("engine_traceback", obj, ["the engine serves, but the log of this start holds %d "
                                                              "traceback(s)" % len(logf["tracebacks"])]
                                    + exception_evidence(logf, where),
                                    "Some requests failed: read the exception."))
        return result([f for f in findings if f["code"] != "healthy"] or findings)
    if health.get("result") == "no_answer":
        return result([finding("engine_hung", obj, [
            "port %s accepts connections but GET /health gave no answer in %.1f s (pid %s, up %s)" % (
                port, health["seconds"], st.get("pid"), fmt_s(elapsed))] + exception_evidence(logf, where),
            "The engine is alive but stuck (a deadlock, a stuck collective, a full event loop): read the log's last "
            "lines, `py-spy dump --pid %s`, then restart it." % st.get("pid"))])
    if health.get("result") == "status":
        return result([finding("crashed", obj, [
            "GET /health on port %s answered %s: the server runs but its engine does not (vLLM answers 503 once its "
            "EngineCore died)" % (port, health.get("status"))] + exception_evidence(logf, where),
            "Read the exception above; restart the engine (llmops.serving.engine_process state=restarted).")])
    ev = ["the engine (pid %s) has been starting for %s; port %s does not listen yet" % (
        st.get("pid"), fmt_s(elapsed), port)]
    progress = progress_text(logf.get("progress"))
    if progress:
        ev.append(progress)
    if elapsed is not None and elapsed > PLAUSIBLE_START_SECONDS:
        ev.append("no cold start takes longer than %s" % fmt_s(PLAUSIBLE_START_SECONDS))
        return result([finding("engine_hung", obj, ev + exception_evidence(logf, where),
                               "It is not loading any more: read the log's last lines (a stuck collective, a wait for "
                               "a peer), then restart it (llmops.serving.engine_process state=restarted).")])
    findings.append(finding("still_loading", obj, ev, "Not an error: wait for the port to open (engine_probe "
                                                      "waits with a deadline)."))
    kv = kv_transfer_finding(obj, logf, where)
    if kv:
        findings.append(kv)
    if logf["tracebacks"]:
        findings.append(finding("engine_traceback", obj, ["the log of this start holds %d traceback(s)"
                                                          % len(logf["tracebacks"])] + exception_evidence(logf, where),
                                "Read the exception: a worker may have died while the front end waits."))
    return result(findings)
