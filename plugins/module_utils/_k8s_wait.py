# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: pure functions over Kubernetes API objects (plain dicts as the API returns them).

* :func:`route_status` - an HTTPRoute's parent conditions. Healthy means what the AIBrix gateway checks
  before routing: ``Accepted`` with reason ``Accepted`` and ``ResolvedRefs`` with reason ``ResolvedRefs``.
* :func:`pod_status` - where an engine pod is: unscheduled, starting, ready, or failed (restarted,
  crash loop, exited). A restart or an exit is judged from ``restartCount`` and ``lastState.terminated``
  (reason, exitCode, signal) and, when given, the log of that run, by ``_diagnose``'s exit classification
  (``classify_exit`` over ``analyse_log``): exit 0 / ``Completed`` is a masked crash, ``OOMKilled`` is the
  OOM killer, and the log's root exception is named. A container that restarted and is Ready again is still
  failed (beyond ``max_restarts``): the restart hid the crash, it did not fix it.
* :func:`evaluate` - one verdict for a rollout from the pods and the route, given the clock.
* :func:`cold_start_timeline` - a pod's timestamps and probe marks as ``_timeline.staged``: pod created ->
  scheduled -> container started -> port open -> /health 200 -> model listed -> first correct response;
  the SLO figure is the first to the last.

No I/O here; the polling module feeds these the objects it reads, and tests feed recorded ones.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils import _diagnose, _process, _timeline

# Why each Gateway API reason happens, and what fixes it (gateway-api apis/v1/shared_types.go).
ROUTE_REASONS = {
    "NotAllowedByListeners": "the Gateway's listeners do not admit routes from this namespace or of this kind; "
    "check the listener's allowedRoutes on the Gateway",
    "NoMatchingListenerHostname": "no listener hostname matches the route's hostnames",
    "NoMatchingParent": "the parentRef names no existing Gateway/listener (check gateway_name, namespace, sectionName)",
    "UnsupportedValue": "the route uses a value the gateway implementation does not support",
    "Pending": "the gateway controller has not processed the route yet",
    "BackendNotFound": "the backend Service does not exist; it must be created in the engine namespace under the "
    "DNS-safe name the route points at (AIBrix <= v0.7 would look for a Service named exactly the model, "
    "which is impossible for names with dots)",
    "RefNotPermitted": "the route references a Service in another namespace and no ReferenceGrant there allows "
    "HTTPRoutes from the gateway namespace to reach it",
    "InvalidKind": "the backendRef kind/group is not a Service",
    "UnsupportedProtocol": "the backend Service's port protocol is not supported by the gateway",
}

FATAL_WAITING = {
    "CrashLoopBackOff": "the engine keeps exiting",
    "CreateContainerConfigError": "the container spec references something missing (a Secret or ConfigMap key?)",
    "CreateContainerError": "the runtime could not create the container",
    "InvalidImageName": "the image reference is malformed",
}
PULL_WAITING = {"ErrImagePull", "ImagePullBackOff"}

# --------------------------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------------------------- #

parse_time = _timeline.parse_time


def condition(conditions, ctype):
    for cond in conditions or []:
        if cond.get("type") == ctype:
            return cond
    return None


def _name(obj):
    meta = obj.get("metadata", {})
    return "%s/%s" % (meta.get("namespace", ""), meta.get("name", ""))


# --------------------------------------------------------------------------------------------- #
# HTTPRoute
# --------------------------------------------------------------------------------------------- #


def route_status(route, gateway_name=None):
    """Summarise an HTTPRoute's ``status.parents``.

    Returns ``dict(state=ready|pending|failed, accepted, resolved_refs, reason, message, parents)``.
    ``failed`` means a condition is False with a known reason; the caller decides how long to let the
    controller converge before treating that as final.
    """
    if route is None:
        return dict(state="pending", accepted=None, resolved_refs=None, reason="NotFound",
                    message="the HTTPRoute does not exist (yet)", parents=[])
    generation = route.get("metadata", {}).get("generation")
    parents = route.get("status", {}).get("parents") or []
    if gateway_name:
        parents = [p for p in parents if (p.get("parentRef") or {}).get("name") == gateway_name] or parents
    if not parents:
        return dict(state="pending", accepted=None, resolved_refs=None, reason="NoStatus",
                    message="no gateway controller has reported on %s yet; check that its parentRef names an "
                    "existing Gateway and that the gateway controller runs" % _name(route), parents=[])
    summaries = []
    verdict = None
    for parent in parents:
        conds = parent.get("conditions") or []
        acc = condition(conds, "Accepted")
        res = condition(conds, "ResolvedRefs")
        gw = (parent.get("parentRef") or {}).get("name", "?")
        summary = dict(gateway=gw, controller=parent.get("controllerName"),
                       accepted=_cond_view(acc), resolved_refs=_cond_view(res))
        summaries.append(summary)
        stale = any(c.get("observedGeneration") is not None and generation is not None
                    and c["observedGeneration"] < generation for c in (acc, res) if c)
        for ctype, cond, good in (("Accepted", acc, "Accepted"), ("ResolvedRefs", res, "ResolvedRefs")):
            if cond is None or stale:
                verdict = verdict or ("pending", "Pending", "%s on %s: %s not reported for the current generation yet"
                                      % (_name(route), gw, ctype))
            elif cond.get("status") != "True" or cond.get("reason") != good:
                reason = cond.get("reason") or "Unknown"
                explain = ROUTE_REASONS.get(reason, "see the condition message")
                state = "pending" if cond.get("status") == "Unknown" or reason == "Pending" else "failed"
                msg = "%s on gateway %s: %s=%s reason %s: %s (%s)" % (
                    _name(route), gw, ctype, cond.get("status"), reason, cond.get("message", ""), explain)
                if verdict is None or verdict[0] != "failed":
                    verdict = (state, reason, msg)
    accepted = all(s["accepted"] and s["accepted"]["status"] == "True" for s in summaries)
    resolved = all(s["resolved_refs"] and s["resolved_refs"]["status"] == "True" for s in summaries)
    if verdict is None:
        return dict(state="ready", accepted=True, resolved_refs=True, reason="Accepted",
                    message="%s: Accepted and ResolvedRefs are True" % _name(route), parents=summaries)
    return dict(state=verdict[0], accepted=accepted, resolved_refs=resolved, reason=verdict[1],
                message=verdict[2], parents=summaries)


def _cond_view(cond):
    if not cond:
        return None
    return dict(status=cond.get("status"), reason=cond.get("reason"), message=cond.get("message"),
                last_transition=cond.get("lastTransitionTime"))


# --------------------------------------------------------------------------------------------- #
# Pods
# --------------------------------------------------------------------------------------------- #


def _container(pod, container):
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == container:
            return cs
    return statuses[0] if statuses else None


def _container_spec(pod, container):
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return c
    return {}


def ended_run(pod, container="engine"):
    """``(terminated, which)`` of the run to judge: the current state when the container has ended now
    (``which`` = ``current``), else ``lastState.terminated`` of a container that restarted (``previous``, the
    log ``kubectl logs --previous`` shows); ``(None, None)`` when the container never ended."""
    cs = _container(pod, container) or {}
    now = (cs.get("state") or {}).get("terminated")
    if now:
        return now, "current"
    last = (cs.get("lastState") or {}).get("terminated")
    if last and int(cs.get("restartCount") or 0) > 0:
        return last, "previous"
    return None, None


def pod_status(pod, container="engine", log=None, max_restarts=0):
    """Where one engine pod stands, with its timestamps (epoch seconds).

    ``log`` is the text of the run that ended (see :func:`ended_run`), when it could be read. A pod that
    restarted more than ``max_restarts`` times is ``failed`` even when it is Ready again.
    """
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    conds = status.get("conditions") or []
    sched = condition(conds, "PodScheduled")
    ready = condition(conds, "Ready")
    cs = _container(pod, container) or {}
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    out = dict(
        name=meta.get("name"),
        phase=status.get("phase"),
        node=pod.get("spec", {}).get("nodeName"),
        created=parse_time(meta.get("creationTimestamp")),
        scheduled=parse_time(sched.get("lastTransitionTime")) if sched and sched.get("status") == "True" else None,
        started=parse_time((state.get("running") or {}).get("startedAt")),
        ready=parse_time(ready.get("lastTransitionTime")) if ready and ready.get("status") == "True" else None,
        restarts=int(cs.get("restartCount") or 0),
        waiting_reason=(state.get("waiting") or {}).get("reason"),
        last_exit=None,
        diagnosis=None,
        unschedulable=None,
        deleting=bool(meta.get("deletionTimestamp")),
    )
    term = state.get("terminated") or last
    if term:
        out["last_exit"] = dict(exit_code=term.get("exitCode"), reason=term.get("reason"), signal=term.get("signal"),
                                finished=term.get("finishedAt"), message=term.get("message"))
    if sched and sched.get("status") == "False":
        out["unschedulable"] = "%s: %s" % (sched.get("reason", "Unschedulable"), sched.get("message", ""))

    if status.get("phase") in ("Succeeded", "Failed") or state.get("terminated"):
        _judge_exit(out, pod, container, "exited", log)
    elif out["restarts"] > max_restarts:
        _judge_exit(out, pod, container, "restarted %d time(s)%s" % (
            out["restarts"], " and is Ready again" if out["ready"] is not None else ""), log)
    elif out["ready"] is not None:
        out["state"], out["message"] = "ready", "%s is Ready" % out["name"]
    elif out["waiting_reason"] in FATAL_WAITING:
        out["state"] = "failed"
        out["message"] = "%s: container %s is %s: %s. %s" % (
            out["name"], container, out["waiting_reason"], (state.get("waiting") or {}).get("message", ""),
            FATAL_WAITING[out["waiting_reason"]])
    elif out["unschedulable"]:
        out["state"], out["message"] = "unscheduled", "%s is not scheduled: %s" % (out["name"], out["unschedulable"])
    elif out["waiting_reason"] in PULL_WAITING:
        out["state"] = "starting"
        out["message"] = "%s: %s: %s" % (out["name"], out["waiting_reason"], (state.get("waiting") or {}).get("message", ""))
    else:
        out["state"] = "starting"
        doing = "loading (started, not Ready)" if out["started"] else status.get("phase") or "pending"
        out["message"] = "%s: %s" % (out["name"], out["waiting_reason"] or doing)
    return out


def _judge_exit(out, pod, container, what, log):
    """``failed`` with the diagnosis of the run that ended: ``_diagnose.classify_exit`` over its status and log."""
    ex = out["last_exit"] or {}
    code, sig = ex.get("exit_code"), ex.get("signal")
    spec = _container_spec(pod, container)
    argv = list(spec.get("command") or []) + list(spec.get("args") or [])
    masking = _process.command_problems(argv, read_files=False) if argv else []
    where = "log (%s)" % ("kubectl logs --previous" if what.startswith("restarted") else "kubectl logs")
    restarts = " (restarted %d time%s)" % (out["restarts"], "" if out["restarts"] == 1 else "s") if out["restarts"] else ""
    f = _diagnose.classify_exit("container %s%s" % (container, restarts), "pod %s" % out["name"], code, sig,
                                _diagnose.analyse_log(log or ""), where, masking=masking,
                                oom=ex.get("reason") == "OOMKilled")
    if log is None:
        f["evidence"].append("the log of that run could not be read; read it with kubectl logs%s"
                             % (" --previous" if what.startswith("restarted") else ""))
    out["diagnosis"] = dict(code=f["code"], evidence=f["evidence"], hint=f["hint"])
    head = "%s: engine container %s; last exit code %s (reason %s%s%s)" % (
        out["name"], what, code, ex.get("reason"), ", signal %s" % sig if sig else "",
        ", finished %s" % ex.get("finished") if ex.get("finished") else "")
    out["state"] = "failed"
    out["message"] = "%s: %s: %s. Fix: %s" % (head, f["code"], "; ".join(f["evidence"]), f["hint"])


# --------------------------------------------------------------------------------------------- #
# Rollout verdict
# --------------------------------------------------------------------------------------------- #


def evaluate(pods, route=None, now=None, replicas=1, schedule_timeout=900, gateway_name=None, check_route=True,
             container="engine", logs=None, max_restarts=0):
    """One verdict: ``dict(state=ready|waiting|failed, message, pods, route)``.

    ``failed`` is final (an engine restarted more than ``max_restarts`` times or exited, a container can
    never be created, a pod stayed unschedulable longer than ``schedule_timeout`` seconds). ``logs`` maps a
    pod name to the log text of its run that ended (:func:`ended_run`). Route conditions that are False are
    left to the caller's route deadline, because a controller may still converge.
    """
    logs = logs or {}
    live = [pod_status(p, container, log=logs.get((p.get("metadata") or {}).get("name")), max_restarts=max_restarts)
            for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    rstate = route_status(route, gateway_name) if check_route else None
    failed = [p for p in live if p["state"] == "failed"]
    if failed:
        return dict(state="failed", message="; ".join(p["message"] for p in failed), pods=live, route=rstate)
    if now is not None:
        stuck = [p for p in live if p["state"] == "unscheduled" and p["created"] is not None
                 and now - p["created"] > schedule_timeout]
        if stuck:
            return dict(state="failed", pods=live, route=rstate,
                        message="; ".join("%s (for %ds, limit %ds)" % (p["message"], now - p["created"], schedule_timeout)
                                          for p in stuck))
    ready = [p for p in live if p["state"] == "ready"]
    waiting = []
    if len(ready) < replicas:
        others = [p["message"] for p in live if p["state"] != "ready"]
        waiting.append("%d/%d engine pod(s) Ready%s" % (len(ready), replicas, (": " + "; ".join(others)) if others else ""))
    if rstate is not None and rstate["state"] != "ready":
        waiting.append(rstate["message"])
    if waiting:
        return dict(state="waiting", message="; ".join(waiting), pods=live, route=rstate)
    return dict(state="ready", message="%d/%d pod(s) Ready%s" % (len(ready), replicas,
                "; " + rstate["message"] if rstate else ""), pods=live, route=rstate)


# --------------------------------------------------------------------------------------------- #
# Cold-start timeline
# --------------------------------------------------------------------------------------------- #


def pod_marks(summary):
    """Timeline marks of one :func:`pod_status` summary (``created``, ``scheduled``, ``started``, ``ready``)."""
    return dict(pod_created=summary.get("created"), scheduled=summary.get("scheduled"),
                container_started=summary.get("started"), pod_ready=summary.get("ready"))


def cold_start_timeline(pod=None, marks=None):
    """Merge a pod's own timestamps with probe marks into the cold-start timeline (``_timeline.staged``).

    ``marks`` maps ``port_open``, ``health_ok``, ``model_listed``, ``first_correct_response`` (and
    optionally any pod stage, e.g. ``pod_created`` for a local process start) to RFC 3339 or epoch
    times. Returns ``dict(stages=[{stage, label, at, t_s, step_s}], slo_seconds, missing)``; ``t_s``
    counts from pod creation, ``step_s`` from the previous recorded stage. ``slo_seconds`` is pod created
    -> first correct response (None while either is unknown).
    """
    merged = pod_marks(pod_status(pod)) if pod is not None else {}
    for key, value in (marks or {}).items():
        _timeline.check_stage(key)
        if value is not None or key not in merged:
            merged[key] = value
    return _timeline.staged(merged)


# --------------------------------------------------------------------------------------------- #
# Polling loop (I/O injected)
# --------------------------------------------------------------------------------------------- #


def read_logs(pods, read_log, container, names):
    """``{pod name: log text}`` of the ended run (:func:`ended_run`) of the pods named, through ``read_log``."""
    out = {}
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name")
        if name not in names:
            continue
        _term, which = ended_run(pod, container)
        text = read_log(name, container, which == "previous") if which else None
        if text is not None:
            out[name] = text
    return out


def wait_rollout(fetch, timeout, route_condition_timeout=300, schedule_timeout=900, poll_interval=10, replicas=1,
                 gateway_name=None, check_route=True, container="engine", clock=None, sleep=None, now=None,
                 read_log=None, max_restarts=0):
    """Poll ``fetch() -> (pods, route)`` until the rollout is ready, failed, or ``timeout`` seconds pass.

    When pods failed because their engine ended, ``read_log(pod_name, container, previous) -> text or None``
    (``previous``: the run before the restart) is asked once per such pod and the verdict is judged again with
    those logs, so the message names the exception the engine died of.

    A route condition that stays False for ``route_condition_timeout`` seconds fails the wait with its reason.
    Returns the last :func:`evaluate` verdict with ``elapsed`` and ``polls`` added; ``state`` is
    ``ready``, ``failed`` or ``timeout``.
    """
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    now = now or time.time
    start = clock()
    route_bad_since = None
    polls = 0
    while True:
        pods, route = fetch()
        polls += 1
        verdict = evaluate(pods, route, now=now(), replicas=replicas, schedule_timeout=schedule_timeout,
                           gateway_name=gateway_name, check_route=check_route, container=container,
                           max_restarts=max_restarts)
        if verdict["state"] == "failed" and read_log is not None:
            logs = read_logs(pods, read_log, container, [p["name"] for p in verdict["pods"] if p.get("diagnosis")])
            if logs:
                verdict = evaluate(pods, route, now=now(), replicas=replicas, schedule_timeout=schedule_timeout,
                                   gateway_name=gateway_name, check_route=check_route, container=container,
                                   logs=logs, max_restarts=max_restarts)
        elapsed = clock() - start
        verdict.update(elapsed=round(elapsed, 1), polls=polls)
        if verdict["state"] in ("ready", "failed"):
            return verdict
        rstate = verdict["route"]
        if rstate is not None and rstate["state"] == "failed":
            route_bad_since = elapsed if route_bad_since is None else route_bad_since
            if elapsed - route_bad_since >= route_condition_timeout:
                verdict.update(state="failed", message="route not usable for %ds: %s" % (route_condition_timeout,
                                                                                         rstate["message"]))
                return verdict
        else:
            route_bad_since = None
        if elapsed >= timeout:
            verdict.update(state="timeout", message="not ready after %ds: %s" % (timeout, verdict["message"]))
            return verdict
        sleep(min(poll_interval, max(0.0, timeout - elapsed)) or poll_interval)
