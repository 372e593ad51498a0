# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the checks of a prefill/decode pair's inputs, before any object is built from them.

A bad input raises :class:`_k8s_checks.SpecError` naming the field and the fix, the engine's error: the inputs the
roles share with one engine (credentials, profile, init, quantities, staged nodes, RDMA knobs, tolerations, flags
the collection sets) go through :mod:`_k8s_checks`' own checks, and the pair's objects (:mod:`_pd_manifests`) are
built only from inputs that passed.

* :func:`validate` - every P/D input of :data:`_pd_manifests.DEFAULTS`, credentials first (no later message can
  then quote one); normalises ``env``, ``rdma``, ``prefill_nodes`` and ``decode_nodes`` in place.
* :func:`check_credentials` - the engine role's credential rule on the P/D inputs, and the variables the
  renderer sets on every engine container (:data:`MANAGED_ENV`) kept out of ``env``.
* :func:`check_net_devices` - ``ucx_net_devices`` named the way UCX names each transport's devices.
"""
from __future__ import annotations

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube._k8s_checks import SpecError
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names

# The pair's roles; each has its own <role>_replicas, <role>_nodes and <role>_node_selector inputs.
ROLES = ("prefill", "decode")
# sglang_router: --bootstrap-port-annotation default (router_args.py), read from prefill pods by service discovery.
SGLANG_ROUTER_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
# sglang_router --policy choices (sgl-model-gateway/bindings/python/src/sglang_router/router_args.py).
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")

# Environment the renderer sets on every engine container; env entries cannot replace them.
MANAGED_ENV = frozenset({"UCX_TLS", "UCX_NET_DEVICES", "POD_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST",
                         "VLLM_NIXL_SIDE_CHANNEL_PORT", "PYTHONHASHSEED", "SGLANG_DISAGGREGATION_NIXL_BACKEND",
                         "SGLANG_HOST_IP"})

# Engine flags the P/D renderer sets; engine_args/extra_args cannot set them.
PD_FLAGS = {
    "vllm": {"kv-transfer-config": "kv_connector / kv_buffer_device"},
    "sglang": {"disaggregation-mode": "the role (prefill/decode)",
               "disaggregation-transfer-backend": "sglang_transfer_backend",
               "disaggregation-bootstrap-port": "sglang_bootstrap_port",
               "disaggregation-ib-device": "sglang_ib_device"},
}

_IB_PORT_DEVICE = re.compile(r"^[A-Za-z0-9_.-]+:[0-9]+$")
_BARE_IB_DEVICE = re.compile(r"^(mlx5|mlx4|bnxt_re|irdma|efa|ionic|hfi1|qedr|rxe)_?[0-9]+$")


def check_net_devices(transport, devices):
    """UCX names devices per transport: IB transports ``mlx5_0:1``, tcp the netdev (``eth0``)."""
    items = [d.strip() for d in str(devices).split(",") if d.strip()]
    if not items:
        raise SpecError("ucx_net_devices.%s: empty; name the devices UCX may use, or 'all'" % transport)
    for item in items:
        if item == "all":
            continue
        if transport == "tcp" and _IB_PORT_DEVICE.match(item):
            raise SpecError(
                "ucx_net_devices.tcp: %r is an RDMA device:port. UCX's tcp transport lists its devices from "
                "/sys/class/net, so with only RDMA names it has no network device and the TCP run cannot "
                "connect; set ucx_net_devices.tcp to the pod's interface (eth0, or the Multus one such as net1)"
                % item)
        if transport == "rdma" and _BARE_IB_DEVICE.match(item):
            raise SpecError(
                "ucx_net_devices.rdma: %r has no port; UCX names RDMA devices device:port (%s:1, see "
                "'ucx_info -d'), so the bare name matches nothing" % (item, item))


def _check_resources(value, field, forbidden):
    if not isinstance(value, dict) or set(value) - {"requests", "limits"}:
        raise SpecError("%s: must be {requests: {cpu: ..., memory: ...}, limits: {...}}" % field)
    for part, quantities in value.items():
        if not isinstance(quantities, dict):
            raise SpecError("%s.%s: must be a mapping of resource name to quantity" % (field, part))
        for name, qty in quantities.items():
            if name in forbidden:
                raise SpecError("%s.%s: do not set %s here; %s" % (field, part, name, forbidden[name]))
            if not _k8s_checks.QUANTITY.match(str(qty)):
                raise SpecError("%s.%s.%s: %r is not a Kubernetes quantity such as 16, 500m or 128Gi"
                                % (field, part, name, qty))


def _check_int(p, field, low, high=None):
    value = p[field]
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        raise SpecError("%s: must be an integer %s, got %r"
                        % (field, ">= %d" % low if high is None else "in %d..%d" % (low, high), value))


def check_credentials(p):
    """Refuse plain-text credentials (the engine role's rule); normalises ``p["env"]``."""
    for field, kind in (("extra_args", list), ("engine_args", dict), ("kernel_cache_env", dict), ("env", list)):
        if not isinstance(p[field], kind):
            raise SpecError("%s: must be a %s" % (field, "mapping" if kind is dict else "list"))
    if not all(isinstance(a, str) for a in p["extra_args"]):
        raise SpecError("extra_args: must be a list of strings")
    q = dict(engine_args=p["engine_args"], kernel_cache_env=p["kernel_cache_env"], extra_args=p["extra_args"],
             hf_token_secret=p["hf_token_secret"], env=p["env"], command=None)
    _k8s_checks.check_credentials(q)
    p["env"] = q["env"]
    rdma_env = (("NCCL_IB_HCA", "nccl_ib_hca"), ("NCCL_SOCKET_IFNAME", "socket_ifname"),
                ("GLOO_SOCKET_IFNAME", "socket_ifname"))
    managed = set(MANAGED_ENV) | {name for name, key in rdma_env if p.get(key)}
    taken = sorted(managed.intersection(e["name"] for e in p["env"]))
    if taken:
        raise SpecError("env: %s is set by the collection (transport, NIXL side channel, advertised host and hash "
                        "seed must match the rest of the pair); use ucx_tls, ucx_net_devices, side_channel_port, "
                        "nccl_ib_hca, socket_ifname instead" % ", ".join(taken))
    if p["hf_token_secret"] and "HF_TOKEN" in [e["name"] for e in p["env"]]:
        raise SpecError("env: HF_TOKEN is rendered from hf_token_secret; drop one of the two")


def _check_flags(p):
    _k8s_checks.check_args(p["engine"], p["engine_args"], p["extra_args"])
    owned = PD_FLAGS[p["engine"]]
    for flag in p["engine_args"]:
        if flag.lstrip("-") in owned:
            raise SpecError("engine_args: %r is set by pd_manifests for each role; use %s"
                            % (flag, owned[flag.lstrip("-")]))
    for tok in p["extra_args"]:
        name = _k8s_checks.flag_name(tok)
        if name in owned:
            raise SpecError("extra_args: %r is set by pd_manifests for each role; use %s" % (tok, owned[name]))


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
    _k8s_checks.profile_entry(p["profiles"], p["profile"], p["engine"])
    if p["init"]:
        _k8s_checks.init_flavour(p["init"])
    _k8s_checks.check_quantity("engine_cpu_request", p["engine_cpu_request"], cpu=True)
    _k8s_checks.check_quantity("engine_memory_request", p["engine_memory_request"])
    if p["model_source"] not in _k8s_checks.LOADER_THREADS:
        raise SpecError("model_source: %r is not staged_nvme or shared_fs" % (p["model_source"],))
    if p["transport"] not in p["ucx_tls"]:
        raise SpecError("ucx_tls: no entry for transport %r (keys: %s); add the UCX_TLS value for it"
                        % (p["transport"], ", ".join(sorted(p["ucx_tls"]))))
    for transport in sorted(set(p["ucx_tls"]) & {"rdma", "tcp"}):
        check_net_devices(transport, p["ucx_net_devices"].get(transport, ""))
    if p["engine"] == "sglang" and p["sglang_transfer_backend"] == "mooncake" and p["transport"] == "tcp":
        raise SpecError(
            "transport: tcp with sglang_transfer_backend mooncake: Mooncake moves the KV over RDMA and ignores "
            "UCX_TLS, so this would be no TCP run (AIBrix samples/disaggregation/sglang/README.md: mooncake "
            "requires RDMA); use sglang_transfer_backend nixl for the TCP control")
    if not names.is_label_value(p["model_name"]):
        raise SpecError("model_name: %r is not a valid label value (at most 63 characters, alphanumerics, "
                        "'-', '_', '.'); AIBrix matches it against the model.aibrix.ai/name label"
                        % p["model_name"])
    if not names.is_dns1123_label(p["namespace"]):
        raise SpecError("namespace: %r is not a DNS-1123 label" % p["namespace"])
    for field in ("model_path", "model_host_path", "kernel_cache_dir"):
        if p[field] and not os.path.isabs(p[field]):
            raise SpecError("%s: %r must be an absolute path" % (field, p[field]))
    for field, low, high in (("tp_size", 1, None), ("gpus", 1, None), ("port", 1, 65535),
                             ("side_channel_port", 1, 65535), ("sglang_bootstrap_port", 1, 65535),
                             ("proxy_port", 1, 65535), ("prefill_replicas", 1, None), ("decode_replicas", 1, None),
                             ("proxy_replicas", 1, None), ("startup_timeout", 60, None), ("probe_period", 1, None),
                             ("rdma_count", 1, None), ("proxy_prefill_timeout", 1, None),
                             ("proxy_decode_timeout", 1, None)):
        _check_int(p, field, low, high)
    if p["gpus"] < p["tp_size"]:
        raise SpecError("gpus: %d GPUs cannot hold tensor parallel size %d; set gpus >= tp_size"
                        % (p["gpus"], p["tp_size"]))
    if p["workload"] == "deployments" and p["engine"] == "vllm" and not p["proxy_source"]:
        raise SpecError("proxy_source: the P/D proxy source is required for workload deployments with vLLM")
    if p["workload"] == "deployments" and p["engine"] == "vllm" and not p["proxy_image"]:
        raise SpecError("proxy_image: required for workload deployments with vLLM, and a site choice: an image with "
                        "Python 3.9+ from your registry, pinned by digest (for example a mirror of python:3.11-slim); "
                        "the proxy runs pd_proxy.py from a ConfigMap and needs nothing else")
    if not isinstance(p["front_node_selector"], dict):
        raise SpecError("front_node_selector: must be a mapping of node label to value (the front's non-GPU nodes)")
    if p["front_avoid_node_label"] and not isinstance(p["front_avoid_node_label"], str):
        raise SpecError("front_avoid_node_label: must be a node label key such as nvidia.com/gpu.present")
    for role in ROLES:
        p["%s_nodes" % role] = _k8s_checks.check_staged_nodes(
            p["%s_nodes" % role], p["%s_replicas" % role] if p["model_source"] == "staged_nvme" else 0,
            field="%s_nodes" % role, what="%s_replicas" % role, hint="lower %s_replicas" % role)
    both = sorted(set(p["prefill_nodes"] or []) & set(p["decode_nodes"] or []))
    if both:
        raise SpecError("prefill_nodes, decode_nodes: %s are in both; a node serves one role (prefill and decode "
                        "pods each take a whole GPU node), so put each host in one group" % ", ".join(both))
    p["rdma"] = _k8s_checks.check_rdma(dict(
        resource=p["rdma_resource"] or "", count=p["rdma_count"], host_network=p["host_network"],
        nccl_ib_hca=p["nccl_ib_hca"], socket_ifname=p["socket_ifname"]))
    ports = [p["port"], p["side_channel_port"]] + ([p["sglang_bootstrap_port"]] if p["engine"] == "sglang" else [])
    if len(set(ports)) != len(ports):
        raise SpecError("side_channel_port: %d collides with another port of the pod (%s); pick a free port"
                        % (p["side_channel_port"], ports))
    if p["engine"] == "vllm" and p["kv_buffer_device"] not in ("cuda", "cpu"):
        raise SpecError("kv_buffer_device: %r is not cuda or cpu" % p["kv_buffer_device"])
    if p["routing_strategy"] == "pd" and p["workload"] == "deployments":
        raise SpecError(
            "routing_strategy: pd pairs StormService pods by roleset-name/role-name, which workload deployments "
            "does not have (its front pairs the roles); leave routing_strategy unset (the gateway then follows "
            "the <model>-router HTTPRoute) or use workload stormservice")
    if p["router_policy"] and p["router_policy"] not in ROUTER_POLICIES:
        raise SpecError("router_policy: %r is not one of SGLang's router policies (%s)"
                        % (p["router_policy"], ", ".join(ROUTER_POLICIES)))
    _k8s_checks.check_shm_size(p["shm_size"])
    _k8s_checks.check_hf_token_secret(p["hf_token_secret"])
    _k8s_checks.check_image_pull_secret(p["image_pull_secret"])
    if not isinstance(p["pod_annotations"], dict) or not all(isinstance(v, str) for v in p["pod_annotations"].values()):
        raise SpecError("pod_annotations: must be a mapping of annotation name to string value "
                        "(e.g. k8s.v1.cni.cncf.io/networks: rdma-net)")
    for key in p["pod_annotations"]:
        if key.startswith("model.aibrix.ai/") or key == SGLANG_ROUTER_BOOTSTRAP_ANNOTATION:
            raise SpecError("pod_annotations: %r is set by the collection (routing strategy, bootstrap port)" % key)
    forbidden = {p["gpu_resource"]: "gpus sets it", p["rdma_resource"] or "-": "rdma_resource/rdma_count set it"}
    _check_resources(p["engine_resources"], "engine_resources", forbidden)
    _check_resources(p["proxy_resources"], "proxy_resources", {})
    _k8s_checks.check_tolerations(p["tolerations"])
    for role in ROLES:
        selector = p["%s_node_selector" % role]
        if not isinstance(selector, dict):
            raise SpecError("%s_node_selector: must be a mapping of node label to value" % role)
    _check_flags(p)
