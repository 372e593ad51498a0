"""Property-based harness for the reference answer cache (``_reference.cached_reference``).

For any sequence of requests (prompts, max_new_tokens, dtype) interleaved with changes of the model directory
(a file grown, a file touched, SHA256SUMS rewritten with the same size and mtime, a file added) and entries spoiled
with arbitrary bytes:

* an answer is served from the cache exactly when that request was computed before on the files as they are now
  and its entry was not spoiled since; otherwise it is computed (once) and written;
* what is served always equals what a computation on the current files returns (never a stale answer);
* the directory holds only regular entries of mode 0600 and no temporary file.

The computation here is a function of the request and of the bytes of the files, so a stale answer would differ.
CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + (
    [Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

PROMPT_SETS = [("The model is staged",), ("Prefill computes the prompt",), ("The model is staged", "Prefill")]
REQUEST = st.tuples(st.sampled_from(range(len(PROMPT_SETS))), st.sampled_from([1, 8, 16]),
                    st.sampled_from(["float32", "bfloat16"]))
STEP = st.one_of(
    st.tuples(st.just("request"), REQUEST),
    st.tuples(st.just("grow"), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("touch"), st.integers(1, 10 ** 9)),
    st.tuples(st.just("sums"), st.integers(0, 15)),
    st.tuples(st.just("add"), st.integers(0, 10 ** 6)),
    st.tuples(st.just("spoil"), st.binary(max_size=64)),
)


def _fake_python(base):
    p = os.path.join(base, "python")
    with open(p, "w") as f:
        f.write("#!/bin/sh\necho '{\"torch\": \"2.8.0\", \"transformers\": \"4.56.1\"}'\n")
    os.chmod(p, 0o755)
    return p


def _truth(model, prompts, max_new_tokens, dtype):
    """What a computation on the files as they are now returns."""
    h = hashlib.sha256(repr((list(prompts), max_new_tokens, dtype)).encode())
    for name in sorted(os.listdir(model)):
        with open(os.path.join(model, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return {"references": [{"prompt": p, "token_ids": [int(h.hexdigest()[:6], 16)], "text": h.hexdigest()}
                           for p in prompts], "load_seconds": 1.0}


@SETTINGS
@given(steps=st.lists(STEP, min_size=1, max_size=10))
def test_an_answer_is_served_only_for_the_request_and_files_it_was_computed_on(steps):
    with tempfile.TemporaryDirectory() as base:
        model = os.path.join(base, "rev")
        os.mkdir(model)
        for name, data in (("config.json", b"{}"), ("model.safetensors", b"\0" * 16), ("SHA256SUMS", b"a" * 16)):
            with open(os.path.join(model, name), "wb") as f:
                f.write(data)
        python, cache = _fake_python(base), os.path.join(base, "cache")
        calls = []

        def compute(model_path, prompts, max_new_tokens, dtype, python=None, timeout=None):
            calls.append(1)
            return _truth(model_path, prompts, max_new_tokens, dtype)

        state = {"version": 0, "valid": set(), "last": None}

        def ask(arg):
            prompts, tokens, dtype = PROMPT_SETS[arg[0]], arg[1], arg[2]
            before = len(calls)
            out, warnings = _reference.cached_reference(model, prompts, tokens, dtype, python=python,
                                                        cache_dir=cache, compute=compute)
            assert warnings == []
            assert out["cached"] is ((arg, state["version"]) in state["valid"])
            assert len(calls) == before + (0 if out["cached"] else 1)
            assert out == dict(_truth(model, prompts, tokens, dtype), cached=out["cached"])
            state["valid"].add((arg, state["version"]))
            state["last"] = (arg, state["version"], _reference.cache_key(model, prompts, tokens, dtype, python)[0])

        for kind, arg in steps:
            shard = os.path.join(model, "model.safetensors")
            if kind == "request":
                ask(arg)
                continue
            if kind == "spoil":
                if state["last"] is not None:
                    with open(os.path.join(cache, state["last"][2] + ".json"), "wb") as f:
                        f.write(arg)
                    state["valid"].discard(state["last"][:2])
            elif kind == "grow":
                with open(shard, "ab") as f:
                    f.write(arg)
            elif kind == "touch":
                st_ = os.stat(shard)
                os.utime(shard, ns=(st_.st_atime_ns, st_.st_mtime_ns + arg))
            elif kind == "sums":
                p = os.path.join(model, "SHA256SUMS")
                st_ = os.stat(p)
                with open(p, "r+b") as f:
                    data = bytearray(f.read())
                    data[arg] = (data[arg] + 1) % 256 or 1
                    f.seek(0)
                    f.write(bytes(data))
                os.utime(p, ns=(st_.st_atime_ns, st_.st_mtime_ns))  # only the bytes differ
            elif kind == "add":
                with open(os.path.join(model, "extra-%d.json" % arg), "ab") as f:
                    f.write(b"x")
            if kind != "spoil":
                state["version"] += 1
            if state["last"] is not None:
                ask(state["last"][0])  # the request just answered, asked again after the change
        if os.path.isdir(cache):
            for name in os.listdir(cache):
                st_ = os.lstat(os.path.join(cache, name))
                assert name.endswith(".json") and stat.S_ISREG(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600
            assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
