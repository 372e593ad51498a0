"""The engine objects for both engines: structure users rely on, validated against the real schemas."""
from __future__ import annotations

import hashlib
import json
import os

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils.kube import _render_dir
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import K8S_VERSION, PROFILES

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMAS = os.path.join(HERE, "..", "..", "fixtures", "schemas", "gateway-api-v1.4.1")

VLLM = dict(
    engine="vllm",
    served_model_name="glm-5.2-fp8-vllm",
    namespace="llm-lab",
    model_path="/mnt/nvme/models/GLM-5.2-FP8/3f2a9c1",
    image="registry.example/vllm-openai:v0.26.0@sha256:" + "a" * 64,
    profile="glm-5.2-fp8",
    profiles=PROFILES,
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H20"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    kernel_cache_dir="/mnt/nvme/kernel-cache/vllm/0c1d2e3f4a5b",
    kernel_cache_env={"VLLM_CACHE_ROOT": "/mnt/nvme/kernel-cache/vllm/0c1d2e3f4a5b/vllm",
                      "TRITON_CACHE_DIR": "/mnt/nvme/kernel-cache/vllm/0c1d2e3f4a5b/triton"},
    hf_token_secret={"name": "hf-token", "key": "token"},
    image_pull_secret="registry-pull",
    # a Secret reference for the API key, and tuning knobs whose names contain TOKEN but hold no credential
    env=[{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "engine-api", "key": "key"}}},
         {"name": "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", "value": "163840"},
         {"name": "TOKENIZERS_PARALLELISM", "value": "false"}],
)
SGLANG = dict(VLLM, engine="sglang", served_model_name="glm-5.2-fp8-sglang-test",
              image="lmsysorg/sglang:v0.5.16b1@sha256:" + "b" * 64, model_source="shared_fs",
              model_path="/mnt/shared/models/GLM-5.2-FP8/v1", model_pvc="models-ro", model_pvc_sub_path="GLM-5.2-FP8/v1")


def _crd_schema(filename, version):
    with open(os.path.join(SCHEMAS, filename)) as f:
        crd = yaml.safe_load(f)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise AssertionError("no %s in %s" % (version, filename))


def _by_kind(built):
    return {o["kind"]: o for o in built["objects"]}


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def built(request):
    return request.param, k8s.build(VLLM if request.param == "vllm" else SGLANG)


def test_objects_in_apply_order(built):
    b = built[1]
    assert [o["kind"] for o in b["objects"]] == ["Service", "ReferenceGrant", "HTTPRoute", "Deployment"]


def test_builtin_kinds_validate_against_kubernetes_schema(built):
    b = built[1]
    kinds = _by_kind(b)
    for kind in ("Service", "Deployment"):
        kubernetes_validate.validate(kinds[kind], K8S_VERSION, strict=True)


def test_gateway_objects_validate_against_gateway_api_v1_4_1(built):
    b = built[1]
    kinds = _by_kind(b)
    jsonschema.validate(kinds["HTTPRoute"], _crd_schema("httproutes.yaml", "v1"))
    jsonschema.validate(kinds["ReferenceGrant"], _crd_schema("referencegrants.yaml", "v1beta1"))
    assert kinds["ReferenceGrant"]["apiVersion"] == "gateway.networking.k8s.io/v1beta1"


def test_schema_validation_is_not_vacuous():
    bad = _by_kind(k8s.build(VLLM))["HTTPRoute"]
    bad["spec"]["rules"][0]["backendRefs"][0]["port"] = "eight-thousand"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _crd_schema("httproutes.yaml", "v1"))
    dep = _by_kind(k8s.build(VLLM))["Deployment"]
    dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"] = "many"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_aibrix_names_labels_and_route(built):
    engine, b = built
    model = VLLM["served_model_name"] if engine == "vllm" else SGLANG["served_model_name"]
    kinds = _by_kind(b)
    svc, route, grant, dep = kinds["Service"], kinds["HTTPRoute"], kinds["ReferenceGrant"], kinds["Deployment"]
    # Service: DNS-safe name derived from the model; in the engine namespace, not the gateway's
    # (the dot makes the DNS-1035 spelling lossy: the served name's hash keeps it apart from glm-5-2-...)
    assert svc["metadata"]["name"] == "%s-%s" % (model.replace(".", "-"), hashlib.sha256(model.encode()).hexdigest()[:8])
    assert svc["metadata"]["namespace"] == "llm-lab"
    # pod labels: the model name, byte-identical to --served-model-name
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["model.aibrix.ai/name"] == model
    assert labels["model.aibrix.ai/port"] == "8000"
    assert labels["model.aibrix.ai/engine"] == engine
    argv = b["command"]
    assert argv[argv.index("--served-model-name") + 1] == model
    # the Deployment does not carry the model label, so the AIBrix controller creates no competing route
    assert "model.aibrix.ai/name" not in dep["metadata"]["labels"]
    # the Service selects exactly the pods
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    assert svc["spec"]["ports"][0]["port"] == 8000
    # HTTPRoute: AIBrix name, gateway namespace, backend is the safe Service across namespaces
    assert route["metadata"] == dict(route["metadata"], name=model + "-router", namespace="aibrix-system")
    assert route["spec"]["parentRefs"][0]["name"] == "aibrix-eg"
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert backend == {"group": "", "kind": "Service", "name": svc["metadata"]["name"], "namespace": "llm-lab", "port": 8000}
    matches = route["spec"]["rules"][0]["matches"]
    assert {m["path"]["value"] for m in matches} >= {"/v1/completions", "/v1/chat/completions"}
    assert all(m["headers"] == [{"type": "Exact", "name": "model", "value": model}] for m in matches)
    # ReferenceGrant: in the Service's namespace, from HTTPRoutes in the gateway namespace, to that Service only
    assert grant["metadata"]["namespace"] == "llm-lab"
    assert grant["spec"]["from"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "aibrix-system"}]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": svc["metadata"]["name"]}]


def test_pod_spec(built):
    engine, b = built
    dep = _by_kind(b)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H20"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # one GPU node at a time, never a surge pod
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"]["mountPath"] == "/dev/shm"
    model_path = VLLM["model_path"] if engine == "vllm" else SGLANG["model_path"]
    assert mounts["model"]["mountPath"] == model_path and mounts["model"]["readOnly"] is True
    if engine == "vllm":
        assert vols["model"]["hostPath"] == {"path": model_path, "type": "Directory"}
    else:
        assert vols["model"]["persistentVolumeClaim"] == {"claimName": "models-ro", "readOnly": True}
        assert mounts["model"]["subPath"] == "GLM-5.2-FP8/v1"
    # kernel cache: node dir mounted at the same path, env points inside it
    assert vols["kernel-cache"]["hostPath"]["path"] == VLLM["kernel_cache_dir"]
    assert mounts["kernel-cache"]["mountPath"] == VLLM["kernel_cache_dir"]
    env = {e["name"]: e for e in c["env"]}
    assert env["VLLM_CACHE_ROOT"]["value"].startswith(VLLM["kernel_cache_dir"] + "/")
    # secrets only by reference
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert pod["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert not any(o["kind"] == "Secret" for o in b["objects"])
    assert all("valueFrom" in e for e in c["env"] if e["name"] == "HF_TOKEN")


def test_probes_cover_startup_timeout_and_cannot_kill_a_loading_engine(built):
    b = built[1]
    c = _by_kind(b)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    sp = c["startupProbe"]
    assert sp["httpGet"]["path"] == "/health"
    assert sp["periodSeconds"] * sp["failureThreshold"] >= 3600
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert "initialDelaySeconds" not in c[probe]  # gated by the startup probe instead
    assert b["probe_windows"]["startup_seconds"] >= 3600
    assert _by_kind(b)["Deployment"]["spec"]["progressDeadlineSeconds"] > 3600


def test_startup_window_follows_startup_timeout_with_headroom():
    b = k8s.build(dict(VLLM, startup_timeout=5405, probe_period=15))
    dep = _by_kind(b)["Deployment"]
    sp = dep["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    # 5405 s plus max(300 s, 10 %) = 5946 s: ceil(5946 / 15) periods, so a start that takes the whole
    # startup_timeout is reported by the wait, never killed by the kubelet mid-load
    assert sp["periodSeconds"] == 15 and sp["failureThreshold"] == 397
    assert b["probe_windows"]["startup_seconds"] - 5405 >= 300
    # and the Deployment controller does not call the rollout failed before the kubelet would
    assert dep["spec"]["progressDeadlineSeconds"] > b["probe_windows"]["startup_seconds"]
    small = k8s.build(dict(VLLM, startup_timeout=600, probe_period=10))["probe_windows"]["startup_seconds"]
    assert small >= 900


def test_engine_is_exec_form_main_process(built):
    engine, b = built
    c = _by_kind(b)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == (["vllm", "serve"] if engine == "vllm" else ["python3", "-m", "sglang.launch_server"])
    assert not any(tok in ("|", "&", "nohup", "tee") for tok in c["command"] + c["args"])


def test_sglang_profile_and_loader_pair():
    b = k8s.build(SGLANG)
    argv = b["command"]
    flags = {argv[i]: argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
             for i in range(len(argv)) if argv[i].startswith("--")}
    assert flags["--kv-cache-dtype"] == "fp8_e4m3"
    assert flags["--context-length"] == "131072"
    assert flags["--speculative-algorithm"] == "EAGLE"
    assert flags["--speculative-num-draft-tokens"] == "4"
    assert flags["--max-running-requests"] == "32"
    assert flags["--enable-metrics"] is True
    assert flags["--tp-size"] == "8"
    loader = json.loads(flags["--model-loader-extra-config"])
    assert loader == {"enable_multithread_load": True, "num_threads": 2}
    assert b["read_concurrency"]["concurrent_reads"] == 16


def test_loader_follows_model_source():
    nvme = k8s.build(dict(SGLANG, model_source="staged_nvme", model_pvc=None, model_pvc_sub_path=None))
    argv = nvme["command"]
    cfg = json.loads(argv[argv.index("--model-loader-extra-config") + 1])
    assert cfg == {"enable_multithread_load": True, "num_threads": 8}
    assert nvme["read_concurrency"]["concurrent_reads"] == 64
    v_nvme = k8s.build(VLLM)["command"]
    assert v_nvme[v_nvme.index("--safetensors-load-strategy") + 1] == "lazy"
    v_fs = k8s.build(dict(VLLM, model_source="shared_fs", replicas=2))
    argv = v_fs["command"]
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "prefetch"
    assert argv[argv.index("--safetensors-prefetch-num-threads") + 1] == "2"
    rc = v_fs["read_concurrency"]
    assert (rc["pods"], rc["tp_ranks"], rc["threads_per_rank"], rc["concurrent_reads"]) == (2, 8, 2, 32)
    assert any("exceeds read_streams_warn" in w for w in v_fs["warnings"])


def test_single_thread_sglang_sets_both_keys():
    b = k8s.build(dict(SGLANG, loader_threads=1))
    argv = b["command"]
    assert json.loads(argv[argv.index("--model-loader-extra-config") + 1]) == {"enable_multithread_load": False, "num_threads": 1}
    assert b["read_concurrency"]["concurrent_reads"] == 8


def test_sglang_loader_config_missing_a_key_is_refused():
    with pytest.raises(_k8s_checks.SpecError, match="num_threads.*single-threaded"):
        k8s.build(dict(SGLANG, engine_args={"model-loader-extra-config": {"enable_multithread_load": True}}))


@pytest.mark.parametrize("raw,why", [
    ("[" * 200 + "]" * 200, "nests deeper"),
    ('{"enable_multithread_load": true, "num_threads": NaN}', "refused"),
    ('{"enable_multithread_load": true, "num_threads": 4', "is not JSON"),
    ('["enable_multithread_load"]', "must be a JSON object"),
])
def test_sglang_loader_config_text_is_read_as_untrusted_json(raw, why):
    """The JSON text given for model-loader-extra-config goes through the shared reader (_untrusted.loads_json):
    a clean error naming the flag, never a RecursionError or a NaN thread count, and never the text itself."""
    with pytest.raises(_k8s_checks.SpecError) as e:
        k8s.build(dict(SGLANG, engine_args={"model-loader-extra-config": raw}))
    assert "model-loader-extra-config" in str(e.value) and why in str(e.value)
    assert raw not in str(e.value)


def test_overrides_extra_args_and_removal():
    b = k8s.build(dict(VLLM, engine_args={"max-num-seqs": 32, "enable-prefix-caching": None, "max-model-len": 65536},
                       extra_args=["--disable-log-requests"]))
    argv = b["command"]
    assert argv[argv.index("--max-num-seqs") + 1] == "32"
    assert argv[argv.index("--max-model-len") + 1] == "65536"
    assert "--enable-prefix-caching" not in argv
    assert argv[-1] == "--disable-log-requests"


def test_same_namespace_needs_no_reference_grant():
    b = k8s.build(dict(VLLM, namespace="aibrix-system"))
    assert [o["kind"] for o in b["objects"]] == ["Service", "HTTPRoute", "Deployment"]
    assert b["reference_grant_name"] is None


def test_unmanaged_route_leaves_aibrix_labels_on_deployment():
    b = k8s.build(dict(VLLM, served_model_name="qwen3-8b", manage_route=False))
    kinds = _by_kind(b)
    assert set(kinds) == {"Service", "Deployment"}
    assert kinds["Deployment"]["metadata"]["labels"]["model.aibrix.ai/name"] == "qwen3-8b"


@pytest.mark.parametrize(
    "override, match",
    [
        ({"tolerations": [{"operator": "Exists"}]}, r"tolerations\[0\]: operator Exists without a key tolerates every taint"),
        ({"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}, r"name the taint"),
        ({"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}, r"Exists takes no value"),
        ({"tolerations": [{"key": "gpu", "effect": "NoRun"}]}, r"effect 'NoRun'"),
        ({"command": ["bash", "-c", "vllm serve /m 2>&1 | tee -a /log/engine.log"]}, r"pipeline.*Completed/exit 0"),
        ({"command": ["sh", "-c", "nohup vllm serve /m & wait"]}, r"nohup"),
        ({"command": ["bash", "-c", "vllm serve /m"]}, r"does not 'exec'"),
        ({"env": [{"name": "HF_TOKEN", "value": "hf_abc"}]}, r"^env\.HF_TOKEN: plain-text credential .*secretKeyRef"),
        ({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}, r"env\.X: valueFrom\.secretKeyRef needs .* key"),
        ({"env": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}, r"env\.X: set either"),
        ({"extra_args": ["--served-model-name=other"]}, r"extra_args: '--served-model-name=other' is set by the collection"),
        ({"engine_args": {"port": 9000}}, r"engine_args: 'port' is set by the collection"),
        ({"served_model_name": "Qwen3-8B"}, r"served_model_name: .*DNS-1123"),
        ({"served_model_name": "org/model"}, r"label value"),
        ({"service_name": "glm-5.2"}, r"service_name: 'glm-5.2' is not a DNS-1035 label"),
        ({"model_path": "models/glm"}, r"model_path: .* must be an absolute path"),
        ({"namespace": "LLM_Lab"}, r"namespace: 'LLM_Lab' is not a valid namespace"),
        ({"tp_size": 0}, r"tp_size: must be an integer >= 1"),
        ({"shm_size": "lots"}, r"shm_size"),
        ({"resources": {"limits": {"nvidia.com/gpu": "4"}}}, r"exactly tp_size GPUs"),
        ({"model_pvc": "x"}, r"model_pvc: only used with model_source=shared_fs"),
        ({"labels": {"model.aibrix.ai/name": "other"}}, r"labels: 'model.aibrix.ai/name' is set by the collection"),
    ],
)
def test_bad_input_is_refused_with_the_field_and_fix(override, match):
    with pytest.raises(_k8s_checks.SpecError, match=match):
        k8s.build(dict(VLLM, **override))


def test_exec_shell_wrapper_is_accepted():
    b = k8s.build(dict(VLLM, command=["bash", "-c", "ulimit -l unlimited && exec vllm serve \"$@\"", "vllm"]))
    assert b["command"][:2] == ["bash", "-c"]


def test_render_writes_yaml_and_kustomization(tmp_path):
    b = k8s.build(VLLM)
    files = _render_dir.manifest_files(b["objects"])
    plan = _render_dir.plan(str(tmp_path), files)
    assert plan.stale == [] and set(plan.changes) == set(files) | {_render_dir.MARKER}
    _render_dir.write(plan)
    kust = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    assert len(kust["resources"]) == 4
    loaded = [yaml.safe_load((tmp_path / r).read_text()) for r in kust["resources"]]
    assert loaded == b["objects"]
    # unchanged second plan: nothing to write
    assert _render_dir.plan(str(tmp_path), files).changes == {}
    # the model changes: the old files are stale and removed
    b2 = k8s.build(dict(VLLM, served_model_name="glm-5.3-fp8-vllm"))
    plan2 = _render_dir.plan(str(tmp_path), _render_dir.manifest_files(b2["objects"]))
    assert "10-service-glm-5-2-fp8-vllm-019f2c25.yaml" in plan2.stale
    _render_dir.write(plan2)
    assert not (tmp_path / "10-service-glm-5-2-fp8-vllm-019f2c25.yaml").exists()


def test_env_values_are_strings_and_secret_references_render():
    b = k8s.build(dict(VLLM, env=[{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": "NCCL_DEBUG_SUBSYS", "value": 1},
                                  {"name": "VLLM_ENABLE_V1_MULTIPROCESSING", "value": True},
                                  {"name": "ENGINE_KEY", "valueFrom": {"secretKeyRef": {"name": "engine-api", "key": "key"}}}],
                       extra_args=["--api-key=$(ENGINE_KEY)"]))
    dep = _by_kind(b)["Deployment"]
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NCCL_DEBUG_SUBSYS"]["value"] == "1" and env["VLLM_ENABLE_V1_MULTIPROCESSING"]["value"] == "true"
    assert b["command"][-1] == "--api-key=$(ENGINE_KEY)"
    kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


@pytest.mark.parametrize("command", [
    ["env", "A=1", "bash", "-c", "vllm serve /m | tee /log/engine.log"],   # env in front of the wrapper
    ["bash", "/opt/start.sh"],                                             # a script in the image: unseen here
    ["bash", "-lc", "exec vllm serve /m || true"],
    ["setsid", "bash", "-lc", "exec vllm serve /m"],
])
def test_container_command_follows_engine_process_rule(command):
    # One rule for "the engine is the foreground process" (_process_command.command_problems), here applied to the
    # container's command without reading files of the host that renders it.
    with pytest.raises(_k8s_checks.SpecError, match=r"^command: .*Completed/exit 0"):
        _k8s_checks.check_command(command)


def test_container_command_that_execs_the_engine_is_accepted():
    _k8s_checks.check_command(["bash", "-lc", "source /opt/venv/bin/activate && exec vllm serve /m"])
    _k8s_checks.check_command(["vllm", "serve", "/m"])


def test_two_served_names_with_one_dns1035_spelling_render_no_common_object():
    """glm-5.2-fp8-vllm and glm-5-2-fp8-vllm both rendered Service/Deployment/PDB glm-5-2-fp8-vllm: the second apply
    took over the first model's objects. Object names are unique per kind and namespace, so the two sets must not
    meet (kube/_k8s_names.object_name: a lossy spelling carries the served name's hash)."""
    def keys(served):
        return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                for o in k8s.build(dict(VLLM, served_model_name=served, replicas=2))["objects"]}
    dotted, dashed = keys("glm-5.2-fp8-vllm"), keys("glm-5-2-fp8-vllm")
    assert {k[0] for k in dotted} >= {"Deployment", "Service", "HTTPRoute", "ReferenceGrant", "PodDisruptionBudget"}
    assert not dotted & dashed, dotted & dashed
