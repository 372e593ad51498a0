# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: Kubernetes objects for a prefill/decode pair (xPyD) over NIXL/UCX.

Each role is a full engine (TP=8 by default) built by the engine role's own rule
(:func:`_k8s_argv.engine_argv`: ``profile``, ``engine_args``, loader strategy from ``model_source``), plus
the P/D flags: vLLM ``--kv-transfer-config`` (NixlConnector), SGLang ``--disaggregation-mode``.
``transport`` picks ``UCX_TLS`` and ``UCX_NET_DEVICES`` (each a per-transport value) and nothing else, so an
RDMA rendering and a TCP rendering differ only in those two variables. UCX's tcp transport lists its
devices from ``/sys/class/net`` (``eth0``, ``net1``: ``uct_tcp_query_devices`` in UCX
``src/uct/tcp/tcp_iface.c``); an RDMA ``mlx5_0:1`` there leaves UCX without a network device.

Workloads (``workload``):

* ``stormservice``: one AIBrix StormService with roles ``prefill`` and ``decode``; the pods carry the AIBrix
  labels and the ``model.aibrix.ai/config`` annotation with ``routingStrategy: pd`` (the gateway's ``pd``
  router pairs them by ``roleset-name``/``role-name``; StormService gets no HTTPRoute).
* ``deployments``: a Deployment per role and a front that pairs them behind our own ``<model>-router``
  HTTPRoute (:mod:`_aibrix_route`): the collection's P/D proxy for vLLM (it speaks ``kv_transfer_params``), or
  SGLang's own router (``sglang_router.launch_router --pd-disaggregation`` with Kubernetes service discovery;
  it sends ``bootstrap_host/port/room`` to both roles). Only the front pods carry the AIBrix labels; no
  workload carries ``model.aibrix.ai/name`` in its own metadata, so AIBrix's route controller never creates
  a route to a Service named exactly the model (impossible for dotted names: 503).

Credentials are refused in ``env``, ``kernel_cache_env``, ``engine_args`` and ``extra_args`` (:mod:`_pd_checks`) and
in the built objects by the one rule in :mod:`_secrets`; a Secret is referenced through ``hf_token_secret`` or an
``env`` entry with ``valueFrom.secretKeyRef``. Every input is checked first (:func:`_pd_checks.validate`); a bad
input raises :class:`_k8s_checks.SpecError` naming the field and the fix.

* :func:`render` - the objects and the facts derived from them (pod selectors, containers, workloads, replicas,
  nodes, names, read concurrency, probe windows, warnings); :func:`build` - the objects only.
* :func:`storm_service`, :func:`deployments` - the two workloads; :func:`pod_spec`, :func:`engine_command`,
  :func:`engine_env`, :func:`pd_flags` - one role's engine pod, command line, environment and P/D flags;
  :func:`router_args` - SGLang's router in P/D mode; :func:`base_name` - the model's object name.
"""
from __future__ import annotations

import json

from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route as aroute
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_argv, _k8s_checks, _k8s_engine, _pd_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

AIBRIX_NAME = aroute.AIBRIX_NAME
AIBRIX_PORT = aroute.AIBRIX_PORT
AIBRIX_ENGINE = aroute.AIBRIX_ENGINE
AIBRIX_CONFIG = "model.aibrix.ai/config"
# pkg/cache/utils.go getPodMetricPort (a pod label; 8000 when missing).
AIBRIX_METRIC_PORT = "model.aibrix.ai/metric-port"
# pkg/plugins/gateway/algorithms/pd/engine/sglang.go sglangBootstrapPortFor (a pod annotation; 8998 when missing).
AIBRIX_SGLANG_BOOTSTRAP_PORT = "model.aibrix.ai/sglang-bootstrap-port"
ROLE_LABEL = "llmops.serving/pd-role"
MODEL_LABEL = "llmops.serving/pd-model"
MANAGED_BY = "llmops.serving"
PROXY_PATH = "/opt/pd-proxy/pd_proxy.py"
ROUTER_METRICS_PORT = 29000
# The label NVIDIA's GPU operator puts on every GPU node (nvidia.com/gpu.present=true, gpu-operator
# controllers/state_manager.go commonGPULabelKey): the P/D front requires nodes without it.
GPU_NODE_LABEL = "nvidia.com/gpu.present"

DEFAULT_UCX_TLS = {"rdma": "rc,ud,sm,self,cuda_copy,cuda_ipc", "tcp": "tcp,sm,self,cuda_copy,cuda_ipc"}
# UCX_NET_DEVICES per transport: RDMA device:port names for rc/ud, the pod's netdev for tcp.
DEFAULT_UCX_NET_DEVICES = {"rdma": "all", "tcp": "eth0"}
DEFAULT_FRONT_RESOURCES = {
    "proxy": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    "router": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
}

DEFAULTS = dict(
    engine="vllm", transport="rdma", workload="stormservice", namespace="llm", model_name=None,
    image=None, image_pull_policy="IfNotPresent", image_pull_secret=None, model_path=None, model_host_path=None,
    model_source="staged_nvme", loader_threads=None, tp_size=8, gpus=8, gpu_resource="nvidia.com/gpu", port=8000,
    profile="none", profiles={}, engine_args={}, extra_args=[], env=[], hf_token_secret=None, init=None,
    kernel_cache_dir=None, kernel_cache_env={},
    ucx_tls=dict(DEFAULT_UCX_TLS), ucx_net_devices=dict(DEFAULT_UCX_NET_DEVICES),
    side_channel_port=5600, kv_connector="NixlConnector", kv_buffer_device="cuda",
    sglang_transfer_backend="nixl", sglang_ib_device="", sglang_bootstrap_port=8998,
    rdma_resource="rdma/rdma_shared_device_a", rdma_count=1,
    prefill_replicas=1, decode_replicas=1,
    prefill_node_selector={}, decode_node_selector={}, tolerations=[], pod_annotations={}, host_network=False,
    engine_resources={}, engine_cpu_request=None, engine_memory_request=None, startup_timeout=3600, probe_period=10,
    shm_size="64Gi", routing_strategy=None,
    gateway_name=aroute.DEFAULT_GATEWAY_NAME, gateway_namespace=aroute.DEFAULT_GATEWAY_NAMESPACE,
    route_request_timeout=aroute.DEFAULT_REQUEST_TIMEOUT, route_paths=list(aroute.ROUTE_PATHS), gateway_policies=None,
    proxy_image="", proxy_port=8000, proxy_source="", proxy_replicas=1, proxy_resources=None,
    proxy_prefill_timeout=600, proxy_decode_timeout=3600, router_image="", router_policy="",
    prefill_nodes=None, decode_nodes=None, nccl_ib_hca="", socket_ifname="",
    front_node_selector={}, front_avoid_node_label=GPU_NODE_LABEL,
)


def _normal_net_devices(value):
    """``ucx_net_devices`` as a per-transport dict; a plain string (the old form) is the RDMA value."""
    if isinstance(value, str):
        return dict(DEFAULT_UCX_NET_DEVICES, rdma=value)
    if not isinstance(value, dict):
        raise _k8s_checks.SpecError("ucx_net_devices: must be a mapping {rdma: <device:port list>, tcp: <netdev list>}")
    return dict(DEFAULT_UCX_NET_DEVICES, **value)


def _engine_params(p, role):
    """The engine role's parameters for one P/D role (same profile, engine_args and loader strategy)."""
    q = dict(_k8s_engine.DEFAULTS)
    q.update(engine=p["engine"], served_model_name=p["model_name"], model_path=p["model_path"], port=p["port"],
             tp_size=p["tp_size"], profile=p["profile"], profiles=p["profiles"], model_source=p["model_source"],
             loader_threads=p["loader_threads"], engine_args=dict(p["engine_args"] or {}),
             extra_args=list(p["extra_args"] or []), command=None, namespace=p["namespace"], image=p["image"],
             env=p["env"], kernel_cache_env=p["kernel_cache_env"], hf_token_secret=p["hf_token_secret"],
             init=p["init"], gpu_resource=p["gpu_resource"], resources=p["engine_resources"],
             cpu_request=p["engine_cpu_request"], memory_request=p["engine_memory_request"])
    q["engine_args"].update(pd_flags(p, role))
    return q


def pd_flags(p, role):
    """The flags that make the engine one role of the pair (:data:`_pd_checks.PD_FLAGS` keeps them out of the user's)."""
    if p["engine"] == "vllm":
        return {"kv-transfer-config": {"kv_connector": p["kv_connector"], "kv_role": "kv_both",
                                       "kv_buffer_device": p["kv_buffer_device"]}}
    flags = {"disaggregation-mode": role,
             "disaggregation-transfer-backend": p["sglang_transfer_backend"],
             "disaggregation-bootstrap-port": p["sglang_bootstrap_port"],
             "enable-metrics": True}
    if p["sglang_ib_device"]:
        flags["disaggregation-ib-device"] = p["sglang_ib_device"]
    return flags


def base_name(model_name):
    """DNS-1035 object name for the model (``_k8s_names.object_name``; Service names are the strictest)."""
    return names.object_name(model_name)


# --------------------------------------------------------------------------------------------- #
# Engine pods
# --------------------------------------------------------------------------------------------- #


def engine_command(p, role):
    """``(command, args, final_flags)`` of one role, by the engine role's own rule plus the P/D flags."""
    return _k8s_argv.engine_argv(_engine_params(p, role))


def engine_env(p):
    field_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    env = [
        {"name": "UCX_TLS", "value": p["ucx_tls"][p["transport"]]},
        {"name": "UCX_NET_DEVICES", "value": p["ucx_net_devices"][p["transport"]]},
        {"name": "POD_IP", "valueFrom": dict(field_ip)},
    ]
    if p["engine"] == "vllm":
        env += [
            {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": dict(field_ip)},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(p["side_channel_port"])},
            {"name": "PYTHONHASHSEED", "value": "1047"},
        ]
    else:
        # The address SGLang's KV managers advertise to the other role (get_local_ip_auto in
        # python/sglang/srt/utils/common.py reads SGLANG_HOST_IP first, else guesses from the default route).
        env.append({"name": "SGLANG_HOST_IP", "valueFrom": dict(field_ip)})
        if p["sglang_transfer_backend"] == "nixl":
            env.append({"name": "SGLANG_DISAGGREGATION_NIXL_BACKEND", "value": "UCX"})
    user = [dict(e) for e in p["env"]]
    user_names = {e["name"] for e in user}
    env += [{"name": k, "value": _k8s_argv.fmt_value(v)} for k, v in sorted(p["kernel_cache_env"].items())
            if k not in user_names]
    if p["hf_token_secret"]:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": p["hf_token_secret"]["name"], "key": p["hf_token_secret"].get("key") or "token"}}})
    return env + user


def _resources(p):
    """The engine role's rule (GPUs exactly, CPU and memory requested per GPU unless given); the RDMA device is
    added by :func:`_k8s_engine.apply_rdma` with the other RDMA knobs."""
    return _k8s_engine.container_resources(_engine_params(p, "prefill"), p["gpus"])


def _front_pod(p, spec):
    """The front's pod (proxy or router): on CPU nodes only.

    It gets neither the engines' tolerations (those admit it to tainted GPU nodes) nor their node selectors; it
    requires nodes without ``front_avoid_node_label`` (a GPU node label) and, when given, ``front_node_selector``.
    A front on a GPU node would take CPU and memory the engine requested there, or a node a GPU pod needs.
    """
    if p["front_node_selector"]:
        spec["nodeSelector"] = dict(p["front_node_selector"])
    if p["front_avoid_node_label"]:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": p["front_avoid_node_label"], "operator": "DoesNotExist"}]}]}}}
    if p["image_pull_secret"]:
        spec["imagePullSecrets"] = [{"name": p["image_pull_secret"]}]
    return spec


def pod_spec(p, role):
    ports = [{"name": "http", "containerPort": p["port"], "protocol": "TCP"}]
    if p["engine"] == "vllm":
        ports.append({"name": "nixl", "containerPort": p["side_channel_port"], "protocol": "TCP"})
    elif role == "prefill":
        ports.append({"name": "bootstrap", "containerPort": p["sglang_bootstrap_port"], "protocol": "TCP"})
    command, args, _final = engine_command(p, role)
    command = _k8s_argv.container_command(_engine_params(p, role), command)
    startup, readiness, liveness = _k8s_engine.probes(p["startup_timeout"], p["probe_period"], p["engine"])
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "model", "mountPath": p["model_path"], "readOnly": True}]
    shm = {"medium": "Memory"}
    if p["shm_size"]:
        shm["sizeLimit"] = p["shm_size"]
    volumes = [{"name": "dshm", "emptyDir": shm},
               {"name": "model", "hostPath": {"path": p["model_host_path"] or p["model_path"], "type": "Directory"}}]
    if p["kernel_cache_dir"]:
        volumes.append({"name": "kernel-cache", "hostPath": {"path": p["kernel_cache_dir"], "type": "Directory"}})
        mounts.append({"name": "kernel-cache", "mountPath": p["kernel_cache_dir"]})
    container = {
        "name": "engine",
        "image": p["image"],
        "imagePullPolicy": p["image_pull_policy"],
        "command": command,
        "args": args,
        "env": engine_env(p),
        "ports": ports,
        "resources": _resources(p),
        "volumeMounts": mounts,
        "startupProbe": startup,
        "readinessProbe": readiness,
        "livenessProbe": liveness,
    }
    # Prefill and decode must land on different nodes: the KV has to cross the network.
    other = "decode" if role == "prefill" else "prefill"
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {MODEL_LABEL: p["model_name"], ROLE_LABEL: other}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    # Each role only on the nodes of its group that staged the revision (the hostPath exists there).
    affinity = _k8s_engine.pin_to_nodes(affinity, p["%s_nodes" % role])
    spec = _k8s_engine.engine_pod_spec(container, volumes, init=p["init"],
                                       node_selector=p["%s_node_selector" % role], affinity=affinity,
                                       tolerations=p["tolerations"], image_pull_secret=p["image_pull_secret"])
    # The same RDMA knobs as a multi-node engine (device resource, IPC_LOCK, hostNetwork, NCCL/Gloo interfaces);
    # the P/D roles' Multus networks come with pod_annotations.
    _k8s_engine.apply_rdma(spec, {}, p["rdma"])
    return spec


def _labels(p, role=None):
    labels = {MODEL_LABEL: p["model_name"], "app.kubernetes.io/managed-by": MANAGED_BY}
    if role:
        labels[ROLE_LABEL] = role
    return labels


def _aibrix_pod_labels(p, port, metric_port):
    """AIBrix's pod labels; ``model.aibrix.ai/metric-port`` only where ``/metrics`` answers on ``metric_port``.

    The gateway scrapes ``http://<podIP>:<metric-port>/metrics`` of every Ready pod of the model
    (pkg/cache/cache_metrics.go, vllm-project/aibrix v0.7.0); advertising a port without /metrics gives a steady
    404 stream. The engines serve /metrics on their HTTP port, SGLang's router on its Prometheus port; the P/D
    proxy serves none, so it advertises none.
    """
    labels = aroute.pod_labels(p["model_name"], port, p["engine"])
    if metric_port:
        labels[AIBRIX_METRIC_PORT] = str(metric_port)
    return labels


def _meta(name, p, labels=None, annotations=None):
    meta = {"name": name, "namespace": p["namespace"], "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    return meta


def _aibrix_config(strategy):
    return json.dumps({"defaultProfile": "default", "profiles": {"default": {"routingStrategy": strategy}}},
                      separators=(",", ":"), sort_keys=True)


def _engine_annotations(p, role, workload):
    ann = dict(p["pod_annotations"])
    if p["engine"] == "sglang" and role == "prefill":
        if workload == "stormservice":
            ann[AIBRIX_SGLANG_BOOTSTRAP_PORT] = str(p["sglang_bootstrap_port"])
        else:
            ann[_pd_checks.SGLANG_ROUTER_BOOTSTRAP_ANNOTATION] = str(p["sglang_bootstrap_port"])
    return ann


def storm_service(p):
    name = names.stormservice_name(p["model_name"])
    roles = []
    for role in _pd_checks.ROLES:
        labels = dict(_labels(p, role), **_aibrix_pod_labels(p, p["port"], p["port"]))
        annotations = _engine_annotations(p, role, "stormservice")
        annotations[AIBRIX_CONFIG] = _aibrix_config(p["routing_strategy"])
        roles.append({
            "name": role,
            "replicas": p["%s_replicas" % role],
            "stateful": True,
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec(p, role)},
        })
    return {
        "apiVersion": "orchestration.aibrix.ai/v1alpha1",
        "kind": "StormService",
        # No model.aibrix.ai/name here: a route controller watching StormServices would route to a Service
        # named exactly the model (AIBrix issue #1321).
        "metadata": _meta(name, p, aroute.workload_labels(_labels(p))),
        "spec": {
            "replicas": 1,
            "stateful": True,
            "updateStrategy": {"type": "InPlaceUpdate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": name}},
                "spec": {"roles": roles},
            },
        },
    }


# --------------------------------------------------------------------------------------------- #
# Deployments with a front
# --------------------------------------------------------------------------------------------- #


def _deployment(name, p, labels, pod, replicas=1, annotations=None, rolling=None, progress_deadline=None):
    selector = {"app.kubernetes.io/name": name}
    template_meta = {"labels": dict(labels, **selector)}
    if annotations:
        template_meta["annotations"] = annotations
    spec = {
        "replicas": replicas,
        "selector": {"matchLabels": selector},
        "template": {"metadata": template_meta, "spec": pod},
    }
    if rolling:
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": dict(rolling)}
    if progress_deadline:
        spec["progressDeadlineSeconds"] = progress_deadline
    # The Deployment's own metadata never carries model.aibrix.ai/name (AIBrix's route controller reads it there).
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(name, p, aroute.workload_labels(labels)), "spec": spec}


def _service(name, p, selector, port, extra_ports=()):
    ports = [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
    ports += [dict(x) for x in extra_ports]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, p, {"app.kubernetes.io/managed-by": MANAGED_BY, MODEL_LABEL: p["model_name"]}),
        "spec": {"type": "ClusterIP", "selector": selector, "ports": ports},
    }


def _front_resources(p, kind):
    return dict(p["proxy_resources"]) if p["proxy_resources"] else json.loads(json.dumps(DEFAULT_FRONT_RESOURCES[kind]))


def _proxy(p, urls):
    proxy = names.object_name(p["model_name"], "pd-proxy")
    config = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(proxy, p, {"app.kubernetes.io/managed-by": MANAGED_BY}),
        "data": {"pd_proxy.py": p["proxy_source"]},
    }
    args = ["--host", "0.0.0.0", "--port", str(p["proxy_port"])]
    for role in _pd_checks.ROLES:
        args += ["--%s" % role, urls[role]]
    # vLLM returns its side-channel host (the pod IP) in kv_transfer_params, so the engines can sit behind
    # Services and no remote_host rewrite is needed. A 128K-token prefill takes minutes, not 30 s.
    args += ["--prefill-timeout", str(p["proxy_prefill_timeout"]), "--decode-timeout", str(p["proxy_decode_timeout"])]
    pod = _front_pod(p, {
        "containers": [{
            "name": "pd-proxy",
            "image": p["proxy_image"],
            "command": ["python3", PROXY_PATH],
            "args": args,
            "ports": [{"name": "http", "containerPort": p["proxy_port"], "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                               "timeoutSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 30, "timeoutSeconds": 5,
                              "failureThreshold": 5},
            "volumeMounts": [{"name": "proxy", "mountPath": "/opt/pd-proxy", "readOnly": True}],
            "resources": _front_resources(p, "proxy"),
        }],
        "volumes": [{"name": "proxy", "configMap": {"name": proxy}}],
        "enableServiceLinks": False,
    })
    return proxy, [config], pod, {}


def router_args(p):
    """SGLang's router in P/D mode, discovering the role pods by label (pod IPs, bootstrap port annotation)."""
    selector = "%s=%s" % (MODEL_LABEL, p["model_name"])
    args = ["-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--host", "0.0.0.0", "--port", str(p["proxy_port"]),
            "--service-discovery", "--service-discovery-namespace", p["namespace"],
            "--service-discovery-port", str(p["port"]),
            "--prefill-selector", selector, "%s=prefill" % ROLE_LABEL,
            "--decode-selector", selector, "%s=decode" % ROLE_LABEL,
            "--bootstrap-port-annotation", _pd_checks.SGLANG_ROUTER_BOOTSTRAP_ANNOTATION,
            "--request-timeout-secs", str(p["proxy_decode_timeout"]),
            "--worker-startup-timeout-secs", str(p["startup_timeout"]),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT)]
    if p["router_policy"]:
        args += ["--policy", p["router_policy"]]
    return args


def _router(p):
    router = names.object_name(p["model_name"], "sglang-router")
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, MODEL_LABEL: p["model_name"]}
    # Service discovery lists and watches pods (sgl_model_gateway.md: "RBAC must allow get, list, and watch on pods").
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(router, p, dict(labels))},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(router, p, dict(labels)),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(router, p, dict(labels)),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": router},
         "subjects": [{"kind": "ServiceAccount", "name": router, "namespace": p["namespace"]}]},
    ]
    pod = _front_pod(p, {
        "serviceAccountName": router,
        "containers": [{
            "name": "sglang-router",
            "image": p["router_image"] or p["image"],
            "imagePullPolicy": p["image_pull_policy"],
            "command": ["python3"],
            "args": router_args(p),
            "ports": [{"name": "http", "containerPort": p["proxy_port"], "protocol": "TCP"},
                      {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"}],
            # /readiness answers 200 once a healthy worker is registered, /liveness always (sgl_model_gateway.md).
            "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 10,
                               "timeoutSeconds": 5, "failureThreshold": 3},
            "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 30,
                              "timeoutSeconds": 5, "failureThreshold": 5},
            "resources": _front_resources(p, "router"),
        }],
        "enableServiceLinks": False,
    })
    return router, rbac, pod, {"metric_port": ROUTER_METRICS_PORT}


def deployments(p):
    base = base_name(p["model_name"])
    objs, urls = [], {}
    for role in _pd_checks.ROLES:
        name = names.object_name(p["model_name"], role)
        objs.append(_deployment(name, p, _labels(p, role), pod_spec(p, role), replicas=p["%s_replicas" % role],
                                annotations=_engine_annotations(p, role, "deployments"),
                                # one GPU node at a time: a surge pod could never schedule beside a TP=8 pod
                                rolling={"maxSurge": 0, "maxUnavailable": 1},
                                # the engine role's rule: a cold start within the startup window is progress
                                progress_deadline=_k8s_engine.progress_deadline(p["startup_timeout"])))
        if p["engine"] == "vllm":
            objs.append(_service(name, p, {"app.kubernetes.io/name": name}, p["port"]))
        urls[role] = "http://%s.%s.svc:%d" % (name, p["namespace"], p["port"])
    if p["engine"] == "vllm":
        front, extra, pod, info = _proxy(p, urls)
    else:
        front, extra, pod, info = _router(p)
    objs.extend(extra)
    front_labels = dict(_labels(p, "front"), **_aibrix_pod_labels(p, p["proxy_port"], info.get("metric_port")))
    annotations = {AIBRIX_CONFIG: _aibrix_config(p["routing_strategy"])} if p["routing_strategy"] else None
    objs.append(_deployment(front, p, front_labels, pod, replicas=p["proxy_replicas"], annotations=annotations))
    # The front's Service has the model's DNS-1035 name; our own <model>-router HTTPRoute points at it.
    objs.append(_service(base, p, {"app.kubernetes.io/name": front}, p["proxy_port"]))
    try:
        routed = aroute.route_objects(
            p["model_name"], base, p["namespace"], p["proxy_port"], gateway_name=p["gateway_name"],
            gateway_namespace=p["gateway_namespace"], request_timeout=p["route_request_timeout"],
            paths=p["route_paths"], labels={"app.kubernetes.io/managed-by": MANAGED_BY, MODEL_LABEL: p["model_name"]})
    except aroute.RouteError as e:
        raise _k8s_checks.SpecError(str(e))
    # Apply order: each role, then the front (what it mounts or runs as first), its Service, the grant and the
    # route to that Service.
    objs.extend(routed["objects"])
    return objs, routed


def _normalise(params):
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None})
    p["ucx_net_devices"] = _normal_net_devices(p["ucx_net_devices"])
    p["engine_args"] = p["engine_args"] if p["engine_args"] is not None else {}
    p["engine_resources"] = p["engine_resources"] or {}
    p["proxy_resources"] = p["proxy_resources"] or {}
    if p["routing_strategy"] is None and p["workload"] == "stormservice":
        p["routing_strategy"] = "pd"
    p["router_policy"] = p["router_policy"] or ""
    return p


def render(params):
    """Validate ``params`` (keys of :data:`DEFAULTS`) and return the objects and derived facts."""
    p = _normalise(params)
    _pd_checks.validate(p)
    _pairs, min_version = _k8s_checks.profile_entry(p["profiles"], p["profile"], p["engine"])
    warnings = _k8s_checks.check_image(p["engine"], p["image"], min_version, p["profile"])
    route = dict(route_name=None, reference_grant_name=None, warnings=[])
    if p["workload"] == "stormservice":
        objects = [storm_service(p)]
        if p["routing_strategy"] != "pd":
            warnings.append(
                "routing_strategy=%s: AIBrix's gateway pairs StormService prefill/decode pods only with the pd "
                "strategy; with another one it sends whole requests to single pods" % p["routing_strategy"])
    else:
        objects, route = deployments(p)
        warnings.extend(route["warnings"])
    problems = aroute.workload_problems(objects)
    if problems:
        raise _k8s_checks.SpecError("; ".join(problems))
    net = _secrets.Scan(env_field="env")
    net.objects(objects)
    net.refuse(_k8s_checks.SpecError)
    _command, _args, final = engine_command(p, "decode")
    if p["routing_strategy"]:  # every request takes AIBrix's original_route and its timeout, not the HTTPRoute's
        try:
            error, note = aroute.original_route_findings(final, p["route_request_timeout"], p["gateway_policies"],
                                                         engine=p["engine"] if p["workload"] == "stormservice" else None)
        except aroute.RouteError as e:
            raise _k8s_checks.SpecError("gateway_policies: %s" % e)
        if error:
            raise _k8s_checks.SpecError("gateway_policies: " + error)
        warnings.extend([note] if note else [])
    reads = _k8s_argv.read_concurrency(p["engine"], p["model_source"], p["prefill_replicas"] + p["decode_replicas"],
                                       p["tp_size"], final)
    startup, _readiness, _liveness = _k8s_engine.probes(p["startup_timeout"], p["probe_period"], p["engine"])
    selectors = {role: _labels(p, role) for role in _pd_checks.ROLES}
    containers = {role: "engine" for role in _pd_checks.ROLES}
    if p["workload"] == "deployments":
        selectors["front"] = _labels(p, "front")
        containers["front"] = "pd-proxy" if p["engine"] == "vllm" else "sglang-router"
        workloads = {role: dict(kind="Deployment", name=names.object_name(p["model_name"], role))
                     for role in _pd_checks.ROLES}
        workloads["front"] = dict(kind="Deployment", name=names.object_name(
            p["model_name"], "pd-proxy" if p["engine"] == "vllm" else "sglang-router"))
    else:
        workloads = {role: dict(kind="StormService", name=names.stormservice_name(p["model_name"]))
                     for role in _pd_checks.ROLES}
    return dict(
        pod_selectors=selectors,
        containers=containers,
        workloads=workloads,
        replicas=dict(prefill=p["prefill_replicas"], decode=p["decode_replicas"],
                      front=p["proxy_replicas"] if p["workload"] == "deployments" else 0),
        nodes=dict(prefill=p["prefill_nodes"], decode=p["decode_nodes"]),
        objects=objects,
        warnings=warnings,
        service_name=base_name(p["model_name"]) if p["workload"] == "deployments" else None,
        route_name=route["route_name"],
        reference_grant_name=route["reference_grant_name"],
        read_concurrency=reads,
        startup_window_seconds=startup["periodSeconds"] * startup["failureThreshold"],
        progress_deadline_seconds=_k8s_engine.progress_deadline(p["startup_timeout"]),
    )


def build(params):
    """The rendered objects only (see :func:`render`)."""
    return render(params)["objects"]
