"""Fingerprint stability (same inputs anywhere -> same name) and sensitivity (any component -> new name)."""
from __future__ import annotations

import json

import pytest

from ansible_collections.llmops.serving.plugins.module_utils import _fingerprint as fpmod

DSV3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


def write_model(path, cfg=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg or DSV3_CONFIG))
    return str(path)


def base_kwargs(model_path):
    return dict(
        engine="sglang", engine_version="0.5.16b1", driver_version="570.86.15", gpu_name="NVIDIA H20",
        compute_capability="9.0", model_path=model_path, model_revision="abc123", kv_cache_dtype="fp8_e4m3",
        versions={"torch": "2.9.1", "triton": "3.6.0", "cuda": "12.9", "deep_gemm": "2.1.1",
                  "sgl_kernel": "0.3.21", "flashinfer": "0.5.3"},
        parallel={"tp": 8, "pp": 1, "dp": 1, "ep": 1},
        engine_args=["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "8192", "--port", "30000", "--host", "10.0.3.17"],
    )


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "m" / "abc123")


def fp(**kw):
    return fpmod.compute(**kw)["fingerprint"]


def test_same_inputs_same_fingerprint_across_hosts_paths_and_order(tmp_path, model):
    a = fpmod.compute(**base_kwargs(model))
    # another host: different model location, different host/port/IP args, reordered dicts and args
    other = write_model(tmp_path / "elsewhere" / "nvme" / "models" / "dsv3")
    kw = base_kwargs(other)
    kw["versions"] = dict(reversed(list(kw["versions"].items())))
    kw["parallel"] = {"ep": 1, "dp": 1, "pp": 1, "tp": 8}
    kw["engine_args"] = ["--host", "10.9.9.9", "--port=31000", "--chunked_prefill_size=8192",
                         "--speculative-num-steps", "3", "--speculative-algorithm", "EAGLE",
                         "--dist-init-addr", "10.9.9.9:5000", "--served-model-name", "x"]
    b = fpmod.compute(**kw)
    assert a["fingerprint"] == b["fingerprint"]
    assert a["components"] == b["components"]
    assert "host" in b["ignored_args"] and "dist-init-addr" in b["ignored_args"]
    assert len(a["fingerprint"]) == 16 and int(a["fingerprint"], 16) >= 0
    assert list(a["components"]) == sorted(a["components"])


def test_json_arg_key_order_and_paths_do_not_matter(model):
    kw = base_kwargs(model)
    kw["engine"] = "vllm"
    kw["engine_args"] = ["--speculative-config", '{"model": "/mnt/a/draft-mtp", "num_speculative_tokens": 2}']
    a = fp(**kw)
    kw["engine_args"] = ["--speculative-config={\"num_speculative_tokens\":2,\"model\":\"/other/root/draft-mtp\"}"]
    assert fp(**kw) == a
    kw["engine_args"] = ["--speculative-config", '{"model": "/mnt/a/draft-mtp", "num_speculative_tokens": 3}']
    assert fp(**kw) != a


SENSITIVE = [
    ("engine_version", "0.5.16b2"),
    ("driver_version", "575.51.03"),
    ("gpu_name", "NVIDIA H200"),
    ("compute_capability", "10.0"),
    ("model_revision", "def456"),
    ("kv_cache_dtype", "auto"),
] + [("versions." + k, "9.9.9") for k in fpmod.VERSION_KEYS] + [
    ("parallel." + k, 2) for k in fpmod.PARALLEL_KEYS
] + [
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "4",
                     "--chunked-prefill-size", "8192"]),
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "16384"]),
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "8192", "--enable-dp-attention"]),
]


@pytest.mark.parametrize("field,value", SENSITIVE, ids=[s[0] + "=" + str(s[1])[:20] for s in SENSITIVE])
def test_every_component_changes_the_fingerprint(model, field, value):
    kw = base_kwargs(model)
    before = fp(**kw)
    if "." in field:
        outer, inner = field.split(".")
        kw[outer] = dict(kw[outer], **{inner: value})
    else:
        kw[field] = value
    assert fp(**kw) != before


def test_engine_changes_fingerprint(model):
    kw = base_kwargs(model)
    before = fp(**kw)
    kw["engine"] = "vllm"
    assert fp(**kw) != before


def test_quantization_from_config_changes_fingerprint(tmp_path):
    kw = base_kwargs(write_model(tmp_path / "a"))
    a = fpmod.compute(**kw)
    assert a["components"]["quantization"] == "fp8:fmt=e4m3:activation_scheme=dynamic:block=128x128"
    cfg = dict(DSV3_CONFIG, quantization_config=dict(DSV3_CONFIG["quantization_config"], weight_block_size=[64, 64]))
    kw = base_kwargs(write_model(tmp_path / "b", cfg))
    assert fp(**kw) != a["fingerprint"]
    cfg = dict(DSV3_CONFIG)
    cfg.pop("quantization_config")
    kw = base_kwargs(write_model(tmp_path / "c", cfg))
    assert fpmod.compute(**kw)["components"]["quantization"] == "none"


def test_missing_revision_falls_back_to_config_hash(tmp_path):
    kw = base_kwargs(write_model(tmp_path / "a"))
    kw["model_revision"] = None
    a = fpmod.compute(**kw)
    assert a["components"]["model_revision"].startswith("config:")
    cfg = dict(DSV3_CONFIG, max_position_embeddings=4096)
    kw = base_kwargs(write_model(tmp_path / "b", cfg))
    kw["model_revision"] = None
    assert fp(**kw) != a["fingerprint"]


def test_non_kernel_args_are_ignored(model):
    kw = base_kwargs(model)
    before = fp(**kw)
    kw["engine_args"] = kw["engine_args"] + ["--mem-fraction-static", "0.8", "--log-level", "debug",
                                             "--api-key", "secret", "--enable-metrics"]
    assert fp(**kw) == before


def test_vllm_O_shorthand_and_bool_flags(model):
    kw = base_kwargs(model)
    kw["engine"] = "vllm"
    kw["engine_args"] = ["-O3", "--enforce-eager", "--max-num-batched-tokens", "8192"]
    c = fpmod.compute(**kw)["components"]["engine_args"]
    assert c == {"O": "3", "enforce-eager": "true", "max-num-batched-tokens": "8192"}


@pytest.mark.parametrize("drop,needle", [
    ("engine_version", "engine_version"),
    ("gpu_name", "gpu_name"),
    ("versions.triton", "versions.triton"),
])
def test_missing_required_component_is_named(model, drop, needle):
    kw = base_kwargs(model)
    if "." in drop:
        kw["versions"] = {k: v for k, v in kw["versions"].items() if k != drop.split(".")[1]}
    else:
        kw[drop] = None
    with pytest.raises(fpmod.FingerprintError, match=needle):
        fpmod.compute(**kw)


def test_bad_model_path_is_named(tmp_path):
    kw = base_kwargs(str(tmp_path / "nope"))
    with pytest.raises(fpmod.FingerprintError, match="model_path: cannot read"):
        fpmod.compute(**kw)


def test_bad_parallel_value(model):
    kw = base_kwargs(model)
    kw["parallel"] = {"tp": 0}
    with pytest.raises(fpmod.FingerprintError, match="parallel.tp"):
        fpmod.compute(**kw)


def test_gather_reads_engine_python_and_explicit_wins(model, monkeypatch):
    calls = []

    def fake_gather(engine, python):
        calls.append(python)
        return "0.5.16b1", {"torch": "2.9.1", "triton": "3.6.0", "deep_gemm": None, "sgl_kernel": "0.3.21",
                            "flashinfer": None, "cuda": "12.9"}

    monkeypatch.setattr(fpmod, "gather_versions", fake_gather)
    inv = {"mode": "gpu", "names": ["NVIDIA H20"], "compute_capability": "9.0", "driver_version": "570.86.15"}
    r = fpmod.compute("sglang", model_path=model, model_revision="abc123", gather=True, engine_python="/opt/py",
                      gpu_inventory=inv, versions={"triton": "3.5.1"}, parallel={"tp": 8})
    assert calls == ["/opt/py"]
    c = r["components"]
    assert (c["engine_version"], c["torch"], c["triton"], c["deep_gemm"]) == ("0.5.16b1", "2.9.1", "3.5.1", "absent")
    assert (c["gpu_name"], c["compute_capability"], c["driver_version"]) == ("NVIDIA H20", "9.0", "570.86.15")
    assert r["gathered"]["triton"] == "3.6.0"


def test_gather_real_interpreter(model):
    """The metadata probe runs in a real interpreter (this one) and finds its torch."""
    import sys
    engine_version, found = fpmod.gather_versions("vllm", sys.executable)
    import torch
    assert found["torch"] == torch.__version__.split("+")[0] or found["torch"] == torch.__version__
