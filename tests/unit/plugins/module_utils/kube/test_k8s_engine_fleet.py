"""What the first real fleet deployment needs from the engine objects (crash status, QoS, timeouts, rollouts,
profiles and images), each rule restated from the upstream source it comes from."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_argv, _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest import K8S_VERSION, PROFILES

DIGEST = "@sha256:" + "d" * 64
BASE = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab",
            model_path="/mnt/nvme/models/GLM-5.2-FP8/v1", image="vllm/vllm-openai:v0.26.0" + DIGEST)
SGL = dict(BASE, engine="sglang", served_model_name="glm-5.2-fp8-sglang", image="lmsysorg/sglang:v0.5.16" + DIGEST)


def _kind(built, kind):
    return [o for o in built["objects"] if o["kind"] == kind][0]


def _pod(built):
    return _kind(built, "Deployment")["spec"]["template"]["spec"]


def _flags(argv):
    return [a for a in argv if a.startswith("--")]


# ------------------------------------------------------------------------------------------------ #
# Item 3: a crash never exits 0
# ------------------------------------------------------------------------------------------------ #

# SGLang's kill_process_tree (python/sglang/srt/utils/common.py): when it is asked to kill its own process
# tree it does ``itself.kill()`` (SIGKILL to itself) and then ``sys.exit(0)``; its comment says processes
# "cannot be killed with SIGKILL (e.g, PID=1 launched by kubernetes)". The same two steps, run for real:
SGLANG_SELF_KILL = "import os, signal, sys; os.kill(os.getpid(), signal.SIGKILL); sys.exit(0)"


def _in_pid_namespace(argv):
    unshare = shutil.which("unshare")
    if not unshare:
        pytest.skip("unshare(1) is not installed")
    proc = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"] + argv,
                          capture_output=True, text=True, timeout=30, check=False)
    if "unshare:" in proc.stderr:
        pytest.skip("user/PID namespaces are not available here: %s" % proc.stderr.strip())
    return proc


def run_sglang_crash_like(pod_spec):
    """Run SGLang's crash path in a fresh PID namespace arranged as the pod would be; return the exit status.

    Plain pod: the container's command is PID 1. ``shareProcessNamespace: true``: the pause container is PID 1
    and the engine its sibling. An init (tini/dumb-init) as the command: the init is PID 1, the engine its
    child, and the init exits 128 + the signal that killed it (tini's reap_zombies).
    """
    command = pod_spec["containers"][0]["command"]
    off_pid_1 = pod_spec.get("shareProcessNamespace") is True or os.path.basename(command[0]) in ("tini", "dumb-init")
    if not off_pid_1:
        return _in_pid_namespace([sys.executable, "-c", SGLANG_SELF_KILL]).returncode
    parent = ("import subprocess, sys; r = subprocess.run([sys.executable, '-c', %r]).returncode; "
              "sys.exit(128 - r if r < 0 else r)" % SGLANG_SELF_KILL)
    return _in_pid_namespace([sys.executable, "-c", parent]).returncode


def test_a_crashing_engine_never_exits_0():
    # the mechanism, for real: as PID 1 the self-SIGKILL is dropped and the crash exits 0 ("Completed")
    assert run_sglang_crash_like({"containers": [{"command": ["python3"]}]}) == 0
    for params in (SGL, dict(SGL, init="/usr/bin/tini")):
        built = k8s.build(params)
        # as the rendered pod runs it: SIGKILL, exit 137, a restart Kubernetes counts
        assert run_sglang_crash_like(_pod(built)) == 137
        kubernetes_validate.validate(_kind(built, "Deployment"), K8S_VERSION, strict=True)


def test_default_pod_keeps_the_engine_off_pid_1():
    for params in (BASE, SGL):
        built = k8s.build(params)
        pod = _pod(built)
        assert pod["shareProcessNamespace"] is True
        assert pod["containers"][0]["command"] == _k8s_argv.DEFAULT_COMMAND[params["engine"]]


@pytest.mark.parametrize("init, prefix", [("/usr/bin/tini", ["/usr/bin/tini", "-g", "--"]),
                                          ("/usr/local/bin/dumb-init", ["/usr/local/bin/dumb-init", "--"])])
def test_an_init_from_the_image_runs_the_engine(init, prefix):
    # tini (src/tini.c reap_zombies) exits with the child's status, 128 + signal when it was killed; dumb-init
    # (README) likewise. The engine is its child, never PID 1; the pod then needs no shared namespace.
    built = k8s.build(dict(SGL, init=init))
    c = _pod(built)["containers"][0]
    assert c["command"] == prefix + ["python3", "-m", "sglang.launch_server"]
    assert "shareProcessNamespace" not in _pod(built)
    assert built["command"][:len(prefix)] == prefix


def test_an_unknown_init_is_refused():
    with pytest.raises(_k8s_checks.SpecError, match=r"^init: '/bin/sh' is neither tini nor dumb-init"):
        k8s.build(dict(BASE, init="/bin/sh"))


@pytest.mark.parametrize("script", [
    "vllm serve /m; exec true",            # exec replaces the shell, but with 'true': the container exits 0
    "vllm serve /m; exec sleep infinity",  # the pod stays Running with no engine in it
    "vllm serve /m; exec tail -f /dev/null",
])
def test_wrappers_that_replace_the_exit_status_are_refused(script):
    with pytest.raises(_k8s_checks.SpecError, match=r"^command: .*its last 'exec' runs .* not the engine.*Completed/exit 0"):
        k8s.build(dict(BASE, command=["bash", "-c", script]))
    # a wrapper that execs the engine itself stays accepted
    built = k8s.build(dict(BASE, command=["bash", "-lc", "ulimit -l unlimited && exec env A=1 vllm serve \"$@\"", "vllm"]))
    assert _pod(built)["containers"][0]["command"][:2] == ["bash", "-lc"]


# ------------------------------------------------------------------------------------------------ #
# Item 4: pods are not BestEffort
# ------------------------------------------------------------------------------------------------ #


def qos_class(pod_spec):
    """Kubernetes' rule (pkg/apis/core/helper/qos/qos.go, ComputePodQOS): only cpu and memory count;
    BestEffort when no container requests or limits either, Guaranteed when every container's cpu and
    memory limits equal its requests, else Burstable."""
    requests, limits, guaranteed = {}, {}, True
    for c in pod_spec["containers"]:
        res = c.get("resources") or {}
        req = {k: v for k, v in (res.get("requests") or {}).items() if k in ("cpu", "memory")}
        lim = {k: v for k, v in (res.get("limits") or {}).items() if k in ("cpu", "memory")}
        requests.update(req)
        limits.update(lim)
        if set(lim) != {"cpu", "memory"} or any(req.get(k, lim[k]) != lim[k] for k in lim):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def test_default_requests_size_an_8_gpu_engine_and_leave_best_effort():
    pod = _pod(k8s.build(BASE))
    res = pod["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
    assert res["limits"] == {"nvidia.com/gpu": "8"}  # no memory limit that could OOM-kill the loader
    assert qos_class(pod) == "Burstable"
    # a GPU-only pod (what was rendered before) is BestEffort: GPUs do not count for the QoS class
    gpu_only = copy.deepcopy(pod)
    gpu_only["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert qos_class(gpu_only) == "BestEffort"


def test_requests_follow_the_gpu_count_and_the_variables():
    assert _pod(k8s.build(dict(BASE, tp_size=2)))["containers"][0]["resources"]["requests"] == {
        "cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    res = _pod(k8s.build(dict(BASE, cpu_request="48", memory_request="512Gi")))["containers"][0]["resources"]
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("48", "512Gi")
    # an explicit resources.requests wins; a limit alone is not contradicted by a default request
    res = _pod(k8s.build(dict(BASE, resources={"requests": {"cpu": "16"}, "limits": {"memory": "300Gi"}})))["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "16", "nvidia.com/gpu": "8"} and res["limits"]["memory"] == "300Gi"
    kubernetes_validate.validate(_kind(k8s.build(dict(BASE, cpu_request="500m")), "Deployment"), K8S_VERSION, strict=True)


@pytest.mark.parametrize("override, match", [
    ({"cpu_request": "lots"}, r"^cpu_request: 'lots' is not a Kubernetes quantity"),
    ({"memory_request": "256GB"}, r"^memory_request: '256GB' is not a Kubernetes quantity"),
])
def test_bad_requests_are_refused(override, match):
    with pytest.raises(_k8s_checks.SpecError, match=match):
        k8s.build(dict(BASE, **override))


def test_a_memory_request_below_the_shm_size_warns():
    built = k8s.build(dict(BASE, memory_request="32Gi", shm_size="64Gi"))
    assert any("below shm_size" in w for w in built["warnings"])


# ------------------------------------------------------------------------------------------------ #
# Item 5: long answers are not cut
# ------------------------------------------------------------------------------------------------ #


def test_engine_route_has_no_timeout_and_routes_responses():
    built = k8s.build(BASE)
    rule = _kind(built, "HTTPRoute")["spec"]["rules"][0]
    assert rule["timeouts"] == {"request": "0s"}
    assert "/v1/responses" in [m["path"]["value"] for m in rule["matches"]]
    assert not any("504" in w for w in built["warnings"])


def test_the_aibrix_default_timeout_warns():
    built = k8s.build(dict(BASE, route_request_timeout="120s"))
    assert any("504" in w and "about 7800 tokens" in w for w in built["warnings"])


# ------------------------------------------------------------------------------------------------ #
# Item 6: rollouts keep serving
# ------------------------------------------------------------------------------------------------ #


def test_rollout_replaces_one_pod_without_a_surge_pod():
    dep = _kind(k8s.build(BASE), "Deployment")
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_several_replicas_get_a_disruption_budget_of_one():
    one = k8s.build(BASE)
    assert not [o for o in one["objects"] if o["kind"] == "PodDisruptionBudget"]
    assert one["pod_disruption_budget_name"] is None
    built = k8s.build(dict(BASE, replicas=3))
    pdb = _kind(built, "PodDisruptionBudget")
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["metadata"]["namespace"] == "llm-lab"
    labels = _kind(built, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    assert [o["kind"] for o in built["objects"]][-1] == "Deployment"


def test_priority_class_and_topology_spread():
    built = k8s.build(dict(BASE, replicas=2, priority_class_name="llm-serving-high",
                           topology_spread=[{"topologyKey": "topology.kubernetes.io/zone"}]))
    pod = _pod(built)
    assert pod["priorityClassName"] == "llm-serving-high"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["maxSkew"] == 1 and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"] == {"matchLabels": built["pod_selector"]}
    kubernetes_validate.validate(_kind(built, "Deployment"), K8S_VERSION, strict=True)


@pytest.mark.parametrize("override, match", [
    ({"topology_spread": [{"maxSkew": 1}]}, r"^topology_spread\[0\]: each constraint needs a topologyKey"),
    ({"topology_spread": [{"topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]}, r"whenUnsatisfiable 'Maybe'"),
    ({"priority_class_name": "High_Priority"}, r"^priority_class_name: 'High_Priority'"),
])
def test_bad_placement_is_refused(override, match):
    with pytest.raises(_k8s_checks.SpecError, match=match):
        k8s.build(dict(BASE, **override))


# ------------------------------------------------------------------------------------------------ #
# Item 9: profiles are data, images are checked
# ------------------------------------------------------------------------------------------------ #


def test_default_profile_adds_no_tuning_flags():
    # a Llama user who names no profile gets no GLM parsers, no fp8 KV cache, no EAGLE
    llama = dict(BASE, served_model_name="llama-3-3-70b", image="vllm/vllm-openai:v0.11.0" + DIGEST)
    argv = k8s.build(llama)["command"]
    assert _flags(argv) == ["--host", "--port", "--tensor-parallel-size", "--served-model-name",
                            "--safetensors-load-strategy"]
    sgl = k8s.build(dict(SGL, image="lmsysorg/sglang:v0.4.0" + DIGEST))["command"]
    assert not any(f in sgl for f in ("--reasoning-parser", "--tool-call-parser", "--speculative-algorithm"))
    # asked for by name, the data gives the field report's command line
    argv = k8s.build(dict(BASE, profile="glm-5.2-fp8", profiles=PROFILES))["command"]
    pairs = dict(zip(argv, argv[1:]))
    assert (pairs["--kv-cache-dtype"], pairs["--max-model-len"], pairs["--tool-call-parser"]) == ("fp8", "131072", "glm47")
    assert "--enable-auto-tool-choice" in argv


def test_a_site_profile_extends_the_data():
    llama = {"description": "Llama", "vllm": {"min_version": "0.11.0", "args": {"max-model-len": 65536}}}
    site = dict(PROFILES, **{"llama-3.3-70b": llama})
    argv = k8s.build(dict(BASE, profile="llama-3.3-70b", profiles=site))["command"]
    assert argv[argv.index("--max-model-len") + 1] == "65536"
    with pytest.raises(_k8s_checks.SpecError, match=r"^profile: 'llama-3.3-70b' has no sglang entry"):
        k8s.build(dict(SGL, profile="llama-3.3-70b", profiles=site))


@pytest.mark.parametrize("override, match", [
    ({"profile": "glm-5.2-fp8"}, r"^profile: 'glm-5.2-fp8' is not defined \(known: none\)"),
    ({"profiles": {"none": {"vllm": {"args": {"x": 1}}}}}, r"^profiles.none: 'none' is built in"),
    ({"profile": "p", "profiles": {"p": {"vllm": {"args": {"port": 9000}}}}}, r"^profiles.p.vllm.args: 'port' is set by the collection"),
    ({"profile": "p", "profiles": {"p": {"vllm": {"min_version": "soon"}}}}, r"^profiles.p.vllm.min_version: 'soon'"),
    ({"profile": "p", "profiles": {"p": {"vllm": {"argz": {}}}}}, r"^profiles.p.vllm: must be a mapping with min_version and args"),
])
def test_bad_profiles_are_refused(override, match):
    with pytest.raises(_k8s_checks.SpecError, match=match):
        k8s.build(dict(BASE, **override))


@pytest.mark.parametrize("engine, image", [
    ("vllm", "vllm/vllm-openai:v0.25.1"),
    ("vllm", "vllm/vllm-openai:v0.26.0b1-cu129"),
    ("sglang", "lmsysorg/sglang:v0.5.15b1"),         # the version that crashed in EAGLE verify (field report 7.3)
    ("sglang", "lmsysorg/sglang:v0.5.9-cu129"),
])
def test_an_image_older_than_the_profile_is_refused_before_rendering(engine, image):
    with pytest.raises(_k8s_checks.SpecError, match=r"^image: .* older than profile glm-5.2-fp8 needs"):
        k8s.build(dict(BASE if engine == "vllm" else SGL, image=image, profile="glm-5.2-fp8", profiles=PROFILES))


@pytest.mark.parametrize("engine, image", [
    ("vllm", "vllm/vllm-openai:v0.26.0"),
    ("vllm", "registry.example:5000/mirror/vllm-openai:0.26.0b2.dev1"),  # the field report's own version
    ("sglang", "lmsysorg/sglang:v0.5.16b1"),
    ("sglang", "lmsysorg/sglang:v0.5.16-cu129"),
])
def test_images_new_enough_pass(engine, image):
    built = k8s.build(dict(BASE if engine == "vllm" else SGL, image=image, profile="glm-5.2-fp8", profiles=PROFILES))
    assert any("pinned by tag only" in w for w in built["warnings"])


def test_the_wrong_sglang_organisation_is_refused():
    for image in ("lmsys/sglang:v0.5.16", "docker.io/lmsys/sglang:latest"):
        with pytest.raises(_k8s_checks.SpecError, match=r"^image: .* publishes lmsysorg/sglang"):
            k8s.build(dict(SGL, image=image))


def test_unknown_versions_and_tags_without_digest_warn():
    latest = k8s.build(dict(SGL, image="lmsysorg/sglang:latest", profile="glm-5.2-fp8", profiles=PROFILES))
    assert any("cannot be read from its tag 'latest'" in w and "0.5.16b1" in w for w in latest["warnings"])
    assert any("pinned by tag only" in w for w in latest["warnings"])
    pinned = k8s.build(dict(SGL, image="lmsysorg/sglang:v0.5.16" + DIGEST, profile="glm-5.2-fp8", profiles=PROFILES,
                            staged_nodes=["h20-gpu-01"]))
    assert pinned["warnings"] == []
    digest_only = k8s.build(dict(SGL, image="lmsysorg/sglang" + DIGEST, profile="glm-5.2-fp8", profiles=PROFILES))
    assert any("cannot be read from its digest" in w for w in digest_only["warnings"])


@pytest.mark.parametrize("older, newer", [
    ("0.26.0b2.dev1", "0.26.0b2"), ("0.26.0b2", "0.26.0rc1"), ("0.26.0rc1", "0.26.0"), ("0.26.0.dev0", "0.26.0a1"),
    ("0.26.0", "0.26.0.post1"), ("v0.5.9", "v0.5.16"), ("0.5.15b1", "0.5.16b1"), ("0.9.2-cu128-nixl-v0.4.1", "0.10.0"),
])
def test_versions_order_as_pep_440(older, newer):
    assert _k8s_checks.version_key(older) < _k8s_checks.version_key(newer)


@pytest.mark.parametrize("image, expected", [
    ("lmsysorg/sglang:v0.5.16", (None, "lmsysorg/sglang", "v0.5.16", None)),
    ("ubuntu", (None, "library/ubuntu", None, None)),
    ("registry.example:5000/vllm/vllm-openai:v0.26.0@sha256:ab", ("registry.example:5000", "vllm/vllm-openai", "v0.26.0", "sha256:ab")),
    ("localhost/sglang@sha256:ab", ("localhost", "sglang", None, "sha256:ab")),
])
def test_image_references_parse(image, expected):
    ref = _k8s_checks.parse_image(image)
    assert (ref["registry"], ref["repository"], ref["tag"], ref["digest"]) == expected
