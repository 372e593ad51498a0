# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: which tuned fused-MoE Triton config file an engine will look for.

vLLM (``fused_moe.get_config_file_name`` / ``get_moe_configs``)::

    E={E},N={N},device_name={name, whitespace and '/' -> '_', any H200 -> NVIDIA_H200}
        [,dtype=fp8_w8a8][,block_shape=[128,128]].json
    searched in $VLLM_TUNED_CONFIG_FOLDER first, then <vllm>/model_executor/layers/fused_moe/configs/

SGLang (``fused_moe_triton_config.get_config_file_name`` / ``get_moe_configs``)::

    <configs>/triton_<triton version, '.' -> '_'>/E=..,N=..,device_name={name, ' ' -> '_'}
        [,dtype=fp8_w8a8][,block_shape=[128, 128]].json
    <configs> is $SGLANG_MOE_CONFIG_DIR when set, else <sglang>/srt/layers/moe/fused_moe_triton/configs;
    a missing file falls back to another triton_* directory with a "Performance might be sub-optimal" warning.

E is the number of routed experts per rank (divided by EP), N the expert intermediate size per rank
(divided by TP when experts are tensor-sharded, i.e. without expert parallelism).
"""
from __future__ import annotations

import os
import re
import subprocess

from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json

VLLM_CONFIGS = ("vllm", "model_executor", "layers", "fused_moe", "configs")
SGLANG_CONFIGS = ("sglang", "srt", "layers", "moe", "fused_moe_triton", "configs")
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
INTER_KEYS = ("moe_intermediate_size", "expert_intermediate_size")


class MoeError(ValueError):
    """Bad input; the message names the option and the fix."""


def load_config(model_path):
    """``<model_path>/config.json`` through the shared reader: a FIFO, a device, a nesting bomb or a number out
    of range is a :class:`MoeError` naming the file and the limit."""
    path = os.path.join(model_path, "config.json")
    try:
        cfg = load_json(path, "model_path")
    except UntrustedInput as e:
        raise MoeError("%s; re-stage the model" % e)
    except OSError as e:
        raise MoeError("model_path: cannot read %s (%s); point model_path at the staged model" % (path, e.strerror or e))
    if not isinstance(cfg, dict):
        raise MoeError("model_path: %s is not a JSON object; re-stage the model" % path)
    return cfg


def _int(value):
    """An integer field of config.json (a JSON ``true`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _text_config(cfg):
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(cfg.get(key), dict):
            merged = dict(cfg[key])
            merged.setdefault("quantization_config", cfg.get("quantization_config"))
            return merged
    return cfg


def moe_shape(cfg, tp, ep=1, fused_shared_experts=0):
    """``{is_moe, E, N, experts_total, intermediate_size}`` for one rank; raises MoeError on bad TP/EP."""
    cfg = _text_config(cfg)
    experts = next((cfg[k] for k in EXPERT_KEYS if _int(cfg.get(k)) and cfg[k] > 1), None)
    if experts is None:
        return {"is_moe": False}
    inter = next((cfg[k] for k in INTER_KEYS if _int(cfg.get(k))), None)
    if inter is None:
        inter = cfg.get("intermediate_size")  # Mixtral-style configs reuse it for the experts
    if not _int(inter) or inter < 1:
        raise MoeError("model_path: config.json has %d experts but no moe_intermediate_size" % experts)
    total = experts + fused_shared_experts
    if ep > 1:
        if total % ep:
            raise MoeError("ep: %d experts do not split evenly over ep=%d; pick an ep that divides %d" % (total, ep, total))
        e_rank, n_rank = total // ep, inter
    else:
        if inter % tp:
            raise MoeError("tp: moe_intermediate_size %d is not divisible by tp=%d; pick a tp that divides it"
                           % (inter, tp))
        e_rank, n_rank = total, inter // tp
    return {"is_moe": True, "E": e_rank, "N": n_rank, "experts_total": total, "intermediate_size": inter}


def quant_dtype(cfg):
    """``(dtype, block_shape)`` as the fused-MoE kernels name them, from ``quantization_config``."""
    q = _text_config(cfg).get("quantization_config") or {}
    if not isinstance(q, dict):
        raise MoeError("model_path: config.json quantization_config is not a JSON object; re-stage the model")
    method = str(q.get("quant_method") or "").lower()
    if method == "fp8":
        block = q.get("weight_block_size")
        if block and not (isinstance(block, list) and all(_int(b) and b >= 0 for b in block)):
            raise MoeError("model_path: config.json quantization_config.weight_block_size is not a list of "
                           "integers; re-stage the model")
        return "fp8_w8a8", [int(b) for b in block] if block else None
    if method in ("w8a8_int8", "int8"):
        return "int8_w8a8", None
    return None, None


def vllm_device_name(gpu_name):
    name = re.sub(r"[\s/]+", "_", gpu_name.strip())
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    return name


def sglang_device_name(gpu_name):
    return gpu_name.strip().replace(" ", "_")


def vllm_file_name(E, N, gpu_name, dtype, block_shape):
    sel = ",dtype=%s" % dtype if dtype else ""
    if block_shape and all(block_shape):
        sel += ",block_shape=[%s]" % ",".join(str(b) for b in block_shape)
    return "E=%d,N=%d,device_name=%s%s.json" % (E, N, vllm_device_name(gpu_name), sel)


def sglang_file_name(E, N, gpu_name, dtype, block_shape):
    sel = ",dtype=%s" % dtype if dtype else ""
    if block_shape and all(block_shape):
        sel += ",block_shape=[%s]" % ", ".join(str(b) for b in block_shape)
    return "E=%d,N=%d,device_name=%s%s.json" % (E, N, sglang_device_name(gpu_name), sel)


def triton_dir(version):
    return "triton_" + str(version).split("+", maxsplit=1)[0].replace(".", "_")


_LOCATE = r"""
import json, os, sys
from importlib import metadata, util
out = {}
spec = util.find_spec(sys.argv[1])
out["package_dir"] = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
try:
    out["triton"] = metadata.version("triton")
except metadata.PackageNotFoundError:
    out["triton"] = None
print(json.dumps(out))
"""


def locate_engine(engine, engine_python, run=_process_run.run):
    """``(configs_dir, triton_version)`` of the engine installed in ``engine_python`` (nothing imported)."""
    try:
        found = _process_run.python_json(engine_python, _LOCATE, [engine], timeout=120, run=run)
    except OSError as e:
        raise MoeError("engine_python: cannot run %s (%s); set engine_python or configs_dir" % (engine_python, e))
    except _process_run.PythonFailed as e:
        raise MoeError("engine_python: %s failed: %s" % (engine_python, e.stderr[-300:]))
    except subprocess.TimeoutExpired:
        raise MoeError("engine_python: %s did not answer within 120 s; check that the engine environment's "
                       "filesystem is responsive, or set configs_dir and triton_version" % engine_python)
    except ValueError as e:  # the shared reader refused the output
        raise MoeError("engine_python: %s printed no package report (%s); set engine_python or configs_dir"
                       % (engine_python, e))
    if not isinstance(found, dict) or not all(isinstance(found.get(k), (str, type(None)))
                                              for k in ("package_dir", "triton")):
        raise MoeError("engine_python: %s printed a package report of another shape; set engine_python or "
                       "configs_dir" % engine_python)
    if not found["package_dir"]:
        raise MoeError("engine_python: %s has no %s package; set engine_python to the engine's interpreter or "
                       "configs_dir to its fused-MoE configs directory" % (engine_python, engine))
    parts = VLLM_CONFIGS if engine == "vllm" else SGLANG_CONFIGS
    return os.path.join(os.path.dirname(found["package_dir"]), *parts), found["triton"]


def check(engine, cfg, tp, gpu_name, configs_dir, ep=1, tuned_config_folder=None, triton_version=None,
          dtype=None, fused_shared_experts=0):
    """Where the engine will look, and what it will find. ``status``: found, fallback, missing, not_moe."""
    shape = moe_shape(cfg, tp, ep, fused_shared_experts)
    if not shape["is_moe"]:
        return {"status": "not_moe", "is_moe": False, "file_name": None, "searched": [], "found": None,
                "fallbacks": []}
    q_dtype, block = quant_dtype(cfg)
    dtype = dtype or q_dtype
    res = dict(shape, dtype=dtype, block_shape=block, fallbacks=[], found=None)
    if engine == "vllm":
        name = vllm_file_name(shape["E"], shape["N"], gpu_name, dtype, block)
        searched = ([os.path.join(tuned_config_folder, name)] if tuned_config_folder else []) + \
            [os.path.join(configs_dir, name)]
        res.update(file_name=name, device_name=vllm_device_name(gpu_name), searched=searched)
        res["found"] = next((p for p in searched if os.path.isfile(p)), None)
    else:
        if not triton_version:
            raise MoeError("triton_version: unknown; pass the engine's Triton version (SGLang keys its "
                           "configs by it) or set engine_python so it can be read")
        name = sglang_file_name(shape["E"], shape["N"], gpu_name, dtype, block)
        base = tuned_config_folder or configs_dir
        primary = os.path.join(base, triton_dir(triton_version), name)
        res.update(file_name=name, device_name=sglang_device_name(gpu_name), searched=[primary],
                   triton_dir=triton_dir(triton_version))
        if os.path.isfile(primary):
            res["found"] = primary
        elif os.path.isdir(base):
            for d in sorted(os.listdir(base), reverse=True):
                p = os.path.join(base, d, name)
                if d.startswith("triton_") and d != triton_dir(triton_version) and os.path.isfile(p):
                    res["fallbacks"].append(p)
    res["status"] = "found" if res["found"] else ("fallback" if res["fallbacks"] else "missing")
    return res
