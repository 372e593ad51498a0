# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: name why an engine is not serving, from the evidence it left: the findings,
the verdict, and what an engine's log and exit status say wherever it ran.

Evidence is what other components already write: the scheduler's and the kubelet's Events, a container's
``state`` / ``lastState``, the Gateway API conditions of the AIBrix route, EndpointSlices, the engine's own log
(current and previous container), and for a local engine the state file and log of ``engine_process``.
Each rule restates one upstream behaviour and cites where it comes from; a rule returns findings
``{code, severity, object, evidence, hint}``: ``evidence`` is a list of facts (the first one is the
headline), ``hint`` says what fixes it.

The verdict is the code of the most severe finding; between findings of one severity, the one earlier in
:data:`CODES` wins (root causes come before their consequences: a pod that cannot be scheduled also has no
endpoints, an OOM kill is also a non-zero exit).

This file holds what both kinds of engine share:

* :data:`CODES`, :func:`finding`, :func:`result` - the findings and the verdict.
* :func:`analyse_log` - tracebacks, engine death lines, argparse errors, weight-loading progress.
* :func:`command_facts` / :func:`classify_exit` - the engine command and what an exit status means.

The Kubernetes rules are in ``_diagnose_pods`` (one pod) and ``_diagnose_k8s`` (the workload, its route and
endpoints, reading them from the API); a local ``engine_process`` engine in ``_diagnose_local``.
"""
from __future__ import annotations

import os
import re
import signal as _signal

from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    MAX_ABS_NUMBER, MAX_FIGURE_CHARS, figure_or_none)
from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_command

# --------------------------------------------------------------------------------------------- #
# Codes
# --------------------------------------------------------------------------------------------- #

#: ``(code, severity)`` in precedence order: between two findings of one severity the earlier one is the verdict.
CODES = (
    ("workload_not_found", "error"),
    ("not_running", "error"),
    ("no_pods", "error"),
    ("evicted", "error"),
    ("unschedulable_gpus", "error"),
    ("unschedulable", "error"),
    ("image_pull", "error"),
    ("mount_failed", "error"),
    ("container_config", "error"),
    ("oom_killed", "error"),
    ("startup_probe_killed", "error"),
    ("bad_argument", "error"),
    ("model_not_found", "error"),
    ("port_in_use", "error"),
    ("crash_exit_zero", "error"),
    ("crashed", "error"),
    ("engine_hung", "error"),
    ("served_name_mismatch", "error"),
    ("route_missing", "error"),
    ("route_backend_not_found", "error"),
    ("route_not_accepted", "error"),
    ("service_no_endpoints", "error"),
    ("rollout_stalled", "error"),
    ("kv_transfer_failed", "warning"),
    ("engine_traceback", "warning"),
    ("not_ready", "warning"),
    ("rolling", "info"),
    ("still_loading", "info"),
    ("stopped", "info"),
    ("healthy", "info"),
)
SEVERITY = dict(CODES)
_ORDER = dict((code, i) for i, (code, _sev) in enumerate(CODES))
_RANK = {"error": 3, "warning": 2, "info": 1}

MAX_EVIDENCE = 8
MAX_LINE = 400
#: A start without a probe to bound it is "still loading" only this long: four times the slowest cold start
#: measured in the field (28 min for a 700 GiB FP8 model with JIT and CUDA graphs), rounded up to 2 h.
PLAUSIBLE_START_SECONDS = 7200


def finding(code, obj, evidence, hint):
    ev = [clip(e) for e in evidence if e][:MAX_EVIDENCE]
    return {"code": code, "severity": SEVERITY[code], "object": obj, "evidence": ev, "hint": hint}


def clip(text):
    text = mask(str(text))
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 3] + "..."


def mask(text):
    """``text`` with token-shaped values (the collection's :data:`_secrets.TOKEN_SHAPES`) replaced."""
    for _what, pattern in _secrets.TOKEN_SHAPES:
        text = pattern.sub("********", text)
    return text


def verdict_of(findings):
    """The code of the most severe finding (earlier in :data:`CODES` on a tie), or ``healthy``."""
    if not findings:
        return "healthy"
    best = min(findings, key=lambda f: (-_RANK[f["severity"]], _ORDER[f["code"]]))
    return best["code"]


def result(findings):
    """``{verdict, findings, summary}``; findings sorted most severe first."""
    findings = sorted(findings, key=lambda f: (-_RANK[f["severity"]], _ORDER[f["code"]]))
    verdict = verdict_of(findings)
    if findings:
        top = findings[0]
        summary = "%s: %s: %s" % (verdict, top["object"], top["evidence"][0] if top["evidence"] else top["hint"])
        others = len(findings) - 1
        if others:
            codes = []
            for f in findings[1:]:
                if f["code"] not in codes:
                    codes.append(f["code"])
            summary += " (+%d more: %s)" % (others, ", ".join(codes))
    else:
        summary = "healthy: nothing found"
    return {"verdict": verdict, "findings": findings, "summary": summary}


def fmt_s(seconds):
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 120:
        return "%d s" % seconds
    m, s = divmod(seconds, 60)
    if m < 120:
        return "%d min %02d s" % (m, s)
    h, m = divmod(m, 60)
    return "%d h %02d min" % (h, m)


# --------------------------------------------------------------------------------------------- #
# Logs
# --------------------------------------------------------------------------------------------- #

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# vLLM's log prefix (vllm/logger.py _FORMAT): "(EngineCore pid=123) ERROR 08-02 09:12:43 [core.py:1510] "; a
# multi-line message (a logged traceback) repeats it on every line (logging_utils/formatter.py NewLineFormatter).
_VLLM_PREFIX = re.compile(r"^\S*?\((?P<proc>[^()\s]+) pid=(?P<pid>\d+)\) "
                          r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?")
_TB_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# CPython traceback.py: chained exceptions are printed cause first, joined by one of these lines.
_TB_CHAIN = ("The above exception was the direct cause of the following exception:",
             "During handling of the above exception, another exception occurred:")
# The last line of a traceback is "<qualified type>: <message>" (traceback.format_exception_only); exception
# classes are named ...Error / ...Exception / ...Exit / ...Interrupt by convention (PEP 8).
_EXC_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_][\w]*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)"
                       r"|StopIteration|GeneratorExit))(?::\s?(?P<msg>.*))?$")
# Exceptions that only say "the cause is above": the root cause is the traceback before them.
_WRAPPERS = re.compile(r"see (?:the )?(?:root cause|stack trace) above|EngineDeadError|^SystemExit", re.I)

# Lines with which engines announce that a process died (the cause is the traceback before them).
DEATH_LINES = (
    # vllm/v1/engine/core.py: logger.exception(...) in run_engine_core
    re.compile(r"EngineCore failed to start"),
    re.compile(r"EngineCore encountered a fatal error"),
    # vllm/v1/engine/utils.py wait_for_engine_startup; vllm/v1/engine/exceptions.py EngineDeadError
    re.compile(r"Engine core initialization failed"),
    re.compile(r"EngineCore encountered an issue"),
    # vllm/v1/executor/multiproc_executor.py worker monitor
    re.compile(r"Worker proc \S+ died unexpectedly"),
    # sglang/srt/entrypoints/engine.py: the SIGQUIT handler of the launcher after a scheduler failed
    re.compile(r"Received sigquit from a child process"),
    # torch ProcessGroupNCCL destructor: printed at exit when the process group was not torn down
    re.compile(r"destroy_process_group\(\) was not called before program exit"),
)
# CPython Lib/argparse.py ArgumentParser.error: "usage: ..." then "<prog>: error: <message>", exit status 2.
_ARGPARSE = re.compile(r"^(?P<prog>\S+): error: (?P<msg>.+)$")
# vllm/model_executor/model_loader/weight_utils.py _BAR_FORMAT (tqdm):
# "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
_PROGRESS = re.compile(r"(?P<desc>Loading (?:safetensors|pt) checkpoint shards):\s+(?P<pct>\d+)% Completed \| "
                       r"(?P<n>\d+)/(?P<total>\d+) \[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:?]+))?")
# vllm/transformers_utils/config.py get_config: the model is neither a directory with a config nor a repo id.
_MODEL_MISSING = (
    re.compile(r"Invalid repository ID or local directory specified: '(?P<path>[^']+)'"),
    re.compile(r"(?:FileNotFoundError|OSError): \[Errno 2\] No such file or directory: '(?P<path>[^']+)'"),
    # huggingface_hub/utils/_validators.py validate_repo_id on an absolute path
    re.compile(r"HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '(?P<path>[^']+)'"),
)
# OSError errno 98 EADDRINUSE (Linux asm-generic/errno.h) as Python prints it for socket.bind, and uvicorn's form.
# The server is up: uvicorn (uvicorn/lifespan/on.py, uvicorn/server.py) for vLLM; SGLang's http_server.py.
_SERVING = re.compile(r"Application startup complete|Uvicorn running on|The server is fired up and ready to roll")
ADDR_IN_USE = re.compile(r"\[Errno 98\][^\n]*[Aa]ddress already in use|EADDRINUSE")


# vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py NixlConnectorWorker._log_failure (vLLM 0.32):
# logger.error("NIXL transfer failure: %s | Context: %s", failure_type, context), failure_type one of
# handshake_setup_failed, handshake_failed, transfer_failed, transfer_exception, transfer_release_failed,
# notification_failed, with ". <msg>" appended when given; context is the repr of a dict holding request_id,
# engine_id and, when the request's metadata is known, remote_host and remote_port.
_KV_FAILURE = "NIXL transfer failure: "
_KV_CONTEXT = " | Context: "
_KV_TYPE = re.compile(r"[a-z_]{1,64}")
_KV_REMOTE = re.compile(r"'remote_host': '(?P<host>[^']{1,255})', 'remote_port': (?P<port>\d{1,5})")
MAX_KV_REMOTES = 4


def _kv_failure(facts, line):
    """Count one ``NIXL transfer failure`` line into ``facts["kv_transfer_failures"]`` (bounded: counts per type,
    the first and last line - clipped when they become evidence, not per line -, at most ``MAX_KV_REMOTES`` remote
    engines)."""
    # found with str.find, not one regular expression: a line an engine echoes from a request could repeat the
    # opening many times, and a lazy match from each would read the rest of the line again
    start = line.find(_KV_FAILURE)
    ctx_at = line.find(_KV_CONTEXT, start) if start >= 0 else -1
    m = _KV_TYPE.match(line, start + len(_KV_FAILURE)) if ctx_at >= 0 else None
    if not m or not (m.end() == ctx_at or line.startswith(". ", m.end())):
        return
    ctx = line[ctx_at + len(_KV_CONTEXT):]
    kv = facts["kv_transfer_failures"]
    if kv is None:
        kv = facts["kv_transfer_failures"] = {"count": 0, "types": {}, "remotes": [], "first": line, "last": None}
    kv["count"] += 1
    kv["types"][m.group(0)] = kv["types"].get(m.group(0), 0) + 1
    kv["last"] = line
    r = _KV_REMOTE.search(ctx)
    remote = "%s:%s" % (r.group("host"), r.group("port")) if r else None
    if remote and remote not in kv["remotes"] and len(kv["remotes"]) < MAX_KV_REMOTES:
        kv["remotes"].append(remote)


def kv_transfer_finding(obj, logf, where, also=()):
    """``kv_transfer_failed`` when the log holds NIXL transfer failures, else None: the pair's KV did not move (the
    decode side recomputes the prompt or fails the request, by ``kv_load_failure_policy``), though the engine may
    answer its health checks. ``also``: further evidence after the failures' (the log's exception, where a rule
    reports one finding per container)."""
    kv = logf.get("kv_transfer_failures")
    if not kv:
        return None
    types = ", ".join("%s x%d" % (t, n) for t, n in sorted(kv["types"].items(), key=lambda x: (-x[1], x[0])))
    ev = ["%s holds %d NIXL transfer failure(s): %s" % (where, kv["count"], types)]
    if kv["remotes"]:
        ev.append("with the remote engine(s) at %s" % ", ".join(kv["remotes"]))
    ev.append("first: %s" % kv["first"])  # finding() clips and masks every line
    if kv["last"] != kv["first"]:
        ev.append("last: %s" % kv["last"])
    ev.extend(also)
    return finding("kv_transfer_failed", obj, ev,
                   "The KV cache did not move between prefill and decode. handshake_*: this engine cannot reach the "
                   "other side's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, a firewall, the other engine "
                   "restarted); transfer_* or notification_failed: the transport failed mid-transfer (UCX_TLS, "
                   "UCX_NET_DEVICES, the RDMA link: ibv_devinfo, the pd_disagg verify round's counters). Requests "
                   "whose KV did not arrive failed, or were recomputed with kv_load_failure_policy=recompute (vLLM's default: "
                   "fail).")


def _log_lines(text):
    """(stream, line) pairs: ANSI colours and vLLM's per-process prefix removed; ``\\r`` splits tqdm updates."""
    out = []
    for raw in re.split(r"\r\n|\n|\r", _ANSI.sub("", text or "")):
        m = _VLLM_PREFIX.match(raw)
        if m:
            out.append(("%s/%s" % (m.group("proc"), m.group("pid")), raw[m.end():]))
        else:
            out.append(("", raw))
    return out


def _hms(text):
    if len(text) > MAX_FIGURE_CHARS:  # no duration tqdm writes; int() of 5000 digits raises
        return None
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    total = 0
    for p in parts:
        total = total * 60 + p
    return total if total <= MAX_ABS_NUMBER else None


def _tracebacks(lines):
    """Tracebacks in order of their end: ``{exception, type, line, stream}`` (``line`` = index of the header)."""
    found = []
    open_tb = {}  # stream -> {"start", "frames", "skipped"}
    for i, (stream, line) in enumerate(lines):
        if _TB_HEADER in line:
            open_tb[stream] = {"start": i, "frames": 0, "skipped": 0}
            continue
        tb = open_tb.get(stream)
        if tb is None:
            continue
        if line.startswith(" ") or not line.strip():
            fm = _FRAME.match(line)
            if fm:
                tb["frames"] += 1
                tb["at"] = "%s:%s in %s" % (os.path.basename(fm.group("file")), fm.group("line"), fm.group("func"))
            continue
        m = _EXC_LINE.match(line.strip())
        if m and tb["frames"]:
            exc = line.strip()
            # an indented continuation of the message (pydantic's "  Value error, ...")
            for _s, nxt in lines[i + 1:i + 4]:
                if nxt.startswith("  ") and not nxt.lstrip().startswith("File ") and nxt.strip():
                    exc += " " + nxt.strip()
                else:
                    break
            found.append({"exception": exc, "type": m.group("type"), "line": tb["start"], "stream": stream,
                          "at": tb.get("at")})
            del open_tb[stream]
            continue
        if line.strip() in _TB_CHAIN:
            continue
        tb["skipped"] += 1  # a log line of another process between the frames
        if tb["skipped"] > 20:
            del open_tb[stream]
    return found


def analyse_log(text):
    """What a log says: ``tracebacks``, ``root_exception``, ``death_lines``, ``argparse_error``,
    ``progress`` (the last weight-loading line), ``model_missing`` (a path), ``address_in_use`` (a line)."""
    lines = _log_lines(text)
    tbs = _tracebacks(lines)
    root = None
    for tb in tbs:
        if not _WRAPPERS.search(tb["exception"]):
            root = tb
    if root is None and tbs:
        root = tbs[0]
    facts = {"tracebacks": tbs, "root_exception": root["exception"] if root else None,
             "root_at": root.get("at") if root else None,
             "root_count": sum(1 for tb in tbs if root and tb["exception"] == root["exception"]),
             "last_exception": tbs[-1]["exception"] if tbs else None,
             "death_lines": [], "argparse_error": None, "progress": None, "model_missing": None,
             "address_in_use": None, "serving_line": None, "kv_transfer_failures": None, "lines": len(lines),
             "last_lines": [ln.strip() for _s, ln in lines if ln.strip()][-3:]}
    for _stream, line in lines:
        s = line.strip()
        if not s:
            continue
        for pattern in DEATH_LINES:
            if pattern.search(s) and s not in facts["death_lines"]:
                facts["death_lines"].append(s)
        m = _ARGPARSE.match(s)
        if m:
            facts["argparse_error"] = s
        m = _PROGRESS.search(s)
        # shard counts or times that cannot be (5000 digits: int() raises) make no progress line
        counts = [figure_or_none(m.group(g), nonnegative=True) for g in ("n", "total")] if m else [None]
        if None not in counts and _hms(m.group("elapsed")) is not None:
            facts["progress"] = {"desc": m.group("desc"), "n": int(counts[0]), "total": int(counts[1]),
                                 "elapsed_s": _hms(m.group("elapsed")),
                                 "remaining_s": _hms(m.group("remaining")) if m.group("remaining") else None,
                                 "line": "%s: %s/%s [%s elapsed]" % (
                                     m.group("desc"), m.group("n"), m.group("total"), m.group("elapsed"))}
        if facts["model_missing"] is None:
            for pattern in _MODEL_MISSING:
                m = pattern.search(s)
                if m:
                    facts["model_missing"] = {"path": m.group("path"), "line": s}
                    break
        if "NIXL transfer failure" in s:
            _kv_failure(facts, s)
        if facts["serving_line"] is None and _SERVING.search(s):
            facts["serving_line"] = s
        if facts["address_in_use"] is None and ADDR_IN_USE.search(s):
            facts["address_in_use"] = s
    return facts


def progress_text(progress):
    if not progress:
        return None
    text = "the log shows %s" % progress["line"]
    if progress["n"] >= progress["total"]:
        text += " (weights read; still initialising: all-rank sync, JIT, KV cache, CUDA graphs)"
    elif progress.get("remaining_s") is not None and progress.get("elapsed_s") is not None:
        text += "; tqdm estimated %s more for the weights alone" % fmt_s(progress["remaining_s"])
    return text


def exception_evidence(logf, where):
    out = []
    if logf.get("root_exception"):
        extra = []
        if logf.get("root_at"):
            extra.append("raised at %s" % logf["root_at"])
        if logf.get("root_count", 1) > 1:
            extra.append("%d times" % logf["root_count"])
        out.append("%s: %s%s" % (where, logf["root_exception"], " (%s)" % ", ".join(extra) if extra else ""))
        last = logf.get("last_exception")
        if last and last != logf["root_exception"]:
            out.append("%s then: %s" % (where, last))
    shown = [logf.get("root_exception") or "", logf.get("last_exception") or ""]
    for line in logf.get("death_lines", []):
        if len(out) >= 5:
            break
        if not any(line in s or s in line for s in shown if s):
            out.append("%s: %s" % (where, line))
    if not out and logf.get("last_lines"):
        out.append("%s, last line: %s" % (where, logf["last_lines"][-1]))
    return out


# --------------------------------------------------------------------------------------------- #
# The engine command
# --------------------------------------------------------------------------------------------- #

def _flag(argv, *names):
    """Values of ``--name X`` / ``--name=X`` (all of them, a multi-value flag reads up to the next ``-``)."""
    values = []
    for i, tok in enumerate(argv):
        for name in names:
            if tok == name:
                j = i + 1
                while j < len(argv) and not argv[j].startswith("--"):
                    values.append(argv[j])
                    j += 1
                    if name != "--served-model-name":
                        break
            elif tok.startswith(name + "="):
                values.append(tok[len(name) + 1:])
    return values


def command_facts(argv):
    """What the engine argv says: engine, model path, served names, host, port.

    vLLM (vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py): ``--model`` or ``vllm serve MODEL``,
    ``--served-model-name`` takes several names and defaults to the model; ``--host``, ``--port`` (8000).
    SGLang (python/sglang/srt/server_args.py): ``--model-path``, ``--served-model-name`` (defaults to the model
    path), ``--host``, ``--port`` (30000).
    """
    argv = [str(a) for a in (argv or [])]
    # a shell wrapper: read the words of its script
    words = list(argv)
    for i, tok in enumerate(argv[:-1]):
        if tok in ("-c", "-lc", "-ec", "-xc") and os.path.basename(argv[0]) in _process_command.SHELLS:
            try:
                words = [t for kind, t in _process_command.shell_tokens(argv[i + 1]) if kind == "word"]
            except ValueError:
                words = argv[i + 1].split()
            break
    joined = " ".join(words)
    engine = "sglang" if "sglang" in joined else ("vllm" if "vllm" in joined else None)
    model = (_flag(words, "--model-path") or _flag(words, "--model") or [None])[0]
    if model is None and "serve" in words:
        k = words.index("serve")
        if k + 1 < len(words) and not words[k + 1].startswith("-"):
            model = words[k + 1]
    names = _flag(words, "--served-model-name")
    port = (_flag(words, "--port") or [None])[0]
    try:
        port = int(port) if port is not None else (30000 if engine == "sglang" else 8000)
    except ValueError:
        port = None
    return {"engine": engine, "model": model, "served_names": names or ([model] if model else []),
            "served_names_given": bool(names), "host": (_flag(words, "--host") or [None])[0], "port": port}


# --------------------------------------------------------------------------------------------- #
# Exit classification (Kubernetes container or local process)
# --------------------------------------------------------------------------------------------- #

def _signal_name(sig):
    try:
        return _signal.Signals(int(sig)).name
    except (ValueError, TypeError):
        return "signal %s" % sig


def classify_exit(what, obj, exit_code, sig, logf, where, model_missing_path=None, port_holders=None,
                  masking=None, port=None, oom=False, engine=None):
    """One finding for an engine that ended, from its status and its log.

    * ``oom``: the kernel's OOM killer (containerd reports reason ``OOMKilled``).
    * exit 2 with ``<prog>: error: ...``: argparse refused an argument (CPython ``ArgumentParser.error``).
    * the model path does not exist (checked on this host, or vLLM's ``Invalid repository ID or local
      directory``).
    * ``[Errno 98] Address already in use``: bind(2) failed with EADDRINUSE.
    * exit 0 (reason ``Completed``): a server never exits 0 on its own: a crash hidden by a wrapper.
    * SIGKILL (137) of an SGLang engine whose log holds an exception: SGLang's own ``kill_process_tree``
      (sgl-project/sglang python/sglang/srt/utils/common.py: ``itself.kill()`` when the parent is the process
      itself) SIGKILLs the server after a scheduler failed; not PID 1 (the pod shares its process namespace),
      the kill takes effect and the status is 137. The exception is the cause, not something outside.
    * anything else: ``crashed`` with the exception line.
    """
    exc = exception_evidence(logf, where)
    if sig is None and exit_code is not None and exit_code > 128:
        sig_guess = exit_code - 128  # a shell or runtime reports death by signal N as 128+N (POSIX sh)
    else:
        sig_guess = None
    status = ("signal %s (%s)" % (sig, _signal_name(sig)) if sig else "exit status %s" % exit_code
              if exit_code is not None else "an unknown status")
    if oom:
        return finding("oom_killed", obj, ["%s was killed by the kernel's OOM killer (%s)" % (what, status)] + exc,
                       "The memory limit is too small for the engine: host memory holds the pinned weights while "
                       "loading, the CPU KV cache/swap space and /dev/shm (an emptyDir with medium Memory counts "
                       "against the limit). Raise the memory limit or lower --swap-space / shm size.")
    if exit_code == 2 and logf.get("argparse_error"):
        return finding("bad_argument", obj, ["%s refused its arguments (exit status 2): %s" % (what, logf["argparse_error"])],
                       "Fix the engine argument named in the error (see `<engine> --help` for its type and choices); "
                       "nothing was loaded.")
    missing = model_missing_path or ((logf.get("model_missing") or {}).get("path") if exit_code else None)
    if missing:
        ev = ["%s ended with %s: the model %s does not exist%s" % (
            what, status, missing, " on this host" if model_missing_path else "")]
        if logf.get("model_missing") and logf["model_missing"]["line"] not in (logf.get("root_exception") or ""):
            ev.append("%s: %s" % (where, logf["model_missing"]["line"]))
        return finding("model_not_found", obj, ev + exc,
                       "Point the engine at the staged model revision directory (it must hold config.json), e.g. the "
                       "path llmops.serving.model_stage published; on Kubernetes check the volume mount and subPath.")
    if logf.get("address_in_use"):
        ev = ["%s ended with %s: its port%s is already in use" % (what, status, " %s" % port if port else "")]
        ev.append("%s: %s" % (where, logf["address_in_use"]))
        for holder in port_holders or []:
            ev.append("port %s is held by pid %s (%s)" % (holder["port"], holder["pid"], holder["comm"]))
        return finding("port_in_use", obj, ev,
                       "Another process listens on the engine's port (an engine that was not stopped, a second "
                       "engine with the same port): stop it or give this engine another --port.")
    if exit_code == 0 and not sig:
        ev = ["%s exited with status 0 (Completed); an inference server never exits 0 on its own" % what]
        ev += exc
        if masking:
            ev.append("the command hides the engine's exit status: %s" % "; ".join(masking))
        return finding("crash_exit_zero", obj, ev,
                       "A crash whose exit status was masked: read the exception above (on Kubernetes: kubectl logs "
                       "--previous). Make the engine the container's foreground process (exec, no '| tee', no nohup "
                       "'&') or use 'set -o pipefail' and 'wait' so the real status reaches Kubernetes.")
    ev = ["%s ended with %s" % (what, status)]
    if sig_guess:
        ev[0] += " (%s: 128 + %d)" % (_signal_name(sig_guess), sig_guess)
    if (sig or sig_guess) == _signal.SIGKILL and engine == "sglang" and (logf.get("root_exception") or logf.get("death_lines")):
        cause = logf.get("root_exception") or logf["death_lines"][0]
        ev = ["%s ended with %s after the engine's own exception: %s" % (what, status, cause)] + exc
        ev.append("SGLang kills its own process tree with SIGKILL after a scheduler failure (kill_process_tree); "
                  "with the pod's shared process namespace the engine is not PID 1, so the kill takes effect and "
                  "the status is 137")
        return finding("crashed", obj, ev, "The exception above is the cause (the SIGKILL is SGLang's own, not the "
                                           "OOM killer's or an operator's): fix it and start again.")
    ev += exc
    hint = "Read the exception above: it is the cause; fix it and start again."
    if (sig or sig_guess) == _signal.SIGKILL:
        hint = ("SIGKILL comes from outside the engine: the OOM killer (dmesg / journalctl -k), an operator, or a "
                "stop whose grace period ran out. " + ("Read the exception above." if exc else ""))
    elif not exc:
        hint = "The log shows no exception: read the whole log, the kernel log (dmesg) and the node's events."
    return finding("crashed", obj, ev, hint.strip())
