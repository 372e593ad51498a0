#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: pd_manifests
short_description: Render Kubernetes objects for a prefill/decode pair over NIXL/UCX
version_added: "0.1.0"
description:
  - Builds a prefill and a decode engine, each a full engine with O(tp_size) GPUs, kept on different nodes by
    pod anti-affinity. vLLM gets C(--kv-transfer-config) with O(kv_connector); SGLang gets
    C(--disaggregation-mode prefill|decode), O(sglang_transfer_backend) and O(sglang_ib_device).
  - O(transport) selects the C(UCX_TLS) value from O(ucx_tls) and changes nothing else.
  - Every engine pod gets C(UCX_NET_DEVICES), C(VLLM_NIXL_SIDE_CHANNEL_HOST) from the pod IP (downward API), the
    RDMA device resource O(rdma_resource), the C(IPC_LOCK) capability (lifts the memlock limit for verbs
    registration) and C(/dev/shm) on a memory emptyDir.
  - O(workload=stormservice) renders an AIBrix StormService with roles C(prefill) and C(decode) whose pods carry the
    C(model.aibrix.ai/config) annotation with O(routing_strategy); without a strategy the AIBrix gateway answers
    503 for StormService models. AIBrix's prefill request timeout (30 s) can kill very long prefills.
  - O(workload=deployments) renders a Deployment and Service per role and the collection's P/D proxy (ConfigMap with
    O(proxy_source), Deployment, and a Service named after the model that AIBrix's HTTPRoute targets).
  - With O(render_dir) the objects are written there as YAML with a C(kustomization.yaml); files it rendered before and
    no longer produces are removed.
  - Plain-text credentials are refused in O(env), O(extra_args) and the built objects, by the rule of
    M(llmops.serving.engine_manifests) (names ending in C(TOKEN), C(KEY), C(SECRET), C(PASSWORD) and the like,
    C(--api-key)/C(--hf-token) values, token-shaped values); the error names the field, never the value.
    Reference a Secret instead (an O(env) entry with C(valueFrom.secretKeyRef), C($(NAME)) in arguments).
options:
  engine:
    description: Inference engine.
    type: str
    choices: [vllm, sglang]
    default: vllm
  transport:
    description: KV transport; picks the C(UCX_TLS) value from O(ucx_tls).
    type: str
    choices: [rdma, tcp]
    default: rdma
  workload:
    description:
      - The Kubernetes workload of the pair - an AIBrix StormService, or plain Deployments with the P/D proxy.
      - C(mode) is a deprecated alias, removed in 1.0.0 (in the roles C(*_k8s_mode) means apply or render).
    type: str
    choices: [stormservice, deployments]
    default: stormservice
    aliases: [mode]
  namespace:
    description: Namespace of every object.
    type: str
    default: llm
  model_name:
    description: Served model name (C(model.aibrix.ai/name) label, C(--served-model-name), request C(model)).
    type: str
    required: true
  image:
    description: Engine image (with NIXL for vLLM).
    type: str
    required: true
  model_path:
    description: Model directory inside the container.
    type: str
    required: true
  model_host_path:
    description: Node directory mounted read-only at O(model_path) (default the same path).
    type: str
  tp_size:
    description: Tensor-parallel size of each engine.
    type: int
    default: 8
  gpus:
    description: C(nvidia.com/gpu) per engine pod.
    type: int
    default: 8
  port:
    description: Engine HTTP port.
    type: int
    default: 8000
  extra_args:
    description:
      - Extra engine arguments for both roles.
      - C(--api-key x) and C(--api-key=x) are refused; write C(--api-key=$(API_KEY)) with C(API_KEY) an O(env)
        entry from C(valueFrom.secretKeyRef).
      - Not written to the target's log; the values are rendered and returned as they are.
    type: list
    elements: str
    default: []
  env:
    description:
      - Extra env entries of both engine containers (C(name) with C(value) or C(valueFrom)); numbers and
        booleans become strings.
      - C(valueFrom) holds one of C(secretKeyRef) or C(configMapKeyRef) (both with C(name) and C(key)),
        C(fieldRef) or C(resourceFieldRef). Credentials (C(HF_TOKEN), C(VLLM_API_KEY), C(AWS_SECRET_ACCESS_KEY))
        must use C(valueFrom.secretKeyRef).
      - The variables the module sets (C(UCX_TLS), C(UCX_NET_DEVICES), C(POD_IP), C(VLLM_NIXL_SIDE_CHANNEL_HOST),
        C(VLLM_NIXL_SIDE_CHANNEL_PORT), C(PYTHONHASHSEED), C(SGLANG_DISAGGREGATION_NIXL_BACKEND)) are refused.
      - Not written to the target's log; the values are rendered and returned as they are.
    type: list
    elements: dict
    default: []
  ucx_tls:
    description: C(UCX_TLS) value per transport (keys C(rdma) and C(tcp)).
    type: dict
    default: {rdma: "rc,ud,sm,self,cuda_copy,cuda_ipc", tcp: "tcp,sm,self,cuda_copy,cuda_ipc"}
  ucx_net_devices:
    description: C(UCX_NET_DEVICES), for example C(mlx5_0:1,mlx5_1:1), or C(all).
    type: str
    default: all
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
    description: SGLang C(--disaggregation-transfer-backend).
    type: str
    choices: [nixl, mooncake]
    default: nixl
  sglang_ib_device:
    description: SGLang C(--disaggregation-ib-device); empty leaves it out.
    type: str
    default: ""
  sglang_bootstrap_port:
    description: SGLang C(--disaggregation-bootstrap-port).
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
  prefill_node_selector:
    description: C(nodeSelector) of the prefill pod.
    type: dict
    default: {}
  decode_node_selector:
    description: C(nodeSelector) of the decode pod.
    type: dict
    default: {}
  shm_size:
    description: Size limit of the C(/dev/shm) memory emptyDir.
    type: str
    default: 64Gi
  routing_strategy:
    description: AIBrix C(routingStrategy) written to the C(model.aibrix.ai/config) annotation.
    type: str
    default: pd
  proxy_image:
    description: Image of the P/D proxy (any Python 3 image).
    type: str
    default: python:3.11-slim
  proxy_port:
    description: Port of the P/D proxy.
    type: int
    default: 8000
  proxy_source:
    description: Source of the P/D proxy script; required with O(workload=deployments).
    type: str
    default: ""
  render_dir:
    aliases: [dest]
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.render_dir
notes:
  - C(dest) is a deprecated alias of O(render_dir), removed in 1.0.0 (the name M(llmops.serving.engine_manifests) uses).
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: StormService P/D pair over RDMA
  llmops.serving.pd_manifests:
    model_name: glm-5.2-fp8
    image: vllm/vllm-openai:v0.10.1
    model_path: /models/glm-5.2-fp8
    model_host_path: /mnt/nvme/models/glm-5.2-fp8/8f94f6f0fade
    transport: rdma
    ucx_net_devices: mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1
    render_dir: /var/tmp/llmops/manifests/pd
  register: pd
"""

RETURN = r"""
objects:
  description: The rendered Kubernetes objects.
  returned: always
  type: list
  elements: dict
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

from ansible_collections.llmops.serving.plugins.module_utils import _pd_manifests, _render_dir, _secrets

# Options rendered into the containers: kept out of the target's log (no_log), returned as rendered.
RENDERED_OPTIONS = ("extra_args", "env")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine=dict(type="str", choices=["vllm", "sglang"], default="vllm"),
            transport=dict(type="str", choices=["rdma", "tcp"], default="rdma"),
            workload=dict(type="str", choices=["stormservice", "deployments"], default="stormservice", aliases=["mode"],
                          deprecated_aliases=[dict(name="mode", version="1.0.0", collection_name="llmops.serving")]),
            namespace=dict(type="str", default="llm"),
            model_name=dict(type="str", required=True),
            image=dict(type="str", required=True),
            model_path=dict(type="str", required=True),
            model_host_path=dict(type="str"),
            tp_size=dict(type="int", default=8),
            gpus=dict(type="int", default=8),
            port=dict(type="int", default=8000),
            extra_args=dict(type="list", elements="str", default=[], no_log=True),
            env=dict(type="list", elements="dict", default=[], no_log=True),
            ucx_tls=dict(type="dict", default={"rdma": "rc,ud,sm,self,cuda_copy,cuda_ipc",
                                               "tcp": "tcp,sm,self,cuda_copy,cuda_ipc"}),
            ucx_net_devices=dict(type="str", default="all"),
            side_channel_port=dict(type="int", default=5600),
            kv_connector=dict(type="str", default="NixlConnector"),
            kv_buffer_device=dict(type="str", choices=["cuda", "cpu"], default="cuda"),
            sglang_transfer_backend=dict(type="str", choices=["nixl", "mooncake"], default="nixl"),
            sglang_ib_device=dict(type="str", default=""),
            sglang_bootstrap_port=dict(type="int", default=8998),
            rdma_resource=dict(type="str", default="rdma/rdma_shared_device_a"),
            rdma_count=dict(type="int", default=1),
            prefill_node_selector=dict(type="dict", default={}),
            decode_node_selector=dict(type="dict", default={}),
            shm_size=dict(type="str", default="64Gi"),
            routing_strategy=dict(type="str", default="pd"),
            proxy_image=dict(type="str", default="python:3.11-slim"),
            proxy_port=dict(type="int", default=8000),
            proxy_source=dict(type="str", default=""),
            render_dir=dict(type="path", aliases=["dest"],
                            deprecated_aliases=[dict(name="dest", version="1.0.0", collection_name="llmops.serving")]),
        ),
        supports_check_mode=True,
    )
    _secrets.unmask_rendered_options(module, RENDERED_OPTIONS)
    # the canonical names only (module.params also holds each alias the task used)
    p = dict((k, v) for k, v in module.params.items() if k not in module.aliases)
    render_dir = p.pop("render_dir")
    try:
        objects = _pd_manifests.build(p)
    except _pd_manifests.SpecError as e:
        module.no_log_values.update(e.secret_values)
        module.fail_json(msg=str(e))
    result = dict(changed=False, objects=objects)
    if render_dir:
        try:
            result.update(_render_dir.apply(render_dir, _render_dir.manifest_files(objects), check_mode=module.check_mode,
                                            diff=module._diff, field="render_dir"))
        except _render_dir.RenderDirError as e:
            module.fail_json(msg=str(e), file=e.file)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
