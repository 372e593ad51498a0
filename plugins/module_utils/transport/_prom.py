# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: Prometheus text exposition parsing and the KV-transfer metrics of a
decode engine (vLLM NixlConnector, SGLang disaggregation).

Only the standard library; fetching a URL goes through ``_http`` (``ansible.module_utils.urls.open_url``), under
its deadline for the whole answer and :data:`_http.MAX_METRICS_BYTES` (an endless ``/metrics`` is refused while it
is read). A figure read from the text is a figure that can be (:func:`counter_value`, ``_untrusted.figure``): a
counter or a histogram's ``_sum``, ``_count`` or ``_bucket`` that is ``NaN``, infinite or negative, or a bucket bound
``le`` that is not a number, is :class:`PromValueError`, so the engine's figures are unknown, never ``Infinity`` in a
file written after. Messages quote the text only through ``_untrusted.excerpt``.
"""
from __future__ import annotations

import math
import re

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, excerpt, figure, figure_or_none)

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

# vLLM NixlConnector (recorded by the worker that completes the READ: decode in pull mode).
VLLM_BYTES = "vllm:nixl_bytes_transferred"
VLLM_XFER_TIME = "vllm:nixl_xfer_time_seconds"
VLLM_FAILED = "vllm:nixl_num_failed_transfers"
VLLM_FAILED_NOTIF = "vllm:nixl_num_failed_notifications"
VLLM_EXPIRED = "vllm:nixl_num_kv_expired_reqs"
VLLM_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"
# SGLang disaggregation.
SGLANG_KV_PREFIX = "sglang:kv_transfer_"
SGLANG_FAILED = "sglang:num_transfer_failed_reqs"
SGLANG_BOOTSTRAP_FAILED = "sglang:num_bootstrap_failed_reqs"

# Fields of a KV sample that are monotonic counters (their delta is meaningful).
COUNTER_FIELDS = (
    "bytes", "transfers", "xfer_time_s", "xfer_count", "failed_transfers", "failed_notifications",
    "kv_expired_reqs", "sglang_failed_reqs", "sglang_bootstrap_failed_reqs",
)


#: Seconds a ``/metrics`` answer may take, all of it (``_http``'s deadline for the whole answer).
FETCH_TIMEOUT = 10.0


class PromParseError(ValueError):
    """The text is not Prometheus exposition format."""


class PromValueError(PromParseError):
    """A sample whose value cannot be what its name says: a counter, or a histogram's ``_sum``, ``_count`` or
    ``_bucket``, that is not finite or is negative; a bucket bound ``le`` that is not a number."""


def _shown_sample(name, labels):
    shown = ",".join('%s="%s"' % (k, v) for k, v in sorted(labels.items()))
    return excerpt("%s{%s}" % (name, shown) if shown else name)


def counter_value(name, labels, value):
    """``value`` of the sample ``name{labels}`` that is a counter or a histogram's ``_sum``, ``_count`` or
    ``_bucket`` (of durations or bytes): a finite, non-negative figure within ``_untrusted.MAX_ABS_NUMBER``, and a
    whole number when it counts (``_count``, ``_bucket``, ``_total``: a count of 1e-300 would make any mean
    infinite), else :class:`PromValueError` naming the sample."""
    where = "sample %s" % _shown_sample(name, labels)
    try:
        number = figure(value, where, nonnegative=True)
    except UntrustedInput as e:
        raise PromValueError(str(e))
    if name.endswith(("_count", "_bucket", "_total")) and not number.is_integer():
        raise PromValueError("%s is %g: it counts, so it is a whole number" % (where, number))
    return number


def bucket_bound(name, labels):
    """The upper bound ``le`` of the histogram bucket ``name{labels}``: ``math.inf`` for ``+Inf``, else a finite
    figure within ``_untrusted.MAX_ABS_NUMBER`` (:class:`PromValueError` for ``NaN``, a word, a missing ``le``)."""
    le = labels.get("le")
    where = "sample %s: its bucket bound le" % _shown_sample(name, labels)
    if le is None:
        raise PromValueError("%s is missing" % where)
    try:
        bound = _parse_value(le)
    except ValueError:
        bound = None
    if bound == math.inf:
        return bound
    try:
        return figure(le if bound is None else bound, where)
    except UntrustedInput as e:
        raise PromValueError(str(e))


def _parse_value(text):
    t = text.strip()
    low = t.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(t)


def _parse_labels(s, pos, lineno):
    """Parse ``{a="x",b="y"}`` starting at ``s[pos] == '{'``; returns (labels, position after '}')."""
    labels = {}
    i = pos + 1
    n = len(s)
    while True:
        while i < n and s[i] in " ,":
            i += 1
        if i < n and s[i] == "}":
            return labels, i + 1
        m = _NAME_RE.match(s, i)
        if not m:
            raise PromParseError("line %d: bad label name at column %d: %s" % (lineno, i + 1, excerpt(s)))
        key = m.group(0)
        i = m.end()
        while i < n and s[i] == " ":
            i += 1
        if i >= n or s[i] != "=":
            raise PromParseError("line %d: expected '=' after label %s: %s" % (lineno, key, excerpt(s)))
        i += 1
        while i < n and s[i] == " ":
            i += 1
        if i >= n or s[i] != '"':
            raise PromParseError("line %d: label %s value must be quoted: %s" % (lineno, key, excerpt(s)))
        i += 1
        buf = []
        while i < n and s[i] != '"':
            if s[i] == "\\" and i + 1 < n:
                nxt = s[i + 1]
                buf.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
                continue
            buf.append(s[i])
            i += 1
        if i >= n:
            raise PromParseError("line %d: unterminated label value for %s: %s" % (lineno, key, excerpt(s)))
        labels[key] = "".join(buf)
        i += 1
        while i < n and s[i] == " ":
            i += 1
        if i >= n or s[i] not in ",}":
            raise PromParseError("line %d: expected ',' or '}' after label %s: %s" % (lineno, key, excerpt(s)))


def parse_text(text):
    """Parse Prometheus text exposition into ``(samples, types)``.

    ``samples`` is a list of ``(name, labels, value)``; ``types`` maps a metric family to its
    ``# TYPE``. Raises :class:`PromParseError` naming the line on malformed input.
    """
    samples = []
    types = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _NAME_RE.match(line)
        if not m:
            raise PromParseError("line %d: not a metric sample: %s" % (lineno, excerpt(raw)))
        name = m.group(0)
        i = m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, lineno)
        rest = line[i:].split()
        if not rest:
            raise PromParseError("line %d: sample %s has no value" % (lineno, name))
        try:
            value = _parse_value(rest[0])
        except ValueError:
            raise PromParseError("line %d: sample %s has a non-numeric value %s" % (lineno, name, excerpt(rest[0])))
        samples.append((name, labels, value))
    return samples, types


def _sum(samples, *names, **match):
    """Sum of every sample named one of ``names`` whose labels include ``match`` (counters and histogram sums or
    counts: each a :func:`counter_value`); None if absent."""
    total = None
    for name, labels, value in samples:
        if name in names and all(labels.get(k) == v for k, v in match.items()):
            total = (total or 0.0) + counter_value(name, labels, value)
    return total


def kv_sample(text):
    """The KV-transfer view of one engine's /metrics text.

    Sums over label sets (engines, DP ranks). Counters are accepted with and without the ``_total``
    suffix. Fields are None when the engine does not export the metric. A counter that is not a finite,
    non-negative figure is :class:`PromValueError` (the engine's figures are unknown); a SGLang transfer gauge that
    is not finite is left out.
    """
    samples, _types = parse_text(text)
    names = {s[0] for s in samples}
    out = {
        "engine": None,
        "bytes": _sum(samples, VLLM_BYTES + "_sum"),
        "transfers": _sum(samples, VLLM_BYTES + "_count"),
        "xfer_time_s": _sum(samples, VLLM_XFER_TIME + "_sum"),
        "xfer_count": _sum(samples, VLLM_XFER_TIME + "_count"),
        "failed_transfers": _sum(samples, VLLM_FAILED + "_total", VLLM_FAILED),
        "failed_notifications": _sum(samples, VLLM_FAILED_NOTIF + "_total", VLLM_FAILED_NOTIF),
        "kv_expired_reqs": _sum(samples, VLLM_EXPIRED + "_total", VLLM_EXPIRED),
        "prompt_tokens_by_source": None,
        "sglang_failed_reqs": _sum(samples, SGLANG_FAILED + "_total", SGLANG_FAILED),
        "sglang_bootstrap_failed_reqs": _sum(samples, SGLANG_BOOTSTRAP_FAILED + "_total", SGLANG_BOOTSTRAP_FAILED),
        "sglang_kv_transfer": {},
    }
    by_source = {}
    for name, labels, value in samples:
        if name in (VLLM_TOKENS_BY_SOURCE + "_total", VLLM_TOKENS_BY_SOURCE) and "source" in labels:
            by_source[labels["source"]] = by_source.get(labels["source"], 0.0) + counter_value(name, labels, value)
        elif name.startswith(SGLANG_KV_PREFIX) and not name.endswith("_bucket"):
            value = figure_or_none(value)
            if value is not None:
                out["sglang_kv_transfer"][name] = out["sglang_kv_transfer"].get(name, 0.0) + value
    if by_source:
        out["prompt_tokens_by_source"] = by_source
    if any(n.startswith("vllm:nixl_") for n in names):
        out["engine"] = "vllm"
    elif out["sglang_kv_transfer"] or out["sglang_failed_reqs"] is not None:
        out["engine"] = "sglang"
    elif any(n.startswith("vllm:") for n in names):
        out["engine"] = "vllm"
    elif any(n.startswith("sglang:") for n in names):
        out["engine"] = "sglang"
    return out


def _delta(before, after):
    """Counter increase with Prometheus ``increase()`` semantics: a drop means a restart."""
    if after is None:
        return None, False
    if before is None:
        return after, False
    if after < before:
        return after, True
    return after - before, False


def kv_delta(before, after):
    """What one load moved, from two :func:`kv_sample` results (``before`` may be None).

    Returns deltas of the counters, ``rate_bytes_per_s`` = bytes / sum(xfer_time) (the rank-aggregated
    NIXL rate, not a NIC line rate), the failure total, the prompt-token sources that grew and the
    list of counters that went down (engine restarted between the samples).
    """
    before = before or {}
    out = {"engine": after.get("engine") or before.get("engine"), "baseline": bool(before), "restarted": []}
    for field in COUNTER_FIELDS:
        d, reset = _delta(before.get(field), after.get(field))
        out[field] = d
        if reset:
            out["restarted"].append(field)
    b_src = before.get("prompt_tokens_by_source") or {}
    a_src = after.get("prompt_tokens_by_source")
    if a_src is None:
        out["prompt_tokens_by_source"] = None
    else:
        out["prompt_tokens_by_source"] = {}
        for src in sorted(a_src):
            d, reset = _delta(b_src.get(src), a_src[src])
            out["prompt_tokens_by_source"][src] = d
            if reset:
                out["restarted"].append("prompt_tokens_by_source:" + src)
    out["sglang_kv_transfer"] = dict(after.get("sglang_kv_transfer") or {})
    if out["bytes"] is not None and out["xfer_time_s"]:
        out["rate_bytes_per_s"] = figure_or_none(out["bytes"] / out["xfer_time_s"])  # None, never inf
    else:
        out["rate_bytes_per_s"] = None
    failed = [out[f] for f in ("failed_transfers", "sglang_failed_reqs", "sglang_bootstrap_failed_reqs")
              if out[f] is not None]
    out["failures"] = sum(failed) if failed else None
    return out


def is_url(value):
    return value.strip().lower().startswith(("http://", "https://"))


def fetch_text(url, opener=None, timeout=None):
    """GET ``url`` and return its body as text (``_http.get_text``; ``opener`` is injectable for tests), all of it
    within ``timeout`` seconds (:data:`FETCH_TIMEOUT`) and at most ``_http.MAX_METRICS_BYTES``.

    Raises ``_http.HttpError`` (its message never shows credentials or the query string of ``url``; ``timed_out``
    or ``too_large`` for an answer that trickles or does not end).
    """
    return _http.get_text(url, timeout=FETCH_TIMEOUT if timeout is None else timeout, opener=opener,
                          max_bytes=_http.MAX_METRICS_BYTES)


def load(value, opener=None):
    """Text of ``value``: fetched when it is a URL, else used as the exposition text itself."""
    return fetch_text(value.strip(), opener=opener) if is_url(value) else value
