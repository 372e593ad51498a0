# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a fixed greedy load through a P/D router, compared with a colocated
engine answering the same prompts.

HTTP goes through ``ansible.module_utils.urls.open_url`` (injectable as ``opener`` for tests).
"""
from __future__ import annotations

import json
import sys
import time

ROUTE_HEADERS = ("target-pod", "target-pod-ip", "prefill-target-pod", "prefill-target-pod-ip")


class LoadError(Exception):
    """A request failed; the message names the URL and the answer."""


def _opener():
    from ansible.module_utils.urls import open_url
    return open_url


def complete(base_url, model, prompt, max_tokens, headers=None, timeout=120.0, opener=None):
    """One greedy completion: ``(text, route_headers, seconds)``."""
    opener = opener or _opener()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    hdrs = {"Content-Type": "application/json"}
    hdrs.update(headers or {})
    url = base_url.rstrip("/") + "/v1/completions"
    t0 = time.monotonic()
    try:
        resp = opener(url, method="POST", data=json.dumps(body), headers=hdrs, timeout=timeout)
        raw = resp.read()
    except Exception as e:  # HTTPError carries the body: show it, it says why (AIBrix 503, no backend...)
        detail = ""
        read = getattr(e, "read", None)
        if read is not None:
            try:
                detail = ": " + read().decode("utf-8", "replace")[:300]
            except Exception:
                detail = ""
        raise LoadError("POST %s failed: %s%s" % (url, e, detail))
    seconds = time.monotonic() - t0
    try:
        answer = json.loads(raw)
        text = answer["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise LoadError("POST %s: unexpected answer %r" % (url, raw[:300]))
    info = getattr(resp, "headers", None) or {}
    route = {}
    for h in ROUTE_HEADERS:
        v = info.get(h) if hasattr(info, "get") else None
        if v:
            route[h] = v
    return text, route, seconds


def run(url, model, prompts, max_tokens=16, repeat=1, reference_url=None, headers=None, timeout=120.0,
        opener=None, progress=sys.stderr):
    """Send every prompt ``repeat`` times through ``url``; with ``reference_url`` compare each answer with
    that engine's answer to the same prompt (asked once per prompt)."""
    reference = {}
    if reference_url:
        for prompt in prompts:
            if prompt not in reference:
                reference[prompt] = complete(reference_url, model, prompt, max_tokens, headers, timeout, opener)[0]
    results = []
    total = len(prompts) * repeat
    t0 = time.monotonic()
    for r in range(repeat):
        for i, prompt in enumerate(prompts):
            text, route, seconds = complete(url, model, prompt, max_tokens, headers, timeout, opener)
            entry = {"prompt": prompt, "round": r, "text": text, "seconds": round(seconds, 3), "route": route}
            if reference_url:
                entry["reference"] = reference[prompt]
                entry["match"] = text == reference[prompt]
            results.append(entry)
            done = len(results)
            if progress is not None:
                elapsed = time.monotonic() - t0
                eta = elapsed / done * (total - done)
                progress.write("pd_load: %d/%d requests, %.2f req/s, ETA %.0fs\n"
                               % (done, total, done / elapsed if elapsed else 0.0, eta))
    elapsed = time.monotonic() - t0
    mismatches = [e for e in results if e.get("match") is False]
    lat = sorted(e["seconds"] for e in results)
    return {
        "requests": results,
        "completed": len(results),
        "elapsed_s": round(elapsed, 3),
        "request_rate": round(len(results) / elapsed, 3) if elapsed else None,
        "p50_s": lat[len(lat) // 2] if lat else None,
        "max_s": lat[-1] if lat else None,
        "compared": bool(reference_url),
        "all_match": (not mismatches) if reference_url else None,
        "mismatches": len(mismatches),
    }
