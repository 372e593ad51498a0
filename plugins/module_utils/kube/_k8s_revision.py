# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: which revision of an engine workload is current, and proof that it answers.

* :func:`rollout_status` - whether the workload's CURRENT revision is rolled out (Deployment generation,
  ``observedGeneration``, ``updatedReplicas``, ``availableReplicas``, old replicas; LeaderWorkerSet and
  StormService status the same way) and which pods belong to that revision (``pod-template-hash`` of the
  current ReplicaSet, :func:`current_replicaset`; pods of an old ReplicaSet do not count).
* :func:`create_failure` - the workload's controllers cannot create its pods (``ReplicaFailure``, ``FailedCreate``
  Events on the workload and :func:`owned_controllers`) for a minute: final, quoting the API server's refusal.
* :func:`revision_facts` - what the current template serves: image, model path, served names.
* :func:`revision_proof` - that the answer comes from the current revision, from what is live: the ``root`` a
  ``/v1/models`` answer lists (:func:`answered_by`), else the pod AIBrix's gateway names in
  ``target-pod``/``target-pod-ip``, else the ready endpoints of the Service the route points at
  (:func:`ready_endpoints`: no old pod left that could answer); :func:`proof_text` says what held.

Pure functions over shaped objects (:mod:`_k8s_shape`); no I/O here.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_clock, _k8s_shape

# --------------------------------------------------------------------------------------------- #
# Rollout: which revision is current, and is it rolled out
# --------------------------------------------------------------------------------------------- #

#: kubernetes/kubernetes pkg/apis/apps types.go DefaultDeploymentUniqueLabelKey: the controller labels the pods of
#: each ReplicaSet with the hash of its template (pkg/controller/deployment/sync.go getNewReplicaSet).
HASH_LABEL = "pod-template-hash"
#: pkg/controller/deployment/util/deployment_util.go RevisionAnnotation, on the Deployment and each ReplicaSet.
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
#: kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go RevisionKey (every pod of a group).
LWS_REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
#: vllm-project/aibrix v0.7.0 pkg/controller/constants/stormservice.go StormServiceRevisionLabelKey: on a RoleSet
#: (stormservice/rolesetoperations.go renderRoleSet), never on its pods (roleset/utils.go renderStormServicePod).
STORM_REVISION_LABEL = "storm-service-revision"
#: the same file's RoleSetNameLabelKey (on every pod of a RoleSet) and RoleRevisionLabelKey /
#: RoleRevisionAnnotationPrefix: a pod's role revision, and its RoleSet's current one per role in
#: ``<prefix>.<role>`` (renderRoleSet writes it, renderStormServicePod copies it onto the pods it creates).
ROLESET_NAME_LABEL = "roleset-name"
ROLE_NAME_LABEL = "role-name"
ROLE_REVISION_KEY = "stormservice.orchestration.aibrix.ai/role-revision"


def _labels(obj):
    return (obj.get("metadata") or {}).get("labels") or {}


def _template_without_hash(template):
    t = dict(template or {})
    meta = dict(t.get("metadata") or {})
    meta["labels"] = dict((k, v) for k, v in (meta.get("labels") or {}).items() if k != HASH_LABEL)
    t["metadata"] = meta
    return t


def current_replicaset(deployment, replicasets):
    """The Deployment's new ReplicaSet: the oldest one it owns whose template equals the Deployment's ignoring
    ``pod-template-hash`` (pkg/controller/deployment/util/deployment_util.go FindNewReplicaSet, EqualIgnoreHash);
    else the one with the Deployment's revision annotation. None when it is not among ``replicasets``."""
    meta = deployment.get("metadata") or {}
    uid = meta.get("uid")
    owned = []
    for rs in replicasets or []:
        refs = (rs.get("metadata") or {}).get("ownerReferences") or []
        if uid and any(r.get("uid") == uid for r in refs) or not uid and any(
                r.get("kind") == "Deployment" and r.get("name") == meta.get("name") for r in refs):
            owned.append(rs)
    owned.sort(key=lambda rs: _k8s_shape.parse_time((rs.get("metadata") or {}).get("creationTimestamp")) or 0)
    want = _template_without_hash((deployment.get("spec") or {}).get("template"))
    for rs in owned:
        if _template_without_hash((rs.get("spec") or {}).get("template")) == want:
            return rs
    rev = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    for rs in owned:
        if rev and ((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION) == rev:
            return rs
    return None


def _engine_template(workload):
    spec = workload.get("spec") or {}
    kind = workload.get("kind")
    if kind == "Deployment":
        return spec.get("template") or {}
    if kind == "LeaderWorkerSet":
        return (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    roles = ((spec.get("template") or {}).get("spec") or {}).get("roles") or []
    return (roles[0].get("template") or {}) if roles else {}


def revision_facts(workload, container="engine"):
    """What the workload's current template serves: the engine image, the model path (the ``root`` the engine
    lists in ``/v1/models``) and the served names, read from the engine container's command."""
    spec = _engine_template(workload).get("spec") or {}
    containers = spec.get("containers") or []
    engine = next((c for c in containers if c.get("name") == container), containers[0] if containers else {})
    cmd = _diagnose.command_facts(list(engine.get("command") or []) + list(engine.get("args") or []))
    return dict(image=engine.get("image"), model_path=cmd.get("model"), served_names=cmd.get("served_names") or [])


def _storm_current_pods(update_revision, rolesets, pods):
    """The pods of a StormService's current revision: on a RoleSet labelled ``storm-service-revision`` =
    ``update_revision``, and of the role revision that RoleSet names for their role (an in-place update relabels the
    RoleSet before its pods are replaced). None when no RoleSet was read (then every pod counts)."""
    if not rolesets:
        return None
    current = {}
    for rs in rolesets:
        if _labels(rs).get(STORM_REVISION_LABEL) == update_revision:
            current[(rs.get("metadata") or {}).get("name")] = (rs.get("metadata") or {}).get("annotations") or {}
    out = []
    for p in pods:
        labels = _labels(p)
        annotations = current.get(labels.get(ROLESET_NAME_LABEL))
        if annotations is None:
            continue
        want = annotations.get("%s.%s" % (ROLE_REVISION_KEY, labels.get(ROLE_NAME_LABEL)))
        if want is None or labels.get(ROLE_REVISION_KEY) == want:
            out.append((p.get("metadata") or {}).get("name"))
    return out


def rollout_status(workload, replicasets=None, pods=None, rolesets=None):
    """Whether the workload's current revision is rolled out, and which pods are of it.

    Returns ``dict(kind, name, state=done|rolling|failed, message, generation, observed_generation, replicas,
    updated, ready, available, revision_label, revision, current_pods)``; ``current_pods`` is None when the
    current revision cannot be told apart (then every pod counts, and only a rolled-out status proves there are
    no old ones).

    * Deployment (kubectl pkg/polymorphichelpers/rollout_status.go DeploymentStatusViewer, the rule
      ``kubectl rollout status`` and kubernetes.core's waiter apply): the controller has observed the current
      generation; no ``Progressing`` condition with reason ``ProgressDeadlineExceeded``; ``updatedReplicas`` ==
      ``spec.replicas``; no old replicas (``status.replicas`` == ``updatedReplicas``); ``availableReplicas`` >=
      ``updatedReplicas``. Current pods carry the new ReplicaSet's ``pod-template-hash``.
    * LeaderWorkerSet (kubernetes-sigs/lws leaderworkerset_types.go): no ``UpdateInProgress``/``Progressing``
      condition True, ``Available`` True, ``updatedReplicas`` and ``readyReplicas`` == ``spec.replicas``;
      current pods carry the newest ``template-revision-hash`` while it rolls.
    * StormService (AIBrix v0.7.0 CRD status): ``observedGeneration`` >= generation, ``currentRevision`` ==
      ``updateRevision``, ``updatedReplicas`` and ``updatedReadyReplicas`` == ``spec.replicas``; current pods
      belong to a RoleSet (``rolesets``) labelled ``storm-service-revision`` = ``updateRevision`` and carry the role
      revision it names (:func:`_storm_current_pods`).
    """
    kind = workload.get("kind")
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    want = _k8s_shape.integer(spec.get("replicas"), 1)
    gen = _k8s_shape.integer(meta.get("generation"), None)
    observed = _k8s_shape.integer(status.get("observedGeneration"), None)
    out = dict(kind=kind, name=meta.get("name"), generation=gen, observed_generation=observed, replicas=want,
               updated=_k8s_shape.integer(status.get("updatedReplicas")), ready=_k8s_shape.integer(status.get("readyReplicas")),
               available=_k8s_shape.integer(status.get("availableReplicas")), revision_label=None, revision=None, current_pods=None)
    pods = pods or []
    label, value, unproven = None, None, False
    if kind == "Deployment":
        label = HASH_LABEL
        rs = current_replicaset(workload, replicasets)
        if rs is not None:
            value = ((rs.get("metadata") or {}).get("labels") or {}).get(HASH_LABEL)
    elif kind == "LeaderWorkerSet":
        label = LWS_REVISION_LABEL
        # the newest pod's hash: the controller recreates groups with the new template, never the old one
        hashes = [(_k8s_shape.parse_time((p.get("metadata") or {}).get("creationTimestamp")) or 0, _labels(p).get(label))
                  for p in pods if _labels(p).get(label)]
        value = max(hashes)[1] if hashes else None
    elif kind == "StormService":
        current = _storm_current_pods(status.get("updateRevision"), rolesets, pods)
        if current is not None and status.get("updateRevision"):
            out.update(revision_label=STORM_REVISION_LABEL, revision=status.get("updateRevision"), current_pods=current)
    if value:
        out.update(revision_label=label, revision=value,
                   current_pods=[(p.get("metadata") or {}).get("name") for p in pods if _labels(p).get(label) == value])
    name = "%s %s" % (kind, meta.get("name"))
    waiting = None
    if kind == "Deployment":
        progressing = _k8s_shape.condition(status.get("conditions"), "Progressing") or {}
        if gen is not None and (observed is None or observed < gen):
            waiting = "%s: waiting for the controller to observe generation %s (observedGeneration %s)" % (name, gen, observed)
        elif progressing.get("reason") == "ProgressDeadlineExceeded":
            out.update(state="failed", message="%s exceeded its progress deadline (progressDeadlineSeconds %s): %s" % (
                name, spec.get("progressDeadlineSeconds", 600), progressing.get("message", "")))
            return out
        elif out["updated"] < want:
            waiting = "%s: %d of %d new replicas have been updated" % (name, out["updated"], want)
        elif _k8s_shape.integer(status.get("replicas")) > out["updated"]:
            waiting = "%s: %d old replica(s) pending termination" % (name, _k8s_shape.integer(status.get("replicas")) - out["updated"])
        elif out["available"] < out["updated"]:
            waiting = "%s: %d of %d updated replicas are available" % (name, out["available"], out["updated"])
    elif kind == "LeaderWorkerSet":
        conds = status.get("conditions")
        stale = [c for c in conds or [] if gen is not None and _k8s_shape.integer(c.get("observedGeneration"), gen) < gen]
        busy = [c["type"] for c in conds or [] if c.get("type") in ("UpdateInProgress", "Progressing")
                and c.get("status") == "True"]
        # kubernetes-sigs/lws added status.observedGeneration and the conditions' observedGeneration in #807, first
        # released in v0.9.0 (api/leaderworkerset/v1/leaderworkerset_types.go; v0.8.0's makeCondition sets neither).
        # Without them nothing tells whether the controller has seen this generation: right after a re-apply the old
        # group is Ready and its status says Available. A first generation has no older revision to confuse.
        unproven = observed is None and conds and gen is not None and gen > 1 and not any(
            c.get("observedGeneration") is not None for c in conds)
        if gen is not None and observed is not None and observed < gen:
            waiting = "%s: waiting for the controller to observe generation %s (observedGeneration %s)" % (name, gen, observed)
        elif stale:
            waiting = "%s: its conditions are of generation %s, not %s yet" % (name, stale[0].get("observedGeneration"), gen)
        elif busy:
            waiting = "%s: %s (%d of %d groups updated, %d ready)" % (name, " and ".join(busy), out["updated"], want,
                                                                      out["ready"])
        elif out["updated"] < want or out["ready"] < want:
            waiting = "%s: %d of %d groups updated, %d ready" % (name, out["updated"], want, out["ready"])
        elif (_k8s_shape.condition(conds, "Available") or {}).get("status") != "True":
            waiting = "%s: not Available yet" % name
    elif kind == "StormService":
        cur, upd = status.get("currentRevision"), status.get("updateRevision")
        upd_ready = _k8s_shape.integer(status.get("updatedReadyReplicas"), out["ready"])
        if gen is not None and (observed is None or observed < gen):
            waiting = "%s: waiting for the controller to observe generation %s (observedGeneration %s)" % (name, gen, observed)
        elif cur and upd and cur != upd:
            waiting = "%s: rolling from revision %s to %s (%d of %d updated)" % (name, cur, upd, out["updated"], want)
        elif out["updated"] < want or upd_ready < want:
            waiting = "%s: %d of %d replicas updated, %d of them ready" % (name, out["updated"], want, upd_ready)
    if kind == "LeaderWorkerSet" and unproven and not waiting:
        # a rollout it reports (UpdateInProgress) is evidence enough that it saw the change; a finished one is not
        out.update(state="failed", message=(
            "%s: generation %s cannot be told from the one before: its controller reports no "
            "status.observedGeneration (LeaderWorkerSet older than v0.9.0, kubernetes-sigs/lws#807), so a Ready "
            "group may still run the old template. Upgrade LeaderWorkerSet to v0.9.0 or later; until then check "
            "the pods' leaderworkerset.sigs.k8s.io/template-revision-hash by hand" % (name, gen)))
        return out
    if waiting:
        out.update(state="rolling", message=waiting)
    else:
        out.update(state="done", message="%s: revision %s rolled out" % (name, value or gen))
    return out


# --------------------------------------------------------------------------------------------- #
# A controller that cannot create the pods
# --------------------------------------------------------------------------------------------- #

#: How long a controller may fail to create pods before the wait fails: a quota freed by a pod that just ended or
#: a webhook that timed out once clears within seconds; PodSecurity, a quota held by other workloads or a webhook
#: that refuses the pod never do.
CREATE_FAILURE_PERSIST_SECONDS = 60
#: kubernetes pkg/controller/controller_utils.go FailedCreatePodReason; the StatefulSet controller's own
#: (pkg/controller/statefulset/stateful_pod_control.go recordPodEvent) has the same reason.
FAILED_CREATE = "FailedCreate"
#: the condition the controllers set while creating pods fails: apps/v1 ReplicaSetReplicaFailure (and the
#: Deployment's copy of it, DeploymentReplicaFailure), AIBrix v0.7.0 RoleSetReplicaFailure / StormServiceReplicaFailure
REPLICA_FAILURE = "ReplicaFailure"
#: kubernetes-sigs/lws api/leaderworkerset/v1 leaderworkerset_types.go SetNameLabelKey, on every StatefulSet of a set
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
#: vllm-project/aibrix v0.7.0 pkg/controller/constants/stormservice.go StormServiceNameLabelKey, on its RoleSets
STORM_NAME_LABEL = "storm-service-name"


def owned_controllers(workload, objects):
    """The controllers of ``workload`` among shaped ``objects``: a Deployment's ReplicaSets (its ownerReference),
    a LeaderWorkerSet's StatefulSets (``leaderworkerset.sigs.k8s.io/name``: the worker StatefulSets are owned by
    the leader pod, not the set), a StormService's RoleSets (``storm-service-name``)."""
    kind = workload.get("kind")
    meta = workload.get("metadata") or {}
    out = []
    for obj in objects or []:
        k = obj.get("kind")
        if kind == "Deployment" and k == "ReplicaSet":
            refs = (obj.get("metadata") or {}).get("ownerReferences") or []
            if any(r.get("uid") == meta.get("uid") if meta.get("uid") else
                   (r.get("kind") == "Deployment" and r.get("name") == meta.get("name")) for r in refs):
                out.append(obj)
        elif kind == "LeaderWorkerSet" and k == "StatefulSet" and _labels(obj).get(LWS_NAME_LABEL) == meta.get("name"):
            out.append(obj)
        elif kind == "StormService" and k == "RoleSet" and _labels(obj).get(STORM_NAME_LABEL) == meta.get("name"):
            out.append(obj)
    return out


def _event_times(ev):
    first = ev.get("firstTimestamp") or ev.get("deprecatedFirstTimestamp") or ev.get("eventTime") \
        or (ev.get("metadata") or {}).get("creationTimestamp")
    last = ev.get("lastTimestamp") or (ev.get("series") or {}).get("lastObservedTime") or ev.get("deprecatedLastTimestamp") \
        or ev.get("eventTime") or first
    return _k8s_shape.parse_time(first), _k8s_shape.parse_time(last)


def create_failure(workload, owned=None, events=None, pods=None, now=None):
    """Why the controllers of ``workload`` cannot create its pods, when that has lasted
    :data:`CREATE_FAILURE_PERSIST_SECONDS` by the API server's clock (``now``, ``_k8s_clock``); None otherwise.

    Evidence, from the upstream controllers: a ``ReplicaFailure`` condition True on the workload or one of its
    controllers (``owned``: kubernetes pkg/controller/replicaset/replica_set_utils.go calculateStatus sets it with
    reason ``FailedCreate`` and the create error as message, from the first failure until a create succeeds;
    pkg/controller/deployment/progress.go syncRolloutStatus copies it onto the Deployment; AIBrix v0.7.0
    pkg/controller/roleset/sync.go calculateStatus on a RoleSet), else ``FailedCreate`` Events on them
    (pkg/controller/controller_utils.go CreatePods "Error creating: <error>"; the StatefulSet controller, which sets
    no condition, "create Pod <pod> in StatefulSet <set> failed error: <error>"), seen at least twice on a controller
    that still has fewer pods (``status.replicas``) than it wants (``spec.replicas``). While a pod of
    the workload terminates, a quota or a node it holds may free up: that is waiting, not failed.

    Returns ``dict(state=failed|waiting, since, message, evidence, hint)``.
    """
    mine = [workload] + list(owned or [])
    # Events outlive the failure (an hour by default): they count only on a controller still short of pods
    names = set(((o.get("kind"), (o.get("metadata") or {}).get("name")) for o in owned or []
                 if _k8s_shape.integer((o.get("status") or {}).get("replicas"))
                 < _k8s_shape.integer((o.get("spec") or {}).get("replicas"), 1)))
    found = []  # (since, who, what, message)
    for obj in mine:
        cond = _k8s_shape.condition((obj.get("status") or {}).get("conditions"), REPLICA_FAILURE)
        if cond and cond.get("status") == "True":
            found.append((_k8s_shape.parse_time(cond.get("lastTransitionTime")),
                          "%s %s" % (obj.get("kind"), (obj.get("metadata") or {}).get("name")),
                          "%s=True (%s)" % (REPLICA_FAILURE, cond.get("reason")), cond.get("message", "")))
    # the Events of one object, taken together: each refused create names the pod it tried (a new name each time)
    per_object = {}
    for ev in events or []:
        ref = ev.get("involvedObject") or ev.get("regarding") or {}
        if ev.get("reason") != FAILED_CREATE or (ref.get("kind"), ref.get("name")) not in names:
            continue
        count = _k8s_shape.integer(ev.get("count")) or _k8s_shape.integer((ev.get("series") or {}).get("count")) or 1
        first, last = _event_times(ev)
        key = "%s %s" % (ref.get("kind"), ref.get("name"))
        seen = per_object.setdefault(key, dict(count=0, first=None, last=None, message=""))
        seen["count"] += count
        if first is not None and (seen["first"] is None or first < seen["first"]):
            seen["first"] = first
        if seen["last"] is None or (last or 0) >= seen["last"]:
            seen["last"], seen["message"] = last or 0, ev.get("message") or ev.get("note") or ""
    with_condition = set(who for _t, who, _x, _m in found)
    for who, seen in sorted(per_object.items()):
        if who in with_condition:
            found = [(t, w, "%s, Events %s x%d" % (x, FAILED_CREATE, seen["count"]) if w == who else x, m)
                     for t, w, x, m in found]
        elif seen["count"] >= 2 or found:
            message = seen["message"]
            found.append((seen["first"], who, "Events %s x%d" % (FAILED_CREATE, seen["count"]),
                          message[len("Error creating: "):] if message.startswith("Error creating: ") else message))
    if not found:
        return None
    times = [t for t, _w, _x, _m in found if t is not None]
    since = min(times) if times else None
    lasted = _k8s_clock.age(now, since)
    by_message = []  # one line per distinct refusal: where it shows, then the refusal once
    for _t, who, what, message in found:
        entry = next((e for e in by_message if e[1] == message), None)
        if entry is None:
            by_message.append(([], message))
            entry = by_message[-1]
        entry[0].append("%s %s" % (who, what))
    evidence = ["%s: %s" % (", ".join(where), message) for where, message in by_message]
    hint = ("The controller cannot create the pods, and retrying does not change that: the namespace's Pod Security "
            "level refuses them (the engine pods use hostPath, IPC_LOCK and, with RDMA, hostNetwork: label the "
            "namespace pod-security.kubernetes.io/enforce=privileged, or on OpenShift grant an SCC), a ResourceQuota "
            "has no room for their GPUs or memory (kubectl describe quota), or an admission webhook denies them. "
            "Fix that; the controller creates them by itself.")
    head = "%s %s cannot create its pods" % (workload.get("kind"), (workload.get("metadata") or {}).get("name"))
    terminating = [(p.get("metadata") or {}).get("name") for p in pods or [] if (p.get("metadata") or {}).get("deletionTimestamp")]
    if terminating:
        return dict(state="waiting", since=since, evidence=evidence, hint=hint, message="%s while %d pod(s) terminate "
                    "(what they hold may free up): %s" % (head, len(terminating), "; ".join(evidence)))
    if lasted is None or lasted < CREATE_FAILURE_PERSIST_SECONDS:
        return dict(state="waiting", since=since, evidence=evidence, hint=hint, message="%s%s: %s" % (
            head, " for %d s" % lasted if lasted is not None else "", "; ".join(evidence)))
    return dict(state="failed", since=since, evidence=evidence, hint=hint, message="%s for %d s: %s. Fix: %s" % (
        head, lasted, "; ".join(evidence), hint))


# --------------------------------------------------------------------------------------------- #
# Proof that the current revision answers
# --------------------------------------------------------------------------------------------- #


def answered_by(models, model_path):
    """``(proven, roots)``: whether a ``/v1/models`` answer (vLLM and SGLang list the served model with
    ``root`` = the path it was loaded from) comes from an engine of ``model_path``; ``roots`` is what it lists
    (empty when the answer names none, as a gateway's own model list)."""
    data = models.get("data") if isinstance(models, dict) else None
    roots = [m.get("root") for m in data if isinstance(m, dict) and isinstance(m.get("root"), str)] \
        if isinstance(data, list) else []
    norm = (model_path or "").rstrip("/")
    return bool(norm) and any(r.rstrip("/") == norm for r in roots), roots


#: Response headers AIBrix v0.7.0's gateway plugin sets when a routing strategy picked a pod
#: (vllm-project/aibrix pkg/plugins/gateway/gateway_rsp_headers.go, ``routerCtx.HasRouted()``): the pod's name, and
#: ``RoutingContext.TargetAddress()`` = ``<podIP>:<port>`` (pkg/types/router_context.go).
TARGET_POD, TARGET_POD_IP = "target-pod", "target-pod-ip"
#: discovery.k8s.io/v1 ``LabelServiceName``: the label the EndpointSlice controller puts on every slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_FIX_OLD = ("Fix: wait for the rollout to finish (an old pod leaves the Service's endpoints and AIBrix's pod cache "
            "once it terminates); a pod that belongs to no current workload (a renamed or leftover Deployment, a pod "
            "started by hand) keeps answering until it is deleted or relabelled")


def _address(value):
    """The IP of an ``<ip>:<port>`` / ``[<ipv6>]:<port>`` / bare IP header value."""
    v = (value or "").strip()
    if v.startswith("["):
        return v[1:v.index("]")] if "]" in v else v[1:]
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


def ready_endpoints(endpointslices):
    """``[dict(pod, addresses)]`` of every endpoint a Service would send traffic to, over its EndpointSlices.

    k8s.io/api discovery/v1 types.go ``EndpointConditions.ready``: "A nil value indicates an unknown state. In most
    cases consumers should interpret this unknown state as ready"; the EndpointSlice controller sets it false for a
    pod that is not Ready or is terminating (kubernetes/kubernetes v1.33.0 staging/src/k8s.io/endpointslice/utils.go
    ``podToEndpoint``: ``ready = publishNotReadyAddresses || (serving && !terminating)``)."""
    out = []
    for sl in endpointslices or []:
        for ep in (sl.get("endpoints") or []):
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            ref = ep.get("targetRef") or {}
            out.append(dict(pod=ref.get("name") if ref.get("kind", "Pod") == "Pod" else None,
                            addresses=list(ep.get("addresses") or [])))
    return out


def _pod_revision(pod, label):
    return _labels(pod).get(label) if (pod is not None and label) else None


def _describe(name, ip, pod, label):
    where = "pod %s" % name if name else "address %s" % ip
    if name and ip:
        where += " (%s)" % ip
    if pod is None:
        return "%s, which is no pod the selector matches" % where
    rev = _pod_revision(pod, label)
    return "%s of revision %s" % (where, rev) if rev else "%s of an earlier revision" % where


def revision_proof(revision, rollout, pods, models=None, served=None, endpointslices=None, service=None):
    """``(proof, waiting)``: whether what is live proves the answer comes from the current revision.

    ``pods``: the shaped live pods the selector matches (every revision); ``revision["pods"]``: the current
    revision's. Tried in this order, the first the evidence allows:

    * ``root``: ``models`` (a ``/v1/models`` answer; False: none came) lists the current model path as ``root``
      (vLLM and SGLang report the path they loaded; a gateway's own list names none);
    * ``target-pod-ip`` / ``target-pod``: ``served`` (the response headers of an answer through AIBrix's gateway;
      False: none came) names the pod a routing strategy picked; it must be a Ready pod of the current revision;
    * ``endpoints``: ``endpointslices`` (the Service's EndpointSlices, ``service`` its ``namespace/name``) have a
      ready endpoint and every one is a pod of the current revision, so no old pod can still answer.

    ``proof`` is None when none could be read; ``waiting`` says what still answers and the fix, or is None.
    """
    label = (rollout or {}).get("revision_label")
    current = set(revision.get("pods") or [])
    ready = set(revision.get("ready_pods") or [])
    by_name = dict(((p.get("metadata") or {}).get("name"), p) for p in pods)
    by_ip = dict(((p.get("status") or {}).get("podIP"), p) for p in pods if (p.get("status") or {}).get("podIP"))
    if models is not None:
        proven, roots = answered_by(models, revision.get("model_path"))
        if not isinstance(models, dict):
            return None, "the serving URL gave no /v1/models answer yet"
        if roots:
            proof = dict(by="root", held=proven, model_path=revision.get("model_path"), answered_roots=roots)
            if not proven:
                return proof, ("rolling: the serving URL answers from %s, not from the current revision's %s (an old "
                               "engine still answers)" % (", ".join(roots), revision.get("model_path")))
            return proof, None
    heard = served if isinstance(served, dict) else {}
    named, ip = heard.get(TARGET_POD) or None, _address(heard.get(TARGET_POD_IP)) or None
    if named or ip:
        pod = by_name.get(named) if named else None
        pod = pod if pod is not None else by_ip.get(ip)
        name = (pod.get("metadata") or {}).get("name") if pod is not None else named
        pod_ip = (pod.get("status") or {}).get("podIP") if pod is not None else None
        held = pod is not None and name in ready and (ip is None or pod_ip is None or pod_ip == ip)
        proof = dict(by=TARGET_POD_IP if ip else TARGET_POD, held=held, pod=name, ip=ip,
                     revision=_pod_revision(pod, label), current_revision=revision.get("revision"))
        if held:
            return proof, None
        if pod is not None and name in current:
            why = "a pod of the current revision that is not Ready"
        else:
            why = _describe(name, ip, pod, label)
        return proof, ("rolling: the gateway's answer came from %s, not from a Ready pod of the current revision %s: "
                       "an old pod still answers. %s" % (why, revision.get("revision") or "", _FIX_OLD))
    if endpointslices is None:
        return None, None
    eps = ready_endpoints(endpointslices)
    current_ips = set((by_name[n].get("status") or {}).get("podIP") for n in current if n in by_name)
    outside = [e for e in eps if not (e["pod"] in current if e["pod"] else set(e["addresses"]) & current_ips)]
    view = [dict(pod=e["pod"], ip=(e["addresses"] or [None])[0],
                 revision=_pod_revision(by_name.get(e["pod"]), label)) for e in eps]
    proof = dict(by="endpoints", held=bool(eps) and not outside, service=service, ready_endpoints=view,
                 current_revision=revision.get("revision"))
    if not eps:
        return proof, "Service %s has no ready endpoint yet" % (service or "")
    if outside:
        who = "; ".join(_describe(e["pod"], (e["addresses"] or [None])[0], by_name.get(e["pod"]), label) for e in outside)
        return proof, ("rolling: Service %s still has %d ready endpoint(s) outside the current revision %s: %s; it can "
                       "still answer. %s" % (service or "", len(outside), revision.get("revision") or "", who, _FIX_OLD))
    return proof, None


def proof_text(proof):
    """What a :func:`revision_proof` that held proves, as a clause of the ready message (empty when none held)."""
    if not proof or not proof.get("held"):
        return ""
    if proof["by"] == "root":
        return "; the answer comes from %s" % proof["model_path"]
    if proof["by"] in (TARGET_POD, TARGET_POD_IP):
        return "; the gateway's answer came from %s, a pod of the current revision" % proof["pod"]
    return "; every ready endpoint of Service %s is a pod of the current revision" % proof["service"]
