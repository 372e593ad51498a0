"""preflight_facts on fixture sysfs trees and fake nvidia-smi binaries."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _image_cuda
from ansible_collections.llmops.serving.plugins.module_utils.engine import _preflight
from ansible_collections.llmops.serving.plugins.modules import preflight_facts
from ansible_collections.llmops.serving.tests.lib import role_tasks as rt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
NVSMI_8xH20 = "\n".join(
    "NVIDIA H20, 8, 9.0, 570.86.15, 97871, 00000000:%02X:00.0" % (0x18 + i) for i in range(8)) + "\n"


def _fake_bin(tmp_path, name, stdout, rc=0):
    p = tmp_path / name
    p.write_text("#!/bin/sh\ncat <<'EOF'\n%sEOF\nexit %d\n" % (stdout, rc))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def _sysfs(tmp_path, devices):
    for dev, ports in devices.items():
        for port, (ll, state) in ports.items():
            d = tmp_path / "sys" / "class" / "infiniband" / dev / "ports" / str(port)
            d.mkdir(parents=True)
            (d / "link_layer").write_text(ll + "\n")
            (d / "state").write_text(state + "\n")
            (d / "rate").write_text("200 Gb/sec (4X HDR)\n")
    return str(tmp_path / "sys")


def test_gpu_node_with_roce(run_module, tmp_path):
    smi = _fake_bin(tmp_path, "nvidia-smi", NVSMI_8xH20)
    sysfs = _sysfs(tmp_path, {"mlx5_0": {1: ("Ethernet", "4: ACTIVE")}, "mlx5_1": {1: ("InfiniBand", "1: DOWN")}})
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": sysfs, "paths": [str(tmp_path / "nvme" / "x")]})
    assert r["gpu"]["mode"] == "gpu"
    assert r["gpu"]["count"] == 8
    assert r["gpu"]["names"] == ["NVIDIA H20"]
    assert r["gpu"]["compute_capability"] == "9.0"
    assert r["rdma"]["present"] is True
    assert [d["name"] for d in r["rdma"]["devices"]] == ["mlx5_0", "mlx5_1"]
    assert r["rdma"]["devices"][0]["ports"][0]["link_layer"] == "Ethernet"
    # a path that does not exist yet is measured at its nearest existing parent
    assert r["disk"][0]["measured_at"] == str(tmp_path)
    assert r["disk"][0]["free_bytes"] > 0
    assert r["changed"] is False


def test_cpu_only_and_no_infiniband(run_module, tmp_path):
    r = run_module(preflight_facts, {"nvidia_smi": str(tmp_path / "absent-nvidia-smi"),
                                     "sysfs_root": str(tmp_path / "empty-sys")})
    assert r["gpu"]["mode"] == "cpu-only"
    assert "not found" in r["gpu"]["reason"]
    assert r["rdma"]["present"] is False
    assert "does not exist" in r["rdma"]["reason"]


def test_nvidia_smi_failure_is_cpu_only_with_reason(run_module, tmp_path):
    smi = _fake_bin(tmp_path, "nvidia-smi", "NVIDIA-SMI has failed because it couldn't communicate with the driver\n", rc=9)
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path)})
    assert r["gpu"]["mode"] == "cpu-only"
    assert "exited 9" in r["gpu"]["reason"]


def test_unparseable_nvidia_smi_fails_naming_the_option(run_module, tmp_path):
    smi = _fake_bin(tmp_path, "nvidia-smi", "garbage\n")
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path)})
    assert r["failed"] and r["msg"].startswith("nvidia_smi:")


def test_engine_runtime_reports_missing_module(run_module, tmp_path):
    r = run_module(preflight_facts, {"nvidia_smi": "none", "sysfs_root": str(tmp_path),
                                     "engine_python": sys.executable,
                                     "engine_modules": ["json", "surely_not_a_module_xyz"]})
    rt = r["engine_runtime"]
    assert rt["importable"] is False
    assert rt["modules"]["json"]["importable"] is True
    assert "surely_not_a_module_xyz" in rt["reason"]


def test_engine_python_missing(run_module, tmp_path):
    r = run_module(preflight_facts, {"nvidia_smi": "none", "sysfs_root": str(tmp_path),
                                     "engine_python": os.path.join(str(tmp_path), "nope", "python")})
    assert r["engine_runtime"]["importable"] is False
    assert "not found" in r["engine_runtime"]["reason"]


def test_returns_its_facts_as_ansible_facts(run_module, tmp_path):
    smi = _fake_bin(tmp_path, "nvidia-smi", NVSMI_8xH20)
    sysfs = _sysfs(tmp_path, {"mlx5_0": {1: ("InfiniBand", "4: ACTIVE")}})
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": sysfs, "paths": [str(tmp_path)],
                                     "engine_python": sys.executable, "engine_modules": ["json"]})
    facts = r["ansible_facts"]["preflight_node"]
    assert sorted(facts) == ["disk", "engine_runtime", "gpu", "rdma"]
    assert facts["gpu"]["count"] == 8
    assert facts["rdma"]["devices"][0]["ports"][0]["state"] == "4: ACTIVE"
    assert facts["disk"][0]["path"] == str(tmp_path)
    assert facts["engine_runtime"]["modules"]["json"]["importable"] is True
    # the top-level return values stay, equal to the facts, for playbooks that register the result
    assert {k: r[k] for k in facts} == facts


def test_role_publishes_the_module_facts_without_fact_injection(tmp_path):
    """The role's preflight_node variable is the module's ansible_facts.preflight_node, also when facts are
    not injected as variables."""
    smi = _fake_bin(tmp_path, "nvidia-smi", NVSMI_8xH20)
    sysfs = _sysfs(tmp_path, {"mlx5_0": {1: ("Ethernet", "4: ACTIVE")}})
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "roles": [{"role": "llmops.serving.preflight",
                   "vars": {"preflight_nvidia_smi": smi, "preflight_sysfs_root": sysfs,
                            "preflight_require_gpu": True, "preflight_min_gpus": 8,
                            "preflight_require_rdma": True, "preflight_paths": [str(tmp_path)]}}],
        "post_tasks": [{"name": "published", "ansible.builtin.debug": {
            "msg": "{{ {'var': preflight_node, 'fact': ansible_facts.preflight_node} }}"}}],
    }]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"),
               ANSIBLE_INJECT_FACT_VARS="False", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    published = [t for t in tasks if t["task"]["name"] == "published"][0]["hosts"]["localhost"]["msg"]
    assert published["var"] == published["fact"]
    assert published["fact"]["gpu"]["names"] == ["NVIDIA H20"]
    assert published["fact"]["rdma"]["devices"][0]["ports"][0]["link_layer"] == "Ethernet"
    assert published["fact"]["disk"][0]["path"] == str(tmp_path)


def _script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_a_hanging_nvidia_smi_fails_naming_the_option_and_the_fix(run_module, tmp_path, monkeypatch):
    """A wedged GPU driver hangs nvidia-smi: the run stops at the timeout with a message, not a traceback."""
    monkeypatch.setattr(_preflight, "NVIDIA_SMI_TIMEOUT", 0.5)
    smi = _script(tmp_path, "nvidia-smi", "exec sleep 30\n")
    t0 = time.monotonic()
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path)})
    assert time.monotonic() - t0 < 10
    assert r["failed"]
    assert r["msg"].startswith("nvidia_smi: %s did not list the GPUs within 0.5 s" % smi)
    assert "point nvidia_smi at a working binary" in r["msg"]


def test_a_hanging_engine_python_fails_naming_the_option(run_module, tmp_path, monkeypatch):
    monkeypatch.setattr(_preflight, "ENGINE_PYTHON_TIMEOUT", 0.5)
    python = _script(tmp_path, "python", "exec sleep 30\n")
    r = run_module(preflight_facts, {"nvidia_smi": "none", "sysfs_root": str(tmp_path),
                                     "engine_python": python, "engine_modules": ["vllm"]})
    assert r["failed"]
    assert r["msg"].startswith("engine_python: %s did not finish importing vllm within 0.5 s" % python)


@pytest.mark.parametrize("stdout", [
    "garbage\n",  # not JSON at all
    "",  # nothing
    "[1, 2]\n",  # JSON, not the report
    '{"vllm": {"importable": "yes"}}\n',  # the report's shape, wrong types
    '{"torch": {"importable": true, "version": "2.9"}}\n',  # a report for other modules
])
def test_an_engine_python_that_prints_no_import_report_fails_naming_engine_python(run_module, tmp_path, stdout):
    """A wrong engine_python (a shell script, another program) is reported as engine_python, not nvidia_smi."""
    python = _script(tmp_path, "python", "cat <<'EOF'\n%sEOF\n" % stdout)
    smi = _fake_bin(tmp_path, "nvidia-smi", NVSMI_8xH20)
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path),
                                     "engine_python": python, "engine_modules": ["vllm"]})
    assert r["failed"]
    assert r["msg"].startswith("engine_python: %s printed no import report" % python)
    assert "point engine_python at the Python interpreter of the engine environment" in r["msg"]


def test_an_engine_python_that_cannot_be_started_fails_naming_engine_python(run_module, tmp_path):
    python = tmp_path / "python"
    python.write_text("not a script, no interpreter line\0\n")
    python.chmod(0o755)
    r = run_module(preflight_facts, {"nvidia_smi": "none", "sysfs_root": str(tmp_path),
                                     "engine_python": str(python)})
    assert r["failed"] and r["msg"].startswith("engine_python: cannot run %s: " % python)


def test_sysfs_attribute_that_is_a_fifo_or_device_reads_as_unknown_without_blocking(tmp_path):
    """A copied or hand-made sysfs tree (sysfs_root) with a FIFO or a link to /dev/zero in an attribute's place."""
    import threading
    sysfs = _sysfs(tmp_path, {"mlx5_0": {1: ("Ethernet", "4: ACTIVE")}})
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "state").unlink()
    os.mkfifo(port / "state")
    (port / "rate").unlink()
    (port / "rate").symlink_to("/dev/zero")
    box = {}
    t = threading.Thread(target=lambda: box.update(r=_preflight.rdma_devices(sysfs)), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "rdma_devices blocked"
    p = box["r"]["devices"][0]["ports"][0]
    assert (p["link_layer"], p["state"], p["rate"]) == ("Ethernet", "unknown", "unknown")


def test_the_nodes_driver_is_checked_against_the_images_cuda(run_module, tmp_path):
    """CUDA 13.x images need driver R580 or newer, 12.x R525 (NVIDIA's CUDA Compatibility guide, Minor Version
    Compatibility Table 1, and the CUDA Toolkit Release Notes' driver table)."""
    smi = _fake_bin(tmp_path, "nvidia-smi", NVSMI_8xH20)  # driver 570.86.15
    r = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path / "sys"), "image_cuda_version": "13.0"})
    assert r["image_cuda"]["ok"] is False and r["image_cuda"]["min_driver"] == "580"
    assert "driver 570.86.15 is older than CUDA 13 images need (R580 or newer" in r["image_cuda"]["reason"]
    assert r["ansible_facts"]["preflight_node"]["image_cuda"] == r["image_cuda"]
    ok = run_module(preflight_facts, {"nvidia_smi": smi, "sysfs_root": str(tmp_path / "sys"), "image_cuda_version": "12.9"})
    assert ok["image_cuda"]["ok"] is True
    assert _preflight.driver_fits_cuda("580.65.06", "13.0")["ok"] is True
    assert _preflight.driver_fits_cuda("450.80.01", "11.8")["ok"] is False
    # no GPU driver seen, or a CUDA the table does not know: cannot be told, never a pass
    assert _preflight.driver_fits_cuda("", "13.0")["ok"] is None
    assert _preflight.driver_fits_cuda("590.1", "14.0")["ok"] is None
    with pytest.raises(_preflight.PreflightError, match="image_cuda_version: 'cu129' is not a CUDA version"):
        _preflight.driver_fits_cuda("580.65.06", "cu129")


# ---- the example fleet: the declared image CUDA against its image (review M3) ----------------------------- #

EXAMPLE = "inventories/example-h20/group_vars/"


def _example_vars(role, **over):
    """A role's variables on a GPU node of the example fleet: its defaults, then the inventory's group_vars (all,
    then gpu_nodes), then ``over``."""
    return rt.RoleVars(role, over, extra_vars_files=[EXAMPLE + "all/main.yml", EXAMPLE + "gpu_nodes/main.yml"])


def _example_preflight(run_module, tmp_path, **over):
    """preflight_facts with the arguments of roles/preflight's task on the example's GPU node; nvidia-smi answers as
    an H20 node with the example's R570 driver and records that it ran."""
    mark = tmp_path / "nvidia-smi-ran"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ntouch %s\ncat <<'EOF'\n%sEOF\n" % (mark, NVSMI_8xH20))
    smi.chmod(0o755)
    variables = _example_vars("preflight", preflight_nvidia_smi=str(smi), preflight_sysfs_root=str(tmp_path / "sys"),
                              preflight_paths=[str(tmp_path)], **over)
    args = variables.template(rt.task("preflight", "llmops.serving.preflight_facts")["llmops.serving.preflight_facts"])
    return args, run_module(preflight_facts, args), mark.exists()


def test_the_example_fleet_declares_the_cuda_its_image_tag_names(run_module, tmp_path):
    args, res, _ran = _example_preflight(run_module, tmp_path)
    # (the test's templating reads "12.9" back as a number, as Jinja's native mode does; the module takes a str)
    assert args["image"] == "vllm/vllm-openai:v0.26.0-cu129" and str(args["image_cuda_version"]) == "12.9"
    assert not res.get("failed"), res.get("msg")
    assert res["image_cuda"]["image_tag"]["cuda"] == "12.9" and res["image_cuda"]["ok"] is True  # R570 runs 12.9


def test_the_reviewed_pin_is_refused_before_the_node_is_read(run_module, tmp_path):
    """Review M3: vllm/vllm-openai:v0.26.0 is the CUDA 13.0 build; declared 12.9, preflight passed on R570 nodes."""
    _args, res, ran = _example_preflight(run_module, tmp_path, engine_image="vllm/vllm-openai:v0.26.0")
    assert res["failed"] and res["reason"] == "image_cuda_mismatch" and res["field"] == "image_cuda_version", res
    assert "12.9 contradicts the image vllm/vllm-openai:v0.26.0, a CUDA 13.0 build" in res["msg"]
    assert "vllm/vllm-openai:v0.26.0-cu129" in res["msg"]
    assert not ran  # refused before anything was read


def test_a_digest_only_image_is_not_read_and_says_so(run_module, tmp_path):
    _args, res, _ran = _example_preflight(run_module, tmp_path, engine_image="vllm/vllm-openai@sha256:" + "b" * 64)
    assert not res.get("failed"), res.get("msg")
    assert res["image_cuda"]["image_tag"]["cuda"] is None
    assert any("pinned by digest alone" in w for w in res.get("warnings", [])), res.get("warnings")


def test_the_driver_check_and_the_kernel_cache_key_read_the_same_checked_cuda():
    """The preflight driver check (preflight_image_cuda_version) and the kernel-cache fingerprint (the versions
    kernel_cache passes to kernel_fingerprint) follow one declaration, the one preflight checks against the image."""
    preflight = rt.task("preflight", "llmops.serving.preflight_facts")["llmops.serving.preflight_facts"]
    fingerprint = rt.task("kernel_cache", "llmops.serving.kernel_fingerprint")["llmops.serving.kernel_fingerprint"]
    for declared in ("12.9", "99.1"):  # the example's, and one set in a single place: both must follow it
        over = {} if declared == "12.9" else {"engine_image_versions": {"engine": "0.26.0", "torch": "t",
                                                                        "triton": "t", "cuda": declared}}
        checked = _example_vars("preflight", **over).template(preflight["image_cuda_version"])
        keyed = _example_vars("kernel_cache", **over).template(fingerprint["versions"])["cuda"]
        assert str(checked) == str(keyed) == declared
    site = _example_vars("preflight")
    _image_cuda.check_declared(site.get("preflight_engine_image"), str(site.get("preflight_image_cuda_version")))
