# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a fixed greedy load through a P/D router, compared with a colocated
engine answering the same prompts.

HTTP goes through ``_http`` (``ansible.module_utils.urls.open_url``, injectable as ``opener`` for tests): each
answer whole within ``timeout`` seconds and at most ``_http.MAX_ANSWER_BYTES``; a message quotes an answer only
through ``_untrusted.excerpt``.
"""
from __future__ import annotations

import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import excerpt

ROUTE_HEADERS = ("target-pod", "target-pod-ip", "prefill-target-pod", "prefill-target-pod-ip")


class LoadError(Exception):
    """A request failed; the message names the URL and the answer."""


def complete(base_url, model, prompt, max_tokens, headers=None, timeout=120.0, opener=None):
    """One greedy completion: ``(text, route_headers, seconds)``."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    url = base_url.rstrip("/") + "/v1/completions"
    t0 = time.monotonic()
    try:
        resp = _http.request("POST", url, payload=body, headers=headers, timeout=timeout, opener=opener)
    except _http.HttpError as e:  # it carries the error answer's body: it says why (AIBrix 503, no backend...)
        raise LoadError(str(e))
    seconds = time.monotonic() - t0
    try:
        text = resp.json()["choices"][0]["text"]
    except (_http.HttpError, KeyError, IndexError, TypeError):
        raise LoadError("POST %s: unexpected answer %s" % (_http.shown_url(url), excerpt(resp.body, 300)))
    route = dict((h, resp.headers[h]) for h in ROUTE_HEADERS if resp.headers.get(h))
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
