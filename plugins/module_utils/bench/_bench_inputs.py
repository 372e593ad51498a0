# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the serving benchmark's inputs: the play variables, and the targets before any load.

* :func:`check_inputs` - the play variables (:func:`check_targets`, :func:`check_lengths`, :func:`check_rates`,
  :func:`check_goodput`), each refusal a :class:`BenchError` naming the variable and the fix.
* :func:`check_tokenizer` - the client's tokenizer directory.
* :func:`check_target` / :func:`probe` - before any load: the target answers, serves the model
  (:func:`served_models`), and one request of each length pair completes (its time bounds what the ladder needs,
  ``_bench_plan.estimate``); :func:`target_alive` - before and after a round, whether it still does.
* :func:`split_headers` / :func:`secret_header_values` - the targets' headers that carry credentials, and their
  values, which a module never shows;
  :func:`failure` - what a module fails with for a benchmark error.
* :func:`shown` - a value as an error message shows it.
"""
from __future__ import annotations

import math
import os
import re
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _http, _secrets
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom

#: Files a Hugging Face tokenizer directory holds (any one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
TRANSPORTS = ("any", "rdma", "tcp")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")


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


def check_goodput(value, var="benchmark_goodput"):
    """``benchmark_goodput`` (or the variable ``var``): the client's ``--goodput`` SLO pairs, ``["ttft:500",
    "e2el:2000"]``."""
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
            raise BenchError("%s[%d]: %s is not metric:milliseconds; %s" % (var, i, shown(v), fix), field=var)
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
                         "saturated)" % shown(tol), field="benchmark_saturation_tolerance")
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


def target_alive(target, opener=None, timeout=5):
    """None when the target still lists its model, else why not (the text for ``stopped``)."""
    try:
        models = served_models(target, opener=opener, timeout=timeout)
    except _http.HttpError as e:
        return "GET %s/v1/models: %s" % (target["url"], e.reason if e.status is None else "HTTP %s" % e.status)
    if target["model"] not in models:
        return "%s no longer lists model %s" % (target["url"], target["model"])
    return None


def split_headers(headers):
    """``(plain, credential)``: the headers that carry no credential, and those that do by the collection's one
    rule (:func:`_secrets.is_credential_header` on the name, :func:`_secrets.token_shape` on the value)."""
    plain, cred = {}, {}
    for k, v in sorted((headers or {}).items()):
        if _secrets.is_credential_header(k) or _secrets.token_shape(v) is not None:
            cred[k] = v
        else:
            plain[k] = v
    return plain, cred


def secret_header_values(targets):
    """The header values of ``targets`` that are credentials (:func:`split_headers`): a module adds them to its
    ``no_log_values``."""
    return [v for t in targets for v in split_headers(t.get("headers"))[1].values()]


def failure(e):
    """``fail_json``'s fields for a benchmark error (:class:`BenchError`, ``_bench_coldstart.ColdstartError``): its
    message, and its ``reason`` and the ``file`` to blame where it has them."""
    out = {"msg": str(e)}
    for key in ("reason", "file"):
        if getattr(e, key, None):
            out[key] = getattr(e, key)
    return out


def shown(v):
    """A value for an error message: numbers and short names as they are, anything else by its type."""
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    if isinstance(v, str) and len(v) <= 64:
        return repr(v)
    return "a %s" % type(v).__name__
