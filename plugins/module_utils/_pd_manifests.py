# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: Kubernetes objects for a prefill/decode pair over NIXL/UCX.

Two full engines (TP=8 by default) on different nodes, with vLLM ``--kv-transfer-config`` NixlConnector
or SGLang ``--disaggregation-mode``. ``transport`` picks the ``UCX_TLS`` value and nothing else, so an
RDMA rendering and a TCP rendering differ only in that environment variable.

Workloads (``workload``):

* ``stormservice``: one AIBrix StormService with roles ``prefill`` and ``decode``; the pods carry the
  ``model.aibrix.ai/config`` annotation with ``routingStrategy`` (default ``pd``), without which the
  gateway answers 503 (StormService gets no HTTPRoute).
* ``deployments``: a Deployment + Service per role plus the collection's P/D proxy (a ConfigMap with
  its source, a Deployment and a Service named after the model).

Credentials are refused in ``env`` and ``extra_args`` and in the built objects by the one rule in
:mod:`_secrets`; a Secret is referenced through an ``env`` entry with ``valueFrom.secretKeyRef``.
"""
from __future__ import annotations

import json

from ansible_collections.llmops.serving.plugins.module_utils import _k8s_names as names
from ansible_collections.llmops.serving.plugins.module_utils import _secrets

AIBRIX_NAME = "model.aibrix.ai/name"
AIBRIX_PORT = "model.aibrix.ai/port"
AIBRIX_ENGINE = "model.aibrix.ai/engine"
AIBRIX_CONFIG = "model.aibrix.ai/config"
ROLE_LABEL = "llmops.serving/pd-role"
MODEL_LABEL = "llmops.serving/pd-model"
MANAGED_BY = "llmops.serving"
ROLES = ("prefill", "decode")
PROXY_PATH = "/opt/pd-proxy/pd_proxy.py"


# Environment the renderer sets on every engine container; env entries cannot replace them.
MANAGED_ENV = frozenset({"UCX_TLS", "UCX_NET_DEVICES", "POD_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST",
                         "VLLM_NIXL_SIDE_CHANNEL_PORT", "PYTHONHASHSEED", "SGLANG_DISAGGREGATION_NIXL_BACKEND"})


class SpecError(ValueError):
    """Bad input; the message names the field and the fix. ``secret_values``: refused credentials, never shown."""

    secret_values = ()


DEFAULTS = dict(
    engine="vllm", transport="rdma", workload="stormservice", namespace="llm", model_name=None,
    image=None, model_path=None, model_host_path=None, tp_size=8, gpus=8, port=8000,
    extra_args=[], env=[], ucx_tls={"rdma": "rc,ud,sm,self,cuda_copy,cuda_ipc", "tcp": "tcp,sm,self,cuda_copy,cuda_ipc"},
    ucx_net_devices="all", side_channel_port=5600, kv_connector="NixlConnector", kv_buffer_device="cuda",
    sglang_transfer_backend="nixl", sglang_ib_device="", sglang_bootstrap_port=8998,
    rdma_resource="rdma/rdma_shared_device_a", rdma_count=1, prefill_node_selector={},
    decode_node_selector={}, shm_size="64Gi", routing_strategy="pd", proxy_image="python:3.11-slim",
    proxy_port=8000, proxy_source="",
)


def check_credentials(p):
    """Refuse plain-text credentials in env and extra_args; normalises ``p["env"]``."""
    if not isinstance(p["extra_args"], list) or not all(isinstance(a, str) for a in p["extra_args"]):
        raise SpecError("extra_args: must be a list of strings")
    scan = _secrets.Scan(env_field="env")
    p["env"] = scan.env(p["env"], "env", SpecError)
    scan.argv(p["extra_args"], "extra_args")
    scan.refuse(SpecError)
    taken = sorted(MANAGED_ENV.intersection(e["name"] for e in p["env"]))
    if taken:
        raise SpecError("env: %s is set by the collection (transport, NIXL side channel and hash seed must match "
                        "the rest of the pair); use ucx_tls, ucx_net_devices, side_channel_port instead"
                        % ", ".join(taken))


def validate(p):
    # Credentials first: no later message can then quote one.
    check_credentials(p)
    for key in ("model_name", "image", "model_path"):
        if not p.get(key):
            raise SpecError("%s: required" % key)
    if p["engine"] not in ("vllm", "sglang"):
        raise SpecError("engine: %r is not vllm or sglang" % p["engine"])
    if p["workload"] not in ("stormservice", "deployments"):
        raise SpecError("workload: %r is not stormservice or deployments" % p["workload"])
    if p["transport"] not in p["ucx_tls"]:
        raise SpecError("ucx_tls: no entry for transport %r (keys: %s); add the UCX_TLS value for it"
                        % (p["transport"], ", ".join(sorted(p["ucx_tls"]))))
    if not names.is_label_value(p["model_name"]):
        raise SpecError("model_name: %r is not a valid label value (at most 63 characters, alphanumerics, "
                        "'-', '_', '.'); AIBrix matches it against the model.aibrix.ai/name label"
                        % p["model_name"])
    if not names.is_dns1123_label(p["namespace"]):
        raise SpecError("namespace: %r is not a DNS-1123 label" % p["namespace"])
    if p["tp_size"] < 1 or p["gpus"] < p["tp_size"]:
        raise SpecError("gpus: %d GPUs cannot hold tensor parallel size %d; set gpus >= tp_size"
                        % (p["gpus"], p["tp_size"]))
    if p["workload"] == "deployments" and not p["proxy_source"]:
        raise SpecError("proxy_source: the P/D proxy source is required for workload deployments")
    ports = [p["port"], p["side_channel_port"]] + ([p["sglang_bootstrap_port"]] if p["engine"] == "sglang" else [])
    if len(set(ports)) != len(ports):
        raise SpecError("side_channel_port: %d collides with another port of the pod (%s); pick a free port"
                        % (p["side_channel_port"], ports))
    if p["engine"] == "vllm" and p["kv_buffer_device"] not in ("cuda", "cpu"):
        raise SpecError("kv_buffer_device: %r is not cuda or cpu" % p["kv_buffer_device"])


def base_name(model_name):
    """DNS-1035 object name for the model (Service names are the strictest)."""
    return names.dns1035_name(model_name)


def engine_argv(p, role):
    if p["engine"] == "vllm":
        kv = {"kv_connector": p["kv_connector"], "kv_role": "kv_both", "kv_buffer_device": p["kv_buffer_device"]}
        argv = ["vllm", "serve", p["model_path"], "--served-model-name", p["model_name"],
                "--host", "0.0.0.0", "--port", str(p["port"]),
                "--tensor-parallel-size", str(p["tp_size"]),
                "--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    else:
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", p["model_path"],
                "--served-model-name", p["model_name"], "--host", "0.0.0.0", "--port", str(p["port"]),
                "--tp-size", str(p["tp_size"]), "--enable-metrics",
                "--disaggregation-mode", role,
                "--disaggregation-transfer-backend", p["sglang_transfer_backend"],
                "--disaggregation-bootstrap-port", str(p["sglang_bootstrap_port"])]
        if p["sglang_ib_device"]:
            argv += ["--disaggregation-ib-device", p["sglang_ib_device"]]
    return argv + list(p["extra_args"])


def engine_env(p):
    env = [
        {"name": "UCX_TLS", "value": p["ucx_tls"][p["transport"]]},
        {"name": "UCX_NET_DEVICES", "value": p["ucx_net_devices"]},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if p["engine"] == "vllm":
        env += [
            {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(p["side_channel_port"])},
            {"name": "PYTHONHASHSEED", "value": "1047"},
        ]
    elif p["sglang_transfer_backend"] == "nixl":
        env.append({"name": "SGLANG_DISAGGREGATION_NIXL_BACKEND", "value": "UCX"})
    return env + [dict(e) for e in p["env"]]


def pod_spec(p, role):
    ports = [{"name": "http", "containerPort": p["port"], "protocol": "TCP"}]
    if p["engine"] == "vllm":
        ports.append({"name": "nixl", "containerPort": p["side_channel_port"], "protocol": "TCP"})
    else:
        ports.append({"name": "bootstrap", "containerPort": p["sglang_bootstrap_port"], "protocol": "TCP"})
    resources = {"nvidia.com/gpu": str(p["gpus"])}
    if p["rdma_resource"]:
        resources[p["rdma_resource"]] = str(p["rdma_count"])
    container = {
        "name": "engine",
        "image": p["image"],
        "command": engine_argv(p, role)[:1],
        "args": engine_argv(p, role)[1:],
        "env": engine_env(p),
        "ports": ports,
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        # IPC_LOCK lifts RLIMIT_MEMLOCK for verbs memory registration (else ibv_create_cq ENOMEM).
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "model", "mountPath": p["model_path"], "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                           "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": 360},
    }
    spec = {
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": p["shm_size"]}},
            {"name": "model", "hostPath": {"path": p["model_host_path"] or p["model_path"], "type": "Directory"}},
        ],
        "terminationGracePeriodSeconds": 60,
    }
    selector = p["%s_node_selector" % role]
    if selector:
        spec["nodeSelector"] = dict(selector)
    # Prefill and decode must land on different nodes: the KV has to cross the network.
    other = "decode" if role == "prefill" else "prefill"
    spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {MODEL_LABEL: p["model_name"], ROLE_LABEL: other}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    return spec


def _labels(p, role=None, aibrix=True, port=None):
    """Pod labels. AIBrix labels go only where the gateway may send traffic: the StormService pods
    (paired by the pd strategy) or the proxy (behind the model's HTTPRoute), never bare engines."""
    labels = {MODEL_LABEL: p["model_name"], "app.kubernetes.io/managed-by": MANAGED_BY}
    if aibrix:
        labels.update({AIBRIX_NAME: p["model_name"], AIBRIX_PORT: str(port or p["port"]),
                       AIBRIX_ENGINE: p["engine"]})
    if role:
        labels[ROLE_LABEL] = role
    return labels


def _meta(name, p, labels=None, annotations=None):
    meta = {"name": name, "namespace": p["namespace"], "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    return meta


def _aibrix_config(p):
    return json.dumps({"defaultProfile": "default",
                       "profiles": {"default": {"routingStrategy": p["routing_strategy"]}}},
                      separators=(",", ":"), sort_keys=True)


def storm_service(p):
    name = base_name(p["model_name"])
    roles = []
    for role in ROLES:
        roles.append({
            "name": role,
            "replicas": 1,
            "stateful": True,
            "template": {
                "metadata": {"labels": _labels(p, role),
                             "annotations": {AIBRIX_CONFIG: _aibrix_config(p)}},
                "spec": pod_spec(p, role),
            },
        })
    return {
        "apiVersion": "orchestration.aibrix.ai/v1alpha1",
        "kind": "StormService",
        "metadata": _meta(name, p, _labels(p)),
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


def _deployment(name, p, labels, pod):
    selector = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, p, labels),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": dict(labels, **selector)}, "spec": pod},
        },
    }


def _service(name, p, selector, port):
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, p, {"app.kubernetes.io/managed-by": MANAGED_BY}),
        "spec": {"selector": selector,
                 "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]},
    }


def deployments(p):
    base = base_name(p["model_name"])
    objs = []
    urls = {}
    for role in ROLES:
        name = names.dns1035_name("%s-%s" % (base, role))
        objs.append(_deployment(name, p, _labels(p, role, aibrix=False), pod_spec(p, role)))
        objs.append(_service(name, p, {"app.kubernetes.io/name": name}, p["port"]))
        urls[role] = "http://%s.%s.svc:%d" % (name, p["namespace"], p["port"])
    proxy = names.dns1035_name("%s-pd-proxy" % base)
    objs.append({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(proxy, p, {"app.kubernetes.io/managed-by": MANAGED_BY}),
        "data": {"pd_proxy.py": p["proxy_source"]},
    })
    proxy_pod = {
        "containers": [{
            "name": "pd-proxy",
            "image": p["proxy_image"],
            "command": ["python3", PROXY_PATH],
            # The engines' Services resolve to pod IPs; vLLM returns its side-channel host (the pod IP)
            # in kv_transfer_params, so no rewrite is needed.
            "args": ["--host", "0.0.0.0", "--port", str(p["proxy_port"]),
                     "--prefill", urls["prefill"], "--decode", urls["decode"]],
            "ports": [{"name": "http", "containerPort": p["proxy_port"], "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
            "volumeMounts": [{"name": "proxy", "mountPath": "/opt/pd-proxy", "readOnly": True}],
            "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        }],
        "volumes": [{"name": "proxy", "configMap": {"name": proxy}}],
    }
    # The proxy Service takes the model's name, so clients use one address for the pair.
    # AIBrix (Deployment mode) creates the HTTPRoute <model>-router to the Service named after the model:
    # the proxy carries the AIBrix labels so that route reaches the pair through the proxy.
    objs.append(_deployment(proxy, p, _labels(p, "proxy", port=p["proxy_port"]), proxy_pod))
    objs.append(_service(base, p, {"app.kubernetes.io/name": proxy}, p["proxy_port"]))
    return objs


def build(params):
    p = dict(DEFAULTS)
    p.update({k: v for k, v in params.items() if v is not None})
    validate(p)
    objects = [storm_service(p)] if p["workload"] == "stormservice" else deployments(p)
    net = _secrets.Scan(env_field="env")
    net.objects(objects)
    net.refuse(SpecError)
    return objects
