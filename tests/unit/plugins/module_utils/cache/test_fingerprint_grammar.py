"""Engine arguments are read with each engine's own flag grammar before they enter the fingerprint.

Upstream rules restated here:
- vLLM ``vllm/engine/arg_utils.py`` ``_compute_kwargs``: bool fields use ``argparse.BooleanOptionalAction``
  (``--x`` / ``--no-x``), list fields ``nargs="+"``, config dataclasses take JSON,
  ``max_num_batched_tokens`` / ``max_model_len`` take ``human_readable_int``.
- vLLM ``vllm/utils/argparse_utils.py`` ``FlexibleArgumentParser.parse_args``: ``_`` -> ``-`` before the
  first ``.``, ``-O3`` / ``-O=3`` / ``-O 3`` -> ``--optimization-level``, ``--json-arg.key value`` pieces
  merged (lists concatenated, ``key+`` appends) and passed after all other arguments.
- SGLang ``python/sglang/srt/arg_groups/arg_utils.py`` ``add_cli_args_from_dataclass``: bool ->
  ``action="store_true"``, ``List[X]`` -> ``nargs="+"``; aliases and ``context_length``'s
  ``type_parser=human_readable_int`` from ``python/sglang/srt/server_args.py``.
- Both build on argparse (``allow_abbrev`` on), so a unique prefix names its flag and a shared one is an
  error; the differential test below checks the grammar against argparse itself.
"""
from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.cache import _engine_flags
from ansible_collections.llmops.serving.plugins.module_utils.cache import _fingerprint as fpmod
from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang as _no_hang

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "models" / "m" / "rev1"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(CONFIG))
    return str(d)


def compute(model, engine, args, **over):
    kw = dict(engine=engine, engine_version="1.0", versions={"torch": "2.13.0", "triton": "3.6.0", "cuda": "none"},
              driver_version="none", gpu_name="cpu", compute_capability="x86_64+avx2", model_path=model,
              model_revision="rev1", engine_args=args)
    kw.update(over)
    return fpmod.compute(**kw)


def counted(model, engine, args, **over):
    return compute(model, engine, args, **over)["components"]["engine_args"]


# --- booleans -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine,flag", [("vllm", "--enforce-eager"), ("sglang", "--enable-torch-compile")])
def test_boolean_flag_does_not_swallow_the_next_positional(model, engine, flag):
    """Before: ``--enforce-eager /models/a`` counted ``enforce-eager=a``, so the key followed the path."""
    a = counted(model, engine, [flag, "/models/a"])
    b = counted(model, engine, ["/srv/other/b", flag])
    assert a == b == {flag[2:]: "true"}


def test_vllm_negation_forms_normalise(model):
    """Before: ``--no-enable-chunked-prefill`` was an ignored flag named ``no-enable-chunked-prefill``, so
    turning chunked prefill off was the same fingerprint as leaving the engine's default on."""
    off = [["--no-enable-chunked-prefill"], ["--enable-chunked-prefill=False"], ["--enable-chunked-prefill", "false"],
           ["--enable_chunked_prefill=0"], ["--no-enable-chunked"]]
    on = [["--enable-chunked-prefill"], ["--enable-chunked-prefill=True"], ["--enable-chunked-prefill", "TRUE"],
          ["--no-enable-chunked-prefill", "--enable-chunked-prefill"], ["--enable-chunked-prefill=yes"]]
    assert all(counted(model, "vllm", a) == {"enable-chunked-prefill": "false"} for a in off)
    assert all(counted(model, "vllm", a) == {"enable-chunked-prefill": "true"} for a in on)
    assert counted(model, "vllm", ["-ep"]) == counted(model, "vllm", ["--enable-expert-parallel"])
    assert counted(model, "vllm", ["-ep"]) == {"enable-expert-parallel": "true"}


@pytest.mark.parametrize("engine,args,needle", [
    ("vllm", ["--enforce-eager=maybe"], "engine_args: --enforce-eager is a boolean flag; give it no value, true or false"),
    ("vllm", ["--no-enforce-eager=1"], "engine_args: --no-enforce-eager takes no value"),
    ("sglang", ["--no-enable-torch-compile"], "store_true and have no --no- form; leave --enable-torch-compile out"),
    ("sglang", ["--no-disable-cuda"], "leave --disable-cuda-graph / --disable-cuda-graph-padding out"),
    ("vllm", ["--max-num-seqs"], "engine_args: --max-num-seqs needs a value"),
    ("vllm", ["--max-num-seqs", "--enforce-eager"], "engine_args: --max-num-seqs needs a value"),
    ("vllm", ["--max-num-seqs", "many"], "engine_args: --max-num-seqs takes an integer"),
    ("sglang", ["--cuda-graph-bs", "--enable-torch-compile"], "engine_args: --cuda-graph-bs needs at least one value"),
    # argparse's nargs="+" takes a following positional too, and the engine then fails on int("/models/m")
    ("vllm", ["--cudagraph-capture-sizes", "1", "2", "/models/m"], "engine_args: --cudagraph-capture-sizes takes an integer"),
    ("vllm", ["--max-num", "8"], "--max-num is ambiguous for vllm (it abbreviates --max-num-batched-tokens, --max-num-seqs)"),
    ("sglang", ["--speculative-num", "3"], "--speculative-num is ambiguous for sglang"),
    ("vllm", ["-O"], "engine_args: -O needs a level"),
    ("vllm", ["--compilation-config.mode"], "engine_args: --compilation-config.mode needs a value"),
    ("vllm", ["-tp", "eight"], "engine_args: --tensor-parallel-size takes an integer"),
])
def test_malformed_flags_are_clean_errors_naming_the_flag(model, engine, args, needle):
    with pytest.raises(fpmod.FingerprintError) as e:
        compute(model, engine, args)
    assert needle in str(e.value)


# --- values, lists, numbers -----------------------------------------------------------------------------

def test_list_flags_take_every_following_value(model):
    """Before: ``--cuda-graph-bs 1 2 4`` counted only ``1``; the rest were positionals."""
    assert counted(model, "sglang", ["--cuda-graph-bs", "1", "2", "4", "--enable-dp-attention"]) == {
        "cuda-graph-bs": "[1,2,4]", "enable-dp-attention": "true"}
    assert counted(model, "sglang", ["--cuda-graph-bs", "1", "2", "4"]) != counted(model, "sglang", ["--cuda-graph-bs", "1", "8"])
    # ``=`` attaches one value, as argparse does
    assert counted(model, "vllm", ["--cudagraph-capture-sizes=8"]) == {"cudagraph-capture-sizes": "[8]"}


def test_numbers_have_one_spelling(model):
    assert counted(model, "vllm", ["--max-num-batched-tokens", "8k"]) == {"max-num-batched-tokens": "8000"}
    assert counted(model, "vllm", ["--max-num-batched-tokens", "8K"]) == {"max-num-batched-tokens": "8192"}
    assert counted(model, "vllm", ["--max-model-len=25.6k"]) == {"max-model-len": "25600"}
    assert counted(model, "vllm", ["--max-model-len", "auto"]) == {"max-model-len": "auto"}
    assert counted(model, "vllm", ["--max-num-seqs", "064"]) == {"max-num-seqs": "64"}
    assert counted(model, "sglang", ["--context-length", "32k"]) == counted(model, "sglang", ["--context-length=32000"])
    # negative numbers are values, not flags
    assert counted(model, "sglang", ["--chunked-prefill-size", "-1", "--enable-torch-compile"]) == {
        "chunked-prefill-size": "-1", "enable-torch-compile": "true"}


def test_short_aliases_and_abbreviations(model):
    """Before: ``-q fp8`` and SGLang's ``--speculative-algo EAGLE`` were ignored flags."""
    assert counted(model, "vllm", ["-q", "fp8"]) == counted(model, "vllm", ["--quantization", "fp8"]) == {"quantization": "fp8"}
    assert counted(model, "vllm", ["-q=fp8"]) == {"quantization": "fp8"}
    assert counted(model, "sglang", ["--speculative-algo", "EAGLE"]) == {"speculative-algorithm": "EAGLE"}
    assert counted(model, "sglang", ["--speculative-draft-model-quant", "unquant"]) == {
        "speculative-draft-model-quantization": "unquant"}
    # an exact alias wins over being a prefix of longer flags
    r = compute(model, "sglang", ["--speculative-draft-model", "org/draft"])
    assert r["components"]["engine_args"] == {"speculative-draft-model-path": "hub:org/draft"}


def test_vllm_O_forms(model):
    for args in (["-O3"], ["-O=3"], ["-O", "3"], ["--optimization-level", "3"], ["--optimization_level=3"]):
        assert counted(model, "vllm", args) == {"optimization-level": "3"}, args


def test_vllm_dotted_json_pieces(model):
    """Pieces merge into one value that vLLM passes after everything else, so it replaces a whole
    ``--compilation-config`` given before or after it; ``key+`` appends to a list."""
    whole = ["--compilation-config", '{"mode": 3, "cudagraph_capture_sizes": [1, 2]}']
    pieces = ["--compilation-config.mode", "3", "--compilation-config.cudagraph_capture_sizes+", "1,2",
              "-cc.cudagraph_capture_sizes+=4"]
    assert counted(model, "vllm", pieces) == {"compilation-config": '{"cudagraph_capture_sizes":["1","2","4"],"mode":3}'}
    assert counted(model, "vllm", whole + ["--compilation-config.mode=1"]) == {"compilation-config": '{"mode":1}'}
    assert counted(model, "vllm", ["--compilation-config.mode=1"] + whole) == {"compilation-config": '{"mode":1}'}
    assert counted(model, "vllm", ["--compilation-config.pass_config.fuse_norm_quant", "true"]) == {
        "compilation-config": '{"pass_config":{"fuse_norm_quant":true}}'}
    # a piece of an uncounted JSON flag takes its value with it and counts nothing
    r = compute(model, "vllm", ["--kv-transfer-config.kv_ip", "10.0.0.7", "--enforce-eager"])
    assert r["components"]["engine_args"] == {"enforce-eager": "true"}
    assert "kv-transfer-config" in r["ignored_args"]


def test_unknown_flags_never_count_and_never_shift_their_neighbours(model):
    base = counted(model, "vllm", ["--enforce-eager", "--max-num-seqs", "8"])
    for args in (["--zz-new-flag", "--enforce-eager", "--max-num-seqs", "8"],
                 ["--zz-new-flag", "value", "--enforce-eager", "--max-num-seqs", "8"],
                 ["--enforce-eager", "--zz-new-flag", "--max-num-seqs", "8", "--zz-other=1"],
                 ["--max-num-seqs", "8", "--zz-list", "1", "2", "--enforce-eager", "/models/m"],
                 ["--max-num-seqs", "8", "--enforce-eager", "--", "--max-num-seqs", "99"]):
        r = compute(model, "vllm", args)
        assert r["components"]["engine_args"] == base, args
    assert compute(model, "vllm", ["--zz-new-flag", "x"])["ignored_args"] == ["zz-new-flag"]


def test_config_file_counts_by_its_bytes(tmp_path, model):
    a = tmp_path / "a" / "serve.yaml"
    b = tmp_path / "b" / "other-name.yaml"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text("enforce-eager: true\nmax-num-seqs: 8\n")
    fa = compute(model, "vllm", ["--config", str(a)])["fingerprint"]
    assert compute(model, "vllm", ["--config=%s" % b])["fingerprint"] == fa
    b.write_text("enforce-eager: false\nmax-num-seqs: 8\n")
    assert compute(model, "vllm", ["--config", str(b)])["fingerprint"] != fa
    with pytest.raises(fpmod.FingerprintError, match="engine_args: --config .*missing.yaml cannot be read on this host"):
        compute(model, "sglang", ["--config", str(tmp_path / "missing.yaml")])


def test_draft_directory_without_config_is_a_clean_error(tmp_path, model):
    (tmp_path / "draft").mkdir()
    with pytest.raises(fpmod.FingerprintError) as e:
        compute(model, "sglang", ["--speculative-draft-model-path", str(tmp_path / "draft")])
    msg = str(e.value)
    assert msg.startswith("engine_args: --speculative-draft-model-path: cannot read ") and "draft_model_path" in msg
    (tmp_path / "draft" / "config.json").write_text("{not json")
    with pytest.raises(fpmod.FingerprintError, match=r"config\.json is not JSON \(.*\); re-stage the model"):
        compute(model, "vllm", ["-sc", json.dumps({"model": str(tmp_path / "draft")})])


# --- differential check against argparse ----------------------------------------------------------------

def _argparse_parser(engine):
    """argparse built from the grammar table the way each engine builds its own parser."""
    ap = argparse.ArgumentParser(prog=engine, add_help=False, exit_on_error=False)
    ap.add_argument("model_tag", nargs="?")
    for canon, (kind, aliases) in _engine_flags.ENGINE_FLAGS[engine].items():
        names = ["--" + canon] + list(aliases)
        kw = dict(dest=canon.replace("-", "_"), default=argparse.SUPPRESS)
        if kind == _engine_flags.BOOL:
            kw["action"] = argparse.BooleanOptionalAction if engine in _engine_flags.NEGATABLE else "store_true"
        elif kind == _engine_flags.INTS:
            kw.update(nargs="+", type=int)
        ap.add_argument(*names, **kw)
    return ap


PARSERS = dict((engine, _argparse_parser(engine)) for engine in fpmod.ENGINES)


def _spellings(engine, canon):
    """Every spelling argparse accepts for ``canon``: names, aliases and unique long prefixes."""
    parser = PARSERS[engine]
    kind = _engine_flags.ENGINE_FLAGS[engine][canon][0]
    out = []
    for action in parser._actions:
        if action.dest != canon.replace("-", "_"):
            continue
        for s in action.option_strings:
            negated = s.startswith("--no-")
            out.append((s, negated))
            if s.startswith("--"):
                for n in range(len(s) - 1, 3, -1):
                    p = s[:n]
                    owners = set(a.dest for a in parser._actions for o in a.option_strings if o.startswith(p))
                    if owners == {action.dest} and not any(o.startswith(p) and o.startswith("--no-") != negated
                                                           for o in action.option_strings):
                        out.append((p, negated))
    assert out or kind is None
    return out


VALUES = st.sampled_from(["fp8", "EAGLE", "16", "-1", '{"mode": 3}', "org/draft", "/models/draft", "bf16"])


@st.composite
def argv(draw, engine):
    flags = sorted(_engine_flags.ENGINE_FLAGS[engine])
    tokens, positional_done = [], False
    for _i in range(draw(st.integers(0, 6))):
        canon = draw(st.sampled_from(flags))
        kind = _engine_flags.ENGINE_FLAGS[engine][canon][0]
        spelling, negated = draw(st.sampled_from(_spellings(engine, canon)))
        if kind == _engine_flags.BOOL:
            tokens.append(spelling)
        elif kind == _engine_flags.INTS:
            n = draw(st.integers(1, 3))
            ints = [str(draw(st.integers(-2, 512))) for _i in range(n)]
            if n == 1 and draw(st.booleans()):
                tokens.append("%s=%s" % (spelling, ints[0]))
            else:
                tokens += [spelling] + ints
            continue  # a positional right after would be taken into the list
        elif draw(st.booleans()):
            tokens.append("%s=%s" % (spelling, draw(VALUES)))
        else:
            tokens += [spelling, draw(VALUES)]
        if not positional_done and draw(st.booleans()):
            tokens.append("/models/m")
            positional_done = True
    return tokens


def _expected(engine, tokens):
    ns, extra = PARSERS[engine].parse_known_args(tokens)
    assert not extra, (tokens, extra)
    ns = vars(ns)
    ns.pop("model_tag", None)
    return dict((dest.replace("_", "-"), value) for dest, value in ns.items())


@pytest.mark.parametrize("engine", fpmod.ENGINES)
@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_grammar_reads_argv_as_argparse_does(engine, data):
    tokens = data.draw(argv(engine))
    want = _expected(engine, tokens)
    got, _ignored = _engine_flags.tokenize_engine_args(engine, tokens)
    got = dict((k, [int(x) for x in v] if _engine_flags.ENGINE_FLAGS[engine][k][0] == _engine_flags.INTS else v) for k, v in got.items())
    assert got == want, tokens


# --- hostile inputs: config.json and JSON arguments go through the shared reader -----------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_config_json_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    import os
    d = tmp_path / "m"
    d.mkdir()
    cfg = d / "config.json"
    {"fifo": lambda: os.mkfifo(cfg), "dev-zero": lambda: cfg.symlink_to("/dev/zero"), "directory": cfg.mkdir}[kind]()
    box = _no_hang(lambda: compute(str(d), "vllm", []))
    err = box.get("error")
    assert isinstance(err, fpmod.FingerprintError), box
    assert str(err).startswith("model_path: %s is " % cfg) and "not a regular file" in str(err)


@pytest.mark.parametrize("body,limit", [("[" * 5000 + "]" * 5000, "nests deeper than 64 levels"),
                                        ('{"a": 1e400}', "not finite"),
                                        ('{"taken_at": 1%s}' % ("0" * 400), "refused"),
                                        ('{"a": NaN}', "refused")])
def test_config_json_nesting_and_numbers_are_clean_errors(tmp_path, body, limit):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(body)
    with pytest.raises(fpmod.FingerprintError, match="re-stage the model") as e:
        compute(str(d), "vllm", [])
    assert limit in str(e.value) and str(d / "config.json") in str(e.value)


@pytest.mark.parametrize("args", [["--compilation-config", "[" * 5000 + "]" * 5000],
                                  ["--compilation-config", '{"a": ' * 100 + "1" + "}" * 100],
                                  ["--compilation-config.level", "[" * 100 + "]" * 100],
                                  ["--compilation-config.mode", '{"x": 1e400}'],
                                  ["--compilation-config." + ".".join(["k"] * 200), "1"],
                                  ["--compilation-config." + ".".join(["k"] * 40), "[" * 40 + "]" * 40]])
def test_json_engine_argument_too_deep_or_out_of_range_is_refused_not_counted_as_text(model, args):
    """Before: RecursionError (or the deep value counted as plain text)."""
    with pytest.raises(fpmod.FingerprintError, match="engine_args: --compilation-config"):
        compute(model, "vllm", args)


def test_json_engine_argument_at_a_sane_depth_still_counts(model):
    a = counted(model, "vllm", ["--compilation-config", json.dumps({"pass_config": {"a": [[1, 2]]}, "level": 3})])
    b = counted(model, "vllm", ["--compilation-config.level", "3", "--compilation-config.pass_config.a", "[[1,2]]"])
    assert a == b


def test_human_readable_integer_out_of_float_range_is_a_clean_error(model):
    with pytest.raises(fpmod.FingerprintError, match="--max-num-batched-tokens takes an integer"):
        compute(model, "vllm", ["--max-num-batched-tokens", "1" * 400 + "k"])


def test_config_file_flag_naming_a_fifo_is_refused_without_blocking(tmp_path, model):
    import os
    fifo = tmp_path / "engine.yaml"
    os.mkfifo(fifo)
    box = _no_hang(lambda: compute(model, "vllm", ["--config", str(fifo)]))
    assert isinstance(box.get("error"), fpmod.FingerprintError) and "a FIFO" in str(box["error"])


@pytest.mark.parametrize("printed,needle", [
    ("[1, 2]", "version report of another shape"),
    ('{"torch": "2.13.0"}', "version report of another shape"),
    ('{"vllm": "0.26.0", "torch": 5}', "version report of another shape"),
    ("[" * 5000 + "]" * 5000, "printed no version report"),
    ('{"vllm": 1e400}', "printed no version report"),
])
def test_engine_python_output_of_another_shape_is_a_clean_error(tmp_path, printed, needle):
    """Before: a list or a missing engine key raised AttributeError / KeyError out of gather_versions."""
    import stat
    out = tmp_path / "out.txt"
    out.write_text(printed + "\n")
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\ncat %s\n" % out)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(fpmod.FingerprintError) as e:
        fpmod.gather_versions("vllm", str(py))
    assert str(e.value).startswith("engine_python: %s" % py) and needle in str(e.value)
