"""Wait logic on recorded API objects: route conditions, unschedulable pods, restarts, masked exits, timeline."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_shape
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait as w
from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "..", "fixtures", "k8s")


def _load(name):
    with open(os.path.join(FIX, name)) as f:
        return yaml.safe_load(f)


ROUTES = _load("routes.yaml")
PODS = _load("pods.yaml")
T0 = _k8s_shape.parse_time("2026-08-02T08:00:05Z")


def test_accepted_route_is_ready():
    r = w.route_status(ROUTES["accepted"], "aibrix-eg")
    assert r["state"] == "ready" and r["accepted"] and r["resolved_refs"]


@pytest.mark.parametrize(
    "scenario, ctype, reason, hint",
    [
        ("not_allowed_by_listeners", "Accepted", "NotAllowedByListeners", "allowedRoutes"),
        ("backend_not_found", "ResolvedRefs", "BackendNotFound", "DNS-safe name"),
        ("ref_not_permitted", "ResolvedRefs", "RefNotPermitted", "ReferenceGrant"),
    ],
)
def test_failing_route_names_reason_and_fix(scenario, ctype, reason, hint):
    r = w.route_status(ROUTES[scenario], "aibrix-eg")
    assert r["state"] == "failed"
    assert r["reason"] == reason
    assert "%s=False reason %s" % (ctype, reason) in r["message"]
    assert hint in r["message"]
    # the controller's own message is kept
    cond = [c for c in ROUTES[scenario]["status"]["parents"][0]["conditions"] if c["type"] == ctype][0]
    assert cond["message"] in r["message"]


def test_route_without_status_or_with_stale_generation_is_pending():
    assert w.route_status(ROUTES["no_status"])["state"] == "pending"
    stale = w.route_status(ROUTES["stale_generation"])
    assert stale["state"] == "pending" and "current generation" in stale["message"]
    assert w.route_status(None)["reason"] == "NotFound"


def test_other_gateways_parents_are_ignored():
    route = json.loads(json.dumps(ROUTES["accepted"]))
    other = json.loads(json.dumps(ROUTES["not_allowed_by_listeners"]["status"]["parents"][0]))
    other["parentRef"]["name"] = "some-other-gateway"
    route["status"]["parents"].append(other)
    assert w.route_status(route, "aibrix-eg")["state"] == "ready"
    assert w.route_status(route)["state"] == "failed"


def test_pod_never_scheduled_fails_after_schedule_timeout_with_scheduler_message():
    pods = [PODS["never_scheduled"]]
    early = w.evaluate(pods, check_route=False, now=T0 + 60, schedule_timeout=900)
    assert early["state"] == "waiting" and "Insufficient nvidia.com/gpu" in early["message"]
    late = w.evaluate(pods, check_route=False, now=T0 + 901, schedule_timeout=900)
    assert late["state"] == "failed"
    assert "untolerated taint" in late["message"] and "limit 900s" in late["message"]


def test_restarting_container_fails_with_exit_code():
    v = w.evaluate([PODS["restarting"]], check_route=False)
    assert v["state"] == "failed"
    assert "restarted 2 time(s)" in v["message"] and "exit code 1" in v["message"]


def test_completed_exit_zero_is_reported_as_masked_crash_not_success():
    v = w.evaluate([PODS["completed_exit0"]], check_route=False)
    assert v["state"] == "failed"
    assert "exit code 0" in v["message"] and "masked" in v["message"]


def test_missing_secret_fails_fast():
    v = w.evaluate([PODS["secret_missing"]], check_route=False)
    assert v["state"] == "failed" and 'secret \\"hf-token\\" not found' in json.dumps(v["message"])


def test_image_pull_backoff_keeps_waiting_with_reason():
    v = w.evaluate([PODS["image_pull_backoff"]], check_route=False, now=T0 + 30)
    assert v["state"] == "waiting" and "ImagePullBackOff" in v["message"]


def test_loading_engine_is_waiting_not_failed():
    v = w.evaluate([PODS["loading"]], ROUTES["accepted"], now=T0 + 600)
    assert v["state"] == "waiting" and "0/1" in v["message"] and "loading" in v["message"]


def test_ready_needs_pods_and_route():
    assert w.evaluate([PODS["ready"]], ROUTES["accepted"])["state"] == "ready"
    v = w.evaluate([PODS["ready"]], ROUTES["ref_not_permitted"])
    assert v["state"] == "waiting" and "RefNotPermitted" in v["message"]
    assert w.evaluate([PODS["ready"]], None, replicas=2, check_route=False)["state"] == "waiting"


def test_terminating_pods_of_the_old_revision_are_ignored():
    v = w.evaluate([PODS["terminating_old"], PODS["ready"]], ROUTES["accepted"])
    assert v["state"] == "ready"


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_rollout_reaches_ready_through_loading():
    seq = [([PODS["never_scheduled"]], None), ([PODS["loading"]], ROUTES["no_status"]),
           ([PODS["loading"]], ROUTES["accepted"]), ([PODS["ready"]], ROUTES["accepted"])]
    fc = FakeClock()
    v = w.wait_rollout(lambda: seq.pop(0) if len(seq) > 1 else seq[0], timeout=600, poll_interval=10,
                       clock=fc.clock, sleep=fc.sleep)
    assert v["state"] == "ready" and v["polls"] == 4 and v["elapsed"] == 30


def test_wait_rollout_fails_when_route_stays_broken():
    fc = FakeClock()
    v = w.wait_rollout(lambda: ([PODS["ready"]], ROUTES["backend_not_found"]), timeout=3600, route_condition_timeout=60,
                       poll_interval=10, clock=fc.clock, sleep=fc.sleep)
    assert v["state"] == "failed"
    assert "BackendNotFound" in v["message"] and "route not usable for 60s" in v["message"]


def test_wait_rollout_times_out_on_a_slow_load():
    fc = FakeClock()
    v = w.wait_rollout(lambda: ([PODS["loading"]], ROUTES["accepted"]), timeout=100, poll_interval=30,
                       clock=fc.clock, sleep=fc.sleep)
    assert v["state"] == "timeout" and "not ready after 100s" in v["message"]


def test_cold_start_timeline_from_pod_and_probe_marks():
    marks = {"port_open": "2026-08-02T08:16:40Z", "health_ok": "2026-08-02T08:16:44.500Z",
             "model_listed": "2026-08-02T08:16:53Z", "first_correct_response": "2026-08-02T08:16:55.250Z"}
    tl = w.cold_start_timeline(PODS["ready"], marks)
    stages = [s["stage"] for s in tl["stages"]]
    assert stages == ["pod_created", "scheduled", "container_started", "port_open", "health_ok", "pod_ready",
                      "model_listed", "first_correct_response"]
    by = {s["stage"]: s for s in tl["stages"]}
    assert by["scheduled"]["t_s"] == 1.0
    assert by["container_started"]["step_s"] == 395.0  # image pull + mounts: 08:00:06 -> 08:06:41
    assert tl["slo_seconds"] == pytest.approx(16 * 60 + 50.25)
    assert tl["missing"] == []
    table = _timeline.format_staged(tl)
    assert "first correct response = 1010.2 s" in table and "/health 200" in table
    assert json.loads(_timeline.to_json(tl)) == tl


def test_timeline_reports_missing_stages_and_no_slo_without_a_correct_answer():
    tl = w.cold_start_timeline(PODS["loading"])
    assert tl["slo_seconds"] is None
    assert tl["missing"] == ["port_open", "health_ok", "model_listed", "first_correct_response"]
    with pytest.raises(ValueError, match="unknown timeline stage"):
        w.cold_start_timeline(None, {"weights_loaded": 1})


def test_probe_marks_relative_to_pod_creation_and_ordering_by_time():
    # engine_probe measured from pod creation; it started after the pod was Ready, so the port is
    # recorded after Ready and the table keeps that order instead of inventing an earlier time
    probe = {"port_open": 1010.0, "health": 1010.2, "models": 1010.4, "first_correct": 1011.5, "probe_seconds": 2}
    marks = _timeline.from_relative(probe, "2026-08-02T08:00:05Z")
    assert set(marks) == {"port_open", "health_ok", "model_listed", "first_correct_response"}
    tl = w.cold_start_timeline(PODS["ready"], marks)
    order = [s["stage"] for s in tl["stages"]]
    assert order.index("pod_ready") < order.index("port_open")
    assert all(s["step_s"] is None or s["step_s"] >= 0 for s in tl["stages"])
    assert tl["slo_seconds"] == 1011.5


def test_filter_builds_timeline_from_wait_module_pod_summary():
    from ansible_collections.llmops.serving.plugins.filter.k8s_engine import k8s_cold_start, k8s_timeline_lines

    summary = w.pod_status(PODS["ready"])
    tl = k8s_cold_start(summary, {"health": 1000.0, "models": 1000.5, "first_correct": 1002.0})
    assert tl["slo_seconds"] == 1002.0 and tl["missing"] == ["port_open"]
    lines = k8s_timeline_lines(tl, "glm-5.2-fp8-vllm")
    assert lines[0] == "glm-5.2-fp8-vllm: pod created -> first correct response = 1002.0 s"
    assert lines[-1] == "not recorded: port_open"


# --------------------------------------------------------------------------------------------- #
# Restarts judged from restartCount / lastState.terminated and the log of the run that ended
# --------------------------------------------------------------------------------------------- #

RESTARTS = _load("restarts.yaml")


def test_restarted_with_exit0_and_ready_again_is_a_masked_crash_not_ready():
    """restartPolicy Always brings an exit-0 crash back; Ready again must not pass the wait."""
    pod = RESTARTS["pods"]["ready_after_exit0"]
    v = w.evaluate([pod], ROUTES["accepted"], logs=RESTARTS["logs"])
    assert v["state"] == "failed"
    msg = v["message"]
    assert "restarted 1 time(s) and is Ready again" in msg and "last exit code 0 (reason Completed" in msg
    assert "crash_exit_zero" in msg and "never exits 0 on its own" in msg
    # the log's root exception, not only the status
    assert "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered'" in msg
    # the fix
    assert "foreground process" in msg and "kubectl logs --previous" in msg
    assert v["pods"][0]["diagnosis"]["code"] == "crash_exit_zero"


def test_tolerated_restarts_leave_a_ready_pod_ready():
    pod = RESTARTS["pods"]["ready_after_exit0"]
    assert w.evaluate([pod], ROUTES["accepted"], max_restarts=1)["state"] == "ready"


def test_exit0_behind_a_pipeline_names_the_wrapper_and_the_exception():
    pod = RESTARTS["pods"]["sglang_tee_exit0"]
    v = w.evaluate([pod], check_route=False, logs=RESTARTS["logs"])
    msg = v["message"]
    assert v["state"] == "failed" and "restarted 3 time(s)" in msg and "crash_exit_zero" in msg
    assert "the command hides the engine's exit status" in msg and "tee" in msg
    assert "torch.OutOfMemoryError: CUDA out of memory" in msg
    assert "Received sigquit from a child process" not in msg.split("torch.OutOfMemoryError")[0]


def test_oom_killed_restart_names_the_oom_killer_and_the_memory_limit():
    v = w.evaluate([RESTARTS["pods"]["oom_killed"]], check_route=False)
    msg = v["message"]
    assert v["state"] == "failed" and "oom_killed" in msg and "OOM killer" in msg and "memory limit" in msg
    assert "could not be read" in msg  # no log given: say where to read it


def test_signal_of_the_ended_run_is_named():
    v = w.evaluate([RESTARTS["pods"]["killed_by_signal"]], check_route=False)
    msg = v["message"]
    assert v["state"] == "failed" and "signal 11 (SIGSEGV)" in msg and "crashed" in msg
    assert v["pods"][0]["last_exit"]["signal"] == 11


def test_wait_rollout_reads_the_previous_log_of_the_failed_pod_only():
    asked = []

    def read_log(pod, container, previous):
        asked.append((pod, container, previous))
        return RESTARTS["logs"].get(pod)

    fc = FakeClock()
    pods = [RESTARTS["pods"]["ready_after_exit0"], PODS["ready"]]
    v = w.wait_rollout(lambda: (pods, ROUTES["accepted"]), timeout=60, clock=fc.clock, sleep=fc.sleep,
                       read_log=read_log, replicas=2)
    assert v["state"] == "failed" and v["polls"] == 1
    assert asked == [("glm-5-2-fp8-vllm-7d9c6b5f4-r1a2b", "engine", True)]
    assert "illegal memory access" in v["message"]
