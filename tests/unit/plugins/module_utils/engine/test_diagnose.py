"""engine_diagnose's rules on recorded objects: one verdict per failure, with the evidence that proves it.

Every object is written to the Kubernetes API schema and validated here (kubernetes-validate for built-in kinds,
the Gateway API v1.4.1 and AIBrix v0.7.0 CRD schemas for the rest); Events carry the reasons and messages the
scheduler (pkg/scheduler/schedule_one.go, noderesources/fit.go), the kubelet (pkg/kubelet/prober/prober.go,
kuberuntime/kuberuntime_manager.go, images/image_manager.go) and the gateway controller write.
"""
from __future__ import annotations

import copy
import os
import socket

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose, _diagnose_local
from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_k8s
from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(HERE, "..", "..", "fixtures", "diagnose")
GATEWAY = os.path.join(HERE, "..", "..", "fixtures", "schemas", "gateway-api-v1.4.1")
AIBRIX = os.path.join(HERE, "..", "..", "fixtures", "pd", "aibrix-v0.7.0")
K8S_VERSION = "1.33.0"
CRDS = {"HTTPRoute": (GATEWAY, "httproutes.yaml", "v1"), "ReferenceGrant": (GATEWAY, "referencegrants.yaml", "v1beta1"),
        "StormService": (AIBRIX, "orchestration.aibrix.ai_stormservices.yaml", "v1alpha1")}
_SCHEMAS = {}


def _crd_schema(kind):
    if kind not in _SCHEMAS:
        root, filename, version = CRDS[kind]
        with open(os.path.join(root, filename)) as f:
            crd = yaml.safe_load(f)
        _SCHEMAS[kind] = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    return _SCHEMAS[kind]


def validate(obj):
    if obj["kind"] in CRDS:
        jsonschema.validate(obj, _crd_schema(obj["kind"]))
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _load(name):
    with open(os.path.join(FIX, name)) as f:
        return yaml.safe_load(f)


SCENARIOS = {}
for _file in ("sglang_completed_exit0", "startup_probe_web_sized", "route_dotted_service", "unschedulable_gpus",
              "unschedulable_rdma", "healthy_vllm"):
    SCENARIOS[_file] = _load(_file + ".yaml")
for _key, _sc in _load("containers.yaml").items():
    if not _key.startswith("_"):
        SCENARIOS[_key] = dict(_sc, namespace="llm-lab", name="glm-5-2-fp8-vllm", served_model_name="glm-5.2-fp8-vllm")


def run(sc, now=None, **overrides):
    for obj in sc["objects"]:
        validate(obj)  # every object a test judges, recorded or changed, is one the API server would accept
    args = dict(namespace=sc["namespace"], name=sc["name"], served_model_name=sc.get("served_model_name"),
                now=_timeline.parse_time(now or sc["now"]))
    args.update(overrides)
    return _diagnose_k8s.diagnose_kubernetes(sc["objects"], sc.get("logs"), **args)


def only(res, code):
    found = [f for f in res["findings"] if f["code"] == code]
    assert found, res
    return found[0]


def text(f):
    return "\n".join(f["evidence"])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recorded_objects_are_valid_api_objects(name):
    for obj in SCENARIOS[name]["objects"]:
        validate(obj)


def test_schema_validation_is_not_vacuous():
    pod = copy.deepcopy(SCENARIOS["oom_killed"]["objects"][0])
    pod["status"]["containerStatuses"][0]["restartCount"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod)
    route = copy.deepcopy(SCENARIOS["route_dotted_service"]["objects"][2])
    route["status"]["parents"][0]["conditions"][1]["status"] = "Maybe"
    with pytest.raises(jsonschema.ValidationError):
        validate(route)


# ---- the field report's cases ----------------------------------------------------------------


def test_sglang_completed_exit_zero_is_a_masked_crash_with_the_previous_logs_exception():
    res = run(SCENARIOS["sglang_completed_exit0"])
    assert res["verdict"] == "crash_exit_zero"
    f = only(res, "crash_exit_zero")
    assert f["object"] == "pod llm-prod/qwen35-397b-sglang-6b7f8c9d5-zt2lr container engine"
    ev = text(f)
    # the real cause, from kubectl logs --previous, not the misleading last line
    assert "TypeError: 'NoneType' object cannot be interpreted as an integer" in f["evidence"][1]
    assert "set_mamba_track_indices_from_reqs" in ev
    assert "Received sigquit from a child process" in ev
    # why Kubernetes saw 0: the wrapper pipes the engine into tee (engine_process's command rule)
    assert "tee" in ev and "restarted 5 times" in f["evidence"][0]
    assert "foreground" in f["hint"]
    assert res["summary"].startswith("crash_exit_zero: pod llm-prod/qwen35-397b-sglang-6b7f8c9d5-zt2lr")


def test_startup_probe_sized_for_web_services_kills_the_cold_start_with_window_and_progress():
    res = run(SCENARIOS["startup_probe_web_sized"])
    assert res["verdict"] == "startup_probe_killed"
    f = only(res, "startup_probe_killed")
    ev = text(f)
    # window = initialDelaySeconds + failureThreshold x periodSeconds = 0 + 30 x 10
    assert "300 s = 0 + 30 x 10 s" in ev
    assert "after running 5 min 35 s (its window is 5 min 00 s) while still loading: 30/141 shards" in f["evidence"][0]
    assert "Container engine failed startup probe, will be restarted" in ev
    assert "Startup probe failed" in ev
    # tqdm's 04:51 elapsed + 17:57 remaining: inside the field report's 17-28 min
    assert "about 22 min 48 s" in ev
    assert "restarts: 3, last exit code 137" in ev
    # not also reported as a plain crash of exit 137
    assert [x["code"] for x in res["findings"]] == ["startup_probe_killed"]


def test_route_to_a_dotted_service_that_never_existed():
    res = run(SCENARIOS["route_dotted_service"])
    assert res["verdict"] == "route_backend_not_found"
    f = only(res, "route_backend_not_found")
    assert f["object"] == "HTTPRoute aibrix-system/glm-5.2-fp8-vllm-router"
    assert "Service llm-lab/glm-5.2-fp8-vllm does not exist and never can" in f["evidence"][0]
    assert "DNS-1035" in f["evidence"][0] and "Service llm-lab/glm-5-2-fp8-vllm exists" in f["evidence"][0]
    assert "ResolvedRefs=False reason BackendNotFound" in text(f)
    assert "glm-5-2-fp8-vllm for model glm-5.2-fp8-vllm" in f["hint"]


def test_the_status_alone_proves_a_missing_backend_when_services_were_not_recorded():
    sc = copy.deepcopy(SCENARIOS["route_dotted_service"])
    sc["objects"] = [o for o in sc["objects"] if o["kind"] != "Service"]
    f = only(run(sc), "route_backend_not_found")
    assert f["evidence"] == ["gateway aibrix-eg: ResolvedRefs=False reason BackendNotFound: Service "
                             "llm-lab/glm-5.2-fp8-vllm not found"]


@pytest.mark.parametrize("name, resource, asks", [
    ("unschedulable_gpus", "nvidia.com/gpu on 4 of 12 node(s)", "8 nvidia.com/gpu"),
    ("unschedulable_rdma", "rdma/rdma_shared_device_a on 4 of 4 node(s)", "1 rdma/rdma_shared_device_a"),
])
def test_gpus_or_rdma_that_cannot_be_scheduled(name, resource, asks):
    res = run(SCENARIOS[name])
    assert res["verdict"] == "unschedulable_gpus"
    f = only(res, "unschedulable_gpus")
    assert f["evidence"][0].endswith("Insufficient " + resource)
    assert "the pod requests %s per replica" % asks in text(f)
    assert "Event FailedScheduling" in text(f)


def test_a_taint_alone_is_unschedulable_not_gpus():
    sc = copy.deepcopy(SCENARIOS["unschedulable_gpus"])
    msg = "0/8 nodes are available: 8 node(s) had untolerated taint {dedicated: inference-prod}. preemption: 0/8 " \
          "nodes are available: 8 Preemption is not helpful for scheduling."
    sc["objects"][0]["status"]["conditions"][0]["message"] = msg
    sc["objects"][1]["message"] = msg
    res = run(sc)
    assert res["verdict"] == "unschedulable" and "untolerated taint" in text(only(res, "unschedulable"))


# ---- one scenario per container code ---------------------------------------------------------


@pytest.mark.parametrize("name, code, headline, evidence", [
    ("oom_killed", "oom_killed", "was killed by the kernel's OOM killer (exit status 137)", "Model loading took"),
    ("engine_core_init_failed", "crashed", "ended with exit status 1",
     "ValueError: To serve at least one request with the models's max seq len (131072)"),
    ("bad_argument", "bad_argument", "refused its arguments (exit status 2): api_server.py: error: argument "
     "--max-model-len", "--max-model-len"),
    ("model_not_found", "model_not_found", "the model /mnt/nvme/models/GLM-5.2-FP8/3f2a9c1 does not exist",
     "Invalid repository ID or local directory specified"),
    ("crashed_signal", "crashed", "exit status 139 (SIGSEGV: 128 + 11)", "Segfault encountered"),
    ("image_pull", "image_pull", "ImagePullBackOff", "code = NotFound"),
    ("mount_failed", "mount_failed", "volume model, pvc-6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b does not mount",
     "timed out waiting for the condition"),
    ("container_config", "container_config", "CreateContainerConfigError: secret \"hf-token\" not found", "Error: secret"),
    ("still_loading", "still_loading", "starting for 6 min 40 s of its 60 min 00 s startup window",
     "97/141 [06:02 elapsed]"),
    ("no_pods", "no_pods", "the workload has no pods (spec.replicas 1)", "exceeded quota: gpu-quota"),
    ("workload_not_found", "workload_not_found", "no Deployment, StormService or LeaderWorkerSet llm-lab/glm-5-2-fp8-vllm",
     "llm-lab/glm-5-2-fp8-vllm"),
])
def test_each_container_failure_gets_its_code_and_evidence(name, code, headline, evidence):
    res = run(SCENARIOS[name])
    assert res["verdict"] == code, res
    f = only(res, code)
    assert headline in f["evidence"][0]
    assert evidence in text(f)
    assert f["severity"] == _diagnose.SEVERITY[code] and f["hint"]
    assert res["summary"].startswith(code + ": ")


def test_the_root_cause_is_the_engine_cores_exception_not_the_see_above_wrapper():
    f = only(run(SCENARIOS["engine_core_init_failed"]), "crashed")
    assert f["evidence"][1].startswith("log (kubectl logs --previous): ValueError: To serve at least one request")
    assert "then: RuntimeError: Engine core initialization failed. See root cause above." in f["evidence"][2]
    assert "Back-off restarting failed container engine" in text(f)


def test_loading_past_the_startup_window_is_a_probe_kill_not_loading():
    res = run(SCENARIOS["still_loading"], now="2026-08-02T09:07:00Z")
    f = only(res, "startup_probe_killed")
    assert "has been starting for 60 min 19 s" in f["evidence"][0]


def test_without_a_startup_probe_the_liveness_window_is_the_one_that_kills():
    sc = copy.deepcopy(SCENARIOS["still_loading"])
    container = sc["objects"][0]["spec"]["containers"][0]
    del container["startupProbe"]
    container["livenessProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    sc["objects"][0]["status"]["containerStatuses"][0]["started"] = True
    f = only(run(sc), "startup_probe_killed")
    assert "of its 30 s liveness window (30 s = 0 + 3 x 10 s)" in f["evidence"][0]
    assert "there is no startupProbe" in text(f)


def test_a_liveness_kill_of_a_container_without_startup_probe_is_reported_with_its_window():
    sc = copy.deepcopy(SCENARIOS["startup_probe_web_sized"])
    pod = sc["objects"][0]
    del pod["spec"]["containers"][0]["startupProbe"]
    sc["objects"][2]["message"] = "Container engine failed liveness probe, will be restarted"
    sc["objects"][1]["message"] = sc["objects"][1]["message"].replace("Startup", "Liveness")
    f = only(run(sc), "startup_probe_killed")
    assert "killed by its liveness probe" in f["evidence"][0] and "150 s = 0 + 5 x 30 s" in text(f)
    assert "there is no startupProbe" in text(f)


def test_a_liveness_kill_after_the_engine_had_served_is_a_hang_not_a_startup_problem():
    sc = copy.deepcopy(SCENARIOS["startup_probe_web_sized"])
    sc["objects"][2]["message"] = "Container engine failed liveness probe, will be restarted"
    sc["objects"][1]["message"] = 'Liveness probe failed: Get "http://10.42.3.17:8000/health": context deadline exceeded'
    sc["logs"]["glm-5-2-fp8-vllm-7d9c6b5f4-k7w9m/engine"]["previous"] = (
        "(APIServer pid=1) INFO:     Application startup complete.\n"
        "(APIServer pid=1) INFO:     10.42.7.3:51234 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n")
    res = run(sc)
    assert res["verdict"] == "engine_hung"
    f = only(res, "engine_hung")
    assert "killed by its liveness probe after it had served" in f["evidence"][0]
    assert "context deadline exceeded" in text(f)


# ---- names, route, endpoints: one field changed in a healthy engine ---------------------------


def healthy():
    return copy.deepcopy(SCENARIOS["healthy_vllm"])


def _kind(sc, kind):
    return next(o for o in sc["objects"] if o["kind"] == kind)


def test_healthy_engine_is_healthy():
    res = run(healthy())
    assert res["verdict"] == "healthy" and [f["code"] for f in res["findings"]] == ["healthy"]
    assert "1/1 pod(s) of Deployment llm-lab/glm-5-2-fp8-vllm Ready" in res["summary"]


def test_route_not_accepted_by_the_gateway():
    sc = healthy()
    cond = _kind(sc, "HTTPRoute")["status"]["parents"][0]["conditions"][0]
    cond.update(status="False", reason="NotAllowedByListeners",
                message="No listeners included by this parent ref allowed this attachment.")
    res = run(sc)
    assert res["verdict"] == "route_not_accepted"
    f = only(res, "route_not_accepted")
    assert "Accepted=False reason NotAllowedByListeners" in f["evidence"][0] and "allowedRoutes" in f["evidence"][0]


def test_route_without_any_status_is_not_accepted():
    sc = healthy()
    del _kind(sc, "HTTPRoute")["status"]
    assert "no gateway controller has reported" in text(only(run(sc), "route_not_accepted"))


def test_a_route_renamed_away_from_model_router_is_never_read_by_the_gateway():
    sc = healthy()
    _kind(sc, "HTTPRoute")["metadata"]["name"] = "glm52-route"
    res = run(sc)
    assert res["verdict"] == "route_missing"
    f = only(res, "route_missing")
    assert "there is no HTTPRoute aibrix-system/glm-5.2-fp8-vllm-router" in f["evidence"][0]
    assert "HTTPRoute aibrix-system/glm52-route matches header model='glm-5.2-fp8-vllm' but the gateway never reads it" \
        in text(f)


def test_a_route_is_not_judged_missing_when_no_route_was_recorded():
    sc = healthy()
    sc["objects"] = [o for o in sc["objects"] if o["kind"] != "HTTPRoute"]
    assert run(sc)["verdict"] == "healthy"


def test_cross_namespace_backend_without_reference_grant_is_not_permitted():
    sc = healthy()
    grant = _kind(sc, "ReferenceGrant")
    grant["spec"]["to"][0]["name"] = "another-service"
    f = only(run(sc), "route_backend_not_found")
    assert f["evidence"][0] == "no ReferenceGrant in llm-lab lets HTTPRoutes from aibrix-system reach Service glm-5-2-fp8-vllm"
    grant["spec"]["to"][0].pop("name")  # a grant for every Service in the namespace permits it
    assert run(sc)["verdict"] == "healthy"


def _drop_served_name(args):
    i = args.index("--served-model-name")
    del args[i:i + 2]


@pytest.mark.parametrize("change, expect", [
    (lambda sc: _kind(sc, "Pod")["spec"]["containers"][0]["args"].__setitem__(3, "glm-5.2-fp8"),
     "serves 'glm-5.2-fp8' but is labelled model.aibrix.ai/name='glm-5.2-fp8-vllm'"),
    (lambda sc: _kind(sc, "HTTPRoute")["spec"]["rules"][0]["matches"][0]["headers"][0].__setitem__("value", "GLM-5.2"),
     "matches header model='GLM-5.2', not 'glm-5.2-fp8-vllm'"),
    (lambda sc: _drop_served_name(_kind(sc, "Pod")["spec"]["containers"][0]["args"]),
     "(no --served-model-name: the model path is the name)"),
])
def test_served_name_mismatch_between_label_engine_and_route(change, expect):
    sc = healthy()
    change(sc)
    res = run(sc)
    assert res["verdict"] == "served_name_mismatch"
    assert expect in text(only(res, "served_name_mismatch"))


def test_requested_model_other_than_the_label_is_a_mismatch():
    res = run(healthy(), served_model_name="glm-5.2-fp8")
    f = only(res, "served_name_mismatch")
    assert "the requested model 'glm-5.2-fp8' differs from the label model.aibrix.ai/name='glm-5.2-fp8-vllm'" in text(f)


def test_service_selecting_none_of_the_pods_has_no_endpoints():
    sc = healthy()
    _kind(sc, "Service")["spec"]["selector"] = {"app": "glm-vllm"}
    _kind(sc, "EndpointSlice")["endpoints"] = []
    res = run(sc)
    assert res["verdict"] == "service_no_endpoints"
    assert 'selects none of the engine\'s pods: selector {"app": "glm-vllm"}' in text(only(res, "service_no_endpoints"))


def test_ready_pod_behind_an_empty_endpointslice_names_the_target_port():
    sc = healthy()
    _kind(sc, "Service")["spec"]["ports"][0]["targetPort"] = "api"
    _kind(sc, "EndpointSlice")["endpoints"][0]["conditions"]["ready"] = False
    f = only(run(sc), "service_no_endpoints")
    assert "has no ready endpoint although 1 engine pod(s) are Ready" in f["evidence"][0]
    assert "targetPort 'api' names no container port of the pods" in text(f)


def test_no_endpoints_while_pods_load_is_not_reported_the_pods_explain_it():
    sc = healthy()
    pod = _kind(sc, "Pod")
    pod["status"]["conditions"][1].update(status="False", reason="ContainersNotReady")
    pod["status"]["containerStatuses"][0].update(ready=False, started=False)
    _kind(sc, "EndpointSlice")["endpoints"][0]["conditions"]["ready"] = False
    res = run(sc, now="2026-08-02T08:10:00Z")
    assert [f["code"] for f in res["findings"]] == ["still_loading"]
    assert res["verdict"] == "still_loading"


def test_a_serving_engine_with_a_traceback_in_its_log_is_a_warning():
    sc = healthy()
    sc["logs"] = {"glm-5-2-fp8-vllm-7d9c6b5f4-k7w9m/engine": (
        "(APIServer pid=1) INFO:     Application startup complete.\n"
        "(APIServer pid=1) ERROR 08-02 08:50:00 [serving_chat.py:1042] Error in chat completion stream generator.\n"
        "(APIServer pid=1) ERROR 08-02 08:50:00 [serving_chat.py:1042] Traceback (most recent call last):\n"
        "(APIServer pid=1) ERROR 08-02 08:50:00 [serving_chat.py:1042]   File \"/vllm/entrypoints/openai/serving_chat.py\", "
        "line 611, in chat_completion_stream_generator\n"
        "(APIServer pid=1) ERROR 08-02 08:50:00 [serving_chat.py:1042] json.decoder.JSONDecodeError: Expecting value: "
        "line 1 column 1 (char 0)\n")}
    res = run(sc)
    assert res["verdict"] == "engine_traceback"
    f = only(res, "engine_traceback")
    assert f["severity"] == "warning"
    assert "json.decoder.JSONDecodeError: Expecting value" in text(f) and "serving_chat.py:611" in text(f)


# vLLM 0.32 vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py NixlConnectorWorker._log_failure:
# logger.error("NIXL transfer failure: %s | Context: %s", failure_type, context) with the remote's host and port
# when the request's metadata is known; transfer_exception logs the exception after it (exc_info).
def _nixl_failure(kind, host="10.0.3.7", port=5600, req="cmpl-5b1f-0", msg=""):
    ctx = ("{'failure_type': '%s', 'request_id': '%s', 'engine_id': 'd-0', 'remote_engine_id': 'p-0', "
           "'remote_request_id': '%s', 'remote_host': '%s', 'remote_port': %d, 'num_local_blocks': 4, "
           "'num_remote_blocks': 4, 'local_block_ids_sample': [11, 12, 13, 14]}" % (kind, req, req, host, port))
    return ("(EngineCore_DP0 pid=311) ERROR 12-06 10:41:07 [base_worker.py:3092] NIXL transfer failure: %s%s | "
            "Context: %s\n" % (kind, ". " + msg if msg else "", ctx))


def test_a_serving_decode_engine_whose_kv_transfers_fail_says_so_over_its_tracebacks():
    """A decode engine that answers its probes while its KV transfers from the prefill side fail (each such request
    failed, vLLM's kv_load_failure_policy default): kv_transfer_failed, the failure types counted, the remote named,
    not a generic traceback warning (transfer_exception also logs its exception)."""
    sc = healthy()
    sc["logs"] = {"glm-5-2-fp8-vllm-7d9c6b5f4-k7w9m/engine": (
        "(APIServer pid=1) INFO:     Application startup complete.\n"
        + _nixl_failure("transfer_failed") * 3
        + _nixl_failure("transfer_exception", req="cmpl-77aa-0")
        + "(EngineCore_DP0 pid=311) ERROR 12-06 10:41:08 [base_worker.py:3101] Traceback (most recent call last):\n"
        "(EngineCore_DP0 pid=311) ERROR 12-06 10:41:08 [base_worker.py:3101]   File \"/vllm/nixl/base_worker.py\", "
        "line 3078, in _pop_done_transfers\n"
        "(EngineCore_DP0 pid=311) ERROR 12-06 10:41:08 [base_worker.py:3101] nixl._bindings.nixlBackendError: "
        "NIXL_ERR_BACKEND\n"
        + _nixl_failure("notification_failed", host="10.0.3.8", msg="P worker blocks will be freed after timeout. "
                        "This may indicate network issues."))}
    res = run(sc)
    assert res["verdict"] == "kv_transfer_failed", res
    f = only(res, "kv_transfer_failed")
    assert f["severity"] == "warning"
    assert ("holds 5 NIXL transfer failure(s): transfer_failed x3, notification_failed x1, transfer_exception x1"
            in f["evidence"][0])
    assert f["evidence"][1] == "with the remote engine(s) at 10.0.3.7:5600, 10.0.3.8:5600"
    assert "first: NIXL transfer failure: transfer_failed" in text(f) and "last: NIXL transfer failure: notification" in text(f)
    assert "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND" in text(f)  # the exception the container logged
    assert [x["code"] for x in res["findings"]] == ["kv_transfer_failed"]
    assert "UCX_TLS" in f["hint"] and "VLLM_NIXL_SIDE_CHANNEL_HOST" in f["hint"]


def test_a_local_engine_serving_with_handshake_failures_is_not_healthy(tmp_path):
    from ansible_collections.llmops.serving.plugins.module_utils.engine._diagnose import command_facts
    log = "(APIServer pid=9) INFO:     Application startup complete.\n" + _nixl_failure("handshake_failed", port=5601)
    facts = {"name": "decode", "run_dir": str(tmp_path), "state": {"state": "running", "pid": 4242, "pid_start": 1},
             "command": command_facts(["vllm", "serve", "/m", "--port", "8200"]), "log_file": str(tmp_path / "log"),
             "log": log, "model_missing": None, "stopped": [], "port_holders": [],
             "health": {"result": "ok", "seconds": 0.01}, "ages": {"running_s": 90.0}}
    res = _diagnose_local.diagnose_local(facts)
    assert res["verdict"] == "kv_transfer_failed", res
    assert "handshake_failed x1" in res["findings"][0]["evidence"][0]
    assert "10.0.3.7:5601" in res["findings"][0]["evidence"][1]
    facts["log"] = "(APIServer pid=9) INFO:     Application startup complete.\n"
    assert _diagnose_local.diagnose_local(facts)["verdict"] == "healthy"


def test_a_flood_of_kv_failures_is_counted_in_bounded_evidence():
    """Every failure counted, at most four remotes named, the lines clipped: a log of 20,000 failures from 20,000
    hosts (or one line of 1 MiB) does not become evidence of that size."""
    log = "".join(_nixl_failure("transfer_failed", host="10.1.%d.%d" % (i // 250, i % 250)) for i in range(20000))
    log += _nixl_failure("transfer_failed", msg="x" * (1 << 20))
    facts = _diagnose.analyse_log(log)
    kv = facts["kv_transfer_failures"]
    assert kv["count"] == 20001 and kv["types"] == {"transfer_failed": 20001}
    assert kv["remotes"] == ["10.1.0.0:5600", "10.1.0.1:5600", "10.1.0.2:5600", "10.1.0.3:5600"]
    f = _diagnose.kv_transfer_finding("engine x", facts, "log")
    assert max(len(e) for e in f["evidence"]) <= _diagnose.MAX_LINE + 100


def test_a_line_repeating_the_failure_opening_is_read_in_one_pass():
    """A request echoed into the log can repeat the opening ("NIXL transfer failure: x. ") 100,000 times on a line
    with no context after it: read with one scan and not counted (a lazy regular expression tried from each opening
    re-read the rest of the line: 100,000 x 4 MB). Text that only looks like the opening is no failure either."""
    noise = "prompt: " + "NIXL transfer failure: transfer_failed. " * 100000
    facts = _diagnose.analyse_log(noise + "\n" + "NIXL transfer failure: Transfer failed badly | Context: {}\n"
                                  + "NIXL transfer failure: transfer_failed and more | Context: {}\n"
                                  + _nixl_failure("transfer_failed"))
    assert facts["kv_transfer_failures"]["count"] == 1
    assert facts["kv_transfer_failures"]["types"] == {"transfer_failed": 1}


def test_the_root_cause_wins_the_verdict_over_its_consequences():
    sc = copy.deepcopy(SCENARIOS["unschedulable_gpus"])
    extra = [o for o in healthy()["objects"] if o["kind"] in ("Service", "EndpointSlice", "HTTPRoute")]
    _kind({"objects": extra}, "Service")["spec"]["selector"] = {"app.kubernetes.io/name": "glm-5-2-fp8-vllm"}
    _kind({"objects": extra}, "EndpointSlice")["endpoints"] = []
    sc["objects"] += extra
    res = run(sc)
    assert res["verdict"] == "unschedulable_gpus"
    assert "service_no_endpoints" not in [f["code"] for f in res["findings"]]


def test_verdict_is_the_most_severe_then_the_earliest_code():
    f = _diagnose.finding
    assert _diagnose.verdict_of([]) == "healthy"
    assert _diagnose.verdict_of([f("still_loading", "x", ["a"], "h"), f("engine_traceback", "x", ["a"], "h")]) == "engine_traceback"
    assert _diagnose.verdict_of([f("route_missing", "x", ["a"], "h"), f("oom_killed", "y", ["b"], "h")]) == "oom_killed"
    res = _diagnose.result([f("route_missing", "x", ["a"], "h"), f("oom_killed", "y", ["b"], "h")])
    assert [x["code"] for x in res["findings"]] == ["oom_killed", "route_missing"]
    assert res["summary"] == "oom_killed: y: b (+1 more: route_missing)"


def test_log_derived_evidence_never_carries_a_token():
    sc = copy.deepcopy(SCENARIOS["bad_argument"])
    token = "hf_" + "Ab3" * 12
    sc["logs"]["glm-5-2-fp8-vllm-7d9c6b5f4-k7w9m/engine"]["previous"] = (
        "api_server.py: error: argument --hf-token: unexpected value %s\n" % token)
    res = run(sc)
    assert token not in repr(res) and "********" in res["summary"]


# ---- logs ---------------------------------------------------------------------------------------


def test_interleaved_processes_keep_their_own_tracebacks():
    # vLLM prefixes every line of a logged traceback with "(<process> pid=N) LEVEL date [file:line] " (vllm/logger.py)
    log = "\n".join([
        "(Worker_TP0 pid=401) ERROR 08-02 08:38:02 [multiproc_executor.py:751] Traceback (most recent call last):",
        "(Worker_TP1 pid=402) INFO 08-02 08:38:02 [gpu_worker.py:298] Available KV cache memory: 5.12 GiB",
        "(Worker_TP0 pid=401) ERROR 08-02 08:38:02 [multiproc_executor.py:751]   File \"/vllm/worker.py\", line 10, in run",
        "(Worker_TP1 pid=402) ERROR 08-02 08:38:02 [multiproc_executor.py:751] Traceback (most recent call last):",
        "(Worker_TP1 pid=402) ERROR 08-02 08:38:02 [multiproc_executor.py:751]   File \"/vllm/worker.py\", line 12, in run",
        "(Worker_TP0 pid=401) ERROR 08-02 08:38:02 [multiproc_executor.py:751] torch.OutOfMemoryError: CUDA out of memory.",
        "(Worker_TP1 pid=402) ERROR 08-02 08:38:02 [multiproc_executor.py:751] torch.OutOfMemoryError: CUDA out of memory.",
        "(EngineCore_DP0 pid=212) ERROR 08-02 08:38:03 [multiproc_executor.py:230] Worker proc VllmWorker-0 died "
        "unexpectedly (exit code: 1), shutting down executor.",
    ])
    facts = _diagnose.analyse_log(log)
    assert [t["stream"] for t in facts["tracebacks"]] == ["Worker_TP0/401", "Worker_TP1/402"]
    assert facts["root_exception"] == "torch.OutOfMemoryError: CUDA out of memory." and facts["root_count"] == 2
    assert facts["root_at"] == "worker.py:12 in run"
    assert any("Worker proc VllmWorker-0 died unexpectedly" in x for x in facts["death_lines"])


def test_chained_exceptions_report_the_outermost_and_colours_are_stripped():
    log = ("\x1b[0;36m(APIServer pid=1)\x1b[0;0m Traceback (most recent call last):\n"
           "  File \"a.py\", line 1, in f\n"
           "FileNotFoundError: [Errno 2] No such file or directory: '/m/config.json'\n\n"
           "The above exception was the direct cause of the following exception:\n\n"
           "Traceback (most recent call last):\n"
           "  File \"b.py\", line 2, in g\n"
           "OSError: cannot load the model\n")
    facts = _diagnose.analyse_log(log)
    assert facts["root_exception"] == "OSError: cannot load the model"
    assert facts["model_missing"]["path"] == "/m/config.json"
    assert _diagnose.analyse_log("WARNING: not an exception\n")["tracebacks"] == []


def test_tqdm_updates_separated_by_carriage_returns_give_the_last_progress():
    facts = _diagnose.analyse_log("Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
                                  "Loading safetensors checkpoint shards: 100% Completed | 4/4 [01:10<00:00, 17.5s/it]\n")
    assert facts["progress"]["n"] == 4 and facts["progress"]["elapsed_s"] == 70
    assert "still initialising" in _diagnose.progress_text(facts["progress"])


def test_command_facts_of_vllm_sglang_and_shell_wrappers():
    v = _diagnose.command_facts(["vllm", "serve", "/m/glm", "--served-model-name", "a", "b", "--port=9000"])
    assert (v["engine"], v["model"], v["served_names"], v["port"]) == ("vllm", "/m/glm", ["a", "b"], 9000)
    s = _diagnose.command_facts(["bash", "-lc", "exec python3 -m sglang.launch_server --model-path /m/q --host 0.0.0.0"])
    assert (s["engine"], s["model"], s["served_names"], s["port"], s["served_names_given"]) == \
        ("sglang", "/m/q", ["/m/q"], 30000, False)


# ---- local facts from /proc ---------------------------------------------------------------------


def test_port_holders_finds_the_listening_process_through_proc():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        port = sock.getsockname()[1]
        holders = _diagnose_local.port_holders(port)
        assert [h["pid"] for h in holders] == [os.getpid()]
    finally:
        sock.close()
    assert _diagnose_local.port_holders(port) == []


def test_stopped_members_reads_state_from_an_injected_proc_root(tmp_path):
    for pid, state, pgrp in ((100, "T", 100), (101, "S", 100), (102, "t", 100), (200, "T", 200)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text("%d (python3 x) %s 1 %d %d 0 -1 0" % (pid, state, pgrp, pgrp))
    assert [(s["pid"], s["comm"]) for s in _diagnose_local.stopped_members(100, str(tmp_path))] == [(100, "python3 x"), (102, "python3 x")]


def test_current_run_log_is_the_section_after_the_last_start_banner(tmp_path):
    log = tmp_path / "e.log"
    log.write_text("==== 2026-08-02T08:00:00Z starting: old\nTraceback (most recent call last):\n  File \"x\", line 1, in y\n"
                   "ValueError: old\n==== 2026-08-02T08:00:09Z exited: returncode=1\n"
                   "==== 2026-08-02T08:01:00Z starting: new\nserving\n")
    assert _diagnose_local.current_run_log(str(log)) == "==== 2026-08-02T08:01:00Z starting: new\nserving\n"
    assert _diagnose_local.current_run_log(str(tmp_path / "missing.log")) is None
