"""_timeline: one set of marks behind the local (engine_probe) and the Kubernetes (k8s_engine_wait) timelines."""
from __future__ import annotations

import json

import pytest

from ansible_collections.llmops.serving.plugins.filter.serving import timeline_table
from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait

T0 = _timeline.parse_time("2026-08-02T08:00:05Z")


def test_recorder_keeps_the_first_time_a_stage_is_reached():
    clock = iter([100.0, 101.5, 103.0])
    rec = _timeline.Recorder(clock=lambda: next(clock))
    rec.mark("port_open")
    rec.mark("health_ok")
    rec.mark("port_open")  # seen again later: the first time stays
    assert rec.marks == {"port_open": 100.0, "health_ok": 101.5}
    assert "port_open" in rec and "model_listed" not in rec
    with pytest.raises(ValueError, match="unknown timeline stage 'health'"):
        rec.mark("health")


def test_relative_view_is_what_engine_probe_returns_and_reads_back():
    marks = {"port_open": T0 + 50.0, "health_ok": T0 + 55.25, "model_listed": T0 + 55.5,
             "first_correct_response": T0 + 60.0004, "scheduled": T0 + 1}
    rel = _timeline.relative(marks, T0)
    assert rel == {"port_open": 50.0, "health": 55.25, "models": 55.5, "first_correct": 60.0}
    back = _timeline.from_relative(dict(rel, probe_seconds=3.0), "2026-08-02T08:00:05Z")
    assert back == {"port_open": T0 + 50.0, "health_ok": T0 + 55.25, "model_listed": T0 + 55.5,
                    "first_correct_response": T0 + 60.0}
    assert _timeline.from_relative(rel, None) == {}


def test_a_local_start_and_a_pod_give_the_same_staged_view_of_the_same_marks():
    """A local engine's relative timeline (since = process start) and a pod's (since = pod created) go through
    one model: the process start stands where the pod's creation does."""
    probe = {"port_open": 12.0, "health": 12.5, "models": 12.6, "first_correct": 14.0, "probe_seconds": 2.1}
    local = _timeline.staged(dict(_timeline.from_relative(probe, T0), pod_created=T0))
    pod = _k8s_wait.cold_start_timeline(None, dict(_timeline.from_relative(probe, T0), pod_created=T0))
    assert local == pod
    stages = [s["stage"] for s in local["stages"]]
    assert stages == ["pod_created", "port_open", "health_ok", "model_listed", "first_correct_response"]
    assert local["slo_seconds"] == 14.0 and local["missing"] == ["scheduled", "container_started"]
    assert json.loads(_timeline.to_json(local)) == local


def test_staged_view_orders_by_time_and_names_what_is_missing():
    tl = _timeline.staged({"pod_created": "2026-08-02T08:00:05Z", "pod_ready": T0 + 30, "port_open": T0 + 40,
                           "health_ok": None})
    assert [s["stage"] for s in tl["stages"]] == ["pod_created", "pod_ready", "port_open"]
    assert tl["stages"][2] == {"stage": "port_open", "label": "port open", "at": "2026-08-02T08:00:45Z",
                               "t_s": 40.0, "step_s": 10.0}
    assert tl["slo_seconds"] is None
    assert tl["missing"] == ["scheduled", "container_started", "health_ok", "model_listed", "first_correct_response"]
    lines = _timeline.format_staged(tl, "glm").splitlines()
    assert lines[0] == "glm: pod created -> first correct response = - s"
    assert lines[-1].startswith("not recorded: scheduled, container_started")


@pytest.mark.parametrize("timeline", [
    {"first_correct": 60.0, "port_open": 50.0, "health": 55.0, "probe_seconds": 3},
    {"process_start": 0.0, "port_open": 8.25, "health": 9.0, "models": 9.5, "first_correct": 11.0, "started_at": 5},
    {},
])
def test_relative_rows_are_the_table_the_engine_role_prints(timeline):
    assert _timeline.relative_rows(timeline, "engine started now") == timeline_table(timeline, "engine started now")
