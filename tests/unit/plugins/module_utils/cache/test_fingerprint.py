"""Fingerprint stability (same inputs anywhere -> same name) and sensitivity (any component -> new name).

The toolchain components restate what torch Inductor keys its caches on (pytorch/pytorch):
``torch/_inductor/codecache.py`` ``torch_key()`` hashes ``torch.__version__`` and the sources under
``_TORCH_PATH``; ``CppCodeCache.load_async`` keys each C++ kernel on its source plus the compile command
line (``get_hashable_command_line``), which carries ``-I<_TORCH_PATH>/include`` and the Python include
directory (``torch/_inductor/cpp_builder.py`` ``_TORCH_PATH``, ``_get_python_include_dirs``); the
precompiled-header key adds ``cpp_builder.get_compiler_version_info(compiler)``, the ``<cxx> -v`` banner
run with ``LC_ALL=C``, and the compiler is ``config.cpp.cxx`` (``$CXX``, else ``g++``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.cache import _fingerprint as fpmod

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
        toolchain={"torch_path": "/opt/sglang/lib/python3.12/site-packages/torch", "torch_git": "0123abc",
                   "python_include": "/usr/include/python3.12", "deep_gemm_path": "absent",
                   "cxx_version": "g++: gcc version 12.2.0 (Debian 12.2.0-14) #0011223344556677"},
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


DRAFT_CONFIG = {"architectures": ["DeepseekV3ForCausalLMNextN"], "model_type": "deepseek_v3",
                "hidden_size": 7168, "num_hidden_layers": 1}


def test_json_arg_key_order_and_draft_location_do_not_matter(tmp_path, model):
    """The same draft model staged under two roots is one fingerprint; JSON key order never counts."""
    kw = base_kwargs(model)
    kw["engine"] = "vllm"
    a_draft = write_model(tmp_path / "mnt" / "a" / "draft-mtp", DRAFT_CONFIG)
    b_draft = write_model(tmp_path / "other" / "root" / "mtp", DRAFT_CONFIG)
    kw["engine_args"] = ["--speculative-config", '{"model": "%s", "num_speculative_tokens": 2}' % a_draft]
    a = fpmod.compute(**kw)
    kw["engine_args"] = ["--speculative-config={\"num_speculative_tokens\":2,\"model\":\"%s\"}" % b_draft]
    assert fp(**kw) == a["fingerprint"]
    kw["engine_args"] = ["--speculative-config.num_speculative_tokens", "2", "--speculative-config.model", b_draft]
    assert fp(**kw) == a["fingerprint"]
    spec = json.loads(a["components"]["engine_args"]["speculative-config"])
    assert spec["model"].startswith("model:DeepseekV3ForCausalLMNextN|none|config:")
    assert "draft-mtp" not in json.dumps(a["components"]) and str(tmp_path) not in json.dumps(a["components"])
    kw["engine_args"] = ["--speculative-config", '{"model": "%s", "num_speculative_tokens": 3}' % a_draft]
    assert fp(**kw) != a["fingerprint"]


def test_draft_model_content_changes_fingerprint(tmp_path, model):
    """Before: only the draft path's last component counted, so a re-trained draft with another
    architecture at the same path (or an SGLang draft at all) reused the old kernels."""
    draft = tmp_path / "drafts" / "eagle"
    kw = base_kwargs(model)
    kw["engine_args"] = kw["engine_args"] + ["--speculative-draft-model-path", write_model(draft, DRAFT_CONFIG)]
    a = fp(**kw)
    write_model(draft, dict(DRAFT_CONFIG, hidden_size=4096))
    b = fp(**kw)
    write_model(draft, dict(DRAFT_CONFIG, architectures=["LlamaForCausalLMEagle3"]))
    c = fp(**kw)
    assert len({a, b, c}) == 3
    # vLLM: the draft inside --speculative-config and --spec-model likewise
    kw["engine"] = "vllm"
    for args in (["--speculative-config", json.dumps({"model": str(draft), "method": "eagle3"})],
                 ["--spec-model", str(draft), "--spec-method", "eagle3"]):
        kw["engine_args"] = args
        before = fp(**kw)
        write_model(draft, DRAFT_CONFIG)
        assert fp(**kw) != before
        write_model(draft, dict(DRAFT_CONFIG, architectures=["LlamaForCausalLMEagle3"]))


def test_draft_model_path_reads_the_staged_copy(tmp_path, model):
    """The engine sees the draft at its container mount; the module reads the node's staged copy."""
    staged = write_model(tmp_path / "nvme" / "models" / "eagle3", DRAFT_CONFIG)
    kw = base_kwargs(model)
    kw["engine_args"] = kw["engine_args"] + ["--speculative-draft-model", "/models/draft"]
    with pytest.raises(fpmod.FingerprintError, match="engine_args: --speculative-draft-model.*draft_model_path"):
        fpmod.compute(**kw)
    kw["draft_model_path"] = staged
    a = fpmod.compute(**kw)
    assert a["components"]["engine_args"]["speculative-draft-model-path"].startswith("model:DeepseekV3ForCausalLMNextN")
    # the same content staged elsewhere, named by its own path, is the same fingerprint
    kw2 = base_kwargs(model)
    kw2["engine_args"] = kw2["engine_args"] + ["--speculative-draft-model-path",
                                               write_model(tmp_path / "elsewhere" / "d", DRAFT_CONFIG)]
    assert fp(**kw2) == a["fingerprint"]
    # a hub id counts as the id
    kw2["engine_args"] = kw["engine_args"][:-1] + ["org/eagle3-draft"]
    assert fpmod.compute(**kw2)["components"]["engine_args"]["speculative-draft-model-path"] == "hub:org/eagle3-draft"
    # draft_model_path without a draft flag is a mistake, not silently ignored
    kw3 = base_kwargs(model)
    kw3["draft_model_path"] = staged
    with pytest.raises(fpmod.FingerprintError, match="draft_model_path: set, but engine_args name no draft model"):
        fpmod.compute(**kw3)


SENSITIVE = [
    ("engine_version", "0.5.16b2"),
    ("driver_version", "575.51.03"),
    ("gpu_name", "NVIDIA H200"),
    ("compute_capability", "10.0"),
    ("model_revision", "def456"),
    ("kv_cache_dtype", "auto"),
] + [("versions." + k, "9.9.9") for k in fpmod.VERSION_KEYS] + [
    ("parallel." + k, 2) for k in fpmod.PARALLEL_KEYS
] + [("toolchain." + k, "/second/checkout/.venv/lib/python3.12/site-packages/x") for k in fpmod.TOOLCHAIN_KEYS] + [
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "4",
                     "--chunked-prefill-size", "8192"]),
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "16384"]),
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "8192", "--enable-dp-attention"]),
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "8192", "--cuda-graph-bs", "1", "2", "4"]),
    ("engine_args", ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--chunked-prefill-size", "8192", "--enable-torch-compile", "true"]),
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
    assert c == {"optimization-level": "3", "enforce-eager": "true", "max-num-batched-tokens": "8192"}


#: Argument lists an engine reads the same way (vLLM: vllm/engine/arg_utils.py BooleanOptionalAction and
#: vllm/utils/argparse_utils.py FlexibleArgumentParser; SGLang: python/sglang/srt/arg_groups/arg_utils.py
#: store_true / nargs="+", server_args.py aliases; both: argparse allow_abbrev).
EQUIVALENT = [
    ("vllm", [["--enforce-eager", "serve-model-dir"], ["--enforce-eager=True"], ["--enforce-eager", "true"],
              ["--enforce_eager=1"], ["/models/other", "--enforce-eager"], ["--enforce-e"]]),
    ("vllm", [["--no-enable-chunked-prefill"], ["--enable-chunked-prefill=false"],
              ["--enable-chunked-prefill", "False"], ["--enable-chunked-prefill", "--no-enable-chunked-prefill"]]),
    ("vllm", [["--max-num-batched-tokens=8192", "--max-num-seqs", "64"],
              ["--max-num-seqs=64", "--max-num-batched-tokens", "8K"],
              ["--max_num_seqs", "64", "--max-num-batched-tokens", "8192", "--port", "8001"]]),
    ("vllm", [["-O3"], ["-O", "3"], ["-O=3"], ["--optimization-level", "3"], ["--optimization-level=3"]]),
    ("vllm", [["-q", "fp8", "-ep"], ["--quantization=fp8", "--enable-expert-parallel"],
              ["--enable-expert-parallel", "true", "--quantization", "fp8"]]),
    ("vllm", [["--compilation-config", '{"mode": 3, "cudagraph_capture_sizes": [1, 2, 4]}'],
              ["-cc", '{"cudagraph_capture_sizes":[1,2,4],"mode":3}'],
              ["--compilation-config.mode", "3", "--compilation-config.cudagraph_capture_sizes", "[1,2,4]"],
              ["-cc.cudagraph_capture_sizes=[1, 2, 4]", "-cc.mode=3"]]),
    ("vllm", [["--cudagraph-capture-sizes", "1", "2", "4", "--enforce-eager"],
              ["--enforce-eager", "true", "--cudagraph_capture_sizes", "1", "2", "4", "--port", "1"],
              ["--port", "1", "--cudagraph-capture-sizes", "1", "2", "4", "--enforce-e", "--", "/models/m"]]),
    ("sglang", [["--enable-torch-compile", "--cuda-graph-bs", "1", "2", "4", "--chunked-prefill-size", "-1"],
                ["--cuda_graph_bs", "1", "2", "4", "--chunked-prefill-size=-1", "--enable-torch-compile=true"],
                ["--chunked-prefill-size", "-1", "--enable-torch-compile", "True", "--cuda-graph-bs", "1", "2", "4"]]),
    ("sglang", [["--speculative-algo", "EAGLE", "--tp", "8"], ["--speculative-algorithm=EAGLE", "--tp-size", "8"],
                ["--tensor-parallel-size=8", "--speculative-algorithm", "EAGLE"], ["--speculative-algorithm", "EAGLE"]]),
]


@pytest.mark.parametrize("engine,spellings", EQUIVALENT, ids=["%s-%d" % (e, i) for i, (e, _s) in enumerate(EQUIVALENT)])
def test_equivalent_argv_spellings_are_one_fingerprint(model, engine, spellings):
    kw = base_kwargs(model)
    kw["engine"] = engine
    got = set()
    for args in spellings:
        kw["engine_args"] = args
        got.add(fp(**kw))
    assert len(got) == 1, spellings


#: Argument lists an engine reads differently, each a different fingerprint (each group had a repeated
#: fingerprint before: ``--no-x`` was ignored, list flags counted only their first value, short aliases
#: and parallel sizes in the arguments were ignored).
DISTINCT = [
    ("vllm", [[], ["--enforce-eager"], ["--no-enforce-eager"]]),
    ("vllm", [["--enable-chunked-prefill"], ["--no-enable-chunked-prefill"], []]),
    ("vllm", [["-pp", "2"], []]),
    ("vllm", [["--cudagraph-capture-sizes", "1", "2", "4"], ["--cudagraph-capture-sizes", "1", "8", "16"]]),
    ("vllm", [["-q", "fp8"], []]),
    ("vllm", [["-ep"], []]),
    ("vllm", [["-sc", '{"method": "ngram", "num_speculative_tokens": 3}'], []]),
    ("sglang", [["--cuda-graph-bs", "1", "2", "4"], ["--cuda-graph-bs", "1", "8", "16"]]),
    ("sglang", [["--enable-torch-compile", "--cuda-graph-bs", "8"], ["--enable-torch-compile", "--cuda-graph-bs", "8", "16"]]),
    ("sglang", [["--ep", "8"], []]),
]


@pytest.mark.parametrize("engine,variants", DISTINCT, ids=["%s-%d" % (e, i) for i, (e, _v) in enumerate(DISTINCT)])
def test_different_argv_meanings_are_different_fingerprints(model, engine, variants):
    kw = base_kwargs(model)
    kw["engine"] = engine
    got = []
    for args in variants:
        kw["engine_args"] = args
        got.append(fp(**kw))
    assert len(set(got)) == len(variants), variants


def test_parallel_size_in_engine_args_counts(model):
    """``-tp 8`` in the engine's arguments is a TP=8 compile even when ``parallel`` was left at 1."""
    kw = base_kwargs(model)
    kw["engine"] = "vllm"
    kw["parallel"] = {}
    kw["engine_args"] = ["-tp", "8"]
    a = fpmod.compute(**kw)
    assert a["components"]["tp"] == 8
    kw["parallel"] = {"tp": 8}
    kw["engine_args"] = ["--tensor-parallel-size=8"]
    assert fp(**kw) == a["fingerprint"]
    kw["parallel"] = {"tp": 4}
    with pytest.raises(fpmod.FingerprintError, match="parallel.tp: 4, but engine_args set --tensor-parallel-size 8"):
        fpmod.compute(**kw)


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
    """The probe runs in a real interpreter (this one) and finds its torch where Inductor does."""
    engine_version, found = fpmod.gather_versions("vllm", sys.executable)
    import torch
    assert found["torch"] == torch.__version__.split("+")[0] or found["torch"] == torch.__version__
    # Inductor's _TORCH_PATH is dirname(dirname(abspath(torch/_inductor/cpp_builder.py))): the package dir
    assert found["torch_path"] == os.path.dirname(os.path.abspath(torch.__file__))
    assert found["torch_git"] == torch.version.git_version
    import sysconfig
    assert found["python_include"] == sysconfig.get_path("include")


def make_checkout(root, torch_version="2.13.0+cpu", git="a1b2c3d4e5f6"):
    """A checkout with its own ``.venv`` holding a torch distribution (metadata and version.py only)."""
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = next((venv / "lib").glob("python*")) / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('metadata probe must not import torch')\n")
    (site / "torch" / "version.py").write_text(
        "__version__ = '%s'\ndebug = False\ncuda: Optional[str] = None\ngit_version = '%s'\n" % (torch_version, git))
    dist = site / ("torch-%s.dist-info" % torch_version)
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: %s\n" % torch_version)
    return str(venv / "bin" / "python"), str(site / "torch")


def fake_cxx(path, banner):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n[ \"$1\" = -v ] || exit 3\necho 'Using built-in specs.' >&2\n"
                    "echo '%s LC_ALL='\"$LC_ALL\" >&2\n" % banner)
    path.chmod(0o755)
    return str(path)


def gathered_fp(model, python, cxx, **over):
    kw = dict(engine="vllm", engine_version="0.32.0", model_path=model, model_revision="rev1", gather=True, engine_python=python,
              gpu_inventory={"mode": "cpu-only"}, cxx=cxx, engine_args=["--dtype", "float32"])
    kw.update(over)
    return fpmod.compute(**kw)


def test_second_checkout_with_its_own_venv_is_another_fingerprint(tmp_path, model):
    """Seen: a second checkout (its own ``.venv``) started the engine on the first checkout's published
    fingerprint; Inductor recompiled, because its C++ kernels embed the torch install path, and wrote
    into the published directory. Same versions, another torch path: another fingerprint."""
    cxx = fake_cxx(tmp_path / "bin" / "g++", "gcc version 12.2.0 (Debian 12.2.0-14)")
    py_a, torch_a = make_checkout(tmp_path / "checkout-a")
    py_b, torch_b = make_checkout(tmp_path / "checkout-b")
    a = gathered_fp(model, py_a, cxx)
    a2 = gathered_fp(model, py_a, cxx)
    b = gathered_fp(model, py_b, cxx)
    assert a["fingerprint"] == a2["fingerprint"]
    assert a["components"]["torch"] == b["components"]["torch"] == "2.13.0+cpu"
    assert (a["components"]["torch_path"], b["components"]["torch_path"]) == (torch_a, torch_b)
    assert a["fingerprint"] != b["fingerprint"]
    assert fpmod.diff_components(a["components"], b["components"]) == ["torch_path"]
    assert a["components"]["torch_git"] == "a1b2c3d4e5f6" and a["components"]["deep_gemm_path"] == "absent"
    assert a["gathered"]["torch_path"] == torch_a
    # another build of the same version (another git_version) is another fingerprint too
    py_c, _torch_c = make_checkout(tmp_path / "checkout-c", git="ffffffffffff")
    c = gathered_fp(model, py_c, cxx)
    assert "torch_git" in fpmod.diff_components(a["components"], c["components"])


def test_compiler_identity_changes_the_fingerprint(tmp_path, model, monkeypatch):
    py, _t = make_checkout(tmp_path / "checkout")
    gcc12 = fake_cxx(tmp_path / "gcc12" / "g++", "gcc version 12.2.0 (Debian 12.2.0-14)")
    gcc13 = fake_cxx(tmp_path / "gcc13" / "g++", "gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2)")
    a = gathered_fp(model, py, gcc12)
    assert a["components"]["cxx_version"].startswith("%s: gcc version 12.2.0 (Debian 12.2.0-14) LC_ALL=C #" % gcc12)
    assert gathered_fp(model, py, gcc12)["fingerprint"] == a["fingerprint"]
    b = gathered_fp(model, py, gcc13)
    assert b["fingerprint"] != a["fingerprint"]
    assert fpmod.diff_components(a["components"], b["components"]) == ["cxx_version"]
    # no cxx option: $CXX, as Inductor's config.cpp.cxx reads it
    monkeypatch.setenv("CXX", gcc13)
    assert gathered_fp(model, py, None)["fingerprint"] == b["fingerprint"]
    # a compiler that is not there is recorded, not a crash (Inductor would fail on it at start)
    missing = gathered_fp(model, py, str(tmp_path / "nope" / "g++"))
    assert missing["components"]["cxx_version"].endswith("g++: not found")
    # explicit toolchain values win over what is gathered
    pinned = gathered_fp(model, py, gcc13, toolchain={"cxx_version": a["components"]["cxx_version"]})
    assert pinned["fingerprint"] == a["fingerprint"]


def test_default_compiler_on_this_host():
    """The real ``g++ -v`` banner (when the host has one) is reduced to its version line."""
    if fpmod.shutil.which("g++") is None:
        pytest.skip("no g++ on this host")
    got = fpmod.gather_cxx("g++")
    assert got.startswith("g++: ") and " version " in got and len(got.rsplit("#", 1)[1]) == 16
