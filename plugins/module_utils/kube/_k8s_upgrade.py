# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the plan of a Kubernetes revision upgrade from A (what serves) to B, with a canary,
waves sized by the spare GPUs, and a rollback that re-applies A's recorded objects.

* :func:`recorded` - A's object as it must be re-applied: without the fields the API server and the controllers set
  (``metadata.resourceVersion``, ``uid``, ``generation``, ``managedFields``, ``creationTimestamp``, ``status`` ...).
* :func:`node_room` - per node that staged B and takes pods, how many more pods of ``gpus`` GPUs fit beside what is
  allocated there (:func:`allocated_gpus` sums it from the pods as the API lists them).
* :func:`pd_generation` - the generation of a P/D pair: a hash of both roles' pod templates, replicas excluded, as
  Dynamo names its worker deployments (ai-dynamo/dynamo docs/pages/kubernetes/rolling-update.md, "Worker Hash and
  DCD Naming": a SHA-256 of all worker specs, replicas excluded; new workers get the new hash in their names so old
  and new never discover each other). :func:`generation_stack` gives B's pair its own names, labels, Services and
  front; :func:`front_reach` says which generations each front can send a request to.
* :func:`plan` - the steps (``apply``/``delete``/``wait``), the canary, the waves, the refusals (an outage of the only
  serving pod, a P/D front that could mix generations) and the rollback. Nothing here talks to the API.

Every step of a plan is whole objects to apply (``kubectl apply`` semantics) and objects to delete, then the pods to
wait for; a rollback is always: delete what B added, re-apply every recorded object of A.
"""
from __future__ import annotations

import copy
import hashlib
import json

#: metadata the API server or a controller writes (k8s.io/apimachinery pkg/apis/meta/v1 types.go ObjectMeta: "Populated
#: by the system. Read-only."); re-applying them makes the apply a conflict or a no-op on stale values.
SERVER_METADATA = ("resourceVersion", "uid", "generation", "creationTimestamp", "managedFields", "selfLink",
                   "deletionTimestamp", "deletionGracePeriodSeconds")
#: annotations written by kubectl (last-applied-configuration) and by the Deployment controller
#: (pkg/controller/deployment/util/deployment_util.go RevisionAnnotation and friends).
SERVER_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision",
                      "deployment.kubernetes.io/revision-history", "deployment.kubernetes.io/desired-replicas",
                      "deployment.kubernetes.io/max-replicas")
#: the canary's own pod label: its workload selects only its pods, the Service (which does not select on it) all.
CANARY_LABEL = "llmops.serving/upgrade"
#: the generation of a P/D pair, on every prefill, decode and front pod and in every selector between them.
GENERATION_LABEL = "llmops.serving/pd-generation"
ROLE_LABEL = "llmops.serving/pd-role"
MODEL_LABEL = "llmops.serving/pd-model"
NAME_LABEL = "app.kubernetes.io/name"
WORKLOADS = ("Deployment", "LeaderWorkerSet", "StormService")
#: kube/_aibrix_route.py SERVED_NAME_ANNOTATION: the served model name on every engine workload the collection renders.
SERVED_NAME_ANNOTATION = "llmops.serving/served-model-name"


class UpgradeError(ValueError):
    """A refusal before anything changes; ``reason`` is the result's ``reason``."""

    def __init__(self, msg, reason):
        super(UpgradeError, self).__init__(msg)
        self.reason = reason


def ref(obj):
    """``{kind, name, apiVersion}`` of an object (what ``kubernetes.core.k8s`` needs to delete it)."""
    return {"kind": obj["kind"], "name": obj["metadata"]["name"], "apiVersion": obj.get("apiVersion", "v1")}


def recorded(obj):
    """A live object as it must be re-applied to be A again (see :data:`SERVER_METADATA`)."""
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.get("metadata") or {}
    for key in SERVER_METADATA:
        meta.pop(key, None)
    ann = meta.get("annotations")
    if ann is not None:
        for key in SERVER_ANNOTATIONS:
            ann.pop(key, None)
        if not ann:
            meta.pop("annotations")
    return out


def _containers(template):
    spec = (template or {}).get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def pod_gpus(template, gpu_resource="nvidia.com/gpu"):
    """GPUs one pod of ``template`` takes (its containers' limits, else requests; pkg/api/v1/resource
    PodRequests: the sum of the app containers; extended resources have request = limit)."""
    total = 0
    for c in (((template or {}).get("spec") or {}).get("containers") or []):
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(gpu_resource, (res.get("requests") or {}).get(gpu_resource, 0))
        total += int(value or 0)
    return total


def allocated_gpus(pods, gpu_resource="nvidia.com/gpu"):
    """``{node: GPUs}`` taken by the pods bound there that are not terminal (Succeeded/Failed pods free theirs;
    a terminating pod holds its GPUs until it is gone)."""
    out = {}
    for p in pods or []:
        node = (p.get("spec") or {}).get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            out[node] = out.get(node, 0) + pod_gpus(p, gpu_resource)
    return out


def node_gpus(node, gpu_resource="nvidia.com/gpu"):
    """``(allocatable, schedulable)`` of a Node object, or of ``{name, allocatable, unschedulable}`` shorthand."""
    if "metadata" in node:
        alloc = ((node.get("status") or {}).get("allocatable") or {}).get(gpu_resource, 0)
        cordoned = bool((node.get("spec") or {}).get("unschedulable")) or any(
            t.get("key") == "node.kubernetes.io/unschedulable" for t in (node.get("spec") or {}).get("taints") or [])
        return int(alloc or 0), not cordoned
    return int(node.get("allocatable") or 0), not node.get("unschedulable", False)


def _node_name(node):
    return node["metadata"]["name"] if "metadata" in node else node["name"]


def node_room(nodes, staged, gpus, allocated=None, gpu_resource="nvidia.com/gpu"):
    """``{node: pods}``: how many more pods of ``gpus`` GPUs fit on each schedulable node that staged B."""
    allocated = allocated or {}
    room = {}
    for node in nodes or []:
        name = _node_name(node)
        alloc, schedulable = node_gpus(node, gpu_resource)
        used = allocated.get(name, node.get("allocated", 0) if "metadata" not in node else 0)
        if name in (staged or []) and schedulable and gpus > 0:
            free = max(0, alloc - int(used or 0)) // gpus
            if free:
                room[name] = free
    return room


def free_gpus(nodes, allocated=None, gpu_resource="nvidia.com/gpu"):
    """``{node: free GPUs}`` of the schedulable nodes."""
    out = {}
    for node in nodes or []:
        name = _node_name(node)
        alloc, schedulable = node_gpus(node, gpu_resource)
        used = (allocated or {}).get(name, node.get("allocated", 0) if "metadata" not in node else 0)
        if schedulable:
            out[name] = max(0, alloc - int(used or 0))
    return out


def pair_room(nodes, staged, gpus, allocated=None, gpu_resource="nvidia.com/gpu"):
    """How many more (prefill pod, decode pod) pairs fit on the nodes that staged each role's revision; a node
    that staged both counts its GPUs once (a prefill pod placed there takes them from a decode pod)."""
    free = free_gpus(nodes, allocated, gpu_resource)
    pairs = 0
    while True:
        placed = []
        for role in ("prefill", "decode"):
            node = next((n for n in sorted(staged.get(role) or []) if gpus[role] and free.get(n, 0) >= gpus[role]), None)
            if node is None:
                break
            free[node] -= gpus[role]
            placed.append(node)
        if len(placed) < 2:
            return pairs
        pairs += 1


def serving(workloads, served_model_name, pd_model_name=None):
    """Which of the live engine ``workloads`` serves ``served_model_name`` (the engine objects' annotation
    ``llmops.serving/served-model-name``), and the revision directory it loads (its ``model`` hostPath volume):
    ``{kind, name, model_path, model, revision, kernel_cache_dir, form}``, or None (``kernel_cache_dir``: the
    ``kernel-cache`` hostPath of A's pods, None without one). What an upgrade pins before it stages B.

    A P/D pair of Deployments (``pd_manifests``, workload ``deployments``) carries no served-name annotation: its
    prefill and decode Deployments' pods carry :data:`MODEL_LABEL` = the model name, :data:`ROLE_LABEL` the role;
    it is ``form: P/D``, named by its front, the revision the one its prefill loads (``prefill``, ``decode``,
    ``front``: the Deployments' names), looked for under ``pd_model_name`` when no engine workload serves
    ``served_model_name``. A StormService pair of ``pd_model_name`` is ``form: StormService`` (refused by
    :func:`plan`)."""
    for w in workloads or []:
        if ((w.get("metadata") or {}).get("annotations") or {}).get(SERVED_NAME_ANNOTATION) != served_model_name:
            continue
        if w.get("kind") == "Deployment":
            template = w["spec"]["template"]
        elif w.get("kind") == "LeaderWorkerSet":
            template, _size = _lws_template(w)
        else:
            continue
        return dict(_revision_of(template), kind=w["kind"], name=w["metadata"]["name"], form=w["kind"])
    if pd_model_name:
        pd = pd_serving(workloads, pd_model_name)
        if pd is not None:
            return pd
        for w in workloads or []:
            roles = (((w.get("spec") or {}).get("template") or {}).get("spec") or {}).get("roles") or []
            if w.get("kind") == "StormService" and any(
                    (((r.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL) == pd_model_name
                    for r in roles):
                template = next((r["template"] for r in roles if r.get("name") == "prefill"), roles[0]["template"])
                return dict(_revision_of(template), kind="StormService", name=w["metadata"]["name"], form="StormService")
    return None


def _revision_of(template):
    path = next(((v.get("hostPath") or {}).get("path") for v in (template.get("spec") or {}).get("volumes") or []
                 if v.get("name") == "model" and v.get("hostPath")), None)
    parts = (path or "").rstrip("/").rsplit("/", 2)
    # the kernel cache A's pods compile into or load (kube/_k8s_engine.py: volume kernel-cache, hostPath = the
    # engine's cache directory on the node): kept from kernel-cache gc while B is staged and prebuilt beside A
    kcache = next(((v.get("hostPath") or {}).get("path") for v in (template.get("spec") or {}).get("volumes") or []
                   if v.get("name") == "kernel-cache" and v.get("hostPath")), None)
    return dict(model_path=path, model=parts[-2] if len(parts) >= 2 else None, revision=parts[-1] if path else None,
                kernel_cache_dir=kcache)


def pd_serving(workloads, model_name):
    """The P/D pair of Deployments of ``model_name`` among ``workloads`` (see :func:`serving`), or None; a pair
    with more than one generation live (an upgrade that ended half way) is named by its prefill of the first."""
    mine = [w for w in workloads or [] if w.get("kind") == "Deployment" and _role(w)
            and ((w["spec"]["template"].get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL) == model_name]
    roles = pd_roles(mine)
    if not (roles.get("prefill") and roles.get("decode") and roles.get("front")):
        return None
    return dict(_revision_of(roles["prefill"]["spec"]["template"]), kind="Deployment",
                name=roles["front"]["metadata"]["name"], form="P/D",
                prefill=roles["prefill"]["metadata"]["name"], decode=roles["decode"]["metadata"]["name"],
                front=roles["front"]["metadata"]["name"])


# --------------------------------------------------------------------------------------------- #
# P/D generations
# --------------------------------------------------------------------------------------------- #


def _strip_generation(template):
    t = copy.deepcopy(template or {})
    labels = (t.get("metadata") or {}).get("labels") or {}
    labels.pop(GENERATION_LABEL, None)
    labels.pop(NAME_LABEL, None)  # the name carries the generation itself
    return t


def pd_generation(prefill_template, decode_template):
    """The generation of a P/D pair: 10 hex digits of SHA-256 over both roles' pod templates (replicas are not in a
    template, so scaling is not a new generation)."""
    text = json.dumps([_strip_generation(prefill_template), _strip_generation(decode_template)], sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


def _role(obj):
    tl = ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {})
    return tl.get(ROLE_LABEL)


def pd_roles(objects):
    """``{role: Deployment}`` of a P/D pair of Deployments (``prefill``, ``decode``, ``front``)."""
    return dict((_role(o), o) for o in objects if o.get("kind") == "Deployment" and _role(o))


def _generation_of(dep):
    labels = ((dep["spec"]["template"].get("metadata") or {}).get("labels") or {})
    return labels.get(GENERATION_LABEL)


def generation_stack(objects, generation, namespace):
    """B's P/D objects (``pd_manifests`` deployments form) as a generation of their own: the prefill, decode and
    front Deployments, the engine Services and the proxy ConfigMap named ``<name>-<generation>``, every pod and
    selector between them labelled :data:`GENERATION_LABEL`, the front's prefill/decode URLs (vLLM proxy) or label
    selectors (SGLang router) rewired to them. The route's Service (the front's, named after the model) is returned
    apart: it moves from A's fronts to B's in the steps of :func:`plan`."""
    out, renamed = [], {}
    objs = copy.deepcopy(objects)
    roles = pd_roles(objs)
    role_names = dict((d["metadata"]["name"], r) for r, d in roles.items())
    for obj in objs:
        if obj["kind"] in ("Deployment", "ConfigMap"):
            renamed[obj["metadata"]["name"]] = "%s-%s" % (obj["metadata"]["name"], generation)
        elif obj["kind"] == "Service" and role_names.get(((obj["spec"].get("selector") or {}).get(NAME_LABEL))) in (
                "prefill", "decode"):
            renamed[obj["metadata"]["name"]] = "%s-%s" % (obj["metadata"]["name"], generation)
    front_service = None
    for obj in objs:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Deployment" and name in role_names:
            new = renamed[name]
            obj["metadata"]["name"] = new
            obj["spec"]["selector"]["matchLabels"] = {NAME_LABEL: new, GENERATION_LABEL: generation}
            obj["spec"]["template"]["metadata"]["labels"].update({NAME_LABEL: new, GENERATION_LABEL: generation})
            pod = obj["spec"]["template"]["spec"]
            for v in pod.get("volumes") or []:
                if (v.get("configMap") or {}).get("name") in renamed:
                    v["configMap"]["name"] = renamed[v["configMap"]["name"]]
            if role_names[name] == "front":
                for c in pod.get("containers") or []:
                    c["args"] = _rewire(c.get("args") or [], renamed, namespace, generation)
            out.append(obj)
        elif obj["kind"] == "ConfigMap":
            obj["metadata"]["name"] = renamed[name]
            out.append(obj)
        elif obj["kind"] == "Service" and name in renamed:
            obj["metadata"]["name"] = renamed[name]
            sel = obj["spec"]["selector"]
            sel.update({NAME_LABEL: renamed[sel[NAME_LABEL]], GENERATION_LABEL: generation})
            out.append(obj)
        elif obj["kind"] == "Service" and role_names.get((obj["spec"].get("selector") or {}).get(NAME_LABEL)) == "front":
            obj["spec"]["selector"] = {NAME_LABEL: renamed[obj["spec"]["selector"][NAME_LABEL]]}
            front_service = obj
        else:
            out.append(obj)  # the route and its grant: the same objects in every generation
    return out, front_service


def _rewire(args, renamed, namespace, generation):
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("--prefill", "--decode") and i + 1 < len(args):
            url = args[i + 1]
            for old, new in renamed.items():
                url = url.replace("//%s.%s.svc" % (old, namespace), "//%s.%s.svc" % (new, namespace))
            out += [a, url]
            i += 2
            continue
        if a in ("--prefill-selector", "--decode-selector"):
            out.append(a)
            i += 1
            while i < len(args) and "=" in args[i] and not args[i].startswith("--"):
                out.append(args[i])
                i += 1
            out.append("%s=%s" % (GENERATION_LABEL, generation))
            continue
        out.append(a)
        i += 1
    return out


def _selector_of_args(args, flag):
    """The label selector an SGLang router discovers ``flag``'s pods by (``k=v`` words after it)."""
    if flag not in args:
        return None
    sel, i = {}, args.index(flag) + 1
    while i < len(args) and "=" in args[i] and not args[i].startswith("--"):
        k, _eq, v = args[i].partition("=")
        sel[k] = v
        i += 1
    return sel


def _url_service(args, flag):
    if flag not in args[:-1]:
        return None
    host = args[args.index(flag) + 1].split("//", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    return host.split(".", 1)[0]


def front_reach(objects):
    """``{front Deployment: {role: [engine Deployments it can reach]}}`` over ``objects``: a vLLM proxy reaches the
    pods its ``--prefill``/``--decode`` Service selects, an SGLang router the pods its ``--prefill-selector``/
    ``--decode-selector`` select; a Deployment is reached when the selector is a subset of its pod labels."""
    services = dict((o["metadata"]["name"], o) for o in objects if o["kind"] == "Service")
    deps = [o for o in objects if o["kind"] == "Deployment" and _role(o) in ("prefill", "decode", "front")]
    out = {}
    for front in (d for d in deps if _role(d) == "front"):
        args = []
        for c in front["spec"]["template"]["spec"].get("containers") or []:
            args += list(c.get("args") or [])
        reach = {}
        for role in ("prefill", "decode"):
            sel = _selector_of_args(args, "--%s-selector" % role)
            if sel is None:
                svc = services.get(_url_service(args, "--%s" % role))
                sel = (svc or {}).get("spec", {}).get("selector") if svc else None
            reach[role] = sorted(d["metadata"]["name"] for d in deps if _role(d) == role and sel and all(
                (d["spec"]["template"]["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items()))
        out[front["metadata"]["name"]] = reach
    return out


def mixed_fronts(objects, generations):
    """The fronts among ``objects`` that can reach engine Deployments of more than one generation
    (``generations``: ``{Deployment name: generation}``), each with what it reaches."""
    bad = {}
    for front, reach in front_reach(objects).items():
        seen = set(generations.get(n) for role in reach for n in reach[role])
        if len(seen) > 1:
            bad[front] = reach
    return bad


# --------------------------------------------------------------------------------------------- #
# The plan
# --------------------------------------------------------------------------------------------- #


#: Why a StormService pair is not upgraded (AIBrix v0.7.0, vllm-project/aibrix).
STORMSERVICE_REFUSAL = (
    "a StormService P/D pair is not upgraded: B's revision in A's StormService would mix generations, because "
    "AIBrix's RoleSet controller rolls one role of a RoleSet at a time (updateStrategy Sequential, the CRD's default; "
    "pkg/controller/roleset/rolling.go RollingManagerSequential.Next: 'each time we only update one role') while the "
    "gateway's pd router pairs the prefill and decode pods of one RoleSet (pkg/plugins/gateway/algorithms/"
    "pd_disaggregation.go filterPrefillDecodePods, scores keyed by roleset-name): B's prefill beside A's decode. "
    "B in a StormService of its own cannot be held back until its canary answered: the pd router picks among every "
    "Ready RoleSet of the model (readyPodList.All()) and AIBrix makes no route for a StormService "
    "(modelrouter_controller.go watches none, issue #1321), so there is no route to switch. Deploy the pair as "
    "Deployments (pd_disagg_k8s_workload: deployments), which playbooks/upgrade.yml upgrades generation by "
    "generation, or replace the pair with the pd_disagg role (an outage)")


def storm_service_refusal():
    """The refusal of a StormService pair (:data:`STORMSERVICE_REFUSAL`, ``reason: pd_stormservice``)."""
    return UpgradeError(STORMSERVICE_REFUSAL, "pd_stormservice")


def _with_replicas(obj, replicas):
    out = copy.deepcopy(obj)
    out["spec"]["replicas"] = replicas
    return out


def _a_pods_on(pods, workload, staged, default):
    """How many of ``workload``'s pods (its selector) run on the ``staged`` nodes and will give their GPUs back;
    ``default`` without a pod list."""
    if pods is None:
        return default
    sel = _pod_selector(workload)
    return sum(1 for p in pods if (p.get("spec") or {}).get("nodeName") in staged
               and not (p.get("metadata") or {}).get("deletionTimestamp")
               and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
               and all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in sel.items()))


def _waves(units, surge):
    size = max(1, surge)
    waves, done = [], 0
    while done < units:
        waves.append(min(size, units - done))
        done += waves[-1]
    return waves


def _workload(objects, what):
    found = [o for o in objects if o.get("kind") in WORKLOADS]
    if not found:
        raise UpgradeError("%s: no Deployment, LeaderWorkerSet or StormService among the objects" % what, "no_workload")
    return found


def _canary_of(workload, suffix="canary"):
    """A one-unit copy of B's workload under its own name whose pods also carry :data:`CANARY_LABEL`."""
    c = copy.deepcopy(workload)
    c["metadata"]["name"] = "%s-%s" % (workload["metadata"]["name"], suffix)
    c["spec"]["replicas"] = 1
    if c["kind"] == "Deployment":
        c["spec"]["selector"]["matchLabels"][CANARY_LABEL] = suffix
        c["spec"]["template"]["metadata"]["labels"][CANARY_LABEL] = suffix
    else:  # LeaderWorkerSet: the controller selects by its own name label; the pods carry ours too
        lwt = c["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                lwt[key].setdefault("metadata", {}).setdefault("labels", {})[CANARY_LABEL] = suffix
    return c


def _lws_template(lws):
    lwt = lws["spec"]["leaderWorkerTemplate"]
    return lwt.get("leaderTemplate") or lwt["workerTemplate"], int(lwt.get("size", 1))


def _outage(what, unit, room_hint):
    return UpgradeError(
        "the upgrade would stop the only serving %s of %s: it has 1 %s and no node that staged B has free GPUs for "
        "one more (%s). Stage B on a spare node (model_stage on a node with free GPUs, then engine_k8s_staged_nodes) "
        "so the canary runs beside A, or set engine_allow_outage: true to accept that nothing serves while B starts"
        % (unit, what, unit, room_hint), "outage")


def plan(live, rendered, nodes, staged, allow_outage=False, gpu_resource="nvidia.com/gpu", pods=None,
         namespace=None, pinned=(), a_ref=None, b_ref=None, kernel_cache=None):
    """The plan of the upgrade from ``live`` (A's objects as read from the API) to ``rendered`` (B's objects).

    ``nodes``: Node objects (or ``{name, allocatable, allocated, unschedulable}``); ``pods``: the pods as listed
    (their GPUs count as allocated); ``staged``: the nodes that staged B (a list, or ``{prefill, decode}`` for a P/D
    pair). Raises :class:`UpgradeError` for a refusal; returns the plan (see docs/upgrade.md, "The plan").
    """
    a_work = _workload(live, "A")
    b_work = _workload(rendered, "B")
    allocated = allocated_gpus(pods, gpu_resource) if pods is not None else None
    if any(o["kind"] == "StormService" for o in a_work + b_work):
        raise storm_service_refusal()
    roles = pd_roles(b_work)
    if roles.get("prefill") and roles.get("decode"):
        out = _plan_pd(live, rendered, nodes, staged, allow_outage, gpu_resource, allocated, namespace, pods)
    elif len(b_work) == 1 and b_work[0]["kind"] in ("Deployment", "LeaderWorkerSet"):
        out = _plan_single(live, rendered, b_work[0], nodes, staged, allow_outage, gpu_resource, allocated, pods)
    else:
        raise UpgradeError("B: %s is not one Deployment, one LeaderWorkerSet or a P/D pair of Deployments"
                           % ", ".join("%s %s" % (o["kind"], o["metadata"]["name"]) for o in b_work), "shape")
    out["record"] = [recorded(o) for o in live]
    out["rollback"] = {"delete": out.pop("added"), "apply": out["record"], "wait": out.pop("rollback_wait", [])}
    out["pinned"] = list(pinned)
    out["a"], out["b"] = a_ref, b_ref
    kc = kernel_cache or {}
    out["kernel_cache"] = [] if out["noop"] or kernel_cache is None else kernel_cache_state(
        staged, kc.get("reports"), kc.get("enabled", True), kc.get("compile_minutes"),
        kc.get("off_reason") or "kernel_cache_enabled: false")
    return out


def _plan_single(live, rendered, b, nodes, staged, allow_outage, gpu_resource, allocated, pods):
    name, kind = b["metadata"]["name"], b["kind"]
    a = next((o for o in live if o["kind"] == kind and o["metadata"]["name"] == name), None)
    if a is None:
        raise UpgradeError("A: no %s %s is serving (found: %s); deploy A with playbooks/site.yml first"
                           % (kind, name, ", ".join("%s %s" % (o["kind"], o["metadata"]["name"]) for o in live
                                                    if o["kind"] in WORKLOADS) or "nothing"), "no_a")
    units = int(a["spec"].get("replicas", 1))
    if subset(_workload_spec(b), _workload_spec(a)):
        return _noop(kind, "replica" if kind == "Deployment" else "group", units)
    if kind == "Deployment":
        template, size, unit = b["spec"]["template"], 1, "replica"
    else:
        template, size = _lws_template(b)
        unit = "group"
    gpus = pod_gpus(template, gpu_resource)
    room = node_room(nodes, staged, gpus, allocated, gpu_resource)
    pod_slots = sum(room.values())
    surge = min(units, pod_slots // size)
    b_units = int(b["spec"].get("replicas", 1))
    cap = pod_slots + _a_pods_on(pods, a, staged or [], units * size)
    if b_units * size > cap:
        raise UpgradeError(
            "B asks %d %s(s) of %d pod(s) of %d GPU(s) but the nodes that staged B hold %d such pods (%d beside A, %d "
            "of A's); stage B on more nodes (engine_k8s_staged_nodes) or lower engine_replicas"
            % (b_units, unit, size, gpus, cap, pod_slots, cap - pod_slots), "capacity")
    canary = _canary_of(b)
    others = [o for o in rendered if o is not b]
    steps = []
    outage = False
    shrink = None
    if surge < 1:
        if units > 1:
            shrink = _with_replicas(recorded(a), units - 1)
        elif not allow_outage:
            raise _outage("%s %s" % (kind, name), unit, "%d GPU(s) a pod; room on staged nodes: %s"
                          % (gpus, room or "none"))
        else:
            shrink, outage = _with_replicas(recorded(a), 0), True
    if shrink is not None:
        steps.append(dict(name="make room: A's %s %s from %d to %d %s(s)" % (kind, name, units, units - 1, unit),
                          apply=[shrink], delete=[], wait=[]))
    steps.append(dict(name="canary: one %s of B (%s %s)" % (unit, kind, canary["metadata"]["name"]),
                      apply=[canary], delete=[], canary=True,
                      wait=[dict(kind=kind, name=canary["metadata"]["name"], replicas=1,
                                 selector=_pod_selector(canary))]))
    # the canary leaves before the waves: its GPUs are the first wave's (a canary beside A holds a surge slot, one
    # that took an A replica's place holds that replica's)
    wave_b = copy.deepcopy(b)
    wave_surge = surge if surge >= 1 else 0
    if kind == "Deployment":
        wave_b["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {
            "maxSurge": wave_surge, "maxUnavailable": 0 if wave_surge else 1}}
    else:
        wave_b["spec"]["rolloutStrategy"] = {"type": "RollingUpdate", "rollingUpdateConfiguration": {
            "maxSurge": wave_surge, "maxUnavailable": 0 if wave_surge else 1}}
    waves = _waves(units, wave_surge)
    steps.append(dict(name="waves: B's %s %s, %s %s(s) at a time (%s)" % (
        kind, name, max(1, wave_surge), unit, "surge beside A" if wave_surge else "one replaced at a time"),
        apply=others + [wave_b], delete=[ref(canary)],
        wait=[dict(kind=kind, name=name, replicas=units, selector=_pod_selector(b))]))
    return dict(rollback_wait=[dict(kind=kind, name=name, replicas=units, selector=_pod_selector(a))],
                form=kind, unit=unit, units=units, gpus_per_pod=gpus, pods_per_unit=size, room=room, surge=surge,
                wave_surge=wave_surge,
                outage=outage, waves=waves,
                canary=dict(kind=kind, name=canary["metadata"]["name"], selector=_pod_selector(canary)),
                order=[s["name"] for s in steps], steps=steps, added=[ref(canary)],
                retire=[ref(canary)], generations=None, noop=False)


def subset(want, have):
    """Whether every field of ``want`` is in ``have`` with the same value (lists item by item): ``have`` may carry
    what the API server defaulted (``terminationMessagePath``, ``dnsPolicy`` ...) beside what was applied."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(subset(w, h) for w, h in zip(want, have))
    return want == have


def _workload_spec(workload):
    """What B changes of a workload: its replicas and pod template(s)."""
    spec = workload["spec"]
    if workload["kind"] == "Deployment":
        return {"replicas": spec.get("replicas", 1), "template": spec["template"]}
    return {"replicas": spec.get("replicas", 1), "leaderWorkerTemplate": spec["leaderWorkerTemplate"]}


def _noop(form, unit, units):
    """The plan when B already serves: no step, nothing to roll back."""
    return dict(form=form, unit=unit, units=units, room={}, surge=0, wave_surge=0, outage=False, waves=[],
                canary=None, order=[], steps=[], added=[], retire=[], generations=None, gpus_per_pod=None,
                pods_per_unit=None, noop=True)


def _pod_selector(workload):
    if workload["kind"] == "Deployment":
        return dict(workload["spec"]["selector"]["matchLabels"])
    labels = {"leaderworkerset.sigs.k8s.io/name": workload["metadata"]["name"]}
    return labels


def _plan_pd(live, rendered, nodes, staged, allow_outage, gpu_resource, allocated, namespace, pods):
    a_roles, b_roles = pd_roles(live), pd_roles(rendered)
    if not (a_roles.get("prefill") and a_roles.get("decode") and a_roles.get("front")):
        raise UpgradeError("A: no P/D pair of Deployments (prefill, decode, front) is serving; found %s"
                           % sorted(a_roles), "no_a")
    if not b_roles.get("front"):
        raise UpgradeError("B: the P/D pair has no front (proxy or router) Deployment", "shape")
    namespace = namespace or b_roles["prefill"]["metadata"].get("namespace")
    gen_a = _generation_of(a_roles["prefill"]) or pd_generation(a_roles["prefill"]["spec"]["template"],
                                                                a_roles["decode"]["spec"]["template"])
    gen_b = pd_generation(b_roles["prefill"]["spec"]["template"], b_roles["decode"]["spec"]["template"])
    if gen_a == gen_b:
        return dict(_noop("P/D", "P/D group", max(int(b_roles[r]["spec"].get("replicas", 1)) for r in ("prefill", "decode"))),
                    generations={"a": gen_a, "b": gen_b})
    stack, front_service = generation_stack(rendered, gen_b, namespace)
    if front_service is None:
        raise UpgradeError("B: the P/D pair has no Service for its front", "shape")
    s_roles = pd_roles(stack)
    a_units = dict((r, int(a_roles[r]["spec"].get("replicas", 1))) for r in ("prefill", "decode", "front"))
    b_units = dict((r, int(b_roles[r]["spec"].get("replicas", 1))) for r in ("prefill", "decode", "front"))
    staged = staged if isinstance(staged, dict) else {"prefill": staged, "decode": staged}
    gpus = dict((r, pod_gpus(b_roles[r]["spec"]["template"], gpu_resource)) for r in ("prefill", "decode"))
    room = dict((r, node_room(nodes, staged.get(r) or [], gpus[r], allocated, gpu_resource)) for r in gpus)
    surge = dict((r, sum(room[r].values())) for r in gpus)
    pair_surge = pair_room(nodes, staged, gpus, allocated, gpu_resource)
    a_rec = dict((r, recorded(a_roles[r])) for r in a_roles)
    a_front_service = next((recorded(o) for o in live if o["kind"] == "Service"
                            and (o["spec"].get("selector") or {}).get(NAME_LABEL) == a_roles["front"]["metadata"]["name"]),
                           None)
    if a_front_service is None:
        raise UpgradeError("A: no Service selects the front %s" % a_roles["front"]["metadata"]["name"], "shape")
    steps, outage = [], False
    # the canary: one prefill, one decode and one front of generation B, beside A when there is room
    shrink = []
    if pair_surge < 1:
        for role in ("prefill", "decode"):
            if surge[role] >= 1:
                continue
            if a_units[role] > 1:
                shrink.append(_with_replicas(a_rec[role], a_units[role] - 1))
            elif not allow_outage:
                raise _outage("the P/D pair's %s Deployment %s" % (role, a_roles[role]["metadata"]["name"]),
                              "%s replica" % role, "room on staged %s nodes: %s" % (role, room[role] or "none"))
            else:
                shrink.append(_with_replicas(a_rec[role], 0))
                outage = True
    if shrink:
        steps.append(dict(name="make room: A's %s one replica fewer" % " and ".join(_role(o) for o in shrink),
                          apply=shrink, delete=[], wait=[]))
    canary = [_with_replicas(o, 1) if o["kind"] == "Deployment" else o for o in stack]
    waits = [_pd_wait(stack, s_roles[r], 1) for r in ("prefill", "decode", "front")]
    steps.append(dict(name="canary: generation %s, one prefill, one decode and one front (not yet on the route)" % gen_b,
                      apply=canary, delete=[], canary=True, wait=waits))
    common = copy.deepcopy(front_service)
    common["spec"]["selector"] = {MODEL_LABEL: b_roles["front"]["spec"]["template"]["metadata"]["labels"][MODEL_LABEL],
                                  ROLE_LABEL: "front"}
    steps.append(dict(name="route: the model's Service %s selects the fronts of both generations; each front sends "
                           "a request to its own generation's prefill and decode only" % common["metadata"]["name"],
                      apply=[common, _with_replicas(s_roles["front"], b_units["front"])], delete=[], wait=[]))
    # capacity per role: the room beside A plus the GPUs of A's own pods on nodes that staged B (they come back as A
    # gives its replicas); B must fit in it, or its last pods would wait for GPUs forever
    cap = dict((r, surge[r] + _a_pods_on(pods, a_roles[r], staged.get(r) or [], a_units[r])) for r in ("prefill", "decode"))
    for r in ("prefill", "decode"):
        if b_units[r] > cap[r]:
            raise UpgradeError(
                "B asks %d %s replica(s) of %d GPU(s) but the nodes that staged B for %s hold %d (%d beside A, %d "
                "of A's); stage B on more nodes (%s) or lower B's %s replicas"
                % (b_units[r], r, gpus[r], r, cap[r], surge[r], cap[r] - surge[r],
                   "pd_disagg_prefill_staged" if r == "prefill" else "engine_k8s_staged_nodes", r), "capacity")
    a_now = dict((r, a_units[r] - (1 if any(_role(o) == r for o in shrink) else 0)) for r in ("prefill", "decode"))
    if outage:
        a_now = dict((r, int(next((o for o in shrink if _role(o) == r), a_rec[r])["spec"]["replicas"])) for r in a_now)
    b_now = {"prefill": 1, "decode": 1}
    a_only = [o for o in live if o["kind"] in ("Deployment", "ConfigMap")
              or (o["kind"] == "Service" and o["metadata"]["name"] != front_service["metadata"]["name"])]
    route_b = dict(name="route: the model's Service selects generation %s's fronts only" % gen_b,
                   apply=[front_service], delete=[], wait=[])
    retire = dict(name="retire A: its pair is deleted (%s)" % ", ".join("%s %s" % (o["kind"], o["metadata"]["name"])
                                                                        for o in a_only),
                  apply=[], delete=[ref(o) for o in a_only], wait=[])
    waves, retired = [], False
    roles2 = ("prefill", "decode")
    while not retired or b_now != dict((r, b_units[r]) for r in roles2):
        if b_now == dict((r, b_units[r]) for r in roles2):
            steps += [route_b, retire]  # B is whole beside A: the route leaves A, then A goes
            retired = True
            break
        free = dict((r, cap[r] - (0 if retired else a_now[r]) - b_now[r]) for r in roles2)
        growing = [r for r in roles2 if b_now[r] < b_units[r]]
        width = max(1, min(free[r] for r in growing))
        b_next = dict((r, min(b_units[r], b_now[r] + width)) for r in roles2)
        b_apply = [_with_replicas(s_roles[r], b_next[r]) for r in roles2]
        b_apply.append(_with_replicas(s_roles["front"], b_units["front"]))
        b_wait = [_pd_wait(stack, s_roles[r], b_next[r]) for r in roles2]
        name = "wave: generation %s to %d prefill / %d decode" % (gen_b, b_next["prefill"], b_next["decode"])
        waves.append(max(b_next[r] - b_now[r] for r in roles2))
        if retired:
            steps.append(dict(name=name, apply=b_apply, delete=[], wait=b_wait))
            b_now = b_next
            continue
        a_next = dict((r, min(a_now[r], cap[r] - b_next[r])) for r in roles2)
        if any(a_next[r] <= 0 for r in roles2):
            # this wave needs A's last replicas of a role: the route leaves A first, then A goes, then B takes them
            steps += [route_b, retire, dict(name=name + " on A's GPUs", apply=b_apply, delete=[], wait=b_wait)]
            retired = True
        elif a_next != a_now:
            steps.append(dict(name=name + ", A first to %d / %d (its GPUs are this wave's)" % (a_next["prefill"], a_next["decode"]),
                              apply=[_with_replicas(a_rec[r], a_next[r]) for r in roles2 if a_next[r] != a_now[r]] + b_apply,
                              delete=[], wait=b_wait))
        else:
            steps.append(dict(name=name + " beside A", apply=b_apply, delete=[], wait=b_wait))
        a_now, b_now = a_next, b_next
    if not retired:
        steps += [route_b, retire]
    generations = dict((a_roles[r]["metadata"]["name"], gen_a) for r in ("prefill", "decode"))
    generations.update((s_roles[r]["metadata"]["name"], gen_b) for r in ("prefill", "decode"))
    for step in steps:  # the proof, step by step: no front reaches two generations
        state = _state_after(live, steps[:steps.index(step) + 1])
        bad = mixed_fronts(state, generations)
        if bad:
            raise UpgradeError(
                "P/D generations would mix at step %r: %s. A's front selects its prefill/decode pods without %s; "
                "redeploy A once with playbooks/site.yml (which labels the generation) before upgrading"
                % (step["name"], "; ".join("front %s reaches %s" % (f, r) for f, r in sorted(bad.items())),
                   GENERATION_LABEL), "pd_generations_mix")
    added = [ref(o) for o in stack]
    rollback_wait = [_pd_wait(live, a_roles[r], a_units[r]) for r in ("prefill", "decode", "front")]
    return dict(rollback_wait=rollback_wait, form="P/D", unit="P/D group", units=max(b_units["prefill"], b_units["decode"]), room=room, surge=pair_surge,
                wave_surge=max(waves or [0]), outage=outage,
                waves=waves,
                canary=dict(kind="Deployment", names=[s_roles[r]["metadata"]["name"] for r in ("prefill", "decode", "front")]),
                generations={"a": gen_a, "b": gen_b}, order=[s["name"] for s in steps], steps=steps, added=added,
                retire=[ref(o) for o in a_only], gpus_per_pod=None, pods_per_unit=2, noop=False)


def _pd_wait(objects, dep, replicas):
    """What ``k8s_engine_wait`` waits for of one P/D Deployment: its pods (its selector, its first container) and
    the engine Service among ``objects`` that selects exactly them (a front's Service is the model's, which moves
    between generations in its own steps: none)."""
    sel = dict(dep["spec"]["selector"]["matchLabels"])
    service = next((o["metadata"]["name"] for o in objects if o["kind"] == "Service" and _role(dep) != "front"
                    and (o["spec"].get("selector") or {}) == sel), None)
    return dict(kind="Deployment", name=dep["metadata"]["name"], replicas=replicas, selector=sel,
                container=dep["spec"]["template"]["spec"]["containers"][0]["name"], service=service)


def _state_after(live, steps):
    """The objects after ``steps`` were applied to ``live`` (apply replaces by kind and name; delete removes)."""
    state = dict(((o["kind"], o["metadata"]["name"]), o) for o in live)
    for step in steps:
        for r in step.get("delete") or []:
            state.pop((r["kind"], r["name"]), None)
        for o in step.get("apply") or []:
            state[(o["kind"], o["metadata"]["name"])] = o
    return list(state.values())


def kernel_cache_state(staged, reports, enabled=True, compile_minutes=None, off_reason="kernel_cache_enabled: false"):
    """Per node that staged B (``staged``: a list, or ``{prefill, decode}``), whether B's kernel-cache fingerprint
    hits a published cache there, from each node's ``reports`` (the kernel_cache role's facts: ``node``,
    ``status``, ``fingerprint``, ``dir``, ``capturing``): ``[{node, state, fingerprint, dir, line}]``, ``state``
    ``hit`` (the published cache is mounted), ``miss`` (B compiles at its first start into ``dir``, captured after
    its first correct answer), ``unknown`` (no report) or ``off`` (kernel caches disabled)."""
    nodes = sorted(set(staged.get("prefill") or []) | set(staged.get("decode") or [])) if isinstance(staged, dict) \
        else sorted(set(staged or []))
    by_node = dict((r.get("node"), r) for r in reports or [] if isinstance(r, dict))
    cold = ("+%d min cold start" % compile_minutes) if compile_minutes else "a longer cold start"
    out = []
    for node in nodes:
        r = by_node.get(node)
        if not enabled:
            state, line = "off", "no kernel cache (%s): B compiles at its start, %s" % (off_reason, cold)
        elif r is None:
            state, line = "unknown", "not checked (no host of the play is this node): B may compile at its start"
        elif r.get("status") == "hit":
            state, line = "hit", "hit: B's published cache is mounted (%s)" % (r.get("dir") or "?")
        else:
            state = "miss"
            line = "miss: B compiles at its start, %s; %s" % (cold, (
                "captured into %s after its first correct answer, published when the upgrade ends" % r["dir"])
                if r.get("capturing")
                and r.get("dir") else "nothing is captured (kernel_cache_capture: false)")
        out.append(dict(node=node, state=state, fingerprint=(r or {}).get("fingerprint"), dir=(r or {}).get("dir"),
                        line=line))
    return out


def summary(p):
    """The plan as lines for check mode and the play's output."""
    if p.get("noop"):
        return ["B already serves (%s): nothing to upgrade, nothing changes" % p["form"]]
    lines = ["form: %s, %d %s(s); surge room %s (%s); waves %s%s" % (
        p["form"], p["units"], p["unit"], p["surge"], p["room"] or "no staged node with free GPUs", p["waves"],
        "; OUTAGE accepted (engine_allow_outage)" if p["outage"] else "")]
    if p.get("generations"):
        lines.append("P/D generations: A %(a)s -> B %(b)s" % p["generations"])
    lines += ["%d. %s" % (i + 1, s) for i, s in enumerate(p["order"])]
    lines.append("rollback: delete %s; re-apply A's %d recorded object(s): %s" % (
        ", ".join("%(kind)s %(name)s" % r for r in p["rollback"]["delete"]) or "nothing", len(p["record"]),
        ", ".join("%s %s" % (o["kind"], o["metadata"]["name"]) for o in p["record"])))
    if p["pinned"]:
        lines.append("pinned until the upgrade ends: %s" % ", ".join(p["pinned"]))
    fps = sorted(set(k["fingerprint"] for k in p.get("kernel_cache") or [] if k.get("fingerprint")))
    if p.get("kernel_cache"):
        lines.append("B's kernel cache%s, before any pod changes:" % (" (fingerprint %s)" % ", ".join(fps) if fps else ""))
        lines += ["  %s: %s" % (k["node"], k["line"]) for k in p["kernel_cache"]]
    return lines
