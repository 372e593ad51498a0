# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the Kubernetes objects that serve one model with vLLM or SGLang behind AIBrix.

:func:`build` turns the engine inputs (:data:`DEFAULTS`) into a Deployment (a LeaderWorkerSet over several nodes),
a Service with a DNS-1035 name, the AIBrix HTTPRoute ``<model>-router`` in the gateway namespace pointing at that
Service and, when the engine runs in another namespace, a ReferenceGrant for exactly that Service. Everything is
checked first (:func:`_k8s_checks.validate`); a bad input raises :class:`_k8s_checks.SpecError` naming the field
and the fix. Credentials are refused wherever they could be rendered (env, kernel_cache_env, engine_args,
extra_args, command, then the built objects) by the one rule in :mod:`_secrets`; the command line is
:mod:`_k8s_argv`'s; :mod:`_render_dir` writes the objects to a directory for GitOps users.

* :func:`build` - the objects and the facts derived from them (names, pod selector, command, read concurrency,
  probe windows, warnings).
* :func:`pod_argument_spec` - the engine pod options both renderers of engine pods take alike.
* :func:`engine_pod_spec`, :func:`container_resources`, :func:`gpus_per_pod`, :func:`probes`,
  :func:`startup_window`, :func:`progress_deadline` - the pod around one engine container (shared with the P/D
  roles of :mod:`_pd_manifests`).
* :func:`pin_to_nodes` - a required node affinity to the nodes that staged the revision.
* :func:`apply_rdma` - the RDMA knobs on an engine pod.
"""
from __future__ import annotations

import json
import math

from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route as route
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_argv, _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

MANAGED_BY = "llmops.serving"

# Paths the AIBrix model-router controller matches (the one list lives in _aibrix_route).
AIBRIX_ROUTE_PATHS = list(route.ROUTE_PATHS)

# CPU and memory requested per GPU when not given: 32 CPUs and 256 GiB for an 8-GPU engine. Requests make the
# pod Burstable instead of BestEffort (GPUs alone do not count for the QoS class, so without them the engine
# is the first pod the kubelet evicts under node memory pressure); no CPU/memory limit is set by default, a
# limit below weights-in-page-cache plus /dev/shm would OOM-kill the loader.
CPU_PER_GPU = 4
MEMORY_GI_PER_GPU = 32

# Multi-node rendezvous: vLLM's multiprocessing launcher (--nnodes/--node-rank/--master-addr, --headless on
# the other nodes; vllm-project/vllm PR #23691, docs/serving/parallelism_scaling.md) and SGLang's
# (--nnodes/--node-rank/--dist-init-addr; sgl-project/sglang docs/references/multi_node_deployment).
DIST_PORT = {"vllm": 29501, "sglang": 20000}
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"

DEFAULTS = dict(
    engine="vllm",
    served_model_name=None,
    namespace=None,
    gateway_namespace=route.DEFAULT_GATEWAY_NAMESPACE,
    gateway_name=route.DEFAULT_GATEWAY_NAME,
    model_path=None,
    model_source="staged_nvme",
    model_pvc=None,
    model_pvc_sub_path=None,
    tp_size=8,
    pp_size=1,
    nodes=1,
    dist_port=None,
    replicas=1,
    image=None,
    image_pull_policy="IfNotPresent",
    image_pull_secret=None,
    port=8000,
    profile="none",
    profiles={},
    engine_args={},
    extra_args=[],
    command=None,
    init=None,
    gpu_resource="nvidia.com/gpu",
    resources={},
    cpu_request=None,
    memory_request=None,
    node_selector={},
    affinity={},
    tolerations=[],
    priority_class_name=None,
    topology_spread=[],
    startup_timeout=3600,
    probe_period=10,
    kernel_cache_dir=None,
    kernel_cache_env={},
    env=[],
    hf_token_secret=None,
    shm_size="64Gi",
    loader_threads=None,
    read_streams_warn=16,
    service_name=None,
    manage_route=True,
    route_paths=list(AIBRIX_ROUTE_PATHS),
    route_request_timeout=route.DEFAULT_REQUEST_TIMEOUT,
    labels={},
    annotations={},
    staged_nodes=None,
    rdma={},
)


def pod_argument_spec():
    """The spec of the engine options both renderers of engine pods take alike (doc fragment
    ``llmops.serving.engine_pod``), defaults from :data:`DEFAULTS`, to ``update()`` a module's argument spec with."""
    return {
        "engine": {"type": "str", "choices": ["vllm", "sglang"], "default": DEFAULTS["engine"]},
        "gpu_resource": {"type": "str", "default": DEFAULTS["gpu_resource"]},
        "probe_period": {"type": "int", "default": DEFAULTS["probe_period"]},
    }


# --------------------------------------------------------------------------------------------- #
# Placement: engine pods run only on the nodes that staged the revision
# --------------------------------------------------------------------------------------------- #

# The field a node selector term matches a node's name with (k8s.io/api core/v1 types.go NodeSelectorTerm.MatchFields;
# pkg/apis/core/validation/validation.go validateNodeFieldSelectorRequirement: key metadata.name, operator In or NotIn,
# exactly one value). The node's name, not its kubernetes.io/hostname label: the kubelet sets the two apart
# (pkg/kubelet/kubelet_node_status.go initialNode: Name kl.nodeName, LabelHostname kl.hostname), and they differ where a
# cloud provider or --hostname-override names the node (kubernetes/kops#10413, rancher/rke#3140), while the inventory's
# k8s_node_name is the name kubectl get nodes shows.
NODE_NAME_FIELD = "metadata.name"


def pin_to_nodes(affinity, nodes):
    """``affinity`` with a required node affinity to exactly ``nodes`` by name (ANDed with what it already requires).

    The scheduler ORs ``nodeSelectorTerms`` and ANDs what is inside one term
    (k8s.io/component-helpers scheduling/corev1/nodeaffinity/nodeaffinity.go), and a ``matchFields`` requirement
    takes exactly one node name: each existing term becomes one term per node, that term plus
    ``metadata.name In [node]``, so no term can admit a node outside ``nodes``.
    """
    out = json.loads(json.dumps(affinity or {}))
    if nodes is None:
        return out
    node_aff = out.setdefault("nodeAffinity", {})
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = [t for t in required.get("nodeSelectorTerms") or [] if t.get("matchExpressions") or t.get("matchFields")]
    pinned = []
    for term in terms or [{}]:
        for node in nodes:
            t = json.loads(json.dumps(term))
            t["matchFields"] = list(t.get("matchFields") or []) + [
                {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]
            pinned.append(t)
    required["nodeSelectorTerms"] = pinned
    return out


# --------------------------------------------------------------------------------------------- #
# RDMA: one definition for multi-node engines and the P/D roles
# --------------------------------------------------------------------------------------------- #

MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"


def apply_rdma(spec, annotations, r):
    """Put the RDMA knobs ``r`` (:func:`_k8s_checks.check_rdma`) on an engine pod ``spec`` and its ``annotations`` (in place).

    Used by the engine's Deployment and every LeaderWorkerSet pod and by the P/D roles, so both get the same
    device resource, capability, network attachment and NCCL/Gloo interfaces.
    """
    if not r:
        return
    container = spec["containers"][0]
    if r["resource"]:
        for part in ("requests", "limits"):
            container.setdefault("resources", {}).setdefault(part, {})[r["resource"]] = str(r["count"])
    caps = container.setdefault("securityContext", {}).setdefault("capabilities", {}).setdefault("add", [])
    if "IPC_LOCK" not in caps:
        caps.append("IPC_LOCK")
    env = _k8s_checks.rdma_env(r)
    if env:
        taken = {e["name"] for e in env}
        container["env"] = env + [e for e in container.get("env") or [] if e["name"] not in taken]
    if r["host_network"]:
        # The engines then use the node's interfaces (RDMA netdevs included); cluster DNS still resolves.
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if r["networks"]:
        annotations[MULTUS_NETWORKS] = r["networks"]


# --------------------------------------------------------------------------------------------- #
# Objects
# --------------------------------------------------------------------------------------------- #


# Headroom of the startup probe over startup_timeout: the kubelet's window must outlast the wait that reports a
# slow start, so a start that takes just the timeout is reported as slow by the wait, not killed mid-load.
STARTUP_HEADROOM_SECONDS = 300
STARTUP_HEADROOM_FRACTION = 0.10
# SGLang serves /health and /health_generate with one handler (health_generate in
# python/sglang/srt/entrypoints/http_server.py, sgl-project/sglang v0.5.x) that sends a one-token request and waits
# up to SGLANG_HEALTH_CHECK_TIMEOUT seconds (default 20) for the detokenizer before answering 503: a probe timeout
# below that budget fails a server that is only busy, and the liveness probe then kills it.
SGLANG_HEALTH_CHECK_TIMEOUT = 20
PROBE_TIMEOUT = {"vllm": 5, "sglang": SGLANG_HEALTH_CHECK_TIMEOUT + 5}


def startup_window(startup_timeout):
    """Seconds the startup probe allows: ``startup_timeout`` plus max(300 s, 10 %)."""
    return startup_timeout + max(STARTUP_HEADROOM_SECONDS, int(math.ceil(startup_timeout * STARTUP_HEADROOM_FRACTION)))


def progress_deadline(startup_timeout):
    """``progressDeadlineSeconds`` of an engine Deployment: the startup window plus 30 min of image pull, so a slow
    cold start is not ProgressDeadlineExceeded (the default 600 s is far below a 700 GiB load)."""
    return startup_window(startup_timeout) + 1800


def probes(startup_timeout, period, engine="vllm"):
    """startupProbe covering ``startup_timeout`` with headroom; readiness/liveness only start after it succeeded."""
    http = {"path": "/health", "port": "http"}
    timeout = PROBE_TIMEOUT.get(engine, 5)
    startup = dict(httpGet=dict(http), periodSeconds=period, timeoutSeconds=timeout, successThreshold=1,
                   failureThreshold=int(math.ceil(float(startup_window(startup_timeout)) / period)))
    readiness = dict(httpGet=dict(http), periodSeconds=max(10, timeout + 5), timeoutSeconds=timeout,
                     successThreshold=1, failureThreshold=3)
    liveness = dict(httpGet=dict(http), periodSeconds=30, timeoutSeconds=max(10, timeout), successThreshold=1,
                    failureThreshold=5)
    return startup, readiness, liveness


def _volumes(p):
    volumes, mounts = [], []
    if p["model_source"] == "shared_fs" and p["model_pvc"]:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": p["model_pvc"], "readOnly": True}})
        mount = {"name": "model", "mountPath": p["model_path"], "readOnly": True}
        if p["model_pvc_sub_path"]:
            mount["subPath"] = p["model_pvc_sub_path"]
        mounts.append(mount)
    else:
        # The same path on the node and in the container: the path the stager wrote is the path the
        # engine reads, so the two can never drift apart.
        volumes.append({"name": "model", "hostPath": {"path": p["model_path"], "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": p["model_path"], "readOnly": True})
    if p["kernel_cache_dir"]:
        volumes.append({"name": "kernel-cache", "hostPath": {"path": p["kernel_cache_dir"], "type": "Directory"}})
        mounts.append({"name": "kernel-cache", "mountPath": p["kernel_cache_dir"]})
    shm = {"medium": "Memory"}
    if p["shm_size"]:
        shm["sizeLimit"] = p["shm_size"]
    volumes.append({"name": "dshm", "emptyDir": shm})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _env(p):
    env = [{"name": k, "value": _k8s_argv.fmt_value(v)} for k, v in sorted((p["kernel_cache_env"] or {}).items())]
    if p["hf_token_secret"]:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": p["hf_token_secret"]["name"], "key": p["hf_token_secret"].get("key") or "token"}}})
    if p["nodes"] > 1:
        # The node rank for $(LWS_WORKER_INDEX) in the arguments, from the label LeaderWorkerSet puts on every
        # pod (0 on the leader); the same downward-API reference SGLang's LWS examples use.
        env.append({"name": "LWS_WORKER_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['%s']" % LWS_WORKER_INDEX_LABEL}}})
        if p["engine"] == "vllm":
            # the address this node's workers announce to the others
            env.append({"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    seen = {e["name"] for e in env}
    for item in p["env"] or []:
        if item["name"] in seen:
            env = [e for e in env if e["name"] != item["name"]]
        env.append(dict(item))
    return env


def gpus_per_pod(p):
    return p["tp_size"] * p["pp_size"] // p["nodes"]


def container_resources(p, gpus):
    """GPU count exactly; CPU and memory requested (4 CPUs and 32 GiB per GPU unless given).

    An explicit ``resources.requests`` value wins, then ``cpu_request``/``memory_request``; with only a limit
    set, no request is added (Kubernetes then requests the limit).
    """
    given = p["resources"] or {}
    requests = dict(given.get("requests") or {})
    limits = dict(given.get("limits") or {})
    for key, explicit, default in (("cpu", p["cpu_request"], str(CPU_PER_GPU * gpus)),
                                   ("memory", p["memory_request"], "%dGi" % (MEMORY_GI_PER_GPU * gpus))):
        if key in requests:
            continue
        if explicit:
            requests[key] = str(explicit)
        elif key not in limits:
            requests[key] = default
    gpu = {p["gpu_resource"]: str(gpus)}
    requests.update(gpu)
    limits.update(gpu)
    return {"requests": requests, "limits": limits}


def engine_pod_spec(container, volumes, init=None, host_network=False, node_selector=None, affinity=None,
                    tolerations=None, image_pull_secret=None, priority_class_name=None, spread=None):
    """The pod spec around one engine container: this module's engine pods and the P/D roles of ``_pd_manifests``."""
    spec = {
        "containers": [container],
        "volumes": volumes,
        # Service links inject <SVC>_PORT=tcp://... variables; a Service named "vllm" would shadow
        # vLLM's own VLLM_PORT setting.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 120,
    }
    if not init:
        # Without an init in the image the pause container becomes PID 1, so the engine is not: a process that
        # SIGKILLs itself as PID 1 survives it (the kernel drops signals PID 1 has no handler for), and SGLang's
        # kill_process_tree then reaches sys.exit(0) and the crash shows as Completed.
        spec["shareProcessNamespace"] = True
    if host_network:
        # The engines then use the node's interfaces (RDMA netdevs included); cluster DNS still resolves.
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["affinity"] = affinity
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if image_pull_secret:
        spec["imagePullSecrets"] = [{"name": image_pull_secret}]
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    if spread:
        spec["topologySpreadConstraints"] = [dict(c) for c in spread]
    return spec


def _pod_spec(p, container, volumes, spread):
    return engine_pod_spec(container, volumes, init=p["init"], node_selector=p["node_selector"],
                           affinity=pin_to_nodes(p["affinity"], p["staged_nodes"]) if p["staged_nodes"] else p["affinity"],
                           tolerations=p["tolerations"], image_pull_secret=p["image_pull_secret"],
                           priority_class_name=p["priority_class_name"], spread=spread)


def _container(p, role, volumes_mounts, probes_):
    command, args, _final = _k8s_argv.engine_argv(p, role)
    container = {
        "name": "engine",
        "image": p["image"],
        "imagePullPolicy": p["image_pull_policy"],
        "command": _k8s_argv.container_command(p, command),
        "args": args,
        "ports": [{"name": "http", "containerPort": p["port"], "protocol": "TCP"}],
        "env": _env(p),
        "resources": container_resources(p, gpus_per_pod(p)),
        "volumeMounts": volumes_mounts,
    }
    if p["nodes"] > 1:
        container["ports"].append({"name": "dist", "containerPort": p["dist_port"], "protocol": "TCP"})
    if role == "leader":
        container["startupProbe"], container["readinessProbe"], container["livenessProbe"] = probes_
    if not container["env"]:
        del container["env"]
    return container


def build(params):
    """Validate ``params`` (keys of :data:`DEFAULTS`) and return the objects and derived facts."""
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None or k in ("loader_threads",)})
    if p["dist_port"] is None:
        p["dist_port"] = DIST_PORT.get(p["engine"], 29501)
    _k8s_checks.validate(p)
    model = p["served_model_name"]
    svc = p["service_name"] or names.service_name(model)
    _pairs, min_version = _k8s_checks.profile_entry(p["profiles"], p["profile"], p["engine"])
    warnings = _k8s_checks.check_image(p["engine"], p["image"], min_version, p["profile"], p["nodes"])
    command, args, final = _k8s_argv.engine_argv(p)
    gpus = gpus_per_pod(p)
    concurrency = _k8s_argv.read_concurrency(p["engine"], p["model_source"], p["replicas"] * p["nodes"], gpus, final)
    if p["model_source"] == "shared_fs" and concurrency["concurrent_reads"] > p["read_streams_warn"]:
        warnings.append(
            "%s exceeds read_streams_warn=%d; the shared filesystem sees this per rollout. Stage the "
            "revision to node NVMe or lower loader_threads." % (concurrency["summary"], p["read_streams_warn"])
        )
    if p["kernel_cache_dir"]:
        outside = sorted(k for k, v in (p["kernel_cache_env"] or {}).items()
                         if isinstance(v, str) and v.startswith("/") and not (v + "/").startswith(p["kernel_cache_dir"].rstrip("/") + "/"))
        if outside:
            warnings.append("kernel_cache_env: %s point outside kernel_cache_dir %s, so those caches are "
                            "not persisted" % (", ".join(outside), p["kernel_cache_dir"]))
    elif p["kernel_cache_env"]:
        warnings.append("kernel_cache_env is set but kernel_cache_dir is not: the caches land in the "
                        "container filesystem and are lost with the pod")
    if p["model_source"] == "staged_nvme" and p["staged_nodes"] is None and p["replicas"]:
        warnings.append("staged_nodes is not set: the engine pods can be scheduled on any GPU node, and on one that "
                        "never staged %s the hostPath mount fails after scheduling; pass the nodes that staged it "
                        "(the engine role does)" % p["model_path"])
    resources = container_resources(p, gpus)
    mem = _k8s_checks.quantity_bytes(resources["requests"]["memory"]) if "memory" in resources["requests"] else None
    shm = _k8s_checks.quantity_bytes(p["shm_size"]) if p["shm_size"] else None
    if mem is not None and shm and mem < shm:
        warnings.append("memory request %s is below shm_size %s: /dev/shm is memory charged to the engine "
                        "container" % (resources["requests"]["memory"], p["shm_size"]))

    multi = p["nodes"] > 1
    selector = {"app.kubernetes.io/name": svc, "app.kubernetes.io/instance": svc}
    common = dict(selector, **{"app.kubernetes.io/component": "engine", "app.kubernetes.io/managed-by": MANAGED_BY})
    aibrix = route.pod_labels(model, p["port"], p["engine"])
    # The leader (the pod that serves HTTP) carries component=engine; multi-node workers engine-worker, so the
    # Service, the AIBrix labels and the rollout wait select the leader only.
    pod_selector = dict(selector, **{"app.kubernetes.io/component": "engine"}) if multi else dict(selector)
    leader_labels = dict(common, **aibrix)
    leader_labels.update(p["labels"] or {})
    worker_labels = dict(common, **{"app.kubernetes.io/component": "engine-worker"})
    worker_labels.update(p["labels"] or {})
    # The workload itself never carries model.aibrix.ai/name when the route is managed here: AIBrix's
    # controller would otherwise create its own <model>-router pointing at a Service named exactly the model
    # (impossible for names with dots). The gateway and /v1/models discover the pods' labels.
    workload_labels = route.workload_labels(common) if p["manage_route"] else dict(common, **aibrix)
    spread = _k8s_checks.check_topology_spread(p["topology_spread"] or [], selector)

    startup, readiness, liveness = probes(p["startup_timeout"], p["probe_period"], p["engine"])
    volumes, mounts = _volumes(p)
    annotations = {route.SERVED_NAME_ANNOTATION: model}

    def template(role):
        meta = {"labels": leader_labels if role == "leader" else worker_labels}
        if p["annotations"]:
            meta["annotations"] = dict(p["annotations"])
        container = _container(p, role, [dict(m) for m in mounts], (startup, readiness, liveness))
        spec = _pod_spec(p, container, [dict(v) for v in volumes], spread)
        pod_annotations = dict(p["annotations"] or {})
        apply_rdma(spec, pod_annotations, p["rdma"])
        if pod_annotations:
            meta["annotations"] = pod_annotations
        return {"metadata": meta, "spec": spec}

    if multi:
        lws_name = names.statefulset_safe_name(svc)
        workload = {
            "apiVersion": LWS_API,
            "kind": "LeaderWorkerSet",
            "metadata": {"name": lws_name, "namespace": p["namespace"], "labels": workload_labels,
                         "annotations": dict(annotations)},
            "spec": {
                "replicas": p["replicas"],
                # Workers are created with the leader: the leader cannot become Ready before every node joined.
                "startupPolicy": "LeaderCreated",
                # One group (all of its nodes) at a time, never an extra group of GPU nodes.
                "rolloutStrategy": {"type": "RollingUpdate",
                                    "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
                "leaderWorkerTemplate": {
                    "size": p["nodes"],
                    # A restarted rank cannot rejoin a running NCCL group: the whole group starts again.
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": template("leader"),
                    "workerTemplate": template("worker"),
                },
            },
        }
    else:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": svc, "namespace": p["namespace"], "labels": workload_labels,
                         "annotations": dict(annotations)},
            "spec": {
                "replicas": p["replicas"],
                # One GPU node at a time and never a surge pod (a TP=8 pod holds a whole node, a surge pod could
                # not schedule beside it): with one replica the same as Recreate, with more the others keep serving.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                # Longer than the startup window plus image pull, so a slow cold start is not "failed".
                "progressDeadlineSeconds": progress_deadline(p["startup_timeout"]),
                "selector": {"matchLabels": selector},
                "template": template("leader"),
            },
        }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": p["namespace"], "labels": dict(common),
                     "annotations": dict(annotations)},
        "spec": {"type": "ClusterIP", "selector": dict(pod_selector),
                 "ports": [{"name": "http", "port": p["port"], "targetPort": "http", "protocol": "TCP"}]},
    }
    objects = [service]
    routed = dict(route_name=None, reference_grant_name=None)
    if p["manage_route"]:
        try:
            routed = route.route_objects(
                model, svc, p["namespace"], p["port"], gateway_name=p["gateway_name"],
                gateway_namespace=p["gateway_namespace"], request_timeout=p["route_request_timeout"],
                paths=p["route_paths"], labels=common)
        except route.RouteError as e:
            raise _k8s_checks.SpecError(str(e))
        objects.extend(routed["objects"])
        warnings.extend(routed["warnings"])
    pdb_name = None
    if p["replicas"] > 1:
        # Voluntary disruptions (node drains) take one engine pod at a time; the others keep serving.
        pdb_name = svc
        objects.append({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": svc, "namespace": p["namespace"], "labels": dict(common)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(selector)}},
        })
    objects.append(workload)
    problems = route.workload_problems(objects) if p["manage_route"] else []
    if problems:
        raise _k8s_checks.SpecError("; ".join(problems))
    net = _secrets.Scan(env_field="env")
    net.objects(objects)
    net.refuse(_k8s_checks.SpecError)
    startup_seconds = startup["periodSeconds"] * startup["failureThreshold"]
    return dict(
        objects=objects,
        service_name=svc,
        deployment_name=None if multi else svc,
        workload=dict(kind=workload["kind"], name=workload["metadata"]["name"]),
        pod_disruption_budget_name=pdb_name,
        route_name=routed["route_name"],
        reference_grant_name=routed["reference_grant_name"],
        namespace=p["namespace"],
        gateway_namespace=p["gateway_namespace"],
        pod_selector=pod_selector,
        command=_k8s_argv.container_command(p, command) + args,
        read_concurrency=concurrency,
        staged_nodes=p["staged_nodes"],
        probe_windows=dict(startup_seconds=startup_seconds,
                           readiness_seconds=readiness["periodSeconds"] * readiness["failureThreshold"],
                           liveness_seconds=liveness["periodSeconds"] * liveness["failureThreshold"]),
        warnings=warnings,
    )
