"""MoE tuned-config preflight: exact file names for real model configs, both engines' lookup, policy."""
from __future__ import annotations

import json
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _moe
from ansible_collections.llmops.serving.plugins.modules import moe_config_check

DSV3 = {  # DeepSeek-V3 / R1 (block FP8)
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
GLM = {  # GLM-4.5-like (per-tensor FP8)
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 1,
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"},
}
DENSE = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336}


def model(tmp_path, cfg, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_file_names_match_engine_conventions():
    s = _moe.moe_shape(DSV3, tp=8)
    assert (s["E"], s["N"]) == (256, 256)
    assert _moe.vllm_file_name(256, 256, "NVIDIA H20", "fp8_w8a8", [128, 128]) == \
        "E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert _moe.sglang_file_name(256, 256, "NVIDIA H20", "fp8_w8a8", [128, 128]) == \
        "E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert _moe.vllm_device_name("NVIDIA H200 NVL") == "NVIDIA_H200"
    assert _moe.vllm_device_name("NVIDIA H20") == "NVIDIA_H20"
    assert _moe.triton_dir("3.6.0") == "triton_3_6_0"
    g = _moe.moe_shape(GLM, tp=8)
    assert (g["E"], g["N"]) == (160, 192)
    assert _moe.quant_dtype(GLM) == ("fp8_w8a8", None)
    ep = _moe.moe_shape(DSV3, tp=8, ep=8)
    assert (ep["E"], ep["N"]) == (32, 2048)
    assert _moe.moe_shape(DSV3, tp=8, fused_shared_experts=1)["E"] == 257


def test_vllm_real_package_dsv3_on_h20_found(tmp_path, run_module):
    """The installed vLLM ships the DeepSeek-V3 TP=8 H20 block-FP8 file; engine_python finds it."""
    r = run_module(moe_config_check, dict(engine="vllm", model_path=model(tmp_path, DSV3), tp=8,
                                          gpu_name="NVIDIA H20", engine_python=sys.executable, policy="fail"))
    assert not r.get("failed"), r
    assert r["status"] == "found"
    assert r["file_name"] == "E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert r["found"].endswith("/vllm/model_executor/layers/fused_moe/configs/" + r["file_name"])


def test_vllm_real_package_glm_on_h20_missing_fails_or_warns(tmp_path, run_module):
    path = model(tmp_path, GLM)
    args = dict(engine="vllm", model_path=path, tp=8, gpu_name="NVIDIA H20", engine_python=sys.executable)
    r = run_module(moe_config_check, dict(args, policy="fail"))
    assert r["failed"] and "E=160,N=192,device_name=NVIDIA_H20,dtype=fp8_w8a8.json" in r["msg"]
    assert "VLLM_TUNED_CONFIG_FOLDER" in r["msg"]
    r = run_module(moe_config_check, dict(args, policy="warn"))
    assert not r.get("failed") and r["status"] == "missing"
    assert "default kernel parameters" in r["message"]
    # the H200 (any variant) has it
    r = run_module(moe_config_check, dict(args, gpu_name="NVIDIA H200 NVL", policy="fail"))
    assert r["status"] == "found" and r["file_name"].endswith("device_name=NVIDIA_H200,dtype=fp8_w8a8.json")


def test_vllm_tuned_folder_is_searched_first(tmp_path, run_module):
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    name = "E=160,N=192,device_name=NVIDIA_H20,dtype=fp8_w8a8.json"
    (tuned / name).write_text("{}")
    r = run_module(moe_config_check, dict(engine="vllm", model_path=model(tmp_path, GLM), tp=8, gpu_name="NVIDIA H20",
                                          configs_dir=str(tmp_path / "pkg"), tuned_config_folder=str(tuned),
                                          policy="fail"))
    assert r["status"] == "found" and r["found"] == str(tuned / name)
    assert r["searched"] == [str(tuned / name), str(tmp_path / "pkg" / name)]


def test_sglang_triton_dir_and_fallback(tmp_path, run_module):
    configs = tmp_path / "configs"
    name = "E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json"
    (configs / "triton_3_5_1").mkdir(parents=True)
    (configs / "triton_3_5_1" / name).write_text("{}")
    args = dict(engine="sglang", model_path=model(tmp_path, DSV3), tp=8, gpu_name="NVIDIA H20",
                configs_dir=str(configs), triton_version="3.6.0")
    r = run_module(moe_config_check, dict(args, policy="fail"))
    assert r["failed"] and r["status"] == "fallback"
    assert "triton_3_6_0" in r["searched"][0] and r["fallbacks"] == [str(configs / "triton_3_5_1" / name)]
    (configs / "triton_3_6_0").mkdir()
    (configs / "triton_3_6_0" / name).write_text("{}")
    r = run_module(moe_config_check, dict(args, policy="fail"))
    assert r["status"] == "found" and r["found"] == str(configs / "triton_3_6_0" / name)


def test_dense_model_passes(tmp_path, run_module):
    r = run_module(moe_config_check, dict(engine="vllm", model_path=model(tmp_path, DENSE), tp=8,
                                          gpu_name="NVIDIA H20", configs_dir=str(tmp_path), policy="fail"))
    assert r["status"] == "not_moe" and not r.get("failed")


@pytest.mark.parametrize("args,needle", [
    (dict(tp=0), "tp: 0"),
    (dict(tp=7), "not divisible by tp=7"),
    (dict(ep=3), "ep=3"),
    (dict(gpu_name=" "), "gpu_name"),
    (dict(engine="sglang"), "triton_version"),
    (dict(policy="maybe"), "policy"),
])
def test_rejections_name_the_field(tmp_path, run_module, args, needle):
    base = dict(engine="vllm", model_path=model(tmp_path, DSV3), tp=8, gpu_name="NVIDIA H20",
                configs_dir=str(tmp_path))
    base.update(args)
    r = run_module(moe_config_check, base)
    assert r["failed"] and needle in r["msg"], r["msg"]


def test_needs_engine_python_or_configs_dir(tmp_path, run_module):
    r = run_module(moe_config_check, dict(engine="vllm", model_path=model(tmp_path, DSV3), tp=8, gpu_name="NVIDIA H20"))
    assert r["failed"] and "engine_python" in r["msg"] and "configs_dir" in r["msg"]


@pytest.mark.parametrize("make,needle", [
    (lambda p: __import__("os").mkfifo(p), "is a FIFO, not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "is a character device, not a regular file"),
    (lambda p: p.write_text('{"a":' * 5000 + "1" + "}" * 5000), "nests deeper than 64 levels"),
    (lambda p: p.write_text('{"n_routed_experts": 1e400}'), "not finite"),
    (lambda p: p.write_text('{"n_routed_experts": 1%s}' % ("0" * 400)), "refused"),
    (lambda p: p.write_text("[1, 2]"), "is not a JSON object"),
    (lambda p: p.write_text('{"n_routed_experts": 8, "moe_intermediate_size": 64, "quantization_config": "fp8"}'),
     "quantization_config is not a JSON object"),
    (lambda p: p.write_text(json.dumps(dict(DSV3, quantization_config={"quant_method": "fp8",
                                                                       "weight_block_size": ["x", {}]}))),
     "weight_block_size is not a list of integers"),
])
def test_hostile_config_json_fails_cleanly_naming_the_file(tmp_path, run_module, make, needle):
    """Before: a FIFO config.json hung the module, /dev/zero read until memory ran out, nesting raised
    RecursionError and a string quantization_config an AttributeError."""
    d = tmp_path / "m"
    d.mkdir()
    make(d / "config.json")
    r = run_module(moe_config_check, dict(engine="vllm", model_path=str(d), tp=8, gpu_name="NVIDIA H20",
                                          configs_dir=str(tmp_path)))
    assert r["failed"] and needle in r["msg"], r["msg"]
    assert "config.json" in r["msg"] and "Traceback" not in r["msg"]


def test_boolean_expert_count_is_not_an_integer(tmp_path, run_module):
    cfg = dict(DSV3, n_routed_experts=True, moe_intermediate_size=True)
    r = run_module(moe_config_check, dict(engine="vllm", model_path=model(tmp_path, cfg), tp=8,
                                          gpu_name="NVIDIA H20", configs_dir=str(tmp_path)))
    assert r["status"] == "not_moe" and not r.get("failed")


@pytest.mark.parametrize("printed,needle", [
    ("[1, 2]", "package report of another shape"),
    ('{"package_dir": 5, "triton": null}', "package report of another shape"),
    ("[" * 5000 + "]" * 5000, "printed no package report"),
    ("not json", "printed no package report"),
])
def test_engine_python_output_of_another_shape_is_a_clean_error(tmp_path, printed, needle):
    """Before: a list printed by the interpreter raised TypeError out of locate_engine."""
    import stat
    out = tmp_path / "out.txt"
    out.write_text(printed + "\n")
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\ncat %s\n" % out)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(_moe.MoeError) as e:
        _moe.locate_engine("vllm", str(py))
    assert str(e.value).startswith("engine_python: %s" % py) and needle in str(e.value)
