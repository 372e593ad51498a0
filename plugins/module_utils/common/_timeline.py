# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the cold-start timeline, one model for a local process and a Kubernetes pod.

A timeline is a set of *marks*: stage -> the absolute time (epoch seconds) it was first reached, for the
stages in :data:`STAGES` (pod created -> scheduled -> container started -> port open -> /health 200 ->
pod Ready -> model listed -> first correct response). A local engine has no pod: its process start takes
the place of ``pod_created``.

Two views of the same marks:

* :func:`relative` - ``{port_open, health, models, first_correct: seconds after an origin}``, what
  engine_probe returns as ``timeline`` (and the engine role saves as ``timeline.json``); :func:`from_relative`
  turns it back into marks.
* :func:`staged` - ``{stages: [{stage, label, at, t_s, step_s}], slo_seconds, missing}``, ordered by time,
  what k8s_engine_wait returns per pod and the engine role saves per rollout; :func:`format_staged` prints it.
"""
from __future__ import annotations

import datetime
import json
import time

STAGES = [
    ("pod_created", "pod created"),
    ("scheduled", "scheduled"),
    ("container_started", "container started"),
    ("port_open", "port open"),
    ("health_ok", "/health 200"),
    ("pod_ready", "pod Ready"),
    ("model_listed", "model listed"),
    ("first_correct_response", "first correct response"),
]
STAGE_KEYS = tuple(k for k, _label in STAGES)
#: Stages a cold start is expected to record (a pod that never reports Ready is not a gap in the start).
EXPECTED = tuple(k for k in STAGE_KEYS if k != "pod_ready")
#: The relative view's names of the stages a readiness probe measures.
RELATIVE_NAMES = {"port_open": "port_open", "health_ok": "health", "model_listed": "models",
                  "first_correct_response": "first_correct"}
#: Order of the relative view's rows (``process_start`` is the local origin the engine role adds).
RELATIVE_ORDER = ("process_start", "pod_created", "scheduled", "container_started", "port_open", "health",
                  "models", "first_correct")


def parse_time(value):
    """RFC 3339 (the API's ``2026-08-01T10:00:00Z``) or epoch seconds -> epoch seconds (float); None passes."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    dt = datetime.datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


def iso(epoch):
    """Epoch seconds -> RFC 3339 UTC (milliseconds when not whole); None passes."""
    if epoch is None:
        return None
    dt = datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)
    text = dt.isoformat(timespec="milliseconds" if epoch % 1 else "seconds")
    return text.replace("+00:00", "Z")


def check_stage(stage):
    if stage not in STAGE_KEYS:
        raise ValueError("unknown timeline stage %r; known: %s" % (stage, ", ".join(STAGE_KEYS)))
    return stage


class Recorder(object):
    """Marks taken while a start is watched: the first :meth:`mark` of a stage wins."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.marks = {}

    def mark(self, stage):
        check_stage(stage)
        if stage not in self.marks:
            self.marks[stage] = self.clock()

    def __contains__(self, stage):
        return stage in self.marks


def relative(marks, origin):
    """The relative view: ``{port_open, health, models, first_correct}`` seconds after ``origin`` (epoch)."""
    out = {}
    for stage in STAGE_KEYS:
        if stage in RELATIVE_NAMES and marks.get(stage) is not None:
            out[RELATIVE_NAMES[stage]] = round(marks[stage] - origin, 3)
    return out


def from_relative(timeline, since):
    """Marks from a relative view (seconds after ``since``, RFC 3339 or epoch); other keys are ignored."""
    origin = parse_time(since)
    marks = {}
    for stage, name in RELATIVE_NAMES.items():
        value = (timeline or {}).get(name)
        if isinstance(value, (int, float)) and origin is not None:
            marks[stage] = origin + value
    return marks


def staged(marks):
    """The staged view of ``marks`` (stage -> RFC 3339 or epoch time; None values are not recorded).

    Returns ``dict(stages=[{stage, label, at, t_s, step_s}], slo_seconds, missing)``; ``t_s`` counts from
    ``pod_created``, ``step_s`` from the previous recorded stage. ``slo_seconds`` is pod created -> first
    correct response (None while either is unknown). Raises ValueError for a stage not in :data:`STAGES`.
    """
    times = {}
    for key, value in (marks or {}).items():
        check_stage(key)
        if value is not None:
            times[key] = parse_time(value)
    origin = times.get("pod_created")
    labels = dict(STAGES)
    rank = dict((k, i) for i, k in enumerate(STAGE_KEYS))
    missing = [k for k in EXPECTED if times.get(k) is None]
    # ordered by time (ties keep the natural order): a probe that starts after the pod is Ready sees the
    # port open after Ready, and the table shows it that way rather than inventing an earlier time
    recorded = sorted((k for k in STAGE_KEYS if times.get(k) is not None), key=lambda k: (times[k], rank[k]))
    stages, prev = [], None
    for key in recorded:
        at = times[key]
        stages.append(dict(stage=key, label=labels[key], at=iso(at),
                           t_s=round(at - origin, 3) if origin is not None else None,
                           step_s=round(at - prev, 3) if prev is not None else None))
        prev = at
    first = times.get("first_correct_response")
    slo = round(first - origin, 3) if origin is not None and first is not None else None
    return dict(stages=stages, slo_seconds=slo, missing=missing)


def _num(v):
    return "-" if v is None else ("%.1f" % v)


def format_staged(timeline, title="cold start"):
    """A fixed-width table of a :func:`staged` result."""
    rows = [("stage", "at (UTC)", "t (s)", "step (s)")]
    for s in timeline["stages"]:
        rows.append((s["label"], s["at"], _num(s["t_s"]), _num(s["step_s"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["%s: pod created -> first correct response = %s s" % (title, _num(timeline["slo_seconds"]))]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j < 2 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if timeline["missing"]:
        lines.append("not recorded: %s" % ", ".join(timeline["missing"]))
    return "\n".join(lines)


def relative_rows(timeline, title="cold start"):
    """A relative view (``{name: seconds}``) as aligned rows in :data:`RELATIVE_ORDER`, with the step from the
    previous row; keys outside that order (``probe_seconds``) and values that are not numbers are left out."""
    rows = ["%-18s %10s %10s" % (title, "at (s)", "step (s)")]
    prev = 0.0
    for k in RELATIVE_ORDER:
        v = timeline.get(k)
        if k not in timeline or not isinstance(v, (int, float)):
            continue
        rows.append("%-18s %10.1f %10.1f" % (k, v, v - prev))
        prev = v
    return rows


def to_json(timeline):
    return json.dumps(timeline, indent=2, sort_keys=True) + "\n"
