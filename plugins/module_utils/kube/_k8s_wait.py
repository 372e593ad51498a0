# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the verdict on a rollout, and the wait for it (plain dicts as the API returns them).

* :func:`route_status` - an HTTPRoute's parent conditions. Healthy means what the AIBrix gateway checks
  before routing: ``Accepted`` with reason ``Accepted`` and ``ResolvedRefs`` with reason ``ResolvedRefs``.
* :func:`pod_status` - where an engine pod is: unscheduled, starting, ready, or failed. A failure is named by
  ``_diagnose_pods``'s rules over the pod, its Events and the log of the run that ended (:func:`ended_run`; one
  code for the wait and the diagnosis). A container that restarted and is Ready again is still failed (beyond
  ``max_restarts``): the restart hid the crash, it did not fix it. What never clears by waiting (a missing image,
  a mount that keeps failing, no feasible node, an eviction) fails at once.
* :func:`evaluate` - one verdict for a rollout from the objects (shaped by :mod:`_k8s_shape`), the route, the
  current revision and its proof (:mod:`_k8s_revision`), at an API server time; :func:`judge` one poll of it,
  :func:`wait_rollout` the polling loop (I/O injected), :func:`read_logs` the logs of the runs that ended. Every
  age is one API time minus another (:mod:`_k8s_clock`): the controller's wall clock never enters a verdict.
* :func:`cold_start_timeline` / :func:`pod_marks` - a pod's timestamps and probe marks as ``_timeline.staged``:
  pod created -> scheduled -> container started -> port open -> /health 200 -> model listed -> first correct
  response; the SLO figure is the first to the last.

No I/O here; the polling module feeds these the objects it reads, and tests feed recorded ones.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose
from ansible_collections.llmops.serving.plugins.module_utils.kube import _diagnose_pods, _k8s_clock, _k8s_revision, _k8s_shape

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
    route = _k8s_shape.shape(route, "HTTPRoute") if route is not None else None
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
        acc = _k8s_shape.condition(conds, "Accepted")
        res = _k8s_shape.condition(conds, "ResolvedRefs")
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


def ended_run(pod, container="engine"):
    """``(terminated, which)`` of the run to judge: the current state when the container has ended now
    (``which`` = ``current``), else ``lastState.terminated`` of a container that restarted (``previous``, the
    log ``kubectl logs --previous`` shows); ``(None, None)`` when the container never ended."""
    pod = _k8s_shape.shape(pod, "Pod") or {}
    cs = _container(pod, container) or {}
    now = (cs.get("state") or {}).get("terminated")
    if now:
        return now, "current"
    last = (cs.get("lastState") or {}).get("terminated")
    if last and _k8s_shape.integer(cs.get("restartCount")) > 0:
        return last, "previous"
    return None, None


def _context(pod, events, log, container, now):
    """A ``_diagnose_pods.KubeContext`` over one pod, the Events and the log of its ended run."""
    name = (pod.get("metadata") or {}).get("name") or ""
    _term, which = ended_run(pod, container)
    logs = {"%s/%s" % (name, container): {which or "current": log}} if isinstance(log, str) else {}
    return _diagnose_pods.KubeContext([pod] + list(events or []), logs,
                                      (pod.get("metadata") or {}).get("namespace") or "", None, None, None, now, None)


def pod_status(pod, container="engine", log=None, max_restarts=0, events=None, now=None):
    """Where one engine pod stands, with its timestamps (epoch seconds).

    ``log`` is the text of the run that ended (see :func:`ended_run`), when it could be read; ``events`` the
    namespace's Events (shaped or not). A pod that restarted more than ``max_restarts`` times is ``failed`` even
    when it is Ready again; what never clears by waiting (``_diagnose_pods.pod_blocked``) is ``failed`` at once.
    """
    pod = _k8s_shape.shape(pod, "Pod") or {"metadata": {}}
    events = [e for e in (_k8s_shape.shape(ev, "Event") for ev in events or []) if e is not None]
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    conds = status.get("conditions") or []
    sched = _k8s_shape.condition(conds, "PodScheduled")
    ready = _k8s_shape.condition(conds, "Ready")
    cs = _container(pod, container) or {}
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    out = dict(
        name=meta.get("name"),
        phase=status.get("phase"),
        node=pod.get("spec", {}).get("nodeName"),
        created=_k8s_shape.parse_time(meta.get("creationTimestamp")),
        scheduled=_k8s_shape.parse_time(sched.get("lastTransitionTime")) if sched and sched.get("status") == "True" else None,
        started=_k8s_shape.parse_time((state.get("running") or {}).get("startedAt")),
        ready=_k8s_shape.parse_time(ready.get("lastTransitionTime")) if ready and ready.get("status") == "True" else None,
        restarts=_k8s_shape.integer(cs.get("restartCount")),
        waiting_reason=(state.get("waiting") or {}).get("reason"),
        last_exit=None,
        diagnosis=None,
        unschedulable=None,
        deleting=bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
    )
    is_ready = bool(ready and ready.get("status") == "True")  # a Ready pod whose time was not recorded is Ready
    term = state.get("terminated") or last
    if term:
        out["last_exit"] = dict(exit_code=term.get("exitCode"), reason=term.get("reason"), signal=term.get("signal"),
                                finished=term.get("finishedAt"), message=term.get("message"))
    if sched and sched.get("status") == "False":
        out["unschedulable"] = "%s: %s" % (sched.get("reason", "Unschedulable"), sched.get("message", ""))
    ctx = _context(pod, events, log, container, now)
    if status.get("phase") in ("Succeeded", "Failed") or state.get("terminated"):
        _judge_exit(out, ctx, pod, container, "exited", log)
    elif out["restarts"] > max_restarts:
        _judge_exit(out, ctx, pod, container, "restarted %d time(s)%s" % (
            out["restarts"], " and is Ready again" if is_ready else ""), log)
    elif is_ready:
        out["state"], out["message"] = "ready", "%s is Ready" % out["name"]
    elif out["waiting_reason"] in FATAL_WAITING:
        out["state"] = "failed"
        out["message"] = "%s: container %s is %s: %s. %s" % (
            out["name"], container, out["waiting_reason"], (state.get("waiting") or {}).get("message", ""),
            FATAL_WAITING[out["waiting_reason"]])
    else:
        blocked = _diagnose_pods.pod_blocked(ctx, pod)
        if blocked is not None:
            out["diagnosis"] = dict(code=blocked["code"], evidence=blocked["evidence"], hint=blocked["hint"])
            out["state"] = "failed"
            out["message"] = "%s: %s: %s. Fix: %s" % (out["name"], blocked["code"], "; ".join(blocked["evidence"]),
                                                      blocked["hint"])
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


def _judge_exit(out, ctx, pod, container, what, log):
    """``failed`` with the diagnosis of the run that ended, by ``_diagnose``'s rules (the pod's eviction, else the
    engine container's status, its Events - a probe kill - and its log)."""
    ex = out["last_exit"] or {}
    code, sig = ex.get("exit_code"), ex.get("signal")
    pod_ref = "pod %s" % out["name"]
    f = _diagnose_pods.rule_evicted(ctx, pod, pod_ref)
    if f is None:
        cs = _container(pod, container)
        f = _diagnose_pods.rule_container(ctx, pod, pod_ref, cs) if cs else None
        if f is None or f["severity"] != "error":
            restarts = " (restarted %d time%s)" % (out["restarts"], "" if out["restarts"] == 1 else "s") \
                if out["restarts"] else ""
            f = _diagnose.classify_exit("container %s%s" % (container, restarts), pod_ref, code, sig,
                                        _diagnose.analyse_log(log or ""), "log", oom=ex.get("reason") == "OOMKilled")
        if log is None and ex:
            f["evidence"].append("the log of that run could not be read; read it with kubectl logs%s"
                                 % (" --previous" if what.startswith("restarted") else ""))
    out["diagnosis"] = dict(code=f["code"], evidence=f["evidence"], hint=f["hint"])
    head = "%s: engine container %s; last exit code %s (reason %s%s%s)" % (
        out["name"], what, code, ex.get("reason"), ", signal %s" % sig if sig else "",
        ", finished %s" % ex.get("finished") if ex.get("finished") else "")
    if f["code"] == "evicted":
        head = "%s: pod %s (phase %s)" % (out["name"], what, out["phase"])
    out["state"] = "failed"
    out["message"] = "%s: %s: %s. Fix: %s" % (head, f["code"], "; ".join(f["evidence"]), f["hint"])


# --------------------------------------------------------------------------------------------- #
# Rollout verdict
# --------------------------------------------------------------------------------------------- #


def evaluate(pods, route=None, now=None, replicas=1, schedule_timeout=900, gateway_name=None, check_route=True,
             container="engine", logs=None, max_restarts=0, workload=None, replicasets=None, events=None,
             models=None, served=None, endpointslices=None, service=None, controllers=None):
    """One verdict: ``dict(state=ready|waiting|failed, message, pods, route, rollout, revision, revision_proof)``.

    ``now`` is the API server's time the objects are judged at (:mod:`_k8s_clock`; None: the newest time they
    carry). ``failed`` is final (an engine restarted more than ``max_restarts`` times or exited, a container can
    never be created, what never clears by waiting, a pod stayed unschedulable longer than ``schedule_timeout``
    seconds, a Deployment past its progress deadline). ``logs`` maps a pod name to the log text of its run that
    ended (:func:`ended_run`). Route conditions that are False are left to the caller's route deadline, because
    a controller may still converge.

    With ``workload`` (its ``replicasets`` for a Deployment; ``controllers``: the StatefulSets of a LeaderWorkerSet, the
    RoleSets of a StormService) a controller that cannot create the pods for a minute fails the wait
    (:func:`_k8s_revision.create_failure`, quoting the refusal). Only pods of the current revision count, and the
    rollout must be done (:func:`rollout_status`): right after an update the old pod is Ready, and that is
    "waiting", not "ready". Then what is live must prove the answer comes from the current revision
    (:func:`revision_proof` over ``models``, ``served``, ``endpointslices`` of ``service``).
    """
    logs = logs or {}
    events = [e for e in (_k8s_shape.shape(ev, "Event") for ev in events or []) if e is not None]
    shaped = [x for x in (_k8s_shape.shape(p, "Pod") for p in pods or []) if x is not None]
    if now is None:
        now = _k8s_clock.read_time(shaped + events + [o for o in (route, workload) if o is not None])
    live = [p for p in shaped if not (p.get("metadata") or {}).get("deletionTimestamp")]
    route = _k8s_shape.shape(route, "HTTPRoute") if route is not None else None
    ro = revision = creating = None
    judged = live
    if workload is not None:
        workload = _k8s_shape.shape(workload) or _k8s_shape.shape(workload, "Deployment")
        rsets = [x for x in (_k8s_shape.shape(r, "ReplicaSet") for r in replicasets or []) if x is not None]
        owned = _k8s_revision.owned_controllers(
            workload, rsets + [x for x in (_k8s_shape.shape(c) for c in controllers or []) if x is not None])
        ro = _k8s_revision.rollout_status(workload, rsets, live, [o for o in owned if o.get("kind") == "RoleSet"])
        creating = _k8s_revision.create_failure(workload, owned, events, shaped, now)
        if ro["current_pods"] is not None:
            judged = [p for p in live if (p.get("metadata") or {}).get("name") in ro["current_pods"]]
        revision = dict(_k8s_revision.revision_facts(workload, container), kind=ro["kind"], name=ro["name"],
                        generation=ro["generation"], observed_generation=ro["observed_generation"],
                        revision=ro["revision"], pods=ro["current_pods"], proven=None, answered_roots=None,
                        pod_addresses=[dict(name=(p.get("metadata") or {}).get("name"),
                                            ip=(p.get("status") or {}).get("podIP")) for p in judged])
    statuses = [pod_status(p, container, log=logs.get((p.get("metadata") or {}).get("name")), max_restarts=max_restarts,
                           events=events, now=now) for p in judged]
    old = len(live) - len(judged)
    rstate = route_status(route, gateway_name) if check_route else None
    verdict = dict(pods=statuses, route=rstate, rollout=ro, revision=revision, revision_proof=None)
    failed = [p for p in statuses if p["state"] == "failed"]
    if failed:
        return dict(verdict, state="failed", message="; ".join(p["message"] for p in failed))
    if ro is not None and ro["state"] == "failed":
        return dict(verdict, state="failed", message=ro["message"])
    if creating is not None and creating["state"] == "failed":
        return dict(verdict, state="failed", message=creating["message"])
    stuck = [p for p in statuses if p["state"] == "unscheduled" and (_k8s_clock.age(now, p["created"]) or 0) > schedule_timeout]
    if stuck:
        return dict(verdict, state="failed", message="; ".join(
            "%s (for %ds, limit %ds)" % (p["message"], _k8s_clock.age(now, p["created"]), schedule_timeout) for p in stuck))
    ready = [p for p in statuses if p["state"] == "ready"]
    waiting = []
    if creating is not None:
        waiting.append(creating["message"])
    if ro is not None and ro["state"] != "done":
        waiting.append("rolling: %s%s" % (ro["message"], "; %d pod(s) of an old revision do not count" % old if old else ""))
    if len(ready) < replicas:
        others = [p["message"] for p in statuses if p["state"] != "ready"]
        waiting.append("%d/%d engine pod(s)%s Ready%s" % (len(ready), replicas, " of the current revision" if ro else "",
                                                          (": " + "; ".join(others)) if others else ""))
    if rstate is not None and rstate["state"] != "ready":
        waiting.append(rstate["message"])
    if not waiting and revision is not None:
        if revision["pods"] is None:
            revision["pods"] = [p["name"] for p in statuses]
        proof, why = _k8s_revision.revision_proof(dict(revision, ready_pods=[p["name"] for p in ready]), ro, shaped,
                                                  models=models, served=served, endpointslices=endpointslices, service=service)
        if models is not None:
            proven, roots = _k8s_revision.answered_by(models, revision["model_path"])
            # an answer that names no root (a gateway's own model list) has nothing to compare
            revision.update(proven=proven if roots or not isinstance(models, dict) else None, answered_roots=roots)
        verdict["revision_proof"] = proof
        if why:
            waiting.append(why)
    if waiting:
        return dict(verdict, state="waiting", message="; ".join(waiting))
    return dict(verdict, state="ready", message="%d/%d pod(s) Ready%s%s%s" % (
        len(ready), replicas, "; %s" % ro["message"] if ro else "", _k8s_revision.proof_text(verdict["revision_proof"]),
        "; " + rstate["message"] if rstate else ""))


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
        name = ((_k8s_shape.shape(pod, "Pod") or {}).get("metadata") or {}).get("name")
        if name not in names:
            continue
        _term, which = ended_run(pod, container)
        text = read_log(name, container, which == "previous") if which else None
        if isinstance(text, str):
            out[name] = text
    return out


def _read(fetch):
    """``fetch()`` answers ``(pods, route)`` or a dict with ``pods``, ``route``, ``workload``, ``replicasets``,
    ``controllers`` (StatefulSets, RoleSets), ``events``, ``endpointslices`` (None: not read), ``service``
    (``namespace/name``) and ``dates`` (the ``Date``
    headers of the API server's answers). ``read_at`` is the server's time of that read (:func:`_k8s_clock.read_time`)."""
    got = fetch()
    if isinstance(got, dict):
        seen = dict(pods=got.get("pods") or [], route=got.get("route"), workload=got.get("workload"),
                    replicasets=got.get("replicasets"), events=got.get("events"),
                    endpointslices=got.get("endpointslices"), service=got.get("service"),
                    controllers=got.get("controllers"))
        dates = got.get("dates") or ()
    else:
        pods, route = got
        seen = dict(pods=pods, route=route, workload=None, replicasets=None, events=None, endpointslices=None,
                    service=None, controllers=None)
        dates = ()
    objects = [o for o in [seen["route"], seen["workload"]] + list(seen["pods"] or []) + list(seen["replicasets"] or [])
               + list(seen["events"] or []) + list(seen["controllers"] or []) if o is not None]
    seen["read_at"] = _k8s_clock.read_time(objects, dates)
    return seen


def judge(fetch, server_clock=None, read_log=None, answer=None, served=None, **kw):
    """One poll: read, judge (:func:`evaluate`) at the API server's time of the read (``server_clock``, a
    :class:`_k8s_clock.ServerClock`, carries it across the polls of a wait; without one, a recorded read is judged
    at its own newest time); a failure is judged again with the logs of the runs that ended, and a rollout that is
    otherwise ready asks ``answer()`` (the ``/v1/models`` answer, or None) and ``served(revision)`` (the response
    headers of an answer through the gateway, or None) for its proof."""
    seen = _read(fetch)
    now = server_clock.at(seen["read_at"]) if server_clock is not None else seen["read_at"]
    slices = seen["endpointslices"]
    args = dict(kw, workload=seen["workload"], replicasets=seen["replicasets"], events=seen["events"],
                controllers=seen["controllers"],
                endpointslices=[x for x in (_k8s_shape.shape(e, "EndpointSlice") for e in slices) if x is not None]
                if isinstance(slices, list) else None, service=seen["service"])
    verdict = evaluate(seen["pods"], seen["route"], now=now, **args)
    if verdict["state"] == "failed" and read_log is not None:
        logs = read_logs(seen["pods"], read_log, kw.get("container", "engine"),
                         [p["name"] for p in verdict["pods"] if p.get("diagnosis")])
        if logs:
            verdict = evaluate(seen["pods"], seen["route"], now=now, logs=logs, **args)
    if verdict["state"] == "ready" and verdict.get("revision") is not None and (answer is not None or served is not None):
        models = answer() if answer is not None else None
        heard = served(verdict["revision"]) if served is not None else None
        verdict = evaluate(seen["pods"], seen["route"], now=now,
                           models=None if answer is None else (models if models is not None else False),
                           served=None if served is None else (heard if heard is not None else False), **args)
    return verdict


def wait_rollout(fetch, timeout, route_condition_timeout=300, schedule_timeout=900, poll_interval=10, replicas=1,
                 gateway_name=None, check_route=True, container="engine", clock=None, sleep=None,
                 read_log=None, max_restarts=0, answer=None, served=None):
    """Poll ``fetch()`` (see :func:`_read`) until the rollout is ready, failed, or ``timeout`` seconds pass.

    When pods failed because their engine ended, ``read_log(pod_name, container, previous) -> text or None``
    (``previous``: the run before the restart) is asked once per such pod and the verdict is judged again with
    those logs, so the message names the exception the engine died of. ``answer() -> /v1/models body or None``
    and ``served(revision) -> gateway response headers or None`` prove that the current revision answers
    (:func:`revision_proof`).

    ``clock`` (``time.monotonic``) measures the wait and carries the API server's time between reads
    (:class:`_k8s_clock.ServerClock`); this host's wall clock is never read.

    A route condition that stays False for ``route_condition_timeout`` seconds fails the wait with its reason.
    Returns the last :func:`evaluate` verdict with ``elapsed`` and ``polls`` added; ``state`` is
    ``ready``, ``failed`` or ``timeout``.
    """
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    server_clock = _k8s_clock.ServerClock(clock)
    start = clock()
    route_bad_since = None
    polls = 0
    while True:
        polls += 1
        verdict = judge(fetch, server_clock, read_log=read_log, answer=answer, served=served, replicas=replicas,
                        schedule_timeout=schedule_timeout, gateway_name=gateway_name, check_route=check_route,
                        container=container, max_restarts=max_restarts)
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
