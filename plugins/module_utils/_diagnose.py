# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: name why an engine is not serving, from the evidence it left.

Evidence is what other components already write: the scheduler's and the kubelet's Events, a container's
``state`` / ``lastState``, the Gateway API conditions of the AIBrix route, EndpointSlices, the engine's own log
(current and previous container), and for a local engine the state file and log of ``engine_process``.
Each rule below restates one upstream behaviour and cites where it comes from; a rule returns findings
``{code, severity, object, evidence, hint}``: ``evidence`` is a list of facts (the first one is the
headline), ``hint`` says what fixes it.

The verdict is the code of the most severe finding; between findings of one severity, the one earlier in
:data:`CODES` wins (root causes come before their consequences: a pod that cannot be scheduled also has no
endpoints, an OOM kill is also a non-zero exit).

* :func:`diagnose_kubernetes` - pure: Kubernetes objects (dicts as the API returns them) and log texts in.
* :func:`fetch_kubernetes` - reads those objects and logs with a ``kubernetes`` ApiClient (raw JSON).
* :func:`local_facts` / :func:`diagnose_local` - the ``engine_process`` files, ``/proc`` (injectable
  ``proc_root``) and one ``GET /health``.
* :func:`analyse_log` - tracebacks, engine death lines, argparse errors, weight-loading progress.
"""
from __future__ import annotations

import json
import os
import re
import signal as _signal
import time

from ansible_collections.llmops.serving.plugins.module_utils import _http, _k8s_names, _k8s_wait, _process, _process_command, _process_run, _process_state, _secrets
from ansible_collections.llmops.serving.plugins.module_utils._untrusted import UntrustedInput, loads_json, open_regular

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

#: The gateway looks the model up through this route name (AIBrix v0.3.0-v0.7.0, pkg/plugins/gateway/gateway.go).
AIBRIX_NAME_LABEL = "model.aibrix.ai/name"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # EndpointSlice -> Service (discovery.k8s.io/v1)
# Pods of the workload kinds, by the label their controller sets.
STORM_LABEL = "storm-service-name"  # AIBrix pkg/controller/constants/stormservice.go
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"  # kubernetes-sigs/lws api/leaderworkerset/v1/labels

MAX_EVIDENCE = 8
MAX_LINE = 400
#: A start without a probe to bound it is "still loading" only this long: four times the slowest cold start
#: measured in the field (28 min for a 700 GiB FP8 model with JIT and CUDA graphs), rounded up to 2 h.
PLAUSIBLE_START_SECONDS = 7200


def finding(code, obj, evidence, hint):
    ev = [_clip(e) for e in evidence if e][:MAX_EVIDENCE]
    return {"code": code, "severity": SEVERITY[code], "object": obj, "evidence": ev, "hint": hint}


def _clip(text):
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


def _fmt_s(seconds):
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


def _time(value):
    return _k8s_wait.parse_time(value)


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
_ADDR_IN_USE = re.compile(r"\[Errno 98\][^\n]*[Aa]ddress already in use|EADDRINUSE")
LOG_TAIL_BYTES = 512 * 1024


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
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    total = 0
    for p in parts:
        total = total * 60 + p
    return total


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
             "address_in_use": None, "serving_line": None, "lines": len(lines),
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
        if m:
            facts["progress"] = {"desc": m.group("desc"), "n": int(m.group("n")), "total": int(m.group("total")),
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
        if facts["serving_line"] is None and _SERVING.search(s):
            facts["serving_line"] = s
        if facts["address_in_use"] is None and _ADDR_IN_USE.search(s):
            facts["address_in_use"] = s
    return facts


def _progress_text(progress):
    if not progress:
        return None
    text = "the log shows %s" % progress["line"]
    if progress["n"] >= progress["total"]:
        text += " (weights read; still initialising: all-rank sync, JIT, KV cache, CUDA graphs)"
    elif progress.get("remaining_s") is not None and progress.get("elapsed_s") is not None:
        text += "; tqdm estimated %s more for the weights alone" % _fmt_s(progress["remaining_s"])
    return text


def _exception_evidence(logf, where):
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


def _container_argv(container):
    return list(container.get("command") or []) + list(container.get("args") or [])


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
    exc = _exception_evidence(logf, where)
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


# --------------------------------------------------------------------------------------------- #
# Kubernetes: the objects and logs one engine left
# --------------------------------------------------------------------------------------------- #

def _meta(obj):
    return obj.get("metadata") or {}


def _ns(obj):
    return _meta(obj).get("namespace") or ""


def _nm(obj):
    return _meta(obj).get("name") or ""


def ref(obj):
    return "%s %s/%s" % (obj.get("kind", "?"), _ns(obj), _nm(obj))


def _selector_matches(selector, labels):
    """metav1.LabelSelector semantics (apimachinery pkg/apis/meta/v1/helpers.go LabelSelectorAsSelector)."""
    if selector is None:
        return False
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _map_selects(selector, labels):
    """A Service's plain ``selector`` map (an empty one selects nothing: core/v1 ServiceSpec)."""
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


class Objects(object):
    """The objects by kind, and which kinds were listed whole (so that an absent object means absent)."""

    def __init__(self, objects, listed_kinds=None):
        self.by_kind = {}
        for obj in objects or []:
            if isinstance(obj, dict) and obj.get("kind"):
                self.by_kind.setdefault(obj["kind"], []).append(obj)
            elif isinstance(obj, dict) and obj.get("items") is not None:  # a List as kubectl -o json writes it
                for item in obj.get("items") or []:
                    if isinstance(item, dict) and item.get("kind"):
                        self.by_kind.setdefault(item["kind"], []).append(item)
        self.listed = set(listed_kinds) if listed_kinds is not None else set(self.by_kind)

    def of(self, kind, namespace=None):
        return [o for o in self.by_kind.get(kind, []) if namespace is None or _ns(o) == namespace]

    def get(self, kind, namespace, name):
        for o in self.of(kind, namespace):
            if _nm(o) == name:
                return o
        return None


class Logs(object):
    """``logs`` as given: ``{"POD/CONTAINER" or "POD": TEXT or {"current": TEXT, "previous": TEXT}}``."""

    def __init__(self, logs):
        self.data = {}
        for key, value in (logs or {}).items():
            if isinstance(value, dict):
                entry = {"current": value.get("current"), "previous": value.get("previous")}
            else:
                entry = {"current": value, "previous": None}
            self.data[str(key)] = entry

    def get(self, pod, container, which, only_container=False):
        entry = self.data.get("%s/%s" % (pod, container))
        if entry is None and only_container:
            entry = self.data.get(pod)
        return (entry or {}).get(which)


def normalise_event(ev):
    """core/v1 Event and events.k8s.io/v1 Event -> ``{kind, name, uid, field, reason, message, type, count, last}``."""
    inv = ev.get("involvedObject") or ev.get("regarding") or {}
    series = ev.get("series") or {}
    return {
        "kind": inv.get("kind"), "name": inv.get("name"), "namespace": inv.get("namespace") or _ns(ev),
        "uid": inv.get("uid"), "field": inv.get("fieldPath") or "",
        "reason": ev.get("reason") or "", "message": ev.get("message") or ev.get("note") or "",
        "type": ev.get("type") or "", "count": ev.get("count") or series.get("count") or ev.get("deprecatedCount") or 1,
        "last": _time(ev.get("lastTimestamp") or series.get("lastObservedTime") or ev.get("eventTime")
                      or ev.get("deprecatedLastTimestamp") or _meta(ev).get("creationTimestamp")),
        "first": ev.get("firstTimestamp") or ev.get("deprecatedFirstTimestamp") or ev.get("eventTime"),
    }


def _event_text(ev):
    count = " (x%d)" % ev["count"] if ev["count"] and ev["count"] > 1 else ""
    return "Event %s%s: %s" % (ev["reason"], count, ev["message"])


def _probe_window(probe):
    """Seconds a probe allows before the kubelet acts: initialDelaySeconds + failureThreshold x periodSeconds.

    Defaults from k8s.io/api core/v1 types.go Probe: periodSeconds 10, failureThreshold 3, initialDelaySeconds 0.
    """
    if not probe:
        return None
    delay = int(probe.get("initialDelaySeconds") or 0)
    period = int(probe.get("periodSeconds") or 10)
    threshold = int(probe.get("failureThreshold") or 3)
    return {"seconds": delay + threshold * period, "text": "%d s = %d + %d x %d s" % (
        delay + threshold * period, delay, threshold, period)}


class KubeContext(object):

    def __init__(self, objects, logs, namespace, name, served_model_name, gateway_namespace, now, listed_kinds):
        self.o = Objects(_k8s_wait.shape_objects(objects), listed_kinds)
        self.logs = Logs(_k8s_wait.shape_logs(logs))
        self.namespace = namespace
        self.name = name
        self.served_model_name = served_model_name
        self.gateway_namespace = gateway_namespace or "aibrix-system"
        self.now = time.time() if now is None else now
        self.events = [normalise_event(e) for e in self.o.of("Event")]

    def events_for(self, kind, name, uid=None, container=None):
        out = []
        for ev in self.events:
            if ev["kind"] != kind or ev["name"] != name:
                continue
            if uid and ev["uid"] and ev["uid"] != uid:
                continue
            if container and ev["field"] and ev["field"] != "spec.containers{%s}" % container \
                    and ev["field"] != "spec.initContainers{%s}" % container:
                continue
            out.append(ev)
        return sorted(out, key=lambda e: e["last"] or 0)


WORKLOAD_KINDS = ("Deployment", "StormService", "LeaderWorkerSet")


def _templates(workload):
    """Pod templates of a workload (Deployment; AIBrix StormService roles; LeaderWorkerSet leader/worker)."""
    spec = workload.get("spec") or {}
    kind = workload.get("kind")
    if kind == "Deployment":
        return [spec.get("template") or {}]
    if kind == "StormService":
        return [r.get("template") or {} for r in ((spec.get("template") or {}).get("spec") or {}).get("roles") or []]
    if kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    return []


def _workload_pods(ctx, workload):
    pods = ctx.o.of("Pod", ctx.namespace)
    if workload is not None:
        kind = workload.get("kind")
        if kind == "Deployment":
            sel = (workload.get("spec") or {}).get("selector")
            return [p for p in pods if _selector_matches(sel, _meta(p).get("labels"))]
        label = STORM_LABEL if kind == "StormService" else LWS_LABEL
        return [p for p in pods if (_meta(p).get("labels") or {}).get(label) == ctx.name]
    for label in ("app.kubernetes.io/name", STORM_LABEL, LWS_LABEL, "app"):
        found = [p for p in pods if (_meta(p).get("labels") or {}).get(label) == ctx.name]
        if found:
            return found
    return [p for p in pods if _nm(p).startswith(ctx.name + "-")]


# ---- pods -------------------------------------------------------------------------------------

# pkg/scheduler/framework/plugins/noderesources/fit.go: "Insufficient <resource>" per node in the message
# "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, ..."
_INSUFFICIENT = re.compile(r"(?:(?P<count>\d+) )?Insufficient (?P<res>[A-Za-z0-9][A-Za-z0-9./_-]*[A-Za-z0-9])")
_AVAILABLE = re.compile(r"(?P<free>\d+)/(?P<total>\d+) nodes are available")
_ACCEL = re.compile(r"gpu|rdma|hca|infiniband|neuron|tpu|roce", re.I)


def rule_unschedulable(ctx, pod, pod_ref):
    """FailedScheduling events (reason written by pkg/scheduler/schedule_one.go) and PodScheduled=False/Unschedulable.

    ``unschedulable_gpus`` when the scheduler names an accelerator or RDMA resource as ``Insufficient``.
    """
    status = pod.get("status") or {}
    cond = _k8s_wait.condition(status.get("conditions"), "PodScheduled")
    if (pod.get("spec") or {}).get("nodeName") or (cond and cond.get("status") == "True"):
        return None
    msgs = []
    if cond and cond.get("status") == "False":
        msgs.append("PodScheduled=False reason %s: %s" % (cond.get("reason"), cond.get("message", "")))
    evs = [e for e in ctx.events_for("Pod", _nm(pod), _meta(pod).get("uid")) if e["reason"] == "FailedScheduling"]
    if evs:
        msgs.append(_event_text(evs[-1]))
    if not msgs:
        return None
    text = " ".join(msgs)
    requested = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for res, qty in (((c.get("resources") or {}).get("limits")) or {}).items():
            requested[res] = qty
    short = sorted({m.group("res") for m in _INSUFFICIENT.finditer(text)})
    accel = [r for r in short if _ACCEL.search(r) or (r in requested and "/" in r)]
    created = _time(_meta(pod).get("creationTimestamp"))
    head = "not scheduled%s" % (" for %s" % _fmt_s(ctx.now - created) if created else "")
    latest = (evs[-1]["message"] if evs else cond.get("message", "")).split("preemption:")[0]
    nodes = _AVAILABLE.search(latest)
    of = " of %s" % nodes.group("total") if nodes else ""
    counts = ["Insufficient %s on %s%s node(s)" % (m.group("res"), m.group("count") or "?", of)
              for m in _INSUFFICIENT.finditer(latest)]
    if counts:
        head += ": " + ", ".join(counts)
    ev = [head] + msgs
    if accel:
        asks = ", ".join("%s %s" % (requested[r], r) for r in accel if r in requested)
        if asks:
            ev.append("the pod requests %s per replica" % asks)
        return finding("unschedulable_gpus", pod_ref, ev,
                       "No node has %s free for this pod. Free them (a terminating pod of the previous revision holds "
                       "them until it exits: the engine rolls with maxSurge 0, so that clears by itself; other workloads "
                       "on the GPU nodes do not), lower tp_size/replicas, or add nodes; "
                       "check `kubectl describe node` Allocated resources and that the device plugin advertises "
                       "the resource." % " and ".join(accel))
    hint = ("The scheduler's message names the reason per node: fix the nodeSelector/affinity, add the "
            "tolerations for the GPU nodes' taints, or bind the PersistentVolumeClaim.")
    if "node affinity/selector" in text:
        hint += (" The engine role pins its pods to the nodes that staged the revision (required node affinity on "
                 "kubernetes.io/hostname from each host's k8s_node_name): stage the revision on enough nodes, and "
                 "set k8s_node_name where the inventory name is not the node's name.")
    return finding("unschedulable", pod_ref, ev, hint)


def _waiting_rule(ctx, pod, pod_ref, cs):
    """Containers that never started: image pulls, config references, volume mounts.

    Waiting reasons from pkg/kubelet/images/types.go (ErrImagePull, ImagePullBackOff, InvalidImageName) and
    pkg/kubelet/kuberuntime (CreateContainerConfigError, CreateContainerError); events Failed/BackOff "Back-off
    pulling image" (pkg/kubelet/images/image_manager.go) and FailedMount (pkg/kubelet/volumemanager).
    """
    waiting = (cs.get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason") or ""
    cname = cs.get("name")
    obj = "%s container %s" % (pod_ref, cname)
    evs = ctx.events_for("Pod", _nm(pod), _meta(pod).get("uid"))
    if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
        pulls = [e for e in evs if e["reason"] in ("Failed", "BackOff", "InspectFailed")
                 and ("image" in e["message"].lower() or "pull" in e["message"].lower())]
        ev = ["container %s is waiting: %s: %s" % (cname, reason, waiting.get("message", ""))]
        ev += [_event_text(e) for e in pulls[-3:]]
        return finding("image_pull", obj, ev,
                       "The node cannot pull the image: check the reference (tag or digest exists), the "
                       "imagePullSecret (registry credentials in the pod's namespace) and that the node reaches the "
                       "registry.")
    if reason in ("CreateContainerConfigError", "CreateContainerError", "RunContainerError"):
        ev = ["container %s is waiting: %s: %s" % (cname, reason, waiting.get("message", ""))]
        ev += [_event_text(e) for e in evs if e["reason"] == "Failed"][-2:]
        return finding("container_config", obj, ev,
                       "The container spec references something missing (a Secret or ConfigMap key, e.g. the HF token "
                       "Secret) or the runtime refused it: create the referenced object in the pod's namespace.")
    return None


def rule_mount(ctx, pod, pod_ref):
    """FailedMount / FailedAttachVolume events while the pod's containers are still being created."""
    evs = [e for e in ctx.events_for("Pod", _nm(pod), _meta(pod).get("uid"))
           if e["reason"] in ("FailedMount", "FailedAttachVolume", "FailedMapVolume")]
    if not evs:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if any((cs.get("state") or {}).get("running") or cs.get("restartCount") for cs in statuses):
        return None  # mounted in the end
    names = sorted(set(re.findall(r'volume "([^"]+)"', " ".join(e["message"] for e in evs)))
                   | set(x for m in re.findall(r"unmounted volumes=\[([^\]]*)\]", " ".join(e["message"] for e in evs))
                         for x in m.split()))
    return finding("mount_failed", pod_ref, ["the containers cannot start: volume %s does not mount"
                                             % ", ".join(names or ["?"])] + [_event_text(e) for e in evs[-3:]],
                   "Fix the volume named in the event: a hostPath model volume (type Directory) exists only on the "
                   "nodes that staged the revision, so stage it on this node (llmops.serving.model_stage) or keep "
                   "the pod on the staged nodes; a PVC must exist and be Bound, with the shared filesystem's CSI "
                   "driver on the node; a Secret must exist in the pod's namespace.")


def _probe_kills(evs, cname):
    """kubelet Killing events for a probe: "Container <name> failed <startup|liveness> probe, will be restarted"
    (pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions)."""
    out = []
    for e in evs:
        m = re.search(r"Container (\S+) failed (startup|liveness) probe", e["message"])
        if e["reason"] == "Killing" and m and m.group(1) == cname:
            out.append((m.group(2), e))
    return out


def _unhealthy(evs, probe_type):
    """kubelet Unhealthy events: "<Startup|Liveness|Readiness> probe failed: <output>" (pkg/kubelet/prober/prober.go)."""
    return [e for e in evs if e["reason"] == "Unhealthy" and e["message"].startswith("%s probe failed" % probe_type)]


def _served_before(pod, started_at, logf):
    """The engine served in this run of its container: its log says so, or the pod's Ready condition changed
    after the container started (it went Ready, then not)."""
    if logf.get("serving_line"):
        return True
    cond = _k8s_wait.condition((pod.get("status") or {}).get("conditions"), "Ready") or {}
    changed = _time(cond.get("lastTransitionTime"))
    return bool(changed and started_at and changed > started_at + 5)


def _container_spec(pod, cname):
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == cname:
            return c
    return {}


def rule_container(ctx, pod, pod_ref, cs, is_init=False):
    """One finding per container, the most specific one: waiting, terminated (now or last), probe, loading."""
    cname = cs.get("name")
    obj = "%s container %s" % (pod_ref, cname)
    spec = _container_spec(pod, cname)
    single = len((pod.get("spec") or {}).get("containers") or []) == 1
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    term_now = state.get("terminated")
    restarts = int(cs.get("restartCount") or 0)
    evs = ctx.events_for("Pod", _nm(pod), _meta(pod).get("uid"), container=cname)
    found = _waiting_rule(ctx, pod, pod_ref, cs)
    if found:
        return found
    term = term_now or (last if (restarts or (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff") else None)
    which = "current" if term_now else "previous"
    log_text = ctx.logs.get(_nm(pod), cname, which, single)
    if log_text is None and not term_now:
        log_text = ctx.logs.get(_nm(pod), cname, "current", single)
    logf = analyse_log(log_text or "")
    where = "log (%s)" % ("kubectl logs --previous" if which == "previous" else "kubectl logs")
    startup = _probe_window(spec.get("startupProbe"))
    liveness = _probe_window(spec.get("livenessProbe"))
    if term and is_init and term.get("exitCode") == 0:
        return None
    if term:
        ran = None
        if _time(term.get("finishedAt")) and _time(term.get("startedAt")):
            ran = _time(term["finishedAt"]) - _time(term["startedAt"])
        kills = _probe_kills(evs, cname)
        back = [e for e in evs if e["reason"] == "BackOff" and "restarting failed container" in e["message"]]
        what = "container %s%s" % (cname, " (restarted %d time%s)" % (restarts, "s" if restarts > 1 else "")
                                   if restarts else "")
        if term.get("reason") == "OOMKilled":
            return classify_exit(what, obj, term.get("exitCode"), term.get("signal"), logf, where, oom=True)
        # The liveness probe runs only after the startup probe succeeded (pkg/kubelet/prober/worker.go: liveness and
        # readiness results wait for "started"), so a liveness kill with a startupProbe is a kill of an engine that
        # had come up. vLLM then shuts down cleanly on the kubelet's SIGTERM: exit 0 / Completed is that shutdown,
        # not a masked crash.
        if kills and kills[-1][0] == "liveness" and (logf.get("serving_line") or spec.get("startupProbe")):
            kev = kills[-1][1]
            fails = _unhealthy(evs, "Liveness")
            since = ("after it had served (%s)" % logf["serving_line"] if logf.get("serving_line")
                     else "after its startup probe had passed")
            ev = ["container %s was killed by its liveness probe %s: the engine stopped answering /health" % (cname, since),
                  _event_text(kev)] + [_event_text(e) for e in fails[-1:]]
            if term.get("exitCode") == 0:
                ev.append("exit code 0 (%s) is the engine's clean shutdown on the kubelet's SIGTERM, not a masked crash"
                          % term.get("reason"))
            return finding("engine_hung", obj, ev + _exception_evidence(logf, where),
                           "The engine stopped answering /health while serving: read the end of the previous log (a "
                           "stuck collective, a dead EngineCore, an overloaded event loop); the restart hides it until "
                           "it recurs.")
        if kills:
            probe_type, kev = kills[-1]
            window = startup if probe_type == "startup" else liveness
            prog = logf.get("progress")
            head = "container %s was killed by its %s probe%s" % (
                cname, probe_type, " after running %s" % _fmt_s(ran) if ran is not None else "")
            if window:
                head += " (its window is %s)" % _fmt_s(window["seconds"])
            if prog:
                head += (" while still loading: %s/%s shards" % (prog["n"], prog["total"]) if prog["n"] < prog["total"]
                         else " after loading all %s shards (still initialising)" % prog["total"])
            ev = [head]
            if window:
                ev.append("the %s probe allows %s (initialDelaySeconds + failureThreshold x periodSeconds)"
                          % (probe_type, window["text"]))
            ev.append(_event_text(kev))
            fails = _unhealthy(evs, probe_type.capitalize())
            if fails:
                ev.append(_event_text(fails[-1]))
            if prog:
                ev.append("when it was killed, the log (kubectl logs --previous) showed %s" % prog["line"])
                if prog.get("remaining_s") is not None and prog.get("elapsed_s") is not None and prog["n"] < prog["total"]:
                    ev.append("the weights alone need about %s (tqdm: %s elapsed + %s remaining); the window must also "
                              "cover all-rank sync, JIT, KV cache and CUDA graphs" % (
                                  _fmt_s(prog["elapsed_s"] + prog["remaining_s"]), _fmt_s(prog["elapsed_s"]),
                                  _fmt_s(prog["remaining_s"])))
            ev += ["restarts: %d, last exit code %s (reason %s)" % (restarts, term.get("exitCode"), term.get("reason"))]
            if probe_type == "liveness" and not spec.get("startupProbe"):
                ev.append("there is no startupProbe, so the liveness probe runs during the cold start")
            return finding("startup_probe_killed", obj, ev,
                           "The probe window is shorter than the engine's cold start (weights, all-rank sync, JIT, KV "
                           "cache, CUDA graphs; the field report measured 17-28 min for a 700 GiB FP8 model): the "
                           "kubelet kills it just before it is ready, forever. Size the startupProbe for the measured "
                           "cold start (failureThreshold x periodSeconds >= it, e.g. engine_startup_timeout 3600) and "
                           "keep liveness/readiness short behind it.")
        masking = _process_command.command_problems(_container_argv(spec), read_files=False) if spec else []
        cmd = command_facts(_container_argv(spec)) if spec else {}
        f = classify_exit(what, obj, term.get("exitCode"), term.get("signal"), logf, where, masking=masking,
                          port=cmd.get("port"), engine=cmd.get("engine"))
        if back:
            f["evidence"].append(_clip(_event_text(back[-1])))
        if term.get("message"):
            f["evidence"].append(_clip("termination message: %s" % term["message"]))
        return f
    running = state.get("running")
    if not running or is_init:
        return None
    started_at = _time(running.get("startedAt"))
    elapsed = ctx.now - started_at if started_at else None
    if cs.get("ready"):
        if logf["tracebacks"]:
            return finding("engine_traceback", obj,
                           ["container %s serves, but its log holds %d traceback(s)" % (cname, len(logf["tracebacks"]))]
                           + _exception_evidence(logf, where),
                           "The engine answers its probes but some requests failed: read the exception; a crash of "
                           "this kind often recurs under load.")
        return None
    # ContainerStatus.started: true once the startup probe passed, at once when there is none (core/v1 types.go)
    if cs.get("started") is False or (cs.get("started") is None and spec.get("startupProbe")) or \
            (not spec.get("startupProbe") and not _served_before(pod, started_at, logf)):
        window = startup or liveness
        ev = ["container %s has been starting for %s%s" % (
            cname, _fmt_s(elapsed), " of its %s %s window (%s)" % (
                _fmt_s(window["seconds"]), "startup" if startup else "liveness", window["text"]) if window else "")]
        if not startup and liveness:
            ev.append("there is no startupProbe: the liveness probe runs during the cold start and kills a slow load")
        progress = _progress_text(logf.get("progress"))
        if progress:
            ev.append(progress)
        if window and elapsed is not None and elapsed > window["seconds"]:
            fails = _unhealthy(evs, "Startup")
            return finding("startup_probe_killed", obj, ev + [_event_text(e) for e in fails[-1:]],
                           "It has run past its startup window: the kubelet is killing it. Size the startupProbe for the "
                           "measured cold start (failureThreshold x periodSeconds).")
        if not window and elapsed is not None and elapsed > PLAUSIBLE_START_SECONDS:
            ev.append("no probe bounds its start, and no cold start takes longer than %s" % _fmt_s(PLAUSIBLE_START_SECONDS))
            return finding("engine_hung", obj, ev + _exception_evidence(logf, where),
                           "It is not loading any more: read the log's last lines (a stuck collective, a wait for a "
                           "peer that never joined), restart it, and give it a startupProbe sized for its cold start.")
        if window:
            return finding("still_loading", obj, ev, "Not an error: the engine is inside its startup window; wait.")
        return finding("still_loading", obj, ev, "Not an error yet: no probe bounds its start; a cold start takes up to "
                                                 "about 30 min (weights, JIT, CUDA graphs). Wait, and give it a "
                                                 "startupProbe so that a stuck start ends.")
    # started (the startup probe passed) but not Ready: readiness or liveness fail now
    fails = _unhealthy(evs, "Readiness") + _unhealthy(evs, "Liveness")
    ev = ["container %s started but is not Ready" % cname] + [_event_text(e) for e in fails[-2:]]
    ev += _exception_evidence(logf, where)
    return finding("engine_hung", obj, ev,
                   "The engine passed its startup probe and then stopped answering /health: read the log for a "
                   "stuck collective (NCCL timeout) or a dead EngineCore; a restart clears it, the log says why.")


def rule_evicted(ctx, pod, pod_ref):
    """A node-pressure eviction: the kubelet fails the pod with ``status.reason: Evicted`` and a message naming the
    resource (kubernetes/kubernetes pkg/kubelet/eviction/eviction_manager.go, helpers.go evictionMessage "The node
    was low on resource: ..."), a ``DisruptionTarget`` condition (reason ``TerminationByKubelet``) and an ``Evicted``
    Event; its container statuses may never have been recorded."""
    status = pod.get("status") or {}
    if status.get("reason") != "Evicted" or status.get("phase") not in ("Failed", None):
        return None
    node = (pod.get("spec") or {}).get("nodeName") or "?"
    ev = ["the kubelet evicted the pod from node %s: %s" % (node, status.get("message") or "no message recorded")]
    cond = _k8s_wait.condition(status.get("conditions"), "DisruptionTarget")
    if cond:
        ev.append("DisruptionTarget=%s reason %s: %s" % (cond.get("status"), cond.get("reason"), cond.get("message", "")))
    ev += [_event_text(e) for e in ctx.events_for("Pod", _nm(pod), _meta(pod).get("uid")) if e["reason"] == "Evicted"][-2:]
    return finding("evicted", pod_ref, ev,
                   "The node ran short of the resource named (memory, ephemeral storage, PIDs): the engine's pod used "
                   "more than the node could spare (host memory while loading, /dev/shm, logs and caches on the node's "
                   "disk). Give the pod requests equal to its use, free the node or move the caches to a volume; the "
                   "controller creates a replacement, delete the Failed pod once read.")


# The scheduler's preemption summary (pkg/scheduler/framework/preemption/preemption.go): "preemption: 0/N nodes
# are available: N Preemption is not helpful for scheduling." - no node fits even if every lower-priority pod
# left (UnschedulableAndUnresolvable on each node); "No preemption victims found" means room could free up.
_NO_FIT = re.compile(r"preemption: 0/(?P<total>\d+) nodes are available: (?P<n>\d+) Preemption is not helpful for "
                     r"scheduling")
# The kubelet retries a failed volume setup with exponential backoff up to 2m2s (kubernetes/kubernetes
# pkg/util/goroutinemap/exponentialbackoff); a failure still there after this long, seen twice, does not clear.
MOUNT_PERSIST_SECONDS = 90
NO_FIT_PERSIST_SECONDS = 60
# A pull of a tag or digest the registry does not have (containerd "failed to resolve reference ...: not found",
# docker "manifest unknown"): retrying never finds it.
_IMAGE_NOT_FOUND = re.compile(r"not found|NotFound|manifest unknown|repository does not exist", re.I)


def pod_blocked(ctx, pod):
    """A finding for what never clears by waiting, or None: an eviction, a container config error, an image that
    does not exist, a volume that keeps failing to mount (``MOUNT_PERSIST_SECONDS``), no feasible node even with
    preemption (for ``NO_FIT_PERSIST_SECONDS``, and no cluster-autoscaler scale-up under way)."""
    pod_ref = "pod %s/%s" % (_ns(pod), _nm(pod))
    f = rule_evicted(ctx, pod, pod_ref)
    if f:
        return f
    evs = ctx.events_for("Pod", _nm(pod), _meta(pod).get("uid"))
    f = rule_unschedulable(ctx, pod, pod_ref)
    if f:
        cond = _k8s_wait.condition((pod.get("status") or {}).get("conditions"), "PodScheduled") or {}
        sched = [e for e in evs if e["reason"] == "FailedScheduling"]
        text = sched[-1]["message"] if sched else cond.get("message") or ""
        m = _NO_FIT.search(text.strip())
        since = _time(cond.get("lastTransitionTime")) or _time(_meta(pod).get("creationTimestamp"))
        scaling = [e for e in evs if e["reason"] == "TriggeredScaleUp"]
        if m and m.group("n") == m.group("total") and not scaling and since is not None \
                and ctx.now - since >= NO_FIT_PERSIST_SECONDS:
            f["evidence"].insert(1, "no node can ever take it: the scheduler reports for all %s nodes that preemption "
                                    "would not help" % m.group("total"))
            return f
        return None
    f = rule_mount(ctx, pod, pod_ref)
    if f:
        mounts = [e for e in evs if e["reason"] in ("FailedMount", "FailedAttachVolume", "FailedMapVolume")]
        first = min((_time(e.get("first")) or e["last"] or ctx.now for e in mounts), default=ctx.now)
        if sum(e["count"] for e in mounts) >= 2 and ctx.now - first >= MOUNT_PERSIST_SECONDS:
            f["evidence"].insert(1, "the mount has failed for %s" % _fmt_s(ctx.now - first))
            return f
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        f = _waiting_rule(ctx, pod, pod_ref, cs)
        if f is None:
            continue
        if f["code"] == "container_config":
            return f
        waiting = (cs.get("state") or {}).get("waiting") or {}
        texts = [waiting.get("message") or ""] + [e["message"] for e in evs if e["reason"] in ("Failed", "BackOff")]
        if f["code"] == "image_pull" and (waiting.get("reason") == "InvalidImageName"
                                          or any(_IMAGE_NOT_FOUND.search(t) for t in texts)):
            f["evidence"].insert(1, "the registry does not have this image: pulling again cannot succeed")
            return f
    return None


def _pod_ready(pod):
    return (_k8s_wait.condition((pod.get("status") or {}).get("conditions"), "Ready") or {}).get("status") == "True"


def rule_not_ready(ctx, pod):
    """A pod that is not Ready and that no other rule explained: never ``healthy``. The evidence says what its
    status holds (phase, the Ready condition, init containers still running, containers without a status)."""
    pod_ref = "pod %s/%s" % (_ns(pod), _nm(pod))
    status = pod.get("status") or {}
    ev = ["the pod is not Ready (phase %s)" % (status.get("phase") or "not recorded")]
    ready = _k8s_wait.condition(status.get("conditions"), "Ready")
    if ready:
        ev.append("Ready=%s reason %s: %s" % (ready.get("status"), ready.get("reason"), ready.get("message", "")))
    else:
        ev.append("its status records no Ready condition")
    for cs in status.get("initContainerStatuses") or []:
        st = cs.get("state") or {}
        if not (st.get("terminated") or {}).get("exitCode") == 0:
            what = "running" if st.get("running") else (st.get("waiting") or {}).get("reason") or "not finished"
            ev.append("init container %s is %s: the engine container starts after it" % (cs.get("name"), what))
    named = set(cs.get("name") for cs in status.get("containerStatuses") or [])
    missing = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") not in named]
    if missing or not status.get("containerStatuses"):
        ev.append("no status recorded for container(s) %s" % ", ".join(map(str, missing or ["(any)"])))
    if status.get("reason") or status.get("message"):
        ev.append("status reason %s: %s" % (status.get("reason"), status.get("message") or ""))
    return finding("not_ready", pod_ref, ev, "Not serving yet: read `kubectl describe pod` and its events; wait while "
                                             "init containers run, or diagnose again once the containers report.")


def pod_findings(ctx, pod):
    pod_ref = "pod %s/%s" % (_ns(pod), _nm(pod))
    out = []
    f = rule_evicted(ctx, pod, pod_ref)
    if f:
        return [f]
    f = rule_unschedulable(ctx, pod, pod_ref)
    if f:
        return [f]
    f = rule_mount(ctx, pod, pod_ref)
    if f:
        return [f]
    status = pod.get("status") or {}
    for cs in status.get("initContainerStatuses") or []:
        f = rule_container(ctx, pod, pod_ref, cs, is_init=True)
        if f:
            out.append(f)
    for cs in status.get("containerStatuses") or []:
        f = rule_container(ctx, pod, pod_ref, cs)
        if f:
            out.append(f)
    return out


# ---- names, routes, endpoints ------------------------------------------------------------------

def _header_models(route):
    """Values of the ``model`` header matches (AIBrix modelrouter_controller.go: header ``model`` Exact)."""
    out = []
    for rule in (route.get("spec") or {}).get("rules") or []:
        for m in rule.get("matches") or []:
            for h in m.get("headers") or []:
                if (h.get("name") or "").lower() == "model" and h.get("value") not in out:
                    out.append(h.get("value"))
    return out


def rule_served_names(ctx, pods, templates):
    """The AIBrix label, the engine's --served-model-name and the requested name must be byte-identical
    (AIBrix samples/disaggregation/vllm/README.md; the gateway answers 400 "model ... does not exist" otherwise)."""
    labels, engine_names = {}, {}
    sources = [("pod %s/%s" % (_ns(p), _nm(p)), _meta(p).get("labels") or {}, (p.get("spec") or {}).get("containers") or [])
               for p in pods]
    if not sources:
        sources = [("pod template", (t.get("metadata") or {}).get("labels") or {}, (t.get("spec") or {}).get("containers") or [])
                   for t in templates]
    for where, lab, containers in sources:
        if AIBRIX_NAME_LABEL in lab:
            labels.setdefault(lab[AIBRIX_NAME_LABEL], where)
        for c in containers:
            cmd = command_facts(_container_argv(c))
            if cmd["engine"] and cmd["served_names"]:
                engine_names.setdefault(tuple(cmd["served_names"]), (where, c.get("name"), cmd["served_names_given"]))
    ev = []
    label_values = sorted(labels)
    if len(label_values) > 1:
        ev.append("pods carry different %s labels: %s" % (AIBRIX_NAME_LABEL, ", ".join(repr(v) for v in label_values)))
    label = label_values[0] if label_values else None
    for names, (where, cname, given) in engine_names.items():
        if label is not None and label not in names:
            ev.append("%s container %s serves %s%s but is labelled %s=%r" % (
                where, cname, " ".join(repr(n) for n in names), "" if given else " (no --served-model-name: the "
                "model path is the name)", AIBRIX_NAME_LABEL, label))
    wanted = ctx.served_model_name
    if wanted and label is not None and wanted != label:
        ev.append("the requested model %r differs from the label %s=%r" % (wanted, AIBRIX_NAME_LABEL, label))
    if wanted and label is None and engine_names and not any(wanted in n for n in engine_names):
        names = sorted({n for ns in engine_names for n in ns})
        ev.append("the requested model %r is not served (the engine serves %s)" % (wanted, ", ".join(map(repr, names))))
    route = _aibrix_route(ctx, wanted or label)
    if route is not None:
        expect = wanted or label
        other = [h for h in _header_models(route) if h != expect]
        if other:
            ev.append("%s matches header model=%s, not %r" % (ref(route), ",".join(repr(h) for h in other), expect))
    if not ev:
        return None
    return finding("served_name_mismatch", "model %s" % (wanted or label or "?"), ev,
                   "Use one name in all places: the request's model, the pod label %s, the engine's "
                   "--served-model-name and the route's header match (dots are fine in a label and a route name, "
                   "not in a Service name)." % AIBRIX_NAME_LABEL)


def _model_name(ctx, pods):
    """The requested model, else the AIBrix label of the first engine pod."""
    if ctx.served_model_name:
        return ctx.served_model_name
    for p in pods:
        labels = _meta(p).get("labels") or {}
        if AIBRIX_NAME_LABEL in labels:
            return labels[AIBRIX_NAME_LABEL]
    return None


def _aibrix_route(ctx, model):
    if not model:
        return None
    return ctx.o.get("HTTPRoute", ctx.gateway_namespace, "%s-router" % model)


def _grant_permits(grants, route_ns, svc_ns, svc_name):
    """gateway-api apis/v1beta1/referencegrant_types.go: a grant in the target's namespace, from HTTPRoute in
    ``route_ns`` (group gateway.networking.k8s.io), to core Services (group "", name empty or equal)."""
    for g in grants:
        if _ns(g) != svc_ns:
            continue
        spec = g.get("spec") or {}
        frm = any(f.get("group") == "gateway.networking.k8s.io" and f.get("kind") == "HTTPRoute"
                  and f.get("namespace") == route_ns for f in spec.get("from") or [])
        to = any((t.get("group") or "") == "" and t.get("kind") == "Service" and (not t.get("name") or t.get("name") == svc_name)
                 for t in spec.get("to") or [])
        if frm and to:
            return g
    return None


def rule_routes(ctx, pods):
    """The AIBrix route ``<model>-router`` in the gateway namespace: present, Accepted, its backends resolvable.

    Conditions and reasons from gateway-api apis/v1/shared_types.go (Accepted: NotAllowedByListeners,
    NoMatchingParent, ...; ResolvedRefs: BackendNotFound, RefNotPermitted, InvalidKind); AIBrix routes only when
    Accepted/Accepted and ResolvedRefs/ResolvedRefs (pkg/plugins/gateway, 503 otherwise).
    """
    model = _model_name(ctx, pods)
    if not model:
        return []
    rname = "%s-router" % model
    rref = "HTTPRoute %s/%s" % (ctx.gateway_namespace, rname)
    route = _aibrix_route(ctx, model)
    out = []
    if route is None:
        if "HTTPRoute" not in ctx.o.listed:
            return []
        others = [r for r in ctx.o.of("HTTPRoute") if model in _header_models(r)]
        ev = ["there is no %s; the AIBrix gateway looks model %r up by exactly that name" % (rref, model)]
        ev += ["%s matches header model=%r but the gateway never reads it" % (ref(r), model) for r in others[:3]]
        try:
            _k8s_names.route_name(model)
        except ValueError as e:
            ev.append(str(e))
        return [finding("route_missing", rref, ev,
                        "Create the HTTPRoute %s in %s (llmops.serving.engine_manifests renders it), or let the AIBrix "
                        "controller create it from the workload's model label; do not rename it." % (rname, ctx.gateway_namespace))]
    # backends
    missing_ev = []
    for rule in (route.get("spec") or {}).get("rules") or []:
        for b in rule.get("backendRefs") or []:
            if (b.get("kind") or "Service") != "Service" or (b.get("group") or "") != "":
                continue
            svc_ns = b.get("namespace") or _ns(route)
            svc_name = b.get("name") or ""
            svc = ctx.o.get("Service", svc_ns, svc_name)
            if svc is None and "Service" in ctx.o.listed:
                line = "backendRef Service %s/%s does not exist" % (svc_ns, svc_name)
                if not _k8s_names.is_dns1035_label(svc_name):
                    line += (" and never can: a Service name is a DNS-1035 label (lowercase letters, digits and '-', "
                             "starting with a letter; no dots)")
                safe = [s for s in ctx.o.of("Service", svc_ns) if _nm(s) == _k8s_names.service_name(svc_name)]
                if safe:
                    line += "; Service %s/%s exists" % (svc_ns, _nm(safe[0]))
                missing_ev.append(line)
            elif svc_ns != _ns(route) and "ReferenceGrant" in ctx.o.listed and \
                    not _grant_permits(ctx.o.of("ReferenceGrant"), _ns(route), svc_ns, svc_name):
                missing_ev.append("no ReferenceGrant in %s lets HTTPRoutes from %s reach Service %s"
                                  % (svc_ns, _ns(route), svc_name))
    accepted_ev = []
    parents = (route.get("status") or {}).get("parents") or []
    for parent in parents:
        gw = (parent.get("parentRef") or {}).get("name", "?")
        for ctype, good in (("Accepted", "Accepted"), ("ResolvedRefs", "ResolvedRefs")):
            cond = _k8s_wait.condition(parent.get("conditions"), ctype)
            if cond is None or (cond.get("status") == "True" and cond.get("reason") == good):
                continue
            line = "gateway %s: %s=%s reason %s: %s" % (gw, ctype, cond.get("status"), cond.get("reason"), cond.get("message", ""))
            explain = _k8s_wait.ROUTE_REASONS.get(cond.get("reason"))
            if ctype == "ResolvedRefs" and cond.get("status") == "False":
                missing_ev.append(line)
            else:
                accepted_ev.append(line + ("" if not explain else " (%s)" % explain))
    if not parents:
        accepted_ev.append("no gateway controller has reported on the route (status.parents is empty): its parentRef "
                           "names no Gateway that a controller serves")
    if missing_ev:
        out.append(finding("route_backend_not_found", rref, missing_ev,
                           "Point backendRefs at the engine's DNS-safe Service (%s for model %s, the name "
                           "llmops.serving.engine_manifests gives it), create that Service in the engine namespace, and "
                           "a ReferenceGrant there from HTTPRoutes in %s; the gateway answers 503 until ResolvedRefs is "
                           "True." % (_k8s_names.service_name(model), model, ctx.gateway_namespace)))
    if accepted_ev:
        out.append(finding("route_not_accepted", rref, ["the route is not accepted: %s" % accepted_ev[0]] + accepted_ev[1:],
                           "The Gateway must accept the route: parentRef names the AIBrix Gateway (aibrix-eg in "
                           "aibrix-system) and its listener's allowedRoutes admits the route's namespace."))
    return out


def _named_port(pod, name):
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == name:
                return True
    return False


def rule_endpoints(ctx, pods, route):
    """Services of the engine with no ready endpoint although an engine pod is Ready (selector or targetPort
    mismatch). EndpointSlice endpoints[].conditions.ready: nil means ready (discovery.k8s.io/v1 types.go)."""
    names = set()
    for s in ctx.o.of("Service", ctx.namespace):
        if any(_map_selects((s.get("spec") or {}).get("selector"), _meta(p).get("labels")) for p in pods):
            names.add((_ns(s), _nm(s)))
    if route is not None:
        for rule in (route.get("spec") or {}).get("rules") or []:
            for b in rule.get("backendRefs") or []:
                if (b.get("kind") or "Service") == "Service":
                    names.add((b.get("namespace") or _ns(route), b.get("name")))
    ready_pods = [p for p in pods if (_k8s_wait.condition((p.get("status") or {}).get("conditions"), "Ready") or {}).get("status") == "True"]
    out = []
    for svc_ns, svc_name in sorted(names):
        svc = ctx.o.get("Service", svc_ns, svc_name)
        if svc is None:
            continue
        sref = "Service %s/%s" % (svc_ns, svc_name)
        sel = (svc.get("spec") or {}).get("selector") or {}
        selected = [p for p in pods if _map_selects(sel, _meta(p).get("labels"))]
        if pods and not selected:
            labels = _meta(pods[0]).get("labels") or {}
            out.append(finding("service_no_endpoints", sref,
                               ["%s selects none of the engine's pods: selector %s, pod labels %s" % (
                                   sref, json.dumps(sel, sort_keys=True), json.dumps(labels, sort_keys=True))],
                               "Make the Service selector a subset of the engine pods' labels."))
            continue
        if "EndpointSlice" not in ctx.o.listed or not ready_pods:
            continue  # nothing to compare, or the pods explain it
        slices = [e for e in ctx.o.of("EndpointSlice", svc_ns) if (_meta(e).get("labels") or {}).get(SERVICE_NAME_LABEL) == svc_name]
        ready = sum(1 for sl in slices for ep in sl.get("endpoints") or []
                    if ((ep.get("conditions") or {}).get("ready")) is not False)
        if ready:
            continue
        ev = ["%s has no ready endpoint although %d engine pod(s) are Ready" % (sref, len(ready_pods))]
        ev.append("%d EndpointSlice(s) labelled %s=%s" % (len(slices), SERVICE_NAME_LABEL, svc_name))
        for port in (svc.get("spec") or {}).get("ports") or []:
            tp = port.get("targetPort")
            if isinstance(tp, str) and not _named_port(ready_pods[0], tp):
                ev.append("targetPort %r names no container port of the pods" % tp)
        out.append(finding("service_no_endpoints", sref, ev,
                           "Check the Service's targetPort against the container's named port and that the "
                           "EndpointSlice controller runs; the gateway has nowhere to send requests."))
    return out


def diagnose_kubernetes(objects, logs=None, namespace=None, name=None, served_model_name=None,
                        gateway_namespace="aibrix-system", now=None, listed_kinds=None):
    """Findings for the engine workload ``name`` in ``namespace`` from recorded or fetched objects.

    ``listed_kinds``: the kinds listed whole (an object of such a kind that is not there does not exist); by
    default every kind present in ``objects``.
    """
    ctx = KubeContext(objects, logs, namespace, name, served_model_name, gateway_namespace, now, listed_kinds)
    findings = []
    workload = None
    for kind in WORKLOAD_KINDS:
        workload = ctx.o.get(kind, namespace, name)
        if workload is not None:
            break
    pods = [p for p in _workload_pods(ctx, workload) if not _meta(p).get("deletionTimestamp")]
    wref = ref(workload) if workload else "workload %s/%s" % (namespace, name)
    if workload is None and not pods and any(k in ctx.o.listed for k in WORKLOAD_KINDS):
        findings.append(finding("workload_not_found", wref,
                                ["no Deployment, StormService or LeaderWorkerSet %s/%s and no pods of it" % (namespace, name)],
                                "Check name and namespace (the engine role names the Deployment after the DNS-safe "
                                "service name, e.g. glm-5-2-fp8-vllm)."))
    elif workload is not None and not pods:
        evs = []
        for e in ctx.events:
            if e["reason"] in ("FailedCreate", "FailedCreatePodSandBox", "ProgressDeadlineExceeded") or (
                    e["kind"] in WORKLOAD_KINDS + ("ReplicaSet",) and e["type"] == "Warning"):
                evs.append(_event_text(e))
        replicas = (workload.get("spec") or {}).get("replicas")
        findings.append(finding("no_pods", wref, ["the workload has no pods (spec.replicas %s)" % replicas] + evs[-3:],
                                "The controller did not create pods: read its events (quota, admission webhooks, "
                                "an unknown serviceAccount) or scale it up."))
    rollout = None
    if workload is not None:
        rollout = _k8s_wait.rollout_status(workload, ctx.o.of("ReplicaSet", namespace), pods)
    judged = pods
    if rollout is not None and rollout["current_pods"] is not None:
        judged = [p for p in pods if _nm(p) in rollout["current_pods"]]
    old = [p for p in pods if p not in judged]
    for pod in judged:
        findings.extend(pod_findings(ctx, pod))
    if rollout is not None and rollout["state"] == "failed":
        findings.append(finding("rollout_stalled", wref, [rollout["message"]] + [
            _event_text(e) for e in ctx.events_for(workload.get("kind"), name) if e["type"] == "Warning"][-2:],
            "The controller gave up waiting for the new pods: the pod findings say why they are not available; fix "
            "that, or raise progressDeadlineSeconds above the cold start (the engine role sizes it from "
            "engine_startup_timeout)."))
    elif rollout is not None and rollout["state"] != "done":
        ev = [rollout["message"]]
        if old:
            ev.append("%d pod(s) of an earlier revision do not count: %s" % (len(old), ", ".join(_nm(p) for p in old[:4])))
        findings.append(finding("rolling", wref, ev, "Not an error: the new revision is being rolled out; it serves "
                                                     "once its pods are Ready and the old ones are gone."))
    templates = _templates(workload) if workload else []
    f = rule_served_names(ctx, judged, templates)
    if f:
        findings.append(f)
    findings.extend(rule_routes(ctx, judged))
    findings.extend(rule_endpoints(ctx, judged, _aibrix_route(ctx, _model_name(ctx, judged))))
    ready = [p for p in judged if _pod_ready(p)]
    for pod in judged:
        if not _pod_ready(pod) and not any(f["object"] == "pod %s/%s" % (_ns(pod), _nm(pod))
                                           or f["object"].startswith("pod %s/%s " % (_ns(pod), _nm(pod)))
                                           for f in findings):
            findings.append(rule_not_ready(ctx, pod))
    if not findings and ready and len(ready) == len(judged):
        ev = ["%d/%d pod(s) of %s Ready" % (len(ready), len(judged), wref)]
        if rollout is not None:
            ev.append(rollout["message"])
        route = _aibrix_route(ctx, served_model_name)
        if route is not None:
            ev.append("%s Accepted and ResolvedRefs" % ref(route))
        findings.append(finding("healthy", wref, ev, "Nothing to fix."))
    if not findings:
        findings.append(finding("no_pods", wref, ["none of the %d pod(s) given belongs to %s" % (
            len(ctx.o.of("Pod")), wref)], "Give the workload's pods (kubectl get pods -o json) or check name and "
                                          "namespace: without a pod there is no evidence that it serves."))
    return result(findings)


# --------------------------------------------------------------------------------------------- #
# Kubernetes: reading the objects (raw JSON through a kubernetes ApiClient)
# --------------------------------------------------------------------------------------------- #

# (kind, group, version, plural, namespaced-in) read for one diagnosis.
_WORKLOAD_APIS = (
    ("Deployment", "apps", "v1", "deployments"),
    ("StormService", "orchestration.aibrix.ai", "v1alpha1", "stormservices"),
    ("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)
LOG_TAIL_LINES = 3000
#: Largest list answer read from the API server (a namespace's Events can be large; a bigger one is refused).
MAX_API_BYTES = 64 * 1024 * 1024


def fetch_kubernetes(api_client, namespace, name, gateway_namespace="aibrix-system", log_tail_lines=LOG_TAIL_LINES):
    """``(objects, logs, listed_kinds)`` for :func:`diagnose_kubernetes`, read with ``api_client``.

    Lists Pods, Events, Services, EndpointSlices and ReferenceGrants in ``namespace``, HTTPRoutes in both
    namespaces, the workload by name, and each engine pod's container logs (current and previous). A kind whose
    API is not installed (no LeaderWorkerSet CRD) is skipped and not counted as listed.
    """
    from kubernetes import client as k8s_client  # pylint: disable=import-outside-toplevel
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel

    core = k8s_client.CoreV1Api(api_client)
    custom = k8s_client.CustomObjectsApi(api_client)
    apps = k8s_client.AppsV1Api(api_client)
    disc = k8s_client.DiscoveryV1Api(api_client)

    def raw(call, *args, **kwargs):
        resp = call(*args, _preload_content=False, **kwargs)
        # the answer is untrusted input: size, nesting and numbers are checked before anything reads it
        return loads_json(resp.data, "the API server's answer (%s)" % getattr(call, "__name__", "list"),
                          max_bytes=MAX_API_BYTES)

    def listed(kind, call, *args, **kwargs):
        try:
            data = raw(call, *args, **kwargs)
        except ApiException as e:
            if e.status in (403, 404):
                return None
            raise
        items = data.get("items") if isinstance(data, dict) and isinstance(data.get("items"), list) else []
        return [x for x in (_k8s_wait.shape(item, kind) for item in items) if x is not None]

    objects, kinds = [], set()
    plan = [
        ("Pod", core.list_namespaced_pod, (namespace,)),
        ("Event", core.list_namespaced_event, (namespace,)),
        ("Service", core.list_namespaced_service, (namespace,)),
        ("EndpointSlice", disc.list_namespaced_endpoint_slice, (namespace,)),
        ("ReferenceGrant", custom.list_namespaced_custom_object, ("gateway.networking.k8s.io", "v1beta1", namespace,
                                                                  "referencegrants")),
    ]
    for ns in sorted({gateway_namespace, namespace}):
        plan.append(("HTTPRoute", custom.list_namespaced_custom_object, ("gateway.networking.k8s.io", "v1", ns, "httproutes")))
    for kind, group, version, plural in _WORKLOAD_APIS:
        if kind == "Deployment":
            plan.append((kind, apps.list_namespaced_deployment, (namespace,)))
            plan.append(("ReplicaSet", apps.list_namespaced_replica_set, (namespace,)))
        else:
            plan.append((kind, custom.list_namespaced_custom_object, (group, version, namespace, plural)))
    for kind, call, args in plan:
        items = listed(kind, call, *args)
        if items is not None:
            kinds.add(kind)
            objects.extend(items)
    ctx = KubeContext(objects, {}, namespace, name, None, gateway_namespace, None, kinds)
    workload = None
    for kind in WORKLOAD_KINDS:
        workload = ctx.o.get(kind, namespace, name)
        if workload is not None:
            break
    logs = {}
    for pod in _workload_pods(ctx, workload):
        statuses = ((pod.get("status") or {}).get("containerStatuses") or []) + \
            ((pod.get("status") or {}).get("initContainerStatuses") or [])
        for cs in statuses:
            entry = {}
            for which, previous in (("current", False), ("previous", True)):
                if previous and not (cs.get("lastState") or {}).get("terminated"):
                    continue
                try:
                    resp = core.read_namespaced_pod_log(_nm(pod), namespace, container=cs.get("name"), previous=previous,
                                                        tail_lines=log_tail_lines, _preload_content=False)
                    entry[which] = resp.data.decode("utf-8", "replace")
                except ApiException:
                    continue  # no such container instance (yet, or any more)
            if entry:
                logs["%s/%s" % (_nm(pod), cs.get("name"))] = entry
    return objects, logs, sorted(kinds)


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
    elif st.get("state") in ("exited", "lost") and cmd.get("port") and log and _ADDR_IN_USE.search(log):
        facts["port_holders"] = port_holders(cmd["port"], proc_root)
    return facts


def diagnose_local(facts, now=None):
    """Findings for one local engine from :func:`local_facts`."""
    now = time.time() if now is None else now
    st = facts["state"]
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
        ended = st.get("ended_at")
        if ended:
            f["evidence"].append("it ended %s ago, %s after its start" % (
                _fmt_s(now - ended), _fmt_s(ended - st["started_at"]) if st.get("started_at") else "?"))
        return result([f])
    # running
    started = st.get("started_at")
    elapsed = now - started if started else None
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
            port, health["seconds"], st.get("pid"), _fmt_s(elapsed))], "Nothing to fix."))
        if logf["tracebacks"]:
            findings.append(finding("engine_traceback", obj, ["the engine serves, but the log of this start holds %d "
                                                              "traceback(s)" % len(logf["tracebacks"])]
                                    + _exception_evidence(logf, where),
                                    "Some requests failed: read the exception."))
        return result([f for f in findings if f["code"] != "healthy"] or findings)
    if health.get("result") == "no_answer":
        return result([finding("engine_hung", obj, [
            "port %s accepts connections but GET /health gave no answer in %.1f s (pid %s, up %s)" % (
                port, health["seconds"], st.get("pid"), _fmt_s(elapsed))] + _exception_evidence(logf, where),
            "The engine is alive but stuck (a deadlock, a stuck collective, a full event loop): read the log's last "
            "lines, `py-spy dump --pid %s`, then restart it." % st.get("pid"))])
    if health.get("result") == "status":
        return result([finding("crashed", obj, [
            "GET /health on port %s answered %s: the server runs but its engine does not (vLLM answers 503 once its "
            "EngineCore died)" % (port, health.get("status"))] + _exception_evidence(logf, where),
            "Read the exception above; restart the engine (llmops.serving.engine_process state=restarted).")])
    ev = ["the engine (pid %s) has been starting for %s; port %s does not listen yet" % (
        st.get("pid"), _fmt_s(elapsed), port)]
    progress = _progress_text(logf.get("progress"))
    if progress:
        ev.append(progress)
    if elapsed is not None and elapsed > PLAUSIBLE_START_SECONDS:
        ev.append("no cold start takes longer than %s" % _fmt_s(PLAUSIBLE_START_SECONDS))
        return result([finding("engine_hung", obj, ev + _exception_evidence(logf, where),
                               "It is not loading any more: read the log's last lines (a stuck collective, a wait for "
                               "a peer), then restart it (llmops.serving.engine_process state=restarted).")])
    findings.append(finding("still_loading", obj, ev, "Not an error: wait for the port to open (engine_probe "
                                                      "waits with a deadline)."))
    if logf["tracebacks"]:
        findings.append(finding("engine_traceback", obj, ["the log of this start holds %d traceback(s)"
                                                          % len(logf["tracebacks"])] + _exception_evidence(logf, where),
                                "Read the exception: a worker may have died while the front end waits."))
    return result(findings)
