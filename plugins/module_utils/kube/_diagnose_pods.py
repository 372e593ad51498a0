# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: why one engine pod does not serve, from its objects, Events and logs.

:class:`KubeContext` holds what one engine left in the cluster (objects shaped once by ``_k8s_shape.shape_objects``,
normalised Events, current and previous container logs); the rules read it: scheduling
(:func:`rule_unschedulable`), volumes (:func:`rule_mount`), containers (:func:`rule_container`: image pulls,
config errors, OOM kills, probe kills, crashes, a start longer than its probe window), eviction and readiness.
:func:`pod_blocked` is the verdict ``k8s_engine_wait`` asks for while it waits.
"""
from __future__ import annotations

import re

from ansible_collections.llmops.serving.plugins.module_utils.engine import _process_command
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_clock, _k8s_shape
from ansible_collections.llmops.serving.plugins.module_utils.engine._diagnose import (
    PLAUSIBLE_START_SECONDS, analyse_log, classify_exit, clip, command_facts, exception_evidence, finding, fmt_s,
    kv_transfer_finding, progress_text,
)


def _time(value):
    return _k8s_shape.parse_time(value)


def container_argv(container):
    return list(container.get("command") or []) + list(container.get("args") or [])


# --------------------------------------------------------------------------------------------- #
# Kubernetes: the objects and logs one engine left
# --------------------------------------------------------------------------------------------- #

def obj_meta(obj):
    return obj.get("metadata") or {}


def obj_ns(obj):
    return obj_meta(obj).get("namespace") or ""


def obj_name(obj):
    return obj_meta(obj).get("name") or ""


def ref(obj):
    return "%s %s/%s" % (obj.get("kind", "?"), obj_ns(obj), obj_name(obj))


def selector_matches(selector, labels):
    """metav1.LabelSelector semantics (apimachinery pkg/apis/meta/v1/helpers.go LabelSelectorAsSelector)."""
    if selector is None:
        return False
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def map_selects(selector, labels):
    """A Service's plain ``selector`` map (an empty one selects nothing: core/v1 ServiceSpec)."""
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


class Objects(object):
    """The objects by kind, and which kinds were listed whole (so that an absent object means absent)."""

    def __init__(self, objects, listed_kinds=None):
        self.by_kind = {}
        for obj in objects or []:
            if isinstance(obj, dict) and obj.get("kind"):
                self.by_kind.setdefault(obj["kind"], []).append(obj)
            elif isinstance(obj, dict) and obj.get("items") is not None:  # a List as kubectl -o json writes it
                for item in obj.get("items") or []:
                    if isinstance(item, dict) and item.get("kind"):
                        self.by_kind.setdefault(item["kind"], []).append(item)
        self.listed = set(listed_kinds) if listed_kinds is not None else set(self.by_kind)

    def of(self, kind, namespace=None):
        return [o for o in self.by_kind.get(kind, []) if namespace is None or obj_ns(o) == namespace]

    def get(self, kind, namespace, name):
        for o in self.of(kind, namespace):
            if obj_name(o) == name:
                return o
        return None


class Logs(object):
    """``logs`` as given: ``{"POD/CONTAINER" or "POD": TEXT or {"current": TEXT, "previous": TEXT}}``."""

    def __init__(self, logs):
        self.data = {}
        for key, value in (logs or {}).items():
            if isinstance(value, dict):
                entry = {"current": value.get("current"), "previous": value.get("previous")}
            else:
                entry = {"current": value, "previous": None}
            self.data[str(key)] = entry

    def get(self, pod, container, which, only_container=False):
        entry = self.data.get("%s/%s" % (pod, container))
        if entry is None and only_container:
            entry = self.data.get(pod)
        return (entry or {}).get(which)


def normalise_event(ev):
    """core/v1 Event and events.k8s.io/v1 Event -> ``{kind, name, uid, field, reason, message, type, count, last}``."""
    inv = ev.get("involvedObject") or ev.get("regarding") or {}
    series = ev.get("series") or {}
    return {
        "kind": inv.get("kind"), "name": inv.get("name"), "namespace": inv.get("namespace") or obj_ns(ev),
        "uid": inv.get("uid"), "field": inv.get("fieldPath") or "",
        "reason": ev.get("reason") or "", "message": ev.get("message") or ev.get("note") or "",
        "type": ev.get("type") or "", "count": ev.get("count") or series.get("count") or ev.get("deprecatedCount") or 1,
        "last": _time(ev.get("lastTimestamp") or series.get("lastObservedTime") or ev.get("eventTime")
                      or ev.get("deprecatedLastTimestamp") or obj_meta(ev).get("creationTimestamp")),
        "first": ev.get("firstTimestamp") or ev.get("deprecatedFirstTimestamp") or ev.get("eventTime"),
    }


def event_text(ev):
    count = " (x%d)" % ev["count"] if ev["count"] and ev["count"] > 1 else ""
    return "Event %s%s: %s" % (ev["reason"], count, ev["message"])


def _probe_window(probe):
    """Seconds a probe allows before the kubelet acts: initialDelaySeconds + failureThreshold x periodSeconds.

    Defaults from k8s.io/api core/v1 types.go Probe: periodSeconds 10, failureThreshold 3, initialDelaySeconds 0.
    """
    if not probe:
        return None
    delay = int(probe.get("initialDelaySeconds") or 0)
    period = int(probe.get("periodSeconds") or 10)
    threshold = int(probe.get("failureThreshold") or 3)
    return {"seconds": delay + threshold * period, "text": "%d s = %d + %d x %d s" % (
        delay + threshold * period, delay, threshold, period)}


class KubeContext(object):

    def __init__(self, objects, logs, namespace, name, served_model_name, gateway_namespace, now, listed_kinds):
        self.o = Objects(_k8s_shape.shape_objects(objects), listed_kinds)
        self.logs = Logs(_k8s_shape.shape_logs(logs))
        self.namespace = namespace
        self.name = name
        self.served_model_name = served_model_name
        self.gateway_namespace = gateway_namespace or "aibrix-system"
        # the API server's time of the read (``_k8s_clock``); without one, the newest time the objects carry: an age
        # is one API time minus another, never this host's clock minus an API time
        self.now = now if now is not None else _k8s_clock.read_time(list(self.o.by_kind.values()))
        self.events = [normalise_event(e) for e in self.o.of("Event")]

    def events_for(self, kind, name, uid=None, container=None):
        out = []
        for ev in self.events:
            if ev["kind"] != kind or ev["name"] != name:
                continue
            if uid and ev["uid"] and ev["uid"] != uid:
                continue
            if container and ev["field"] and ev["field"] != "spec.containers{%s}" % container \
                    and ev["field"] != "spec.initContainers{%s}" % container:
                continue
            out.append(ev)
        return sorted(out, key=lambda e: e["last"] or 0)


# ---- pods -------------------------------------------------------------------------------------

# pkg/scheduler/framework/plugins/noderesources/fit.go: "Insufficient <resource>" per node in the message
# "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, ..."
_INSUFFICIENT = re.compile(r"(?:(?P<count>\d+) )?Insufficient (?P<res>[A-Za-z0-9][A-Za-z0-9./_-]*[A-Za-z0-9])")
_AVAILABLE = re.compile(r"(?P<free>\d+)/(?P<total>\d+) nodes are available")
_ACCEL = re.compile(r"gpu|rdma|hca|infiniband|neuron|tpu|roce", re.I)


def rule_unschedulable(ctx, pod, pod_ref):
    """FailedScheduling events (reason written by pkg/scheduler/schedule_one.go) and PodScheduled=False/Unschedulable.

    ``unschedulable_gpus`` when the scheduler names an accelerator or RDMA resource as ``Insufficient``.
    """
    status = pod.get("status") or {}
    cond = _k8s_shape.condition(status.get("conditions"), "PodScheduled")
    if (pod.get("spec") or {}).get("nodeName") or (cond and cond.get("status") == "True"):
        return None
    msgs = []
    if cond and cond.get("status") == "False":
        msgs.append("PodScheduled=False reason %s: %s" % (cond.get("reason"), cond.get("message", "")))
    evs = [e for e in ctx.events_for("Pod", obj_name(pod), obj_meta(pod).get("uid")) if e["reason"] == "FailedScheduling"]
    if evs:
        msgs.append(event_text(evs[-1]))
    if not msgs:
        return None
    text = " ".join(msgs)
    requested = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for res, qty in (((c.get("resources") or {}).get("limits")) or {}).items():
            requested[res] = qty
    short = sorted({m.group("res") for m in _INSUFFICIENT.finditer(text)})
    accel = [r for r in short if _ACCEL.search(r) or (r in requested and "/" in r)]
    created = _time(obj_meta(pod).get("creationTimestamp"))
    waited = _k8s_clock.age(ctx.now, created)
    head = "not scheduled%s" % (" for %s" % fmt_s(waited) if waited is not None else "")
    latest = (evs[-1]["message"] if evs else cond.get("message", "")).split("preemption:")[0]
    nodes = _AVAILABLE.search(latest)
    of = " of %s" % nodes.group("total") if nodes else ""
    counts = ["Insufficient %s on %s%s node(s)" % (m.group("res"), m.group("count") or "?", of)
              for m in _INSUFFICIENT.finditer(latest)]
    if counts:
        head += ": " + ", ".join(counts)
    ev = [head] + msgs
    if accel:
        asks = ", ".join("%s %s" % (requested[r], r) for r in accel if r in requested)
        if asks:
            ev.append("the pod requests %s per replica" % asks)
        return finding("unschedulable_gpus", pod_ref, ev,
                       "No node has %s free for this pod. Free them (a terminating pod of the previous revision holds "
                       "them until it exits: the engine rolls with maxSurge 0, so that clears by itself; other workloads "
                       "on the GPU nodes do not), lower tp_size/replicas, or add nodes; "
                       "check `kubectl describe node` Allocated resources and that the device plugin advertises "
                       "the resource." % " and ".join(accel))
    hint = ("The scheduler's message names the reason per node: fix the nodeSelector/affinity, add the "
            "tolerations for the GPU nodes' taints, or bind the PersistentVolumeClaim.")
    if "node affinity/selector" in text:
        hint += (" The engine role pins its pods to the nodes that staged the revision (required node affinity on "
                 "the node's name, metadata.name, from each host's k8s_node_name): stage the revision on enough "
                 "nodes, and set k8s_node_name to the NAME column of `kubectl get nodes` where the inventory name "
                 "is not the node's name (its kubernetes.io/hostname label may differ from it).")
    return finding("unschedulable", pod_ref, ev, hint)


def _waiting_rule(ctx, pod, pod_ref, cs):
    """Containers that never started: image pulls, config references, volume mounts.

    Waiting reasons from pkg/kubelet/images/types.go (ErrImagePull, ImagePullBackOff, InvalidImageName) and
    pkg/kubelet/kuberuntime (CreateContainerConfigError, CreateContainerError); events Failed/BackOff "Back-off
    pulling image" (pkg/kubelet/images/image_manager.go) and FailedMount (pkg/kubelet/volumemanager).
    """
    waiting = (cs.get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason") or ""
    cname = cs.get("name")
    obj = "%s container %s" % (pod_ref, cname)
    evs = ctx.events_for("Pod", obj_name(pod), obj_meta(pod).get("uid"))
    if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
        pulls = [e for e in evs if e["reason"] in ("Failed", "BackOff", "InspectFailed")
                 and ("image" in e["message"].lower() or "pull" in e["message"].lower())]
        ev = ["container %s is waiting: %s: %s" % (cname, reason, waiting.get("message", ""))]
        ev += [event_text(e) for e in pulls[-3:]]
        return finding("image_pull", obj, ev,
                       "The node cannot pull the image: check the reference (tag or digest exists), the "
                       "imagePullSecret (registry credentials in the pod's namespace) and that the node reaches the "
                       "registry.")
    if reason in ("CreateContainerConfigError", "CreateContainerError", "RunContainerError"):
        ev = ["container %s is waiting: %s: %s" % (cname, reason, waiting.get("message", ""))]
        ev += [event_text(e) for e in evs if e["reason"] == "Failed"][-2:]
        return finding("container_config", obj, ev,
                       "The container spec references something missing (a Secret or ConfigMap key, e.g. the HF token "
                       "Secret) or the runtime refused it: create the referenced object in the pod's namespace.")
    return None


def rule_mount(ctx, pod, pod_ref):
    """FailedMount / FailedAttachVolume events while the pod's containers are still being created."""
    evs = [e for e in ctx.events_for("Pod", obj_name(pod), obj_meta(pod).get("uid"))
           if e["reason"] in ("FailedMount", "FailedAttachVolume", "FailedMapVolume")]
    if not evs:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if any((cs.get("state") or {}).get("running") or cs.get("restartCount") for cs in statuses):
        return None  # mounted in the end
    names = sorted(set(re.findall(r'volume "([^"]+)"', " ".join(e["message"] for e in evs)))
                   | set(x for m in re.findall(r"unmounted volumes=\[([^\]]*)\]", " ".join(e["message"] for e in evs))
                         for x in m.split()))
    return finding("mount_failed", pod_ref, ["the containers cannot start: volume %s does not mount"
                                             % ", ".join(names or ["?"])] + [event_text(e) for e in evs[-3:]],
                   "Fix the volume named in the event: a hostPath model volume (type Directory) exists only on the "
                   "nodes that staged the revision, so stage it on this node (llmops.serving.model_stage) or keep "
                   "the pod on the staged nodes; a PVC must exist and be Bound, with the shared filesystem's CSI "
                   "driver on the node; a Secret must exist in the pod's namespace.")


def _probe_kills(evs, cname):
    """kubelet Killing events for a probe: "Container <name> failed <startup|liveness> probe, will be restarted"
    (pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions)."""
    out = []
    for e in evs:
        m = re.search(r"Container (\S+) failed (startup|liveness) probe", e["message"])
        if e["reason"] == "Killing" and m and m.group(1) == cname:
            out.append((m.group(2), e))
    return out


def _unhealthy(evs, probe_type):
    """kubelet Unhealthy events: "<Startup|Liveness|Readiness> probe failed: <output>" (pkg/kubelet/prober/prober.go)."""
    return [e for e in evs if e["reason"] == "Unhealthy" and e["message"].startswith("%s probe failed" % probe_type)]


def _served_before(pod, started_at, logf):
    """The engine served in this run of its container: its log says so, or the pod's Ready condition changed
    after the container started (it went Ready, then not)."""
    if logf.get("serving_line"):
        return True
    cond = _k8s_shape.condition((pod.get("status") or {}).get("conditions"), "Ready") or {}
    changed = _time(cond.get("lastTransitionTime"))
    return bool(changed and started_at and changed > started_at + 5)


def _container_spec(pod, cname):
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == cname:
            return c
    return {}


def rule_container(ctx, pod, pod_ref, cs, is_init=False):
    """One finding per container, the most specific one: waiting, terminated (now or last), probe, loading."""
    cname = cs.get("name")
    obj = "%s container %s" % (pod_ref, cname)
    spec = _container_spec(pod, cname)
    single = len((pod.get("spec") or {}).get("containers") or []) == 1
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated")
    term_now = state.get("terminated")
    restarts = int(cs.get("restartCount") or 0)
    evs = ctx.events_for("Pod", obj_name(pod), obj_meta(pod).get("uid"), container=cname)
    found = _waiting_rule(ctx, pod, pod_ref, cs)
    if found:
        return found
    term = term_now or (last if (restarts or (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff") else None)
    which = "current" if term_now else "previous"
    log_text = ctx.logs.get(obj_name(pod), cname, which, single)
    if log_text is None and not term_now:
        log_text = ctx.logs.get(obj_name(pod), cname, "current", single)
    logf = analyse_log(log_text or "")
    where = "log (%s)" % ("kubectl logs --previous" if which == "previous" else "kubectl logs")
    startup = _probe_window(spec.get("startupProbe"))
    liveness = _probe_window(spec.get("livenessProbe"))
    if term and is_init and term.get("exitCode") == 0:
        return None
    if term:
        ran = None
        if _time(term.get("finishedAt")) and _time(term.get("startedAt")):
            ran = _time(term["finishedAt"]) - _time(term["startedAt"])
        kills = _probe_kills(evs, cname)
        back = [e for e in evs if e["reason"] == "BackOff" and "restarting failed container" in e["message"]]
        what = "container %s%s" % (cname, " (restarted %d time%s)" % (restarts, "s" if restarts > 1 else "")
                                   if restarts else "")
        if term.get("reason") == "OOMKilled":
            return classify_exit(what, obj, term.get("exitCode"), term.get("signal"), logf, where, oom=True)
        # The liveness probe runs only after the startup probe succeeded (pkg/kubelet/prober/worker.go: liveness and
        # readiness results wait for "started"), so a liveness kill with a startupProbe is a kill of an engine that
        # had come up. vLLM then shuts down cleanly on the kubelet's SIGTERM: exit 0 / Completed is that shutdown,
        # not a masked crash.
        if kills and kills[-1][0] == "liveness" and (logf.get("serving_line") or spec.get("startupProbe")):
            kev = kills[-1][1]
            fails = _unhealthy(evs, "Liveness")
            since = ("after it had served (%s)" % logf["serving_line"] if logf.get("serving_line")
                     else "after its startup probe had passed")
            ev = ["container %s was killed by its liveness probe %s: the engine stopped answering /health" % (cname, since),
                  event_text(kev)] + [event_text(e) for e in fails[-1:]]
            if term.get("exitCode") == 0:
                ev.append("exit code 0 (%s) is the engine's clean shutdown on the kubelet's SIGTERM, not a masked crash"
                          % term.get("reason"))
            return finding("engine_hung", obj, ev + exception_evidence(logf, where),
                           "The engine stopped answering /health while serving: read the end of the previous log (a "
                           "stuck collective, a dead EngineCore, an overloaded event loop); the restart hides it until "
                           "it recurs.")
        if kills:
            probe_type, kev = kills[-1]
            window = startup if probe_type == "startup" else liveness
            prog = logf.get("progress")
            head = "container %s was killed by its %s probe%s" % (
                cname, probe_type, " after running %s" % fmt_s(ran) if ran is not None else "")
            if window:
                head += " (its window is %s)" % fmt_s(window["seconds"])
            if prog:
                head += (" while still loading: %s/%s shards" % (prog["n"], prog["total"]) if prog["n"] < prog["total"]
                         else " after loading all %s shards (still initialising)" % prog["total"])
            ev = [head]
            if window:
                ev.append("the %s probe allows %s (initialDelaySeconds + failureThreshold x periodSeconds)"
                          % (probe_type, window["text"]))
            ev.append(event_text(kev))
            fails = _unhealthy(evs, probe_type.capitalize())
            if fails:
                ev.append(event_text(fails[-1]))
            if prog:
                ev.append("when it was killed, the log (kubectl logs --previous) showed %s" % prog["line"])
                if prog.get("remaining_s") is not None and prog.get("elapsed_s") is not None and prog["n"] < prog["total"]:
                    ev.append("the weights alone need about %s (tqdm: %s elapsed + %s remaining); the window must also "
                              "cover all-rank sync, JIT, KV cache and CUDA graphs" % (
                                  fmt_s(prog["elapsed_s"] + prog["remaining_s"]), fmt_s(prog["elapsed_s"]),
                                  fmt_s(prog["remaining_s"])))
            ev += ["restarts: %d, last exit code %s (reason %s)" % (restarts, term.get("exitCode"), term.get("reason"))]
            if probe_type == "liveness" and not spec.get("startupProbe"):
                ev.append("there is no startupProbe, so the liveness probe runs during the cold start")
            return finding("startup_probe_killed", obj, ev,
                           "The probe window is shorter than the engine's cold start (weights, all-rank sync, JIT, KV "
                           "cache, CUDA graphs; the field report measured 17-28 min for a 700 GiB FP8 model): the "
                           "kubelet kills it just before it is ready, forever. Size the startupProbe for the measured "
                           "cold start (failureThreshold x periodSeconds >= it, e.g. engine_startup_timeout 3600) and "
                           "keep liveness/readiness short behind it.")
        masking = _process_command.command_problems(container_argv(spec), read_files=False) if spec else []
        cmd = command_facts(container_argv(spec)) if spec else {}
        f = classify_exit(what, obj, term.get("exitCode"), term.get("signal"), logf, where, masking=masking,
                          port=cmd.get("port"), engine=cmd.get("engine"))
        if back:
            f["evidence"].append(clip(event_text(back[-1])))
        if term.get("message"):
            f["evidence"].append(clip("termination message: %s" % term["message"]))
        return f
    running = state.get("running")
    if not running or is_init:
        return None
    started_at = _time(running.get("startedAt"))
    elapsed = _k8s_clock.age(ctx.now, started_at)
    if cs.get("ready"):
        # one finding per container: a failed transfer names the cause, the log's exception (a transfer_exception
        # logs its own) goes with it
        kv = kv_transfer_finding(obj, logf, where, also=exception_evidence(logf, where) if logf["tracebacks"] else ())
        if kv:
            return kv
        if logf["tracebacks"]:
            return finding("engine_traceback", obj,
                           ["container %s serves, but its log holds %d traceback(s)" % (cname, len(logf["tracebacks"]))]
                           + exception_evidence(logf, where),
                           "The engine answers its probes but some requests failed: read the exception; a crash of "
                           "this kind often recurs under load.")
        return None
    # ContainerStatus.started: true once the startup probe passed, at once when there is none (core/v1 types.go)
    if cs.get("started") is False or (cs.get("started") is None and spec.get("startupProbe")) or \
            (not spec.get("startupProbe") and not _served_before(pod, started_at, logf)):
        window = startup or liveness
        ev = ["container %s has been starting for %s%s" % (
            cname, fmt_s(elapsed), " of its %s %s window (%s)" % (
                fmt_s(window["seconds"]), "startup" if startup else "liveness", window["text"]) if window else "")]
        if not startup and liveness:
            ev.append("there is no startupProbe: the liveness probe runs during the cold start and kills a slow load")
        progress = progress_text(logf.get("progress"))
        if progress:
            ev.append(progress)
        if window and elapsed is not None and elapsed > window["seconds"]:
            fails = _unhealthy(evs, "Startup")
            return finding("startup_probe_killed", obj, ev + [event_text(e) for e in fails[-1:]],
                           "It has run past its startup window: the kubelet is killing it. Size the startupProbe for the "
                           "measured cold start (failureThreshold x periodSeconds).")
        if not window and elapsed is not None and elapsed > PLAUSIBLE_START_SECONDS:
            ev.append("no probe bounds its start, and no cold start takes longer than %s" % fmt_s(PLAUSIBLE_START_SECONDS))
            return finding("engine_hung", obj, ev + exception_evidence(logf, where),
                           "It is not loading any more: read the log's last lines (a stuck collective, a wait for a "
                           "peer that never joined), restart it, and give it a startupProbe sized for its cold start.")
        if window:
            return finding("still_loading", obj, ev, "Not an error: the engine is inside its startup window; wait.")
        return finding("still_loading", obj, ev, "Not an error yet: no probe bounds its start; a cold start takes up to "
                                                 "about 30 min (weights, JIT, CUDA graphs). Wait, and give it a "
                                                 "startupProbe so that a stuck start ends.")
    # started (the startup probe passed) but not Ready: readiness or liveness fail now
    fails = _unhealthy(evs, "Readiness") + _unhealthy(evs, "Liveness")
    ev = ["container %s started but is not Ready" % cname] + [event_text(e) for e in fails[-2:]]
    ev += exception_evidence(logf, where)
    return finding("engine_hung", obj, ev,
                   "The engine passed its startup probe and then stopped answering /health: read the log for a "
                   "stuck collective (NCCL timeout) or a dead EngineCore; a restart clears it, the log says why.")


def rule_evicted(ctx, pod, pod_ref):
    """A node-pressure eviction: the kubelet fails the pod with ``status.reason: Evicted`` and a message naming the
    resource (kubernetes/kubernetes pkg/kubelet/eviction/eviction_manager.go, helpers.go evictionMessage "The node
    was low on resource: ..."), a ``DisruptionTarget`` condition (reason ``TerminationByKubelet``) and an ``Evicted``
    Event; its container statuses may never have been recorded."""
    status = pod.get("status") or {}
    if status.get("reason") != "Evicted" or status.get("phase") not in ("Failed", None):
        return None
    node = (pod.get("spec") or {}).get("nodeName") or "?"
    ev = ["the kubelet evicted the pod from node %s: %s" % (node, status.get("message") or "no message recorded")]
    cond = _k8s_shape.condition(status.get("conditions"), "DisruptionTarget")
    if cond:
        ev.append("DisruptionTarget=%s reason %s: %s" % (cond.get("status"), cond.get("reason"), cond.get("message", "")))
    ev += [event_text(e) for e in ctx.events_for("Pod", obj_name(pod), obj_meta(pod).get("uid")) if e["reason"] == "Evicted"][-2:]
    return finding("evicted", pod_ref, ev,
                   "The node ran short of the resource named (memory, ephemeral storage, PIDs): the engine's pod used "
                   "more than the node could spare (host memory while loading, /dev/shm, logs and caches on the node's "
                   "disk). Give the pod requests equal to its use, free the node or move the caches to a volume; the "
                   "controller creates a replacement, delete the Failed pod once read.")


# The scheduler's preemption summary (pkg/scheduler/framework/preemption/preemption.go): "preemption: 0/N nodes
# are available: N Preemption is not helpful for scheduling." - no node fits even if every lower-priority pod
# left (UnschedulableAndUnresolvable on each node); "No preemption victims found" means room could free up.
_NO_FIT = re.compile(r"preemption: 0/(?P<total>\d+) nodes are available: (?P<n>\d+) Preemption is not helpful for "
                     r"scheduling")
# The kubelet retries a failed volume setup with exponential backoff up to 2m2s (kubernetes/kubernetes
# pkg/util/goroutinemap/exponentialbackoff); a failure still there after this long, seen twice, does not clear.
MOUNT_PERSIST_SECONDS = 90
NO_FIT_PERSIST_SECONDS = 60
# A pull of a tag or digest the registry does not have (containerd "failed to resolve reference ...: not found",
# docker "manifest unknown"): retrying never finds it.
_IMAGE_NOT_FOUND = re.compile(r"not found|NotFound|manifest unknown|repository does not exist", re.I)


def pod_blocked(ctx, pod):
    """A finding for what never clears by waiting, or None: an eviction, a container config error, an image that
    does not exist, a volume that keeps failing to mount (``MOUNT_PERSIST_SECONDS``), no feasible node even with
    preemption (for ``NO_FIT_PERSIST_SECONDS``, and no cluster-autoscaler scale-up under way)."""
    pod_ref = "pod %s/%s" % (obj_ns(pod), obj_name(pod))
    f = rule_evicted(ctx, pod, pod_ref)
    if f:
        return f
    evs = ctx.events_for("Pod", obj_name(pod), obj_meta(pod).get("uid"))
    f = rule_unschedulable(ctx, pod, pod_ref)
    if f:
        cond = _k8s_shape.condition((pod.get("status") or {}).get("conditions"), "PodScheduled") or {}
        sched = [e for e in evs if e["reason"] == "FailedScheduling"]
        text = sched[-1]["message"] if sched else cond.get("message") or ""
        m = _NO_FIT.search(text.strip())
        since = _time(cond.get("lastTransitionTime")) or _time(obj_meta(pod).get("creationTimestamp"))
        scaling = [e for e in evs if e["reason"] == "TriggeredScaleUp"]
        if m and m.group("n") == m.group("total") and not scaling \
                and (_k8s_clock.age(ctx.now, since) or 0) >= NO_FIT_PERSIST_SECONDS:
            f["evidence"].insert(1, "no node can ever take it: the scheduler reports for all %s nodes that preemption "
                                    "would not help" % m.group("total"))
            return f
        return None
    f = rule_mount(ctx, pod, pod_ref)
    if f:
        mounts = [e for e in evs if e["reason"] in ("FailedMount", "FailedAttachVolume", "FailedMapVolume")]
        firsts = [t for t in (_time(e.get("first")) or e["last"] for e in mounts) if t is not None]
        failing = _k8s_clock.age(ctx.now, min(firsts)) if firsts else None
        if sum(e["count"] for e in mounts) >= 2 and (failing or 0) >= MOUNT_PERSIST_SECONDS:
            f["evidence"].insert(1, "the mount has failed for %s" % fmt_s(failing))
            return f
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        f = _waiting_rule(ctx, pod, pod_ref, cs)
        if f is None:
            continue
        if f["code"] == "container_config":
            return f
        waiting = (cs.get("state") or {}).get("waiting") or {}
        texts = [waiting.get("message") or ""] + [e["message"] for e in evs if e["reason"] in ("Failed", "BackOff")]
        if f["code"] == "image_pull" and (waiting.get("reason") == "InvalidImageName"
                                          or any(_IMAGE_NOT_FOUND.search(t) for t in texts)):
            f["evidence"].insert(1, "the registry does not have this image: pulling again cannot succeed")
            return f
    return None


def pod_ready(pod):
    return (_k8s_shape.condition((pod.get("status") or {}).get("conditions"), "Ready") or {}).get("status") == "True"


def rule_not_ready(ctx, pod):
    """A pod that is not Ready and that no other rule explained: never ``healthy``. The evidence says what its
    status holds (phase, the Ready condition, init containers still running, containers without a status)."""
    pod_ref = "pod %s/%s" % (obj_ns(pod), obj_name(pod))
    status = pod.get("status") or {}
    ev = ["the pod is not Ready (phase %s)" % (status.get("phase") or "not recorded")]
    ready = _k8s_shape.condition(status.get("conditions"), "Ready")
    if ready:
        ev.append("Ready=%s reason %s: %s" % (ready.get("status"), ready.get("reason"), ready.get("message", "")))
    else:
        ev.append("its status records no Ready condition")
    for cs in status.get("initContainerStatuses") or []:
        st = cs.get("state") or {}
        if not (st.get("terminated") or {}).get("exitCode") == 0:
            what = "running" if st.get("running") else (st.get("waiting") or {}).get("reason") or "not finished"
            ev.append("init container %s is %s: the engine container starts after it" % (cs.get("name"), what))
    named = set(cs.get("name") for cs in status.get("containerStatuses") or [])
    missing = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") not in named]
    if missing or not status.get("containerStatuses"):
        ev.append("no status recorded for container(s) %s" % ", ".join(map(str, missing or ["(any)"])))
    if status.get("reason") or status.get("message"):
        ev.append("status reason %s: %s" % (status.get("reason"), status.get("message") or ""))
    return finding("not_ready", pod_ref, ev, "Not serving yet: read `kubectl describe pod` and its events; wait while "
                                             "init containers run, or diagnose again once the containers report.")


def pod_findings(ctx, pod):
    pod_ref = "pod %s/%s" % (obj_ns(pod), obj_name(pod))
    out = []
    f = rule_evicted(ctx, pod, pod_ref)
    if f:
        return [f]
    f = rule_unschedulable(ctx, pod, pod_ref)
    if f:
        return [f]
    f = rule_mount(ctx, pod, pod_ref)
    if f:
        return [f]
    status = pod.get("status") or {}
    for cs in status.get("initContainerStatuses") or []:
        f = rule_container(ctx, pod, pod_ref, cs, is_init=True)
        if f:
            out.append(f)
    for cs in status.get("containerStatuses") or []:
        f = rule_container(ctx, pod, pod_ref, cs)
        if f:
            out.append(f)
    return out
