# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the upgrade's SLO gate, ``upgrade_slo``: what one round sends and the limits.

The gate sends one short fixed-rate round of the serving benchmark (``_bench_plan``, ``_bench_round``: the same
client, ``vllm bench serve``) to A alone and the same round to B alone, and compares them
(``_bench_slo_judge``). This file owns the setting:

* :data:`DEFAULTS` - every key and the value a missing key takes (the role's defaults file explains them);
* :func:`check_settings` - ``upgrade_slo`` checked and completed, each refusal a :class:`BenchError` naming
  ``upgrade_slo.<key>`` and the fix; ``{}`` is the gate off (:func:`enabled`);
* :func:`round_line` - the round in words, for the play's output.
"""
from __future__ import annotations

import math

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_inputs
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError, shown

VAR = "upgrade_slo"

#: Every key of ``upgrade_slo`` and what a missing key takes. None: no such limit.
DEFAULTS = {
    # the round: requests measured, offered at ``rate`` per second (Poisson arrivals drawn from ``seed``, so A and
    # B get the same prompts at the same offsets), prompt_tokens in and max_tokens out each (--ignore-eos)
    "requests": 32,
    "rate": 2.0,
    "prompt_tokens": 256,
    "max_tokens": 128,
    "seed": 1,
    # warm-up rounds per side before the measured one (discarded; prompts of other seeds): B has just started
    "warmup": 1,
    # seconds the client may run for one round
    "timeout": 600,
    # limits: B over A on the same prompts, and absolute ones on B (None: no absolute limit)
    "ttft_p95_ratio": 1.5,
    "tpot_p95_ratio": 1.25,
    "ttft_p95_ms": None,
    "tpot_p95_ms": None,
    # goodput: the client's --goodput pairs (metric:ms); the goodput limit is judged only when they are given
    "goodput": [],
    "goodput_min_ratio": 0.9,
    # B's failed requests allowed (and A's: a baseline with more is no baseline)
    "max_failed_requests": 0,
}

_INT_KEYS = {
    "requests": (1, "give the requests of the measured round, for example 32 (a p95 of fewer than 20 is close to "
                    "the slowest request)"),
    "prompt_tokens": (1, "give the prompt length in tokens, for example 256, below the engine's --max-model-len"),
    "max_tokens": (2, "give the output tokens per request, at least 2 so that TPOT exists, for example 128"),
    "seed": (0, "give the prompt seed, a non-negative integer, for example 1"),
    "warmup": (0, "give the warm-up rounds per side, 0 or more, for example 1"),
    "max_failed_requests": (0, "give the failed requests B may have, 0 or more, for example 0"),
}
_POSITIVE_KEYS = {
    "rate": "give the offered requests per second, above 0, for example 2",
    "timeout": "give the seconds the client may run for one round, above 0, for example 600",
    "ttft_p95_ratio": "give the largest B/A ratio of p95 TTFT allowed, above 0, for example 1.5",
    "tpot_p95_ratio": "give the largest B/A ratio of p95 TPOT allowed, above 0, for example 1.25",
    "goodput_min_ratio": "give the smallest B/A ratio of goodput allowed, above 0, for example 0.9",
    "ttft_p95_ms": "give B's largest p95 TTFT in milliseconds, above 0, or leave it out for no absolute limit",
    "tpot_p95_ms": "give B's largest p95 TPOT in milliseconds, above 0, or leave it out for no absolute limit",
}


def enabled(slo):
    """Whether ``upgrade_slo`` turns the gate on: any key given (``{}`` or null is off)."""
    return bool(slo)


def _int(key, v):
    least, fix = _INT_KEYS[key]
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer() and not isinstance(v, bool):
            v = int(v)
        elif isinstance(v, str) and v.strip().lstrip("-").isdigit():
            v = int(v.strip())
        else:
            raise BenchError("%s.%s: %s is not an integer; %s" % (VAR, key, shown(v), fix), field="%s.%s" % (VAR, key))
    if v < least:
        raise BenchError("%s.%s: %d is below %d; %s" % (VAR, key, v, least, fix), field="%s.%s" % (VAR, key))
    return v


def _positive(key, v):
    fix = _POSITIVE_KEYS[key]
    if isinstance(v, bool):
        raise BenchError("%s.%s: %s is not a number; %s" % (VAR, key, shown(v), fix), field="%s.%s" % (VAR, key))
    try:
        f = float(v if isinstance(v, (int, float)) else str(v).strip())
    except ValueError:
        raise BenchError("%s.%s: %s is not a number; %s" % (VAR, key, shown(v), fix), field="%s.%s" % (VAR, key))
    if not math.isfinite(f) or f <= 0:
        raise BenchError("%s.%s: %s must be a finite number above 0; %s" % (VAR, key, shown(v), fix),
                         field="%s.%s" % (VAR, key))
    return f


def check_settings(slo):
    """``upgrade_slo`` checked and completed from :data:`DEFAULTS`; ``{}`` for the gate off.

    Refuses (:class:`BenchError`, ``field`` ``upgrade_slo.<key>``) an unknown key, a value of the wrong type or out
    of range (a rate, a timeout or a ratio at or below 0, a negative count, ``max_tokens`` below 2, a goodput pair
    that is not ``metric:ms``), ``goodput_min_ratio`` given without ``goodput`` (there would be nothing to count),
    and ``max_failed_requests`` that allows every request to fail."""
    if slo is None or slo == {}:
        return {}
    if not isinstance(slo, dict):
        raise BenchError("%s: %s is not a mapping; give {} for no SLO gate, or keys such as {ttft_p95_ratio: 1.5}"
                         % (VAR, shown(slo)), field=VAR)
    unknown = sorted(str(k) for k in slo if k not in DEFAULTS)
    if unknown:
        raise BenchError("%s.%s: unknown key; the keys are %s" % (VAR, unknown[0], ", ".join(sorted(DEFAULTS))),
                         field="%s.%s" % (VAR, unknown[0]))
    out = {}
    for key, default in DEFAULTS.items():
        v = slo.get(key)
        if v is None:
            out[key] = list(default) if isinstance(default, list) else default
        elif key in _INT_KEYS:
            out[key] = _int(key, v)
        elif key in _POSITIVE_KEYS:
            out[key] = _positive(key, v)
        else:  # goodput: the benchmark's own rule for the client's --goodput pairs
            out[key] = _bench_inputs.check_goodput(v, var="%s.goodput" % VAR)
    if slo.get("goodput_min_ratio") is not None and not out["goodput"]:
        raise BenchError("%s.goodput_min_ratio: given without %s.goodput, so no request can count as good; give the "
                         "SLO a good request meets, for example goodput: [\"ttft:2000\", \"tpot:100\"], or leave "
                         "goodput_min_ratio out" % (VAR, VAR), field="%s.goodput_min_ratio" % VAR)
    if out["max_failed_requests"] >= out["requests"]:
        raise BenchError("%s.max_failed_requests: %d allows all %d requests of the round to fail; give fewer than "
                         "requests (0 is usual)" % (VAR, out["max_failed_requests"], out["requests"]),
                         field="%s.max_failed_requests" % VAR)
    return out


def round_line(settings):
    """The round in words: ``16 requests at 2 req/s, 256 prompt + 128 output tokens, seed 1, 1 warm-up round``."""
    s = settings
    return ("%d requests at %g req/s, %d prompt + %d output tokens, seed %d, %d warm-up round%s"
            % (s["requests"], s["rate"], s["prompt_tokens"], s["max_tokens"], s["seed"], s["warmup"],
               "" if s["warmup"] == 1 else "s"))
