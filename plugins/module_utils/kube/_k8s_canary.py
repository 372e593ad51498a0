# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the canary's correct answer, proven to come from a pod of B.

Through AIBrix's gateway a request may reach A's pods as well as the canary's. The gateway names the pod that
answered only when a routing strategy picked it (vllm-project/aibrix v0.7.0 ``pkg/plugins/gateway/
gateway_rsp_headers.go``: ``target-pod`` = the pod's name from v0.6.0, ``target-pod-ip``, only when
``routerCtx.HasRouted()``; under ``pd`` also ``prefill-target-pod``, ``pkg/plugins/gateway/algorithms/
pd_disaggregation.go``). So each attempt is one answer check (:mod:`_probe`'s ``chat`` or ``completion``) sent
without the ``model`` header (a request matched by the per-model route skips the plugin and names no pod) and with
a ``routing-strategy`` (``random`` by default: ``algorithms/random.go`` picks uniformly among the model's Ready
pods). An answer counts when every pod it names is a canary pod (by name, from the pod listing); a wrong answer
from a canary pod fails at once; answers from other pods are tallied and the attempts are bounded.

* :func:`canary_pods` - the listed pods of the canary (its workloads' selectors), and the others of the model.
* :func:`routable` - the pods of a list the gateway can pick (labelled with the model).
* :func:`attempts_for` - how many uniform picks make missing every canary pod less likely than ``miss``.
* :func:`prove` - the attempts, their answers and the verdict.
"""
from __future__ import annotations

import math

#: The AIBrix pod label of the served model (pkg/constants/model.go ModelLabelName) and port (ModelLabelPort).
MODEL_LABEL = "model.aibrix.ai/name"
PORT_LABEL = "model.aibrix.ai/port"
ANSWER_TYPES = ("chat", "completion")
MAX_ATTEMPTS = 200


class CanaryError(Exception):
    """The canary's answer was not proven; ``reason`` is the result's ``reason``."""

    def __init__(self, msg, reason, answers=None):
        super(CanaryError, self).__init__(msg)
        self.reason = reason
        self.answers = answers or []


def _matches(pod, selector):
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def _ready(pod):
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((pod.get("status") or {}).get("conditions") or [])) \
        and not (pod.get("metadata") or {}).get("deletionTimestamp")


def _address(pod):
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    port = (meta.get("labels") or {}).get(PORT_LABEL)
    ip = status.get("podIP")
    return dict(name=meta.get("name"), ip=ip, url=("http://%s:%s" % (ip, port)) if ip and port else None)


def canary_pods(pods, selectors, model):
    """``(canary, others)``: the names of the listed pods that one of ``selectors`` (the canary's workloads) selects,
    and of the other pods labelled with ``model`` (A's, which the gateway may pick too)."""
    canary = sorted(p["metadata"]["name"] for p in pods or [] if any(_matches(p, s) for s in selectors or []))
    others = sorted(p["metadata"]["name"] for p in pods or [] if p["metadata"]["name"] not in canary
                    and ((p.get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL) == model)
    return canary, others


def routable(pods, names, model):
    """Of ``names``, the listed pods the gateway can pick for ``model`` (labelled ``model.aibrix.ai/name``): a P/D
    canary's front, not its prefill and decode pods, which carry no AIBrix label in the Deployments form."""
    return sorted(p["metadata"]["name"] for p in pods or [] if p["metadata"]["name"] in names
                  and ((p.get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL) == model)


def attempts_for(canary, routable, miss=0.001):
    """Uniform picks among ``routable`` pods, ``canary`` of them the canary's, for a chance below ``miss`` that none
    is a canary pod (at most :data:`MAX_ATTEMPTS`, at least 3)."""
    if canary <= 0 or routable <= 0:
        return 3
    p_other = 1.0 - float(min(canary, routable)) / routable
    if p_other <= 0:
        return 3
    return max(3, min(MAX_ATTEMPTS, int(math.ceil(math.log(miss) / math.log(p_other)))))


def answer_check(checks):
    """The first ``chat`` or ``completion`` check of ``checks``, sent through the gateway plugin (no ``model``
    header): the answer whose pod is named."""
    for c in checks or []:
        if isinstance(c, dict) and c.get("type") in ANSWER_TYPES:
            return dict(c, model_header=False, name=c.get("name") or "canary-answer")
    raise CanaryError("checks: no chat or completion check to prove the canary's answer with (types %s); add one, "
                      "e.g. {type: chat, prompt: ..., expect: ...}" % ", ".join(ANSWER_TYPES), "checks")


def _named(headers):
    return [v for v in (headers.get("target-pod"), headers.get("prefill-target-pod")) if v]


def tally(answers, canary):
    """``pod (B's canary|not B's) xN`` for each pod that answered, and the answers that named none."""
    counts = {}
    for a in answers:
        key = " + ".join("%s (%s)" % (n, "B's canary" if n in canary else "not B's") for n in a["pods"]) \
            or "no pod named"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join("%s x%d" % (k, v) for k, v in sorted(counts.items()))


def prove(run, base_url, model, checks, canary, others, headers=None, strategy="random", attempts=None, deadline=600,
          timeout=60.0):
    """Send the answer check until a pod of ``canary`` gave it correctly, each attempt by ``run`` (the engine
    probe's ``_probe.run``, which the module passes: kube imports no engine code); returns ``(pod, answers)``. Raises
    :class:`CanaryError`: ``canary_wrong`` (a canary pod answered wrongly), ``canary_not_reached`` (``attempts``
    answers, none from a canary pod), ``no_pod_named`` (the gateway named no pod: no routing strategy applied),
    ``no_canary_pod`` (the listing holds no pod of the canary), ``probe`` (no answer at all)."""
    check = answer_check(checks)
    if not canary:
        raise CanaryError("the pod listing holds no pod of the canary's workloads: nothing to pin the answer to",
                          "no_canary_pod")
    sent = dict((str(k), str(v)) for k, v in (headers or {}).items() if str(k).lower() != "routing-strategy")
    strategy = next((str(v) for k, v in (headers or {}).items() if str(k).lower() == "routing-strategy"), strategy)
    sent["routing-strategy"] = strategy
    attempts = int(attempts or attempts_for(len(canary), len(canary) + len(others)))
    answers = []
    for i in range(attempts):
        ok, results, _timeline, _warnings, msg = run(base_url, model, [check], headers=sent, deadline=deadline,
                                                     timeout=timeout, target="aibrix_gateway")
        res = (results or [{}])[-1]
        got = dict((str(k).lower(), str(v)) for k, v in (res.get("headers") or {}).items())
        pods = _named(got)
        answers.append(dict(attempt=i + 1, ok=bool(ok), pods=pods,
                            canary=bool(pods) and all(p in canary for p in pods), error=None if ok else msg))
        if not ok and pods and any(p in canary for p in pods):
            raise CanaryError("the canary's pod %s answered wrongly through %s: %s" % (" + ".join(pods), base_url, msg),
                              "canary_wrong", answers)
        if not ok and not pods:
            raise CanaryError("no answer through %s (routing-strategy %s): %s" % (base_url, strategy, msg), "probe", answers)
        if ok and not pods:
            raise CanaryError(
                "the gateway at %s named no pod for the answer (no target-pod): AIBrix v0.7.0 sets it only when a "
                "routing strategy picked the pod (gateway_rsp_headers.go); routing-strategy %s was sent, so the URL "
                "is not AIBrix's gateway or the request did not go through its plugin" % (base_url, strategy),
                "no_pod_named", answers)
        if ok and answers[-1]["canary"]:
            return pods[0], answers
    raise CanaryError(
        "no correct answer from a pod of B (the canary: %s) in %d attempts through %s with routing-strategy %s; the "
        "answers came from: %s. The gateway's pod cache may not list the canary yet, or the canary is not labelled "
        "%s=%s" % (", ".join(canary), attempts, base_url, strategy, tally(answers, canary), MODEL_LABEL, model),
        "canary_not_reached", answers)


def addresses(pods, names):
    """``{name: {name, ip, url}}`` of the listed pods among ``names`` (``url``: ``http://<podIP>:<model port>``)."""
    return dict((p["metadata"]["name"], _address(p)) for p in pods or [] if p["metadata"]["name"] in names)


def one_ready(pods, names):
    """The address of the first Ready pod among ``names`` (by name), or None."""
    for p in sorted(pods or [], key=lambda x: x["metadata"]["name"]):
        if p["metadata"]["name"] in names and _ready(p):
            return _address(p)
    return None
