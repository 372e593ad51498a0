# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the engines' flag grammar: what vLLM and SGLang receive from an argv.

Each engine's flags are read the way its own argparse parser reads them (``ENGINE_FLAGS``): a boolean flag never
takes the next positional, ``--no-x`` / ``--x=false`` / ``--x false`` are one spelling, ``--f=v`` and ``--f v``
are one spelling, list flags take every value that follows, unambiguous prefixes resolve like argparse's, and the
last occurrence wins. Only listed flags are read; an unknown flag cannot change how its neighbours are read (a
following bare token is either its value or a positional). Which listed flags change kernels and which set the
parallel layout is the allow list here too (``KERNEL_ARGS``, ``PARALLEL_FLAGS``); what they count for is
:mod:`_fingerprint`'s. A bad argument raises :class:`EngineArgsError` naming the flag.

Standard library only, so benchmark scripts can import it without Ansible.

* :func:`tokenize_engine_args` - ``(values, ignored)``: what the engine would receive for each listed flag, and
  the names of the flags that are not listed.
* :func:`json_arg`, :func:`check_json_arg` - a JSON engine argument under the shared reader's limits.
* :func:`human_readable_int` - vLLM's and SGLang's ``8k`` / ``8K`` integers.
"""
from __future__ import annotations

import re

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    MAX_DEPTH, UntrustedInput, check_value, loads_json)

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


class EngineArgsError(ValueError):
    """An engine argument its engine cannot read; the message names the flag and the fix."""


def json_arg(text, shown):
    """A JSON engine argument under the shared reader's rules; ``None`` when the text is not JSON at all (the
    engine reads it as text then). Too deep or out-of-range JSON is refused, never counted as text: otherwise
    nesting would decide what the fingerprint (and the secret scan) sees."""
    try:
        return loads_json(text, "engine_args: %s" % shown)
    except UntrustedInput as e:
        if e.limit == "syntax":
            return None
        raise EngineArgsError("%s; pass a flatter value with finite numbers" % e)


def check_json_arg(obj, shown):
    """A JSON value already built (merged ``--flag.key`` pieces, whose depth adds up) under the same limits."""
    try:
        return check_value(obj, "engine_args: %s" % shown)
    except UntrustedInput as e:
        raise EngineArgsError("%s; pass a flatter value with finite numbers" % e)


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


_INDEX = dict((engine, _option_index(engine)) for engine in ENGINE_FLAGS)


def _lookup(engine, spelling):
    """Exact spelling, else argparse's ``allow_abbrev``: a unique prefix of a long option is that option."""
    index = _INDEX[engine]
    if spelling in index:
        return index[spelling]
    if not spelling.startswith("--"):
        return None
    hits = sorted(set(v for k, v in index.items() if k.startswith("--") and k.startswith(spelling)))
    if len(hits) > 1:
        raise EngineArgsError("engine_args: %s is ambiguous for %s (it abbreviates %s); spell the flag out"
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
            raise EngineArgsError(
                "engine_args: %s: %s's boolean flags are store_true and have no --no- form; leave %s out "
                "to keep it off" % (spelling, engine, " / ".join("--" + c for c in bools)))
    return hit


def _bool_word(text, shown):
    word = str(text).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise EngineArgsError("engine_args: %s is a boolean flag; give it no value, true or false" % shown)


def _dotted_value(text, shown):
    """How vLLM reads the value of a ``--json-arg.key value`` piece: JSON, else human-readable int, else text."""
    obj = json_arg(text, shown)
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
                raise EngineArgsError("engine_args: -O needs a level (-O3 or -O 3)")
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
                raise EngineArgsError("engine_args: %s needs a value" % item)
            keys = path.split(".")
            if len(keys) >= MAX_DEPTH:
                raise EngineArgsError("engine_args: %s nests %d keys, over the %d-level limit; pass the value "
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
                    raise EngineArgsError("engine_args: %s takes no value" % shown)
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
                raise EngineArgsError("engine_args: %s needs at least one value" % shown)
            values[canon] = got
        else:
            if eq:
                values[canon] = inline
            elif i < len(items) and not _flag_like(items[i]):
                values[canon] = items[i]
                i += 1
            else:
                raise EngineArgsError("engine_args: %s needs a value" % shown)
    for canon, piece in dotted.items():
        values[canon] = piece  # vLLM passes the merged pieces last, so they replace a whole value
    return values, ignored
