"""kernel_fingerprint and kernel_cache as a playbook calls them: results, env, check mode, rejections."""
from __future__ import annotations

import json
import sys

import pytest

from ansible_collections.llmops.serving.plugins.modules import kernel_cache, kernel_fingerprint


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "models" / "m" / "rev1"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return str(d)


def fp_args(model, **over):
    args = dict(engine="vllm", engine_version="0.32.0", versions=dict(torch="2.13.0", triton="3.6.0", cuda="12.8"),
                driver_version="570.86.15", gpu_name="NVIDIA H20", compute_capability="9.0",
                parallel=dict(tp=8), model_path=model, model_revision="rev1",
                engine_args=["--port", "8000", "--max-num-batched-tokens", "8192"])
    args.update(over)
    return args


def test_fingerprint_module_result(run_module, model):
    r = run_module(kernel_fingerprint, fp_args(model))
    assert not r.get("failed"), r
    assert r["changed"] is False and len(r["fingerprint"]) == 16
    assert r["components"]["tp"] == 8 and r["components"]["pp"] == 1
    assert r["components"]["engine_args"] == {"max-num-batched-tokens": "8192"}
    assert r["ignored_args"] == ["port"]
    assert r["label"].startswith("vllm0.32.0-torch2.13.0-triton3.6.0-cuda12.8-NVIDIA_H20-cc9.0-tp8pp1dp1ep1")
    same = run_module(kernel_fingerprint, fp_args(model, engine_args=["--max-num-batched-tokens=8192"]), check_mode=True)
    assert same["fingerprint"] == r["fingerprint"]


def test_fingerprint_module_gather_on_this_host(run_module, model):
    r = run_module(kernel_fingerprint, dict(engine="vllm", model_path=model, gather=True,
                                            engine_python=sys.executable, nvidia_smi="/nonexistent/nvidia-smi"))
    assert not r.get("failed"), r
    import torch
    assert r["components"]["torch"] == torch.__version__
    assert r["components"]["gpu_name"] == "cpu" and r["gathered"]["driver_version"] == "none"


@pytest.mark.parametrize("over,needle", [
    (dict(engine="trt"), "engine"),
    (dict(engine_version=None), "engine_version"),
    (dict(versions=dict(torch="2.13.0", triton="3.6.0", cuda="12.8", tensorrt="10")), "tensorrt"),
    (dict(parallel=dict(tp=0)), "parallel.tp"),
    (dict(parallel=dict(tp="eight")), "tp"),
    (dict(model_path="/nonexistent/model"), "model_path"),
])
def test_fingerprint_rejections(run_module, model, over, needle):
    r = run_module(kernel_fingerprint, fp_args(model, **over))
    assert r.get("failed") and needle in r["msg"], r


# ---- the declared CUDA against the engine image's tag (the check preflight applies) ---------------------- #

def test_a_declared_cuda_the_image_tag_contradicts_is_refused_before_anything_is_read(run_module, model):
    """vllm/vllm-openai:v0.26.0 is the CUDA 13.0 build: keying its caches on a declared 12.9 is refused as
    preflight refuses image_cuda_version (before: kernel_fingerprint took any declaration)."""
    r = run_module(kernel_fingerprint, fp_args("/nonexistent/model", image="vllm/vllm-openai:v0.26.0",
                                               versions=dict(torch="2.9.0", triton="3.5.0", cuda="12.9")))
    assert r.get("failed") and r.get("reason") == "image_cuda_mismatch" and r.get("field") == "versions.cuda", r
    assert "versions.cuda: 12.9 contradicts the image vllm/vllm-openai:v0.26.0, a CUDA 13.0 build" in r["msg"]
    assert "vllm/vllm-openai:v0.26.0-cu129" in r["msg"]  # the fix: the variant of the declared CUDA


@pytest.mark.parametrize("image,cuda", [
    ("vllm/vllm-openai:v0.26.0-cu129", "12.9"),   # the variant names the declared CUDA
    ("vllm/vllm-openai:v0.26.0", "13.0"),         # the unsuffixed release is 13.0
    ("vllm/vllm-openai@sha256:" + "b" * 64, "12.9"),  # a digest alone names no CUDA: nothing to check
    ("lmsysorg/sglang:v0.5.6", "12.8"),           # another project's unsuffixed tag: not read
    ("vllm/vllm-openai:v0.26.0", "none"),         # no CUDA declared (a CPU build)
])
def test_a_declared_cuda_the_image_agrees_with_or_cannot_name_is_fingerprinted(run_module, model, image, cuda):
    versions = dict(torch="2.9.0", triton="3.5.0", cuda=cuda)
    r = run_module(kernel_fingerprint, fp_args(model, image=image, versions=versions))
    assert not r.get("failed"), r
    # the image itself is no input of the key
    assert r["fingerprint"] == run_module(kernel_fingerprint, fp_args(model, versions=versions))["fingerprint"]


def test_the_kernel_cache_role_passes_the_engine_image_so_its_tag_cannot_be_bypassed(run_module, model):
    """``site.yml -t kernel_cache`` runs without preflight: the role's own fingerprint task checks the same
    declaration against the same image (the example fleet's, then the reviewed unsuffixed pin)."""
    from ansible_collections.llmops.serving.tests.lib import role_tasks as rt  # pylint: disable=import-outside-toplevel
    task = rt.task("kernel_cache", "llmops.serving.kernel_fingerprint")["llmops.serving.kernel_fingerprint"]

    def run(**over):
        variables = rt.RoleVars("kernel_cache", dict(over, kernel_cache_model_path=model),
                                extra_vars_files=["inventories/example-h20/group_vars/all/main.yml"])
        return run_module(kernel_fingerprint, variables.template(task))
    ok = run()
    assert not ok.get("failed"), ok
    refused = run(engine_image="vllm/vllm-openai:v0.26.0")
    assert refused.get("failed") and refused["reason"] == "image_cuda_mismatch", refused
    assert "contradicts the image vllm/vllm-openai:v0.26.0" in refused["msg"]


def components(run_module, model):
    return run_module(kernel_fingerprint, fp_args(model))


WRITER = "import os; d=os.environ['TRITON_CACHE_DIR']; open(os.path.join(d,'k.bin'),'w').write('kernel')"


def test_cache_prebuild_verify_report_gc(run_module, model, tmp_path):
    fp = components(run_module, model)
    root = str(tmp_path / "kc")
    base = dict(cache_root=root, engine="vllm", fingerprint=fp["fingerprint"], components=fp["components"])
    v = run_module(kernel_cache, dict(base, operation="verify", mount_path="/cache"))
    assert v["status"] == "missing" and v["changed"] is False
    assert v["env"]["TRITON_CACHE_DIR"] == "/cache/triton" and v["env"]["VLLM_CACHE_ROOT"] == "/cache/torch_compile"
    pre = dict(base, operation="prebuild", warmup_command=[sys.executable, "-c", WRITER], label=fp["label"])
    chk = run_module(kernel_cache, pre, check_mode=True)
    assert chk["status"] == "would_build" and chk["changed"] is True
    assert not (tmp_path / "kc" / "vllm" / fp["fingerprint"]).exists()
    b = run_module(kernel_cache, pre)
    assert b["status"] == "built" and b["changed"] is True and b["details"]["file_count"] == 1
    assert b["env"]["TRITON_CACHE_DIR"] == b["cache_dir"] + "/triton"
    b2 = run_module(kernel_cache, pre)
    assert b2["status"] == "hit" and b2["changed"] is False
    v = run_module(kernel_cache, dict(base, operation="verify"))
    assert v["status"] == "hit" and v["problems"] == [] and v["details"]["manifest"]["label"] == fp["label"]
    # tamper -> quarantined, never reported as usable
    with open(b["cache_dir"] + "/triton/k.bin", "w") as f:
        f.write("evil!!")  # same size, other bytes
    v = run_module(kernel_cache, dict(base, operation="verify"))
    assert v["status"] == "quarantined" and v["changed"] and "content changed: triton/k.bin" in v["problems"]
    assert "/.quarantine/vllm-" in v["quarantined_to"]
    # report from an engine log
    log = tmp_path / "engine.log"
    log.write_text("WARNING Compiling model again due to a load failure from /x, reason: boom\n")
    rep = run_module(kernel_cache, dict(cache_root=root, engine="vllm", fingerprint=fp["fingerprint"],
                                        operation="report", log_path=str(log)))
    assert rep["status"] == "miss" and rep["changed"] is False
    g = run_module(kernel_cache, dict(cache_root=root, engine="vllm", operation="gc", keep=1,
                                      proc_root=str(tmp_path)))
    assert g["status"] == "done" and not g["changed"]


@pytest.mark.parametrize("over,needle", [
    (dict(operation="verify", components=None), "components"),
    (dict(operation="prebuild"), "warmup_command"),
    (dict(operation="prebuild", warmup_command=["x"], warmup_mode="serve"), "warmup_url"),
    (dict(operation="sync"), "source_root"),
    (dict(operation="report"), "log_path"),
    (dict(operation="report", log_path="/nonexistent.log"), "log_path"),
    (dict(operation="verify", fingerprint="../../etc"), "fingerprint"),
    (dict(operation="verify", engine="sglang"), "components: computed for engine vllm"),
    (dict(operation="gc", keep=0), "keep"),
    (dict(operation="compile"), "operation"),
])
def test_cache_rejections(run_module, model, tmp_path, over, needle):
    fp = components(run_module, model)
    args = dict(cache_root=str(tmp_path / "kc"), engine="vllm", fingerprint=fp["fingerprint"],
                components=fp["components"])
    args.update(over)
    args = dict((k, v) for k, v in args.items() if v is not None)
    r = run_module(kernel_cache, args)
    assert r.get("failed") and needle in r["msg"], r
    assert not (tmp_path / "kc" / "vllm" / fp["fingerprint"]).exists()


def test_report_counts_kernels_written_during_start_as_miss(run_module, model, tmp_path):
    fp = components(run_module, model)
    root = str(tmp_path / "kc")
    base = dict(cache_root=root, engine="vllm", fingerprint=fp["fingerprint"])
    b = run_module(kernel_cache, dict(base, components=fp["components"], operation="prebuild",
                                      warmup_command=[sys.executable, "-c", WRITER]))
    log = tmp_path / "engine.log"
    log.write_text("INFO engine started\n")
    rep = run_module(kernel_cache, dict(base, operation="report", log_path=str(log)))
    assert rep["status"] == "unknown" and rep["details"]["cache_unchanged"] is True
    with open(b["cache_dir"] + "/triton/recompiled.bin", "w") as f:
        f.write("new kernel")
    rep = run_module(kernel_cache, dict(base, operation="report", log_path=str(log)))
    assert rep["status"] == "miss" and "not in manifest: triton/recompiled.bin" in rep["details"]["miss_lines"][-1]
