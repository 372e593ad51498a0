# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the engine cold start in the three states, recorded for the benchmark report.

States (:data:`STATES`): ``shared_fs`` (weights read from the shared filesystem revision), ``nvme`` (the staged
node-local copy), ``nvme_kernel_cache`` (the staged copy with the restored kernel cache). The two cold states run
with compile caches pointed at an empty directory (:func:`prepare`), and before every start the revision's files
are dropped from the page cache (``posix_fadvise(DONTNEED)`` on each file, nothing else on the host), so a start
reads its weights from the device it is meant to measure.

:func:`record` joins one start's relative timeline (what engine_probe returns as ``timeline``: seconds after the
process start to port open, /health, model listed and first correct answer) with the phases vLLM logs for that
start (the part of the supervisor's log after its last ``==== ... starting`` banner):

* ``Loading weights took X seconds`` (``model_loader/default_loader.py``),
* ``init engine (profile, create kv cache, warmup model) took X s [(compilation: Y s)]`` (``v1/engine/core.py``),
* ``torch.compile takes X s in total`` / ``Dynamo bytecode transform time: X s`` (``compilation/backends.py``,
  the compile time when the init line does not carry it).

Phases are consecutive, so they add up to the time to the first correct answer: ``weights_load``, ``compile``,
``engine_init`` (the rest of init: profile, KV cache, warm-up), ``process_other`` (interpreter and API server start,
model construction: the rest until the port opens), ``health``, ``model_listed``, ``first_correct``.

Every figure read from the log goes through ``_untrusted.figure_or_none``: one that cannot be a duration (``1.2.3``,
400 digits, beyond ``_untrusted.MAX_ABS_NUMBER``) is left null, never a traceback, and never ``Infinity`` in the
cold-start file (which would make every later :func:`record` refuse it).
"""
from __future__ import annotations

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.cache import _kcache
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, excerpt, figure, figure_or_none, load_json)

STATES = ("shared_fs", "nvme", "nvme_kernel_cache")
STATE_LABELS = {"shared_fs": "weights from the shared filesystem", "nvme": "weights on node NVMe (staged)",
                "nvme_kernel_cache": "NVMe + restored kernel cache"}
BANNER_RE = re.compile(r"^==== \S+ starting: ", re.M)
WEIGHTS_RE = re.compile(r"Loading weights took ([0-9.]+) ?s")
MODEL_LOADING_RE = re.compile(r"Model loading took \S+ GiB memory and ([0-9.]+) seconds")
INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s"
                     r"(?: \(compilation: ([0-9.]+) s)?")
COMPILE_RE = re.compile(r"torch\.compile takes? ([0-9.]+) ?s in total")
DYNAMO_RE = re.compile(r"Dynamo bytecode transform time: ([0-9.]+) ?s")
PHASES = ("weights_load", "compile", "engine_init", "process_other", "health", "model_listed", "first_correct")


#: The end of the engine's log that is read for the last start's phases.
LOG_TAIL_BYTES = 8 * 1024 * 1024


class ColdstartError(Exception):
    def __init__(self, msg, file=None):
        super(ColdstartError, self).__init__(msg)
        self.file = file


def check_state(state):
    if state not in STATES:
        raise ColdstartError("state: %r is not one of %s" % (state, ", ".join(STATES)))
    return state


def evict(path):
    """Drop the page cache of every regular file under ``path`` (not following links); returns the bytes."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def prepare(state, model_path, work_dir, engine="vllm"):
    """Get ready for a start in ``state``: evict ``model_path`` from the page cache; for the cold states an empty
    cache directory under ``work_dir`` and the environment pointing every compile cache there (``{}`` for
    ``nvme_kernel_cache``: the restored cache's own environment applies). Returns ``{env, cache_dir,
    evicted_bytes}``."""
    check_state(state)
    if not os.path.isdir(model_path):
        raise ColdstartError("model_path: %s is not a directory; point it at the model revision of state %s"
                             % (model_path, state), file=model_path)
    out = {"evicted_bytes": evict(model_path), "env": {}, "cache_dir": None}
    if state != "nvme_kernel_cache":
        n = 1
        while os.path.exists(os.path.join(work_dir, "empty-cache-%s-%d" % (state, n))):
            n += 1
        d = os.path.join(work_dir, "empty-cache-%s-%d" % (state, n))
        _kcache.make_layout(d, engine)
        out.update(cache_dir=d, env=_kcache.cache_env(engine, d))
    return out


def last_start(log_text):
    """The part of a supervisor log written by its last start."""
    starts = [m.start() for m in BANNER_RE.finditer(log_text)]
    return log_text[starts[-1]:] if starts else log_text


def _seconds(text):
    """A duration the log wrote (``_untrusted.figure_or_none``: non-negative, finite, bounded), else None."""
    return figure_or_none(text, "a duration in the engine log", nonnegative=True) if text else None


def _last_float(regex, text, group=1):
    found = [m.group(group) for m in regex.finditer(text)]
    found = [f for f in found if f]
    return _seconds(found[-1]) if found else None


def parse_log(text):
    """``{weights_load_s, model_loading_s, init_engine_s, compile_s}`` of one start's log (None when absent, or when
    the figure the log wrote cannot be a duration)."""
    init = list(INIT_RE.finditer(text))
    compile_s = _seconds(init[-1].group(2)) if init else None
    if compile_s is None:
        compile_s = _last_float(COMPILE_RE, text)
    if compile_s is None:
        dynamo = [_seconds(m.group(1)) for m in DYNAMO_RE.finditer(text)]
        compile_s = _seconds(sum(dynamo)) if dynamo and None not in dynamo else None
    return {"weights_load_s": _last_float(WEIGHTS_RE, text), "model_loading_s": _last_float(MODEL_LOADING_RE, text),
            "init_engine_s": _seconds(init[-1].group(1)) if init else None, "compile_s": compile_s}


def phases(timeline, log):
    """Consecutive phases (seconds) from a relative timeline and :func:`parse_log`; they add up to
    ``first_correct``. A phase whose inputs are missing is None (and counts as 0 in the sums)."""
    t = dict((k, timeline.get(k)) for k in ("port_open", "health", "models", "first_correct"))
    weights = log.get("weights_load_s") or 0.0
    init = log.get("init_engine_s")
    compile_s = min(log.get("compile_s") or 0.0, init) if init is not None else (log.get("compile_s") or 0.0)
    out = {"weights_load": log.get("weights_load_s"), "compile": compile_s if log.get("compile_s") is not None else None,
           "engine_init": (init - compile_s) if init is not None else None}
    if t["port_open"] is not None:
        out["process_other"] = max(0.0, t["port_open"] - weights - (init or 0.0))
    prev = t["port_open"]
    for name, key in (("health", "health"), ("model_listed", "models"), ("first_correct", "first_correct")):
        if t[key] is not None and prev is not None:
            out[name] = max(0.0, t[key] - prev)
            prev = t[key]
        else:
            out[name] = None
    return dict((k, (round(v, 3) if v is not None else None)) for k, v in ((p, out.get(p)) for p in PHASES))


def shape_problem(doc):
    """Why ``doc`` is not a cold-start file this module wrote (naming the field), or None."""
    if not isinstance(doc, dict) or not isinstance(doc.get("states"), list):
        return "expected {states: [...]}"
    for i, st in enumerate(doc["states"]):
        if not isinstance(st, dict) or st.get("state") not in STATES or not isinstance(st.get("reps"), list):
            return "states[%d]: expected {state: one of %s, reps: [...]}" % (i, ", ".join(STATES))
        for j, rep in enumerate(st["reps"]):
            if not isinstance(rep, dict):
                return "states[%d].reps[%d]: expected a mapping" % (i, j)
            r = rep.get("rep")
            if r is not None and (isinstance(r, bool) or not isinstance(r, int)):
                return "states[%d].reps[%d].rep: expected an integer" % (i, j)
    return None


def record(coldstart_file, state, rep, timeline, log_file, started_at=None, extra=None):
    """Add one start to ``coldstart_file`` (``{states: [{state, label, reps: [...]}]}``); returns the rep."""
    check_state(state)
    data = _fsutil.read_part(log_file, LOG_TAIL_BYTES, from_end=True)
    if data is None:
        raise ColdstartError("log_file: %s is missing, unreadable or not a regular file; pass the engine's log "
                             "(engine_log_file)" % log_file, file=log_file)
    text = data.decode("utf-8", "replace")
    log = parse_log(last_start(text))
    if not isinstance(timeline, dict) or timeline.get("first_correct") is None:
        raise ColdstartError("timeline: no first correct answer in %s; pass engine_probe's timeline of a start that "
                             "answered correctly" % excerpt(timeline))
    marks = {}
    for k in ("port_open", "health", "models", "first_correct"):
        try:
            marks[k] = None if timeline.get(k) is None else figure(timeline[k], "timeline.%s" % k, nonnegative=True)
        except UntrustedInput as e:
            raise ColdstartError("%s; pass engine_probe's timeline (seconds after the process start)" % e)
    entry = {"rep": rep, "phases": phases(marks, log), "total_s": round(marks["first_correct"], 3),
             "marks": marks,
             "log": log, "started_at": started_at}
    entry.update(extra or {})
    doc = {"states": []}
    if os.path.lexists(coldstart_file):
        try:
            doc = load_json(coldstart_file, "coldstart_file")
        except (OSError, UntrustedInput) as e:
            raise ColdstartError("%s; remove it to start over" % e, file=coldstart_file)
        problem = shape_problem(doc)
        if problem:
            raise ColdstartError("coldstart_file: %s cannot be used (%s); remove it to start over"
                                 % (coldstart_file, problem), file=coldstart_file)
    by_state = dict((s["state"], s) for s in doc.get("states", []))
    if state not in by_state:
        by_state[state] = {"state": state, "label": STATE_LABELS[state], "reps": []}
    by_state[state]["reps"] = [r for r in by_state[state]["reps"] if r.get("rep") != rep] + [entry]
    by_state[state]["reps"].sort(key=lambda r: r.get("rep") or 0)
    doc["states"] = [by_state[s] for s in STATES if s in by_state]
    _fsutil.atomic_write_json(coldstart_file, doc, indent=2, sort_keys=True, newline=True)
    return entry
