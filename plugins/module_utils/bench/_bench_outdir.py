# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark's run directory, ``<out_dir>``.

Files under ``<out_dir>``: ``plan.json``, ``rounds/NNN.json`` (one per round, written when it ends),
``raw/NNN.json`` (the client's own result), ``logs/NNN.log`` (its output) and ``stopped.json`` when a run ended
early.

* :func:`prepare_out_dir` - a previous run's files are moved under ``previous/<time>/`` first, never deleted;
  :func:`write_plan` writes ``plan.json``.
* :func:`read_plan`, :func:`read_rounds` / :func:`done_rounds`, :func:`read_stopped` - the files read back through
  the reader for untrusted input (:func:`read_json`) and checked (:func:`round_shape_problem`,
  :func:`round_problem`): a file that cannot be used is refused or named, never dropped silently.
"""
from __future__ import annotations

import os
import re
import shutil
import time

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_evidence, _bench_phases, _bench_stats
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError, shown
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json

PLAN_SCHEMA = 1
ROUND_SCHEMA = 1
RUN_FILES = ("plan.json", "stopped.json", "report.json", "report.md", "rounds", "raw", "logs", "coldstart.json")


def prepare_out_dir(out_dir, now=time.time):
    """Create ``out_dir``; a previous run's files move to ``previous/<UTC time>/`` (never deleted).

    Returns the directory they moved to, or None. Refuses a path that is not a directory.
    """
    if not isinstance(out_dir, str) or not os.path.isabs(out_dir):
        raise BenchError("benchmark_out_dir: %r is not an absolute path; give one such as /var/tmp/llmops/bench"
                         % (out_dir,), field="benchmark_out_dir")
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise BenchError("benchmark_out_dir: %s exists and is not a directory; point it at a directory"
                         % out_dir, field="benchmark_out_dir", file=out_dir)
    os.makedirs(out_dir, exist_ok=True)
    old = [n for n in os.listdir(out_dir) if n in RUN_FILES or n.endswith(".png")]
    moved = None
    if old:
        moved = os.path.join(out_dir, "previous", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now())))
        suffix = 0
        while os.path.exists(moved):
            suffix += 1
            moved = moved.rstrip("0123456789-") + "-%d" % suffix if suffix > 1 else moved + "-1"
        os.makedirs(moved)
        for n in old:
            shutil.move(os.path.join(out_dir, n), os.path.join(moved, n))
    for sub in ("rounds", "raw", "logs"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    return moved


def write_plan(out_dir, doc):
    # mode 0600: a target's headers may carry a gateway credential the client needs
    _fsutil.atomic_write_json(os.path.join(out_dir, "plan.json"), doc, mode=0o600, indent=2, sort_keys=True,
                              newline=True)


#: Cap for a round file or a client result: per-request samples with every inter-token gap (4096 requests of
#: 4096 tokens is about 200 MiB of JSON).
MAX_ROUND_BYTES = 256 * 1024 * 1024
#: Fields of a planned round and their types (a saved round carries them too).
ROUND_FIELDS = (("index", int, 1), ("concurrency", int, 1), ("input_len", int, 1), ("output_len", int, 1),
                ("num_prompts", int, 1), ("seed", int, 0), ("rep", int, 0))


def read_json(path, what, max_bytes=None):
    """The JSON document in ``path``, read through the collection's reader for untrusted files (regular file
    only, size, nesting depth, finite numbers); BenchError naming ``what``, the file and the limit."""
    try:
        return load_json(path, what, **({"max_bytes": max_bytes} if max_bytes else {}))
    except FileNotFoundError:
        raise BenchError("%s: %s does not exist; run playbooks/benchmark.yml again from the start" % (what, path),
                         reason="missing_file", file=path)
    except (OSError, UntrustedInput) as e:
        raise BenchError("%s; run playbooks/benchmark.yml again from the start" % e, reason="bad_file", file=path)


def round_shape_problem(r, where):
    """Why ``r`` is not a round as the plan writes it (a sentence naming the field), or None."""
    if not isinstance(r, dict):
        return "%s is a %s, not a round" % (where, type(r).__name__)
    for key, kind, least in ROUND_FIELDS:
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, kind) or v < least:
            return "%s.%s: expected an integer >= %d, got %s" % (where, key, least, shown(v))
    if r.get("kind") not in ("warmup", "measure"):
        return "%s.kind: expected warmup or measure, got %s" % (where, shown(r.get("kind")))
    if not isinstance(r.get("target"), str) or not r["target"]:
        return "%s.target: expected the target's name, got %s" % (where, shown(r.get("target")))
    rate = r.get("request_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
        return "%s.request_rate: expected requests per second above 0 or null, got %s" % (where, shown(rate))
    return None


def read_plan(out_dir):
    path = os.path.join(out_dir, "plan.json")
    doc = read_json(path, "benchmark_out_dir")
    problem = None
    if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA or not isinstance(doc.get("rounds"), list):
        problem = "it is not a plan of this version"
    else:
        targets = doc.get("targets")
        if not isinstance(targets, list) or not targets or not all(
                isinstance(t, dict) and all(isinstance(t.get(k), str) for k in ("name", "url", "model"))
                for t in targets):
            problem = "targets: expected a list of {name, url, model}"
        for i, r in enumerate(doc["rounds"]):
            problem = problem or round_shape_problem(r, "rounds[%d]" % i)
        if not problem and not all(isinstance(doc.get(k), dict) for k in ("protocol",)):
            problem = "protocol: expected a mapping"
        if not problem and (isinstance(doc.get("started_at"), bool)
                            or not isinstance(doc.get("started_at"), (int, float))):
            problem = "started_at: expected a time in seconds"
    if problem:
        raise BenchError("benchmark_out_dir: %s is not a plan of this version (%s); run playbooks/benchmark.yml "
                         "again from the start" % (path, problem), file=path)
    return doc


def round_path(out_dir, index):
    return os.path.join(out_dir, "rounds", "%03d.json" % index)


def round_problem(rec, index, plan_doc=None):
    """Why the saved round ``rec`` (file ``rounds/<index>.json``) cannot be used, naming the field or the
    sample; None when it can. Checks the fields the report and the progress line read, every sample
    (:func:`_bench_stats._check_sample`: a negative or non-finite latency, TTFT above E2EL), and that it
    is the round the plan has at that index."""
    problem = round_shape_problem(rec, "round")
    if problem:
        return problem
    if rec["index"] != index:
        return "round.index: %d is not the index of its file name (%d)" % (rec["index"], index)
    for key in ("duration_s", "wall_s"):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            return "round.%s: expected a non-negative number of seconds, got %s" % (key, shown(v))
    for key in ("client", "evidence", "phases", "prompt_digest"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            return "round.%s: expected a mapping or null, got %s" % (key, shown(rec[key]))
    if rec.get("phases") is not None:
        problem = _bench_phases.round_problem(rec["phases"], "round.phases")
        if problem:
            return problem
    if rec.get("transport_warmup") is not None and not isinstance(rec["transport_warmup"], bool):
        return "round.transport_warmup: expected true or false, got %s" % shown(rec["transport_warmup"])
    if rec.get("transport_requests") is not None:
        problem = _bench_evidence.transport_warmup_problem(rec["transport_requests"])
        if problem:
            return problem
    failed = rec.get("failed")
    if isinstance(failed, bool) or not isinstance(failed, int) or failed < 0:
        return "round.failed: expected a non-negative integer, got %s" % shown(failed)
    try:
        _bench_stats.round_summary(rec.get("samples"), rec["duration_s"], where="round.samples",
                                   duration_where="round.duration_s")
    except ValueError as e:
        return str(e)
    if plan_doc is not None:
        planned = next((r for r in plan_doc["rounds"] if r["index"] == index), None)
        if planned is None:
            return "round %d is not in plan.json (%d rounds)" % (index, len(plan_doc["rounds"]))
        differs = [k for k in ("target", "kind", "concurrency", "request_rate", "input_len", "output_len", "seed",
                               "rep") if rec.get(k) != planned.get(k)]
        if differs:
            return "round.%s: differs from round %d of plan.json" % (differs[0], index)
    return None


def read_rounds(out_dir, plan_doc=None):
    """``(rounds by index, problems)``: the round records saved so far, and ``[{file, reason}]`` for every
    round file that cannot be read or used (not a regular file, over :data:`MAX_ROUND_BYTES`, nested too
    deeply, a number out of range, fields of the wrong type, an impossible sample), named, never dropped
    silently."""
    out, problems = {}, []
    d = os.path.join(out_dir, "rounds")
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        m = re.match(r"^(\d{3,})\.json$", name)
        if not m:
            continue
        path = os.path.join(d, name)
        rel = os.path.join("rounds", name)
        try:
            rec = load_json(path, "round file", max_bytes=MAX_ROUND_BYTES)
        except FileNotFoundError:
            continue  # removed while listed
        except (OSError, UntrustedInput) as e:
            problems.append({"file": rel, "reason": str(e)})
            continue
        problem = round_problem(rec, int(m.group(1)), plan_doc)
        if problem:
            problems.append({"file": rel, "reason": "round file: %s: %s" % (path, problem)})
            continue
        out[int(m.group(1))] = rec
    return out, problems


def done_rounds(out_dir, plan_doc=None):
    """Round records saved so far, by index (those that cannot be used are left out: see :func:`read_rounds`)."""
    return read_rounds(out_dir, plan_doc)[0]


def read_stopped(out_dir):
    path = os.path.join(out_dir, "stopped.json")
    if not os.path.lexists(path):
        return None
    doc = read_json(path, "benchmark_out_dir")
    problem = round_shape_problem(dict(doc, kind=doc.get("kind"), num_prompts=1) if isinstance(doc, dict) else doc,
                                  "stopped")
    if not problem and not all(isinstance(doc.get(k), str) for k in ("reason", "message")):
        problem = "stopped: expected reason and message strings"
    if problem:
        raise BenchError("benchmark_out_dir: %s cannot be used (%s)" % (path, problem), reason="bad_file", file=path)
    return doc
