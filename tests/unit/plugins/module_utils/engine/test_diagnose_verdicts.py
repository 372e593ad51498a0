"""Verdicts that need evidence and that do not mislead, in the diagnosis and in the wait (one code for both).

Derived from the healthy vLLM scenario (tests/unit/fixtures/diagnose/healthy_vllm.yaml) by changing what the
cluster records in each case. The records follow the writers named beside each test: the kubelet's eviction
manager (kubernetes/kubernetes v1.33.0 pkg/kubelet/eviction/eviction_manager.go, helpers.go), the scheduler's
preemption summary (pkg/scheduler/framework/preemption/preemption.go), the kubelet's volume manager
(pkg/kubelet/volumemanager, FailedMount) and image manager (pkg/kubelet/images/image_manager.go), the prober
(pkg/kubelet/prober/prober.go, worker.go) and kuberuntime_manager.go (Killing), SGLang's kill_process_tree
(sgl-project/sglang python/sglang/srt/utils/common.py).
"""
from __future__ import annotations

import copy
import os

import yaml

from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose, _diagnose_local
from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_k8s, _k8s_shape
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait as w
from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "..", "fixtures", "diagnose")
with open(os.path.join(FIX, "healthy_vllm.yaml")) as _f:
    HEALTHY = yaml.safe_load(_f)
NOW = _timeline.parse_time(HEALTHY["now"])


def scenario():
    sc = copy.deepcopy(HEALTHY)
    pod = next(o for o in sc["objects"] if o["kind"] == "Pod")
    return sc, pod


def diagnose(sc, now=NOW, logs=None):
    return _diagnose_k8s.diagnose_kubernetes(sc["objects"], logs if logs is not None else sc.get("logs"), namespace=sc["namespace"],
                                             name=sc["name"], served_model_name=sc["served_model_name"], now=now)


def wait(sc, now=NOW, **kw):
    objs = sc["objects"]
    return w.evaluate([o for o in objs if o["kind"] == "Pod"], None, now=now, check_route=False,
                      events=[o for o in objs if o["kind"] == "Event"], **kw)


def event(pod, reason, message, etype="Warning", count=1, first=None, last=None, field=None):
    ev = {"apiVersion": "v1", "kind": "Event", "type": etype, "reason": reason, "message": message, "count": count,
          "metadata": {"name": "%s.%s" % (pod["metadata"]["name"], reason.lower()), "namespace": "llm-lab"},
          "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": "llm-lab",
                             "uid": pod["metadata"]["uid"]},
          "firstTimestamp": first or HEALTHY["now"], "lastTimestamp": last or HEALTHY["now"]}
    if field:
        ev["involvedObject"]["fieldPath"] = field
    return ev


def not_ready(pod):
    for c in pod["status"]["conditions"]:
        if c["type"] in ("Ready", "ContainersReady"):
            c.update(status="False", reason="ContainersNotReady", lastTransitionTime="2026-08-02T08:00:06Z")


# ---- issue 22.6: never healthy for a pod that is not Ready ------------------------------------------------------


def test_init_container_running_is_not_healthy():
    sc, pod = scenario()
    not_ready(pod)
    pod["status"]["phase"] = "Pending"
    pod["status"]["initContainerStatuses"] = [{"name": "fetch-config", "ready": False, "restartCount": 0,
                                               "image": "busybox", "imageID": "", "started": True,
                                               "state": {"running": {"startedAt": "2026-08-02T08:00:10Z"}}}]
    pod["status"]["containerStatuses"][0].update(ready=False, started=False,
                                                 state={"waiting": {"reason": "PodInitializing"}})
    res = diagnose(sc)
    assert res["verdict"] == "not_ready", res["summary"]
    assert "init container fetch-config is running" in "\n".join(res["findings"][0]["evidence"])


def test_evicted_before_any_status_was_recorded_is_evicted_not_healthy():
    sc, pod = scenario()
    pod["status"] = {"phase": "Failed", "reason": "Evicted",
                     "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki.",
                     "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                                     "message": "The node was low on resource: memory.",
                                     "lastTransitionTime": "2026-08-02T08:50:00Z"}]}
    res = diagnose(sc)
    assert res["verdict"] == "evicted", res["summary"]
    f = res["findings"][0]
    assert "low on resource: memory" in f["evidence"][0] and "TerminationByKubelet" in f["evidence"][1]
    v = wait(sc)
    assert v["state"] == "failed" and v["pods"][0]["diagnosis"]["code"] == "evicted", v["message"]


def test_empty_status_is_not_healthy():
    sc, pod = scenario()
    pod["status"] = {}
    res = diagnose(sc)
    assert res["verdict"] != "healthy" and res["verdict"] == "not_ready", res["summary"]
    assert "no Ready condition" in "\n".join(res["findings"][0]["evidence"])
    assert wait(sc)["state"] == "waiting"


def test_no_pods_and_no_workload_is_not_healthy():
    res = _diagnose_k8s.diagnose_kubernetes([], {}, namespace="llm-lab", name="glm-5-2-fp8-vllm", now=NOW)
    assert res["verdict"] == "no_pods" and res["verdict"] != "healthy"


def test_wrong_typed_fields_count_as_absent():
    sc, pod = scenario()
    pod["status"]["conditions"] = "Ready"
    pod["status"]["containerStatuses"][0]["restartCount"] = "many"
    pod["spec"]["containers"][0]["startupProbe"]["periodSeconds"] = [10]
    pod["metadata"]["creationTimestamp"] = 12
    res = diagnose(sc)
    assert res["verdict"] not in ("healthy",)
    assert _k8s_shape.shape(pod)["status"].get("conditions") is None
    assert "restartCount" not in _k8s_shape.shape(pod)["status"]["containerStatuses"][0]


# ---- issue 23.4: fail in minutes on what never clears ---------------------------------------------------------


def _pending(pod, created="2026-08-02T08:55:00Z"):
    pod["metadata"]["creationTimestamp"] = created
    not_ready(pod)
    pod["status"]["phase"] = "Pending"


def test_image_that_does_not_exist_fails_the_first_poll():
    sc, pod = scenario()
    _pending(pod)
    pod["status"]["containerStatuses"][0].update(ready=False, started=False, state={"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "vllm/vllm-openai:v0.99.0"'}})
    sc["objects"].append(event(pod, "Failed", 'Failed to pull image "vllm/vllm-openai:v0.99.0": rpc error: code = '
                                              'NotFound desc = failed to pull and unpack image "docker.io/vllm/vllm-openai'
                                              ':v0.99.0": failed to resolve reference "docker.io/vllm/vllm-openai:v0.99.0"'
                                              ': docker.io/vllm/vllm-openai:v0.99.0: not found'))
    v = wait(sc)
    assert v["state"] == "failed", v["message"]
    assert v["pods"][0]["diagnosis"]["code"] == "image_pull" and "registry does not have this image" in v["message"]


def test_a_pull_that_may_still_succeed_keeps_waiting():
    sc, pod = scenario()
    _pending(pod)
    pod["status"]["containerStatuses"][0].update(ready=False, started=False, state={"waiting": {
        "reason": "ErrImagePull", "message": "dial tcp 10.0.0.9:443: i/o timeout"}})
    assert wait(sc)["state"] == "waiting"


def _failed_mount(sc, pod, first, count):
    _pending(pod, created=first)
    pod["status"]["containerStatuses"][0].update(ready=False, started=False,
                                                 state={"waiting": {"reason": "ContainerCreating"}})
    sc["objects"].append(event(pod, "FailedMount", 'MountVolume.SetUp failed for volume "model" : hostPath type check '
                               'failed: /mnt/nvme/models/GLM-5.2-FP8/3f2a9c1 is not a directory', count=count,
                               first=first))


def test_a_failed_mount_that_persists_fails_within_minutes():
    sc, pod = scenario()
    _failed_mount(sc, pod, first="2026-08-02T08:57:30Z", count=4)  # 150 s before now
    v = wait(sc)
    assert v["state"] == "failed" and v["pods"][0]["diagnosis"]["code"] == "mount_failed", v["message"]
    assert "has failed for 2 min 30 s" in v["message"] and "stage it on this node" in v["message"]


def test_a_fresh_failed_mount_keeps_waiting():
    sc, pod = scenario()
    _failed_mount(sc, pod, first="2026-08-02T08:59:40Z", count=1)
    assert wait(sc)["state"] == "waiting"


def _unschedulable(pod, message, since):
    _pending(pod, created=since)
    pod["spec"].pop("nodeName")
    pod["status"].pop("containerStatuses")
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "lastTransitionTime": since, "message": message}]


def test_no_feasible_node_fails_within_minutes_not_at_the_schedule_timeout():
    sc, pod = scenario()
    _unschedulable(pod, "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector. preemption: "
                        "0/5 nodes are available: 5 Preemption is not helpful for scheduling.", "2026-08-02T08:58:00Z")
    v = wait(sc, schedule_timeout=900)
    assert v["state"] == "failed", v["message"]
    assert "no node can ever take it" in v["message"]


def test_insufficient_gpus_that_may_free_up_keeps_waiting():
    sc, pod = scenario()
    _unschedulable(pod, "0/5 nodes are available: 5 Insufficient nvidia.com/gpu. preemption: 0/5 nodes are available: "
                        "5 No preemption victims found for incoming pod.", "2026-08-02T08:58:00Z")
    assert wait(sc, schedule_timeout=900)["state"] == "waiting"


# ---- issue 23.8: diagnoses that do not mislead ---------------------------------------------------------------


def _restarted(pod, exit_code, reason):
    cs = pod["status"]["containerStatuses"][0]
    cs.update(restartCount=1, ready=False, started=False, state={"running": {"startedAt": "2026-08-02T08:59:30Z"}},
              lastState={"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": "2026-08-02T08:06:41Z",
                                        "finishedAt": "2026-08-02T08:59:20Z"}})
    not_ready(pod)


def test_liveness_kill_of_a_serving_vllm_with_exit_zero_is_engine_hung_in_both():
    sc, pod = scenario()
    _restarted(pod, 0, "Completed")
    field = "spec.containers{engine}"
    sc["objects"] += [event(pod, "Unhealthy", "Liveness probe failed: Get \"http://10.42.3.17:8000/health\": context "
                                              "deadline exceeded", count=5, field=field),
                      event(pod, "Killing", "Container engine failed liveness probe, will be restarted", etype="Normal",
                            field=field)]
    res = diagnose(sc, logs={})
    assert res["verdict"] == "engine_hung", res["summary"]
    v = wait(sc)
    assert v["state"] == "failed" and v["pods"][0]["diagnosis"]["code"] == "engine_hung", v["message"]
    assert "crash_exit_zero" not in v["message"] and "clean shutdown" in v["message"]


def test_sglang_self_kill_137_names_the_engines_own_exception():
    sc, pod = scenario()
    spec = pod["spec"]["containers"][0]
    spec.update(command=["python3", "-m", "sglang.launch_server"],
                args=["--model-path", "/mnt/nvme/models/Qwen3.5/9a1b", "--port", "8000"])
    _restarted(pod, 137, "Error")
    log = "\n".join([
        "[2026-08-02 08:59:19] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2741, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1011, in event_loop_overlap',
        "    batch = self.get_next_batch_to_run()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "[2026-08-02 08:59:19] Received sigquit from a child process. It usually means the child failed.",
    ])
    logs = {"%s/engine" % pod["metadata"]["name"]: {"previous": log}}
    res = diagnose(sc, logs=logs)
    f = res["findings"][0]
    assert res["verdict"] == "crashed", res["summary"]
    assert "RuntimeError: CUDA error: an illegal memory access" in f["evidence"][0]
    assert "SIGKILL comes from outside" not in f["hint"] and "OOM killer" not in f["evidence"][0]
    assert "SGLang's own" in f["hint"]
    v = wait(sc, logs={pod["metadata"]["name"]: log})
    assert v["state"] == "failed" and "RuntimeError: CUDA error" in v["message"]
    assert "SIGKILL comes from outside" not in v["message"]


def test_still_starting_past_any_plausible_window_is_not_inside_its_window():
    sc, pod = scenario()
    spec = pod["spec"]["containers"][0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        spec.pop(probe)
    not_ready(pod)
    cs = pod["status"]["containerStatuses"][0]
    cs.update(ready=False, started=True, state={"running": {"startedAt": "2026-08-02T08:06:41Z"}})
    early = diagnose(sc, now=_timeline.parse_time("2026-08-02T08:20:00Z"), logs={})
    assert early["verdict"] == "still_loading" and "inside its startup window" not in early["findings"][0]["hint"]
    late = diagnose(sc, now=_timeline.parse_time("2026-08-02T14:00:00Z"), logs={})
    assert late["verdict"] == "engine_hung", late["summary"]
    assert "no cold start takes longer than" in "\n".join(late["findings"][0]["evidence"])


def test_hints_do_not_contradict_the_rendered_rollout_or_volume():
    """The collection renders RollingUpdate maxSurge 0 and a hostPath model volume of type Directory."""
    sc, pod = scenario()
    _unschedulable(pod, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
                        "3 No preemption victims found for incoming pod.", "2026-08-02T08:58:00Z")
    res = diagnose(sc)
    f = next(f for f in res["findings"] if f["code"] == "unschedulable_gpus")
    assert "Recreate" not in f["hint"] and "maxSurge 0" in f["hint"]
    sc, pod = scenario()
    _failed_mount(sc, pod, first="2026-08-02T08:57:30Z", count=4)
    f = next(f for f in diagnose(sc)["findings"] if f["code"] == "mount_failed")
    assert "hostPath" in f["hint"] and "model_stage" in f["hint"]
    sc, pod = scenario()
    _unschedulable(pod, "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector. preemption: "
                        "0/5 nodes are available: 5 Preemption is not helpful for scheduling.", "2026-08-02T08:58:00Z")
    f = next(f for f in diagnose(sc)["findings"] if f["code"] == "unschedulable")
    assert "staged the revision" in f["hint"] and "k8s_node_name" in f["hint"]


def test_every_code_is_documented_in_precedence_order():
    """docs/diagnose.md lists the codes in the order that breaks ties between findings of one severity."""
    import re

    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "..", "..", "..", "docs", "diagnose.md")
    with open(doc) as f:
        rows = [(m.group(1), m.group(2)) for m in re.finditer(r"^\| `([a-z_]+)` \| (error|warning|info) \|", f.read(), re.M)]
    assert rows == list(_diagnose.CODES)


def test_a_fifo_at_the_local_log_path_is_not_read_and_does_not_block(tmp_path):
    fifo = tmp_path / "engine.log"
    os.mkfifo(str(fifo))
    assert _diagnose_local.current_run_log(str(fifo)) is None  # returns at once: no writer would ever come
    plain = tmp_path / "plain.log"
    plain.write_text("==== engine starting: old\nold run\n==== engine starting: new\nnew run\n")
    assert _diagnose_local.current_run_log(str(plain)).startswith("==== engine starting: new")
