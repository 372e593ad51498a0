#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: pd_manifests
short_description: Render Kubernetes objects for a prefill/decode pair (xPyD) over NIXL/UCX
version_added: "0.1.0"
description:
  - Builds O(prefill_replicas) prefill and O(decode_replicas) decode engines, each a full engine with O(gpus) GPUs,
    prefill and decode kept on different nodes by pod anti-affinity.
  - Each engine runs the command line M(llmops.serving.engine_manifests) builds for the same O(profile), O(profiles),
    O(engine_args), O(extra_args), O(model_source) and O(loader_threads) (C(--kv-cache-dtype), C(--max-model-len),
    parsers, loader strategy), plus the P/D flags - vLLM C(--kv-transfer-config) with O(kv_connector); SGLang
    C(--disaggregation-mode prefill|decode), O(sglang_transfer_backend), O(sglang_bootstrap_port) and
    O(sglang_ib_device). Those flags cannot be given through O(engine_args) or O(extra_args).
  - O(transport) selects C(UCX_TLS) from O(ucx_tls) and C(UCX_NET_DEVICES) from O(ucx_net_devices) and changes nothing
    else, so an RDMA and a TCP rendering differ only in these two variables.
  - Every engine pod gets C(VLLM_NIXL_SIDE_CHANNEL_HOST) (vLLM) or C(SGLANG_HOST_IP) (SGLang) from the pod IP, the
    RDMA device resource O(rdma_resource), the C(IPC_LOCK) capability (lifts the memlock limit for verbs
    registration), C(/dev/shm) on a memory emptyDir, CPU and memory requests (not BestEffort), the engine role's
    probes with a startup window of O(startup_timeout), and C(shareProcessNamespace) unless O(init) names an init.
  - O(workload=stormservice) renders an AIBrix StormService with roles C(prefill) and C(decode); the pods carry the
    AIBrix labels (with C(model.aibrix.ai/metric-port)), C(model.aibrix.ai/sglang-bootstrap-port) on SGLang prefill
    pods and the C(model.aibrix.ai/config) annotation with O(routing_strategy) (default C(pd)); without a strategy
    the AIBrix gateway answers 503 for StormService models. AIBrix's prefill request timeout
    (C(AIBRIX_PREFILL_REQUEST_TIMEOUT) on the gateway-plugins Deployment, 60 s in the v0.7.0 install, 30 s where
    it is unset) can kill very long prefills, and the whole answer must fit in C(original_route)'s timeout (see
    O(gateway_policies)).
  - O(workload=deployments) renders a Deployment per role and a front that pairs them - the collection's P/D proxy
    for vLLM (ConfigMap with O(proxy_source)), SGLang's own router for SGLang (C(sglang_router.launch_router
    --pd-disaggregation) with Kubernetes service discovery, its ServiceAccount, Role and RoleBinding) - behind a
    Service with the model's DNS-1035 name, the HTTPRoute C(<model>-router) in O(gateway_namespace) and a
    ReferenceGrant for that Service. Only the front pods carry the AIBrix labels; no workload carries
    C(model.aibrix.ai/name) in its own metadata, so AIBrix's route controller never creates a route to a Service
    named exactly the model (impossible for a dotted name such as C(glm-5.2-fp8)).
  - With O(render_dir) the objects are written there as YAML with a C(kustomization.yaml); files it rendered before and
    no longer produces are removed.
  - Plain-text credentials are refused in O(env), O(kernel_cache_env), O(engine_args), O(extra_args) and the built
    objects, by the rule of M(llmops.serving.engine_manifests) (names ending in C(TOKEN), C(KEY), C(SECRET),
    C(PASSWORD) and the like, C(--api-key)/C(--hf-token) values, token-shaped values); the error names the field,
    never the value. Reference a Secret instead (O(hf_token_secret), an O(env) entry with C(valueFrom.secretKeyRef),
    C($(NAME)) in arguments).
options:
  transport:
    description: KV transport; picks C(UCX_TLS) from O(ucx_tls) and C(UCX_NET_DEVICES) from O(ucx_net_devices).
    type: str
    choices: [rdma, tcp]
    default: rdma
  workload:
    description:
      - The Kubernetes workload of the pair - an AIBrix StormService, or plain Deployments with a P/D front.
      - C(mode) is a deprecated alias, removed in 1.0.0 (in the roles C(*_k8s_mode) means apply or render).
    type: str
    choices: [stormservice, deployments]
    default: stormservice
    aliases: [mode]
  namespace:
    description: Namespace of every object except the HTTPRoute (which lives in O(gateway_namespace)).
    type: str
    default: llm
  model_name:
    description:
      - Served model name (C(model.aibrix.ai/name) label, C(--served-model-name), request C(model)); at most 63
        characters; dots allowed.
    type: str
    required: true
  image:
    description: Engine image (with NIXL for vLLM; C(lmsysorg/sglang) for SGLang).
    type: str
    required: true
  image_pull_policy:
    description: C(imagePullPolicy) of the engine and router containers.
    type: str
    default: IfNotPresent
  image_pull_secret:
    description: Name of a Secret of type C(kubernetes.io/dockerconfigjson) every pod pulls its image with.
    type: str
  model_path:
    description: Model directory inside the container.
    type: str
    required: true
  model_host_path:
    description: Node directory mounted read-only at O(model_path) (default the same path).
    type: str
  model_source:
    description: Where the weights are read from; picks the loader strategy as M(llmops.serving.engine_manifests) does.
    type: str
    choices: [staged_nvme, shared_fs]
    default: staged_nvme
  loader_threads:
    description: Loader threads per TP rank (default by O(model_source), as M(llmops.serving.engine_manifests)).
    type: int
  tp_size:
    description: Tensor-parallel size of each engine.
    type: int
    default: 8
  gpus:
    description: GPUs (O(gpu_resource)) per engine pod.
    type: int
    default: 8
  port:
    description: Engine HTTP port.
    type: int
    default: 8000
  profile:
    description:
      - Engine profile from O(profiles), as M(llmops.serving.engine_manifests) O(llmops.serving.engine_manifests#module:profile).
        C(none) (built in) adds no tuning flags.
    type: str
    default: none
  profiles:
    description: >-
      Profile definitions, C(name -> {description, vllm: {min_version, args}, sglang: {min_version, args}}).
    type: dict
    default: {}
  engine_args:
    description:
      - Engine flags (without C(--)) applied after the profile and the loader settings, as
        M(llmops.serving.engine_manifests); C(true) is a bare flag, C(null) removes a profile flag.
      - Not written to the target's log; the values are rendered and returned as they are.
    type: dict
    default: {}
  extra_args:
    description:
      - Extra engine arguments for both roles.
      - C(--api-key x) and C(--api-key=x) are refused; write C(--api-key=$(API_KEY)) with C(API_KEY) an O(env)
        entry from C(valueFrom.secretKeyRef).
      - Not written to the target's log; the values are rendered and returned as they are.
    type: list
    elements: str
    default: []
  init:
    description:
      - Path of C(tini) or C(dumb-init) in the image; the engine then runs under it and exits with the engine's status.
      - Unset, the engine pods get C(shareProcessNamespace=true) so the pause container is PID 1 and the engine is not.
    type: str
  env:
    description:
      - Extra env entries of both engine containers (C(name) with C(value) or C(valueFrom)); numbers and
        booleans become strings. For example C(UCX_IB_GID_INDEX), C(NCCL_IB_GID_INDEX), C(NCCL_SOCKET_IFNAME),
        C(NCCL_IB_HCA).
      - C(valueFrom) holds one of C(secretKeyRef) or C(configMapKeyRef) (both with C(name) and C(key)),
        C(fieldRef) or C(resourceFieldRef). Credentials (C(HF_TOKEN), C(VLLM_API_KEY), C(AWS_SECRET_ACCESS_KEY))
        must use C(valueFrom.secretKeyRef).
      - The variables the module sets (C(UCX_TLS), C(UCX_NET_DEVICES), C(POD_IP), C(VLLM_NIXL_SIDE_CHANNEL_HOST),
        C(VLLM_NIXL_SIDE_CHANNEL_PORT), C(PYTHONHASHSEED), C(SGLANG_DISAGGREGATION_NIXL_BACKEND), C(SGLANG_HOST_IP))
        are refused.
      - Not written to the target's log; the values are rendered and returned as they are.
    type: list
    elements: dict
    default: []
  hf_token_secret:
    description: C({name, key}) of the Secret the engines read C(HF_TOKEN) from (key default C(token)).
    type: dict
  kernel_cache_dir:
    description: Node directory with the compiled-kernel caches, mounted at the same path in the engine containers.
    type: path
  kernel_cache_env:
    description: Environment pointing the engines' caches into O(kernel_cache_dir) (C(TRITON_CACHE_DIR) and the like).
    type: dict
    default: {}
  ucx_tls:
    description: C(UCX_TLS) value per transport (keys C(rdma) and C(tcp)).
    type: dict
    default: {rdma: "rc,ud,sm,self,cuda_copy,cuda_ipc", tcp: "tcp,sm,self,cuda_copy,cuda_ipc"}
  ucx_net_devices:
    description:
      - >-
        C(UCX_NET_DEVICES) per transport, C({rdma: <device:port list>, tcp: <netdev list>}); missing keys keep the
        defaults C(all) (rdma) and C(eth0) (tcp).
      - UCX's RDMA transports name devices C(mlx5_0:1) (C(ucx_info -d)); its tcp transport lists network
        interfaces from C(/sys/class/net) (C(eth0), the Multus interface C(net1), C(bond0)), so an RDMA name in the
        C(tcp) entry (or a port-less C(mlx5_0) in the C(rdma) entry) is refused.
      - A string is the C(rdma) entry (the earlier form of this option).
    type: raw
    default: {rdma: all, tcp: eth0}
  side_channel_port:
    description: C(VLLM_NIXL_SIDE_CHANNEL_PORT); unique per host, reachable pod to pod.
    type: int
    default: 5600
  kv_connector:
    description: vLLM KV connector.
    type: str
    default: NixlConnector
  kv_buffer_device:
    description: vLLM C(kv_buffer_device).
    type: str
    choices: [cuda, cpu]
    default: cuda
  sglang_transfer_backend:
    description: SGLang C(--disaggregation-transfer-backend); C(mooncake) moves the KV over RDMA only, so it cannot run with O(transport=tcp).
    type: str
    choices: [nixl, mooncake]
    default: nixl
  sglang_ib_device:
    description: SGLang C(--disaggregation-ib-device); empty leaves it out.
    type: str
    default: ""
  sglang_bootstrap_port:
    description: SGLang C(--disaggregation-bootstrap-port), also written to the annotation the gateway or router reads.
    type: int
    default: 8998
  rdma_resource:
    description: RDMA device-plugin resource requested by each engine pod; empty requests none.
    type: str
    default: rdma/rdma_shared_device_a
  rdma_count:
    description: Units of O(rdma_resource) per engine pod.
    type: int
    default: 1
  prefill_replicas:
    description: Prefill engines (the x of xPyD).
    type: int
    default: 1
  decode_replicas:
    description: Decode engines (the y of xPyD).
    type: int
    default: 1
  prefill_node_selector:
    description: C(nodeSelector) of the prefill pods.
    type: dict
    default: {}
  decode_node_selector:
    description: C(nodeSelector) of the decode pods.
    type: dict
    default: {}
  tolerations:
    description: Tolerations of every pod; each names its taint key (C(operator=Exists) without a key is refused).
    type: list
    elements: dict
    default: []
  pod_annotations:
    description: Annotations of the engine pods, for example C(k8s.v1.cni.cncf.io/networks) for a Multus RDMA network.
    type: dict
    default: {}
  host_network:
    description: Run the engine pods in the node's network namespace (C(hostNetwork), C(dnsPolicy=ClusterFirstWithHostNet)).
    type: bool
    default: false
  engine_resources:
    description:
      - C({requests, limits}) of the engine containers. CPU and memory not given here are requested as
        O(engine_cpu_request)/O(engine_memory_request), else 4 CPUs and 32 GiB per GPU (the engine role's rule).
      - The GPU and RDMA resources are set from O(gpus) and O(rdma_count) and cannot appear here.
    type: dict
    default: {}
  engine_cpu_request:
    description: CPU request of each engine container (default 4 per GPU).
    type: str
  engine_memory_request:
    description: Memory request of each engine container (default 32Gi per GPU).
    type: str
  startup_timeout:
    description: Seconds an engine may take to start; the startup probe covers them and the router waits as long.
    type: int
    default: 3600
  shm_size:
    description: Size limit of the C(/dev/shm) memory emptyDir.
    type: str
    default: 64Gi
  routing_strategy:
    description:
      - AIBrix C(routingStrategy) written to the C(model.aibrix.ai/config) annotation. Default C(pd) with
        O(workload=stormservice); unset with O(workload=deployments), where the gateway follows the HTTPRoute
        (C(pd) is refused there - it pairs StormService pods only).
    type: str
  gateway_name:
    description: The AIBrix Gateway the HTTPRoute attaches to (O(workload=deployments)).
  gateway_namespace:
    description: Namespace of the Gateway and of the HTTPRoute C(<model>-router).
  route_request_timeout:
    description: HTTPRoute request timeout (Gateway API duration); C(0s) is no timeout. Below 1800s warns.
    type: str
    default: 0s
  gateway_policies:
    description:
      - The EnvoyPatchPolicy and EnvoyExtensionPolicy objects of the AIBrix gateway as read from the cluster (for
        example the C(resources) of C(kubernetes.core.k8s_info) of those kinds in O(gateway_namespace)).
      - With a routing strategy (always with O(workload=stormservice)) every request goes through AIBrix's Envoy
        route C(original_route), whose timeout (120s in the v0.7.0 install, Helm
        C(gateway.envoyPatchPolicy.route.timeout)) applies instead of O(route_request_timeout). The longest answer
        streams for O(route_request_timeout) when that is set, else for the profile's context length
        (C(max-model-len) / C(context-length)) at 65 tokens/s; a shorter C(original_route) timeout fails here
        with the fix, before anything is written. So does the same route's C(idle_timeout) (Helm
        C(gateway.envoyPatchPolicy.route.idleTimeout), 300s; without one Envoy's 5-minute stream idle timeout), because a
        non-streamed answer is idle until it is whole.
      - A vLLM prefill runs inside the gateway plugin's ext_proc call; a C(messageTimeout) of its
        EnvoyExtensionPolicy (60s, Helm C(gatewayPlugin.messageTimeout)) under C(AIBRIX_PREFILL_REQUEST_TIMEOUT)
        is a warning. Every such message names all three limits.
      - Unset (render only), the same comparison against the v0.7.0 default is a warning.
    type: list
    elements: dict
  route_paths:
    description: Path prefixes of the HTTPRoute (AIBrix v0.7.0's list by default, C(/v1/responses) included).
    type: list
    elements: str
  proxy_image:
    description:
      - Image of the P/D proxy (vLLM with O(workload=deployments)); required there. A site choice - any image
        with Python 3.9+ from your registry, pinned by digest; the proxy runs C(pd_proxy.py) from a ConfigMap.
    type: str
    default: ""
  front_node_selector:
    description: C(nodeSelector) of the P/D front (proxy or router) pods, for example the CPU node pool.
    type: dict
    default: {}
  front_avoid_node_label:
    description:
      - The front pods require nodes without this label (C(DoesNotExist)), so they never take a GPU node.
        The default is the label NVIDIA's GPU operator sets on GPU nodes. They never get O(tolerations).
      - Empty - no such rule.
    type: str
    default: nvidia.com/gpu.present
  prefill_nodes:
    description:
      - Nodes (their C(metadata.name)) that staged the revision for the prefill role; the prefill pods get a
        required node affinity to exactly these nodes. Fewer than O(prefill_replicas) fail before rendering.
      - Unset - no placement (the pd_disagg role passes the staged hosts of its prefill group).
    type: list
    elements: str
  decode_nodes:
    description: As O(prefill_nodes), for the decode role (no node may be in both).
    type: list
    elements: str
  nccl_ib_hca:
    description: C(NCCL_IB_HCA) of the engine containers (the RDMA knobs shared with multi-node engines).
    type: str
    default: ""
  socket_ifname:
    description: C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME) of the engine containers.
    type: str
    default: ""
  proxy_port:
    description: Port of the P/D front (the proxy or SGLang's router) and of the model's Service.
    type: int
    default: 8000
  proxy_source:
    description: Source of the P/D proxy script; required with O(workload=deployments) and O(engine=vllm).
    type: str
    default: ""
  proxy_replicas:
    description: Replicas of the P/D front.
    type: int
    default: 1
  proxy_resources:
    description: C({requests, limits}) of the front container (default 1 CPU / 512Mi for the proxy, 2 CPUs / 2Gi for the router).
    type: dict
    default: {}
  proxy_prefill_timeout:
    description: Seconds the P/D proxy waits for a prefill (C(--prefill-timeout)); a 128K-token prefill takes minutes.
    type: int
    default: 600
  proxy_decode_timeout:
    description: Seconds the proxy waits on decode (C(--decode-timeout)), and SGLang's router C(--request-timeout-secs).
    type: int
    default: 3600
  router_image:
    description: Image of SGLang's router; empty uses O(image) (SGLang's images ship C(sglang_router)).
    type: str
    default: ""
  router_policy:
    description: SGLang router C(--policy) (C(random), C(round_robin), C(cache_aware), C(power_of_two)); empty keeps its default.
    type: str
    default: ""
  render_dir:
    aliases: [dest]
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.render_dir
  - llmops.serving.engine_pod
  - llmops.serving.gateway
notes:
  - C(dest) is a deprecated alias of O(render_dir), removed in 1.0.0 (the name M(llmops.serving.engine_manifests) uses).
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: StormService 1P1D over RDMA on a Multus RDMA network
  llmops.serving.pd_manifests:
    model_name: glm-5.2-fp8
    image: vllm/vllm-openai:v0.26.0
    model_path: /models/glm-5.2-fp8
    model_host_path: /mnt/nvme/models/glm-5.2-fp8/8f94f6f0fade
    transport: rdma
    ucx_net_devices: {rdma: "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", tcp: net1}
    pod_annotations: {k8s.v1.cni.cncf.io/networks: rdma-net}
    env:
      - {name: UCX_IB_GID_INDEX, value: "3"}
      - {name: NCCL_IB_GID_INDEX, value: "3"}
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
    hf_token_secret: {name: hf-token, key: token}
    render_dir: /var/tmp/llmops/manifests/pd
  register: pd

- name: SGLang 2P1D behind SGLang's router and our own route
  llmops.serving.pd_manifests:
    engine: sglang
    workload: deployments
    model_name: glm-5.2-fp8
    image: lmsysorg/sglang:v0.5.16
    model_path: /models/glm-5.2-fp8
    prefill_replicas: 2
    decode_replicas: 1
"""

RETURN = r"""
objects:
  description: The rendered Kubernetes objects, in apply order.
  returned: always
  type: list
  elements: dict
service_name:
  description: The model's Service (the P/D front) with O(workload=deployments).
  returned: success
  type: str
route_name:
  description: The HTTPRoute C(<model>-router) rendered with O(workload=deployments).
  returned: success
  type: str
reference_grant_name:
  description: The ReferenceGrant letting the route reach the Service across namespaces.
  returned: success
  type: str
startup_window_seconds:
  description: Seconds the startup probe gives each engine (O(startup_timeout) plus max(300 s, 10 %)).
  returned: success
  type: int
progress_deadline_seconds:
  description: C(progressDeadlineSeconds) of the role Deployments (the startup window plus 30 min of image pull).
  returned: success
  type: int
pod_selectors:
  description: Labels selecting the pods of each role (C(prefill), C(decode), and C(front) with O(workload=deployments)).
  returned: success
  type: dict
containers:
  description: The container to judge per key of RV(pod_selectors) (C(engine), C(pd-proxy) or C(sglang-router)).
  returned: success
  type: dict
workloads:
  description: Kind and name of the workload of each key of RV(pod_selectors) (the one StormService for both roles).
  returned: success
  type: dict
replicas:
  description: Pods expected per key of RV(pod_selectors) (front 0 for a StormService).
  returned: success
  type: dict
nodes:
  description: The nodes each role is pinned to (null where not given).
  returned: success
  type: dict
read_concurrency:
  description: Expected concurrent weight reads (pods x TP ranks x loader threads) and a summary line.
  returned: success
  type: dict
files:
  description: File names written (or that would be written) under O(render_dir).
  returned: when O(render_dir) is set
  type: list
  elements: str
changed_files:
  description: Files of RV(files) whose content changes (or would change in check mode) under O(render_dir).
  returned: when O(render_dir) is set
  type: list
  elements: str
removed:
  description: Files rendered before and removed now (or that would be removed in check mode).
  returned: when O(render_dir) is set
  type: list
  elements: str
file:
  description: The file or directory a O(render_dir) error is about (for example the marker).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.kube import (
    _aibrix_route, _k8s_checks, _k8s_engine, _pd_manifests, _render_dir,
)

# Options rendered into the containers: kept out of the target's log (no_log), returned as rendered.
RENDERED_OPTIONS = ("extra_args", "env", "engine_args", "kernel_cache_env")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            transport=dict(type="str", choices=["rdma", "tcp"], default="rdma"),
            workload=dict(type="str", choices=["stormservice", "deployments"], default="stormservice", aliases=["mode"],
                          deprecated_aliases=[dict(name="mode", version="1.0.0", collection_name="llmops.serving")]),
            namespace=dict(type="str", default="llm"),
            model_name=dict(type="str", required=True),
            image=dict(type="str", required=True),
            image_pull_policy=dict(type="str", default="IfNotPresent"),
            image_pull_secret=dict(type="str", no_log=False),
            model_path=dict(type="str", required=True),
            model_host_path=dict(type="str"),
            model_source=dict(type="str", choices=["staged_nvme", "shared_fs"], default="staged_nvme"),
            loader_threads=dict(type="int"),
            tp_size=dict(type="int", default=8),
            gpus=dict(type="int", default=8),
            port=dict(type="int", default=8000),
            profile=dict(type="str", default="none"),
            profiles=dict(type="dict", default={}),
            engine_args=dict(type="dict", default={}, no_log=True),
            extra_args=dict(type="list", elements="str", default=[], no_log=True),
            init=dict(type="str"),
            env=dict(type="list", elements="dict", default=[], no_log=True),
            hf_token_secret=dict(type="dict", no_log=False),
            kernel_cache_dir=dict(type="path"),
            kernel_cache_env=dict(type="dict", default={}, no_log=True),
            ucx_tls=dict(type="dict", default=dict(_pd_manifests.DEFAULT_UCX_TLS)),
            ucx_net_devices=dict(type="raw", default=dict(_pd_manifests.DEFAULT_UCX_NET_DEVICES)),
            side_channel_port=dict(type="int", default=5600),
            kv_connector=dict(type="str", default="NixlConnector"),
            kv_buffer_device=dict(type="str", choices=["cuda", "cpu"], default="cuda"),
            sglang_transfer_backend=dict(type="str", choices=["nixl", "mooncake"], default="nixl"),
            sglang_ib_device=dict(type="str", default=""),
            sglang_bootstrap_port=dict(type="int", default=8998),
            rdma_resource=dict(type="str", default="rdma/rdma_shared_device_a"),
            rdma_count=dict(type="int", default=1),
            prefill_replicas=dict(type="int", default=1),
            decode_replicas=dict(type="int", default=1),
            prefill_node_selector=dict(type="dict", default={}),
            decode_node_selector=dict(type="dict", default={}),
            tolerations=dict(type="list", elements="dict", default=[]),
            pod_annotations=dict(type="dict", default={}),
            host_network=dict(type="bool", default=False),
            engine_resources=dict(type="dict", default={}),
            engine_cpu_request=dict(type="str"),
            engine_memory_request=dict(type="str"),
            startup_timeout=dict(type="int", default=3600),
            shm_size=dict(type="str", default="64Gi"),
            routing_strategy=dict(type="str"),
            **_aibrix_route.gateway_argument_spec(),
            route_request_timeout=dict(type="str", default="0s"),
            route_paths=dict(type="list", elements="str"),
            gateway_policies=dict(type="list", elements="dict"),
            proxy_image=dict(type="str", default=""),
            front_node_selector=dict(type="dict", default={}),
            front_avoid_node_label=dict(type="str", default=_pd_manifests.GPU_NODE_LABEL),
            prefill_nodes=dict(type="list", elements="str"),
            decode_nodes=dict(type="list", elements="str"),
            nccl_ib_hca=dict(type="str", default=""),
            socket_ifname=dict(type="str", default=""),
            proxy_port=dict(type="int", default=8000),
            proxy_source=dict(type="str", default=""),
            proxy_replicas=dict(type="int", default=1),
            proxy_resources=dict(type="dict", default={}),
            proxy_prefill_timeout=dict(type="int", default=600),
            proxy_decode_timeout=dict(type="int", default=3600),
            router_image=dict(type="str", default=""),
            router_policy=dict(type="str", default=""),
            **_k8s_engine.pod_argument_spec(),
            **_render_dir.argument_spec(aliases=["dest"], deprecated_aliases=[
                dict(name="dest", version="1.0.0", collection_name="llmops.serving")]),
        ),
        supports_check_mode=True,
    )
    _render_dir.run_module(module, _pd_manifests.render, _k8s_checks.SpecError, RENDERED_OPTIONS,
                           result_keys=("objects", "service_name", "route_name", "reference_grant_name",
                                        "startup_window_seconds", "read_concurrency", "progress_deadline_seconds",
                                        "pod_selectors", "containers", "workloads", "replicas", "nodes"))


if __name__ == "__main__":
    main()
