"""inventories/example-h20 renders the whole Kubernetes set (engine and P/D over RDMA) and every set routes.

site.yml runs against the example inventory on this host in render mode (connection local, the NFS and NVMe
paths pointed at temporary directories, no GPU required): the stage is real (a synthetic checkpoint), the
engine objects are rendered, validated (kubernetes-validate, the Gateway API v1.4.1 and AIBrix v0.7.0 CRD
schemas) and followed by the AIBrix route oracle (tests/lib/aibrix_oracle.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ansible_collections.llmops.serving.tests.lib import aibrix_oracle as oracle
from ansible_collections.llmops.serving.tests.lib import kube_scheduler as ks
from ansible_collections.llmops.serving.tests.lib import stage_synth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(ROOT, "inventories", "example-h20")
BIN = os.path.dirname(sys.executable)
K8S_VERSION = "1.33.0"
CRDS = {
    "HTTPRoute": (os.path.join(ROOT, "tests", "unit", "fixtures", "schemas", "gateway-api-v1.4.1", "httproutes.yaml"), "v1"),
    "ReferenceGrant": (os.path.join(ROOT, "tests", "unit", "fixtures", "schemas", "gateway-api-v1.4.1",
                                    "referencegrants.yaml"), "v1beta1"),
    "StormService": (os.path.join(ROOT, "tests", "unit", "fixtures", "schemas", "aibrix-v0.7.0",
                                  "orchestration.aibrix.ai_stormservices.yaml"), "v1alpha1"),
}


def _env(tmp_path):
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = os.path.join(ROOT, "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(
        [os.path.join(ROOT, ".build", "pycoll"), os.path.join(ROOT, ".build", "collections")])
    env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "ansible-tmp")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["LLMOPS_ROOT"] = str(tmp_path / "llmops")
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def _play(tmp_path, playbook, limit, extra):
    varfile = tmp_path / ("vars-%s.json" % limit)
    varfile.write_text(json.dumps(extra))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, playbook, "--limit", limit,
                           "-e", "@%s" % varfile], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _rendered(out):
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    return [yaml.safe_load((out / f).read_text()) for f in kust["resources"]]


def _validate(objs):
    for obj in objs:
        if obj["kind"] in CRDS:
            path, version = CRDS[obj["kind"]]
            if not os.path.exists(path):
                pytest.skip("CRD schema %s is not here" % path)
            with open(path) as f:
                crd = yaml.safe_load(f)
            schema = [v for v in crd["spec"]["versions"] if v["name"] == version][0]["schema"]["openAPIV3Schema"]
            jsonschema.validate(obj, schema)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    stage_synth.write_checkpoint(str(tmp / "nfs" / "GLM-5.2-FP8" / "3f2a9c1"), 64 * 1024, shards=2)
    common = dict(
        ansible_connection="local", ansible_python_interpreter=sys.executable,
        # no GPU, no RDMA, no engine Python on this host: the hardware checks are the nodes' own
        preflight_require_gpu=False, preflight_min_gpus=0, preflight_require_rdma=False, preflight_engine_python="",
        preflight_paths=[], kernel_cache_enabled=False,
        model_stage_src_root=str(tmp / "nfs"), model_stage_dest_root=str(tmp / "nvme"),
        model_stage_fleet_slots_dir=str(tmp / "slots"), model_stage_progress_dir=str(tmp / "progress"),
        model_stage_min_free_bytes=0, model_stage_textfile_dir="",
        engine_render_dir=str(tmp / "engine"), pd_disagg_render_dir=str(tmp / "pd"))
    rc, out = _play(tmp, os.path.join(ROOT, "playbooks", "site.yml"), "h20-gpu-01", common)
    pd_play = tmp / "pd.yml"
    pd_play.write_text(yaml.safe_dump([{"name": "P/D", "hosts": "prefill[0]", "gather_facts": False,
                                        "roles": ["llmops.serving.pd_disagg"]}]))
    pd_rc, pd_out = _play(tmp, str(pd_play), "prefill", common)
    return dict(tmp=tmp, rc=rc, out=out, pd_rc=pd_rc, pd_out=pd_out)


def test_site_renders_the_engine_set_that_validates_and_routes(fleet):
    assert fleet["rc"] == 0, fleet["out"][-5000:]
    objs = _rendered(fleet["tmp"] / "engine")
    assert [o["kind"] for o in objs] == ["Service", "ReferenceGrant", "HTTPRoute", "Deployment"]
    _validate(objs)
    pod = objs[-1]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert all(t.get("key") for t in pod["tolerations"])
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H20"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "8"
    # the staged revision (real stage from the "NFS") is what the pod mounts
    assert any(str(fleet["tmp"] / "nvme") in json.dumps(v) for v in pod["volumes"])
    v = oracle.route(objs, "glm-5.2-fp8-vllm")
    assert v.ok, v


def test_pd_over_rdma_renders_validates_and_routes(fleet):
    assert fleet["pd_rc"] == 0, fleet["pd_out"][-5000:]
    objs = _rendered(fleet["tmp"] / "pd")
    _validate(objs)
    text = json.dumps(objs)
    assert '"UCX_NET_DEVICES", "value": "mlx5_0:1,mlx5_1:1"' in text
    assert "k8s.v1.cni.cncf.io/networks" in text and "UCX_IB_GID_INDEX" in text
    v = oracle.route(objs, "glm-5.2-fp8-pd")
    assert v.ok and v.disaggregated, v


def _h20_cluster(staged):
    """The example's H20 fleet as the scheduler sees it, with MORE GPU nodes than the inventory stages on: eight
    nodes with the GPU operator's labels, the inventory's taints, 8 GPUs and the RDMA pool each, the revision
    directory only on ``staged``, and one untainted CPU node."""
    nodes = []
    for i in range(1, 9):
        name = "h20-gpu-%02d" % i
        nodes.append(ks.node(
            name, labels={"nvidia.com/gpu.product": "NVIDIA-H20", "nvidia.com/gpu.present": "true"},
            taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
            allocatable={"cpu": "190", "memory": "2000Gi", "nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1000"},
            dirs=staged.get(name, ())))
    nodes.append(ks.node("cpu-01", allocatable={"cpu": "32", "memory": "128Gi"}))
    return nodes


def test_every_engine_pod_lands_only_on_a_node_that_staged_the_revision(fleet):
    """Item 1 of the live-fleet issue: the engine on colocated, prefill and decode on their groups; every engine pod
    is feasible on exactly its staged node among eight GPU nodes, and its hostPath mounts there."""
    assert fleet["rc"] == 0 and fleet["pd_rc"] == 0, (fleet["out"][-3000:], fleet["pd_out"][-3000:])
    rev = str(fleet["tmp"] / "nvme" / "GLM-5.2-FP8" / "3f2a9c1")
    staged = {"h20-gpu-01": {rev}, "h20-gpu-02": {rev}, "h20-gpu-03": {rev}}
    engine, pdobjs = _rendered(fleet["tmp"] / "engine"), _rendered(fleet["tmp"] / "pd")
    nodes = _h20_cluster(staged)
    want = {"engine": ["h20-gpu-01"], "prefill": ["h20-gpu-02"], "decode": ["h20-gpu-03"]}
    pods = ks.pods_of(engine) + ks.pods_of(pdobjs)
    assert len(pods) == 3
    for pod in pods:
        role = pod[1].get("llmops.serving/pd-role") or pod[1].get("app.kubernetes.io/component")
        assert ks.feasible(pod, nodes) == want[role], (pod[0], [(n["name"], ks.reasons(pod, n, nodes)) for n in nodes])
        assert ks.mount_errors(pod[3], [n for n in nodes if n["name"] == want[role][0]][0]) == []
    placed = ks.schedule(engine + pdobjs, nodes)
    assert sorted(n for _o, n, _e in placed) == ["h20-gpu-01", "h20-gpu-02", "h20-gpu-03"]
    assert all(errors == [] for _o, _n, errors in placed), placed
    assert "engine pods only on h20-gpu-01" in fleet["out"]


def test_kernel_cache_and_driver_check_use_the_images_versions_not_the_hosts(tmp_path):
    """On the Kubernetes path the fingerprint is computed from the declared image versions (no engine Python on the
    node is run: gather is off) and preflight checks the node's driver against the image's CUDA."""
    from ansible_collections.llmops.serving.plugins.module_utils.cache import _fingerprint
    with open(os.path.join(INVENTORY, "group_vars", "all", "main.yml")) as f:
        inv = yaml.safe_load(f)
    with open(os.path.join(INVENTORY, "group_vars", "gpu_nodes", "main.yml")) as f:
        gpu = yaml.safe_load(f)
    assert inv["kernel_cache_gather"] is False and gpu["preflight_engine_python"] == ""
    image, node = inv["engine_image_versions"], inv["engine_gpu"]
    assert gpu["preflight_image_cuda_version"] == "{{ engine_image_versions.cuda }}"
    model = tmp_path / "model"
    stage_synth.write_checkpoint(str(model), 4096, shards=1)
    fps = {_fingerprint.compute("vllm", engine_version=image["engine"],
                                versions={k: image[k] for k in ("torch", "triton", "cuda")},
                                driver_version=node["driver_version"], gpu_name=node["name"],
                                compute_capability=node["compute_capability"], parallel={"tp": 8},
                                model_path=str(model), kv_cache_dtype="fp8", gather=False,
                                engine_python=python)["fingerprint"]
           for python in (sys.executable, "/nonexistent/python3")}
    assert len(fps) == 1


def test_every_site_value_is_marked():
    """The values a site must change carry '# CHANGE:' (hosts, NFS path, image, namespace, selectors, NICs)."""
    marked = []
    for dirpath, _dirs, files in os.walk(INVENTORY):
        for name in files:
            with open(os.path.join(dirpath, name)) as f:
                marked += [ln.split(":")[0].strip() for ln in f if "# CHANGE" in ln]
    for key in ("model_stage_src_root", "engine_image", "engine_namespace", "pd_disagg_image", "ansible_host",
                "model_stage_fleet_slots_dir", "pd_disagg_rdma_resource", "k8s_node_name", "pd_disagg_proxy_image",
                "engine_image_versions", "engine_gpu"):
        assert key in marked, key
