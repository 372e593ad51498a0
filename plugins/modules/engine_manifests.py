#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_manifests
short_description: Build the Kubernetes objects that serve one model with vLLM or SGLang behind AIBrix
version_added: "0.1.0"
description:
  - Builds a Deployment (exactly O(tp_size) GPUs, CPU and memory requested, staged revision mounted read-only,
    C(/dev/shm) in memory, startup probe covering O(startup_timeout), rolled one pod at a time without a surge
    pod), a Service whose name is a DNS-1035 label derived from O(served_model_name), the AIBrix HTTPRoute
    C(<model>-router) in O(gateway_namespace) pointing at that Service, when O(namespace) differs from
    O(gateway_namespace) a C(v1beta1) ReferenceGrant for exactly that Service, and with O(replicas) > 1 a
    PodDisruptionBudget (one pod at a time).
  - With O(nodes) > 1 the engine spans several nodes (for example O(tp_size=8), O(pp_size=2), O(nodes=2)) as a
    LeaderWorkerSet (C(leaderworkerset.x-k8s.io/v1)); the leader serves HTTP, the workers join through the
    engine's own rendezvous flags (vLLM C(--nnodes/--node-rank/--master-addr/--headless), SGLang
    C(--nnodes/--node-rank/--dist-init-addr)).
  - The pods (only the leader of a multi-node group) carry the AIBrix labels C(model.aibrix.ai/name)
    (= O(served_model_name) = the request's model), C(model.aibrix.ai/port) and C(model.aibrix.ai/engine); the
    Deployment or LeaderWorkerSet itself does not, so AIBrix's route controller creates no competing route.
  - The engine never runs as PID 1, where a crash can end in exit 0 (SGLang's C(kill_process_tree) SIGKILLs
    itself, which PID 1 survives, then exits with status 0). It runs under O(init) when the image has one,
    else the pod shares its process namespace (C(shareProcessNamespace), the pause container is PID 1).
  - The image is checked before anything is rendered. A tag older than the profile's C(min_version) is refused,
    C(lmsys/sglang) is refused (SGLang publishes C(lmsysorg/sglang)), a tag without a digest warns.
  - Loader settings follow O(model_source) and the expected concurrent weight reads
    (pods x TP ranks x threads per rank) are returned in RV(read_concurrency).
  - Every input is validated before anything is written; errors name the option and the fix.
  - Plain-text credentials are refused wherever they would be rendered - O(env), O(kernel_cache_env),
    O(engine_args), O(extra_args), O(command) and the built objects - and the error names the field
    (for example C(env.HF_TOKEN) or C(extra_args[3])), never the value. A credential is a name whose last
    word is C(TOKEN), C(KEY), C(SECRET), C(PASSWORD), C(PASSWD), C(PASSPHRASE) or C(APIKEY), or
    C(AWS_ACCESS_KEY_ID)/C(S3_ACCESS_KEY_ID) (C(HF_HUB_DISABLE_IMPLICIT_TOKEN) is not one); a credential flag
    C(--api-key), C(--hf-token), C(--admin-api-key) (abbreviated, with C(_) or C(=)); or a value shaped like a
    Hugging Face token, an AWS access key id or a private key. Reference a Secret instead (an O(env) entry with
    C(valueFrom.secretKeyRef), and C($(NAME)) in arguments).
  - With O(render_dir) the objects are written there as YAML plus a C(kustomization.yaml); without it
    nothing is written and the objects are only returned (apply them with M(kubernetes.core.k8s)).
options:
  served_model_name:
    description:
      - The model name clients send; also the AIBrix label value and the engine's C(--served-model-name).
      - Must be a valid label value and C(<name>-router) a DNS-1123 subdomain.
    type: str
    required: true
  namespace:
    description: Namespace of the Deployment, Service and ReferenceGrant.
    type: str
    required: true
  gateway_namespace:
    description: Namespace of the AIBrix gateway and of the HTTPRoute.
  gateway_name:
    description: Name of the AIBrix Gateway the route attaches to.
  model_path:
    description:
      - Absolute path of the model revision; the same path on the node and in the container.
      - With O(model_source=staged_nvme) it is the staged revision on the node's NVMe (hostPath, read-only).
    type: path
    required: true
  model_source:
    description:
      - Where the weights are read from; picks the loader settings.
      - C(staged_nvme) - vLLM C(--safetensors-load-strategy lazy); SGLang multithread load with 8 threads.
      - C(shared_fs) - vLLM C(prefetch) with 2 threads per rank; SGLang multithread load with 2 threads.
    type: str
    choices: [staged_nvme, shared_fs]
    default: staged_nvme
  model_pvc:
    description: With O(model_source=shared_fs), a PersistentVolumeClaim holding the models (else a hostPath).
    type: str
  model_pvc_sub_path:
    description: Path of the revision inside O(model_pvc); requires O(model_pvc).
    type: str
  tp_size:
    description: Tensor-parallel size; a single-node pod requests exactly O(tp_size) x O(pp_size) GPUs.
    type: int
    default: 8
  pp_size:
    description: Pipeline-parallel size (vLLM C(--pipeline-parallel-size), SGLang C(--pp-size)); usually the number of nodes.
    type: int
    default: 1
  nodes:
    description:
      - Nodes one engine spans. With more than one, the engine is a LeaderWorkerSet of this group size and each
        pod requests O(tp_size) x O(pp_size) / O(nodes) GPUs (the LeaderWorkerSet controller must be installed).
      - vLLM needs 0.11.0 or newer (its multiprocessing multi-node launcher); older vLLM needs Ray, not rendered here.
    type: int
    default: 1
  dist_port:
    description: Multi-node rendezvous port on the leader (vLLM C(--master-port), default 29501; SGLang C(--dist-init-addr), default 20000).
    type: int
  replicas:
    description: Number of engine pods.
    type: int
    default: 1
  image:
    description: Engine container image, preferably pinned by digest.
    type: str
    required: true
  image_pull_policy:
    description: Container image pull policy.
    type: str
    choices: [Always, IfNotPresent, Never]
    default: IfNotPresent
  image_pull_secret:
    description: Name of an existing image pull Secret (referenced, never created here).
    type: str
  port:
    description: Engine HTTP port (container port, Service port, AIBrix port label).
    type: int
    default: 8000
  profile:
    description:
      - Name of the engine profile from O(profiles) whose arguments come first. C(none) (built in) adds no
        tuning flags, so a model gets no other model's parsers.
      - The engine role's C(vars/profiles.yml) defines C(glm-5.2-fp8), the field-tested GLM-5.2 FP8 TP=8 command line.
    type: str
    default: none
  profiles:
    description:
      - >-
        Profile definitions, C(name -> {description, vllm: {min_version, args}, sglang: {min_version, args}}).
      - C(args) maps flag (without C(--)) to value, applied in order before the loader settings and O(engine_args).
      - C(min_version) is the oldest engine version the profile runs with; an O(image) tag older than it is refused.
    type: dict
    default: {}
  engine_args:
    description:
      - Flag name (without C(--)) to value, applied over the profile and loader settings.
      - C(true) gives a bare flag; C(false) or C(null) removes the flag; dicts become JSON.
      - A credential flag (C(api-key)) takes a Secret through C($(NAME)) with C(NAME) an O(env) entry from
        C(valueFrom.secretKeyRef); a plain value is refused.
      - Not written to the target's log; the values are rendered and returned as they are.
    type: dict
    default: {}
  extra_args:
    description:
      - Arguments appended verbatim to the engine command line.
      - C(--api-key x) and C(--api-key=x) are refused; write C(--api-key=$(API_KEY)) with C(API_KEY) an O(env)
        entry from C(valueFrom.secretKeyRef), or set C(VLLM_API_KEY) from a Secret.
      - Not written to the target's log; the values are rendered and returned as they are.
    type: list
    elements: str
    default: []
  command:
    description:
      - Container entrypoint (exec form). Defaults to C(vllm serve) or C(python3 -m sglang.launch_server).
      - A shell wrapper is refused unless its script C(exec)s the engine without a pipeline or background job.
      - Its words (a shell script's too) are checked for credentials like O(extra_args).
    type: list
    elements: str
  init:
    description:
      - Path of C(tini) or C(dumb-init) in the image; the container then runs C(init -- engine ...) and exits with
        the engine's status (128 + signal when it was killed).
      - Unset, the pod gets C(shareProcessNamespace=true) so the pause container is PID 1 and the engine is not.
    type: str
  resources:
    description:
      - Extra C(requests)/C(limits) (cpu, memory, RDMA devices); the GPU count is always the engine's.
      - A C(requests.cpu) or C(requests.memory) here wins over O(cpu_request) and O(memory_request).
    type: dict
    default: {}
  cpu_request:
    description:
      - CPU request of each engine pod (a quantity such as C(32) or C(500m)); default 4 per GPU (32 for 8 GPUs).
      - Requests make the pod Burstable, not BestEffort (GPUs do not count for the QoS class).
    type: str
  memory_request:
    description:
      - Memory request of each engine pod (a quantity such as C(256Gi)); default 32Gi per GPU (256Gi for 8 GPUs).
      - No memory limit is set unless O(resources) has one.
    type: str
  node_selector:
    description: Pod nodeSelector.
    type: dict
    default: {}
  affinity:
    description:
      - Pod affinity (Kubernetes C(affinity) object). With O(staged_nodes), the required node affinity to those
        nodes is added to every C(nodeSelectorTerms) entry given here (so it is ANDed with them).
    type: dict
    default: {}
  staged_nodes:
    description:
      - Names of the nodes (C(metadata.name), the NAME column of C(kubectl get nodes)) that staged the revision at
        O(model_path). With O(model_source=staged_nvme), every engine pod (the Deployment's, every LeaderWorkerSet pod) gets a
        required node affinity to exactly these nodes, so none is scheduled where the hostPath does not exist
        (the kubelet's hostPath C(type=Directory) check fails only at mount time, after scheduling).
      - Fewer nodes than O(replicas) x O(nodes) fail before anything is rendered, naming the nodes.
      - Unset - no placement is rendered and a warning says so. The engine role passes the hosts of
        C(engine_k8s_node_group) that staged the revision (host variable C(k8s_node_name), default the
        inventory name).
    type: list
    elements: str
  rdma:
    description:
      - RDMA for the engine pods (every LeaderWorkerSet pod of a multi-node engine), the same knobs as the P/D
        roles of M(llmops.serving.pd_manifests). Empty - none.
      - C(resource) and C(count) - the RDMA device plugin's extended resource (for example
        C(rdma/rdma_shared_device_a)); C(networks) - the Multus C(k8s.v1.cni.cncf.io/networks) annotation;
        C(host_network) - the node's network namespace instead; C(nccl_ib_hca) - C(NCCL_IB_HCA);
        C(socket_ifname) - C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME). C(IPC_LOCK) is always added
        (verbs memory registration).
    type: dict
    default: {}
  tolerations:
    description:
      - Pod tolerations; each must name a taint C(key). C(operator=Exists) without a key is refused.
    type: list
    elements: dict
    default: []
  priority_class_name:
    description: PriorityClass of the engine pods.
    type: str
  topology_spread:
    description:
      - Pod C(topologySpreadConstraints); each needs C(topologyKey). C(maxSkew) defaults to 1,
        C(whenUnsatisfiable) to C(ScheduleAnyway), C(labelSelector) to the engine's pods.
    type: list
    elements: dict
    default: []
  startup_timeout:
    description: Seconds the startup probe allows the engine to load, compile and warm up.
    type: int
    default: 3600
  kernel_cache_dir:
    description: Node path of the kernel cache directory, mounted at the same path.
    type: path
  kernel_cache_env:
    description:
      - Environment pointing the engine's JIT caches inside O(kernel_cache_dir).
      - Rendered as plain values, so credentials are refused here like in O(env).
    type: dict
    default: {}
  env:
    description:
      - Extra container env entries (C(name) with C(value) or C(valueFrom)); later entries replace earlier ones
        of the same name. Numbers and booleans become strings.
      - C(valueFrom) holds one of C(secretKeyRef) or C(configMapKeyRef) (both with C(name) and C(key)),
        C(fieldRef) or C(resourceFieldRef).
      - A credential (see the description) must use C(valueFrom.secretKeyRef); a plain C(value) is refused.
      - Not written to the target's log; the values are rendered and returned as they are.
    type: list
    elements: dict
    default: []
  hf_token_secret:
    description: Secret holding the Hugging Face token, exposed as C(HF_TOKEN) through C(secretKeyRef).
    type: dict
    suboptions:
      name:
        description: Secret name.
        type: str
        required: true
      key:
        description: Key in the Secret.
        type: str
        default: token
  shm_size:
    description: Size limit of the in-memory C(/dev/shm) emptyDir (Kubernetes quantity).
    type: str
    default: 64Gi
  loader_threads:
    description: Loader threads per TP rank; default by O(model_source) (8 on NVMe, 2 on a shared FS).
    type: int
  read_streams_warn:
    description: Warn when the expected concurrent reads from a shared FS exceed this.
    type: int
    default: 16
  service_name:
    description:
      - Service (and Deployment) name; derived from O(served_model_name) when unset.
      - The derived name is O(served_model_name) itself when that is a DNS-1035 label, else its DNS-1035 spelling with
        8 hex characters of the served name's SHA-256 (C(glm-5.2-fp8-vllm) -> C(glm-5-2-fp8-vllm-019f2c25)), so two
        models whose names spell the same never share objects. Set it to keep a name an older version derived.
    type: str
  manage_route:
    description: Create the HTTPRoute (and ReferenceGrant) here instead of leaving it to the AIBrix controller.
    type: bool
    default: true
  route_paths:
    description: Path prefixes the HTTPRoute matches (with header C(model) = the model name).
    type: list
    elements: str
    default: [/v1/completions, /v1/chat/completions, /v1/responses, /v1/messages, /v1/embeddings, /v1/rerank,
              /v1/classify, /generate, /generatevideo, /v1/audio/transcriptions, /v1/audio/translations]
  route_request_timeout:
    description:
      - HTTPRoute request timeout (Gateway API duration, for example C(0s) or C(1h)); the gateway answers 504
        to a request that takes longer. C(0s) is no timeout (Gateway API C(HTTPRouteTimeouts)).
      - A long answer streams for minutes (the field report measured 65-82 tok/s for one GLM-5.2 FP8 stream, so
        AIBrix's own 120 s cuts answers beyond about 8,000 tokens); a value below 1800 s warns with the tokens it holds.
      - C(route_timeout) is a deprecated alias, removed in 1.0.0. It is not the wait for the route's conditions,
        which is O(llmops.serving.k8s_engine_wait#module:route_condition_timeout) (seconds).
    type: str
    default: 0s
    aliases: [route_timeout]
  labels:
    description: Extra pod labels.
    type: dict
    default: {}
  annotations:
    description: Extra pod annotations (for example C(model.aibrix.ai/config)).
    type: dict
    default: {}
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.render_dir
  - llmops.serving.engine_pod
  - llmops.serving.gateway
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Render the vLLM engine for GitOps
  llmops.serving.engine_manifests:
    engine: vllm
    served_model_name: glm-5.2-fp8-vllm
    namespace: llm-serving
    model_path: /mnt/nvme/models/GLM-5.2-FP8/v1
    image: vllm/vllm-openai:v0.26.0@sha256:0123abcd
    # a site's own profile (the engine role passes its vars/profiles.yml plus engine_k8s_profiles)
    profile: glm-5.2-fp8
    profiles:
      glm-5.2-fp8:
        description: GLM-5.2 FP8 on 8 x H20
        vllm:
          min_version: 0.26.0b2.dev1
          args: {kv-cache-dtype: fp8, max-model-len: 131072, tool-call-parser: glm47, reasoning-parser: glm45}
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
    render_dir: /srv/gitops/llm-serving/glm-5.2-fp8-vllm

- name: Build the SGLang objects and apply them
  llmops.serving.engine_manifests:
    engine: sglang
    served_model_name: glm-5.2-fp8-sglang-test
    namespace: llm-lab
    model_path: /mnt/shared/models/GLM-5.2-FP8/v1
    model_source: shared_fs
    image: lmsysorg/sglang:v0.5.16
    init: /usr/bin/tini
  register: engine_objects

- name: Render a 16-GPU engine over two nodes (TP=8 x PP=2) as a LeaderWorkerSet
  llmops.serving.engine_manifests:
    engine: vllm
    served_model_name: big-model
    namespace: llm-serving
    model_path: /mnt/nvme/models/big-model/v1
    image: vllm/vllm-openai:v0.26.0
    tp_size: 8
    pp_size: 2
    nodes: 2
    render_dir: /srv/gitops/llm-serving/big-model

- name: Apply
  kubernetes.core.k8s:
    definition: "{{ engine_objects.objects }}"
    apply: true
"""

RETURN = r"""
objects:
  description: The objects in apply order (Service, ReferenceGrant, HTTPRoute, PodDisruptionBudget, Deployment or LeaderWorkerSet).
  returned: always
  type: list
  elements: dict
service_name:
  description: DNS-1035 Service (and Deployment) name.
  returned: always
  type: str
  sample: glm-5-2-fp8-vllm-019f2c25
deployment_name:
  description: Deployment name; null for a multi-node engine (see RV(workload)).
  returned: always
  type: str
workload:
  description: Kind (C(Deployment) or C(LeaderWorkerSet)) and name of the engine's workload.
  returned: always
  type: dict
  sample: {kind: LeaderWorkerSet, name: big-model}
pod_disruption_budget_name:
  description: PodDisruptionBudget name; null with one replica.
  returned: always
  type: str
route_name:
  description: HTTPRoute name (C(<model>-router)); null when O(manage_route=false).
  returned: always
  type: str
  sample: glm-5.2-fp8-vllm-router
reference_grant_name:
  description: ReferenceGrant name; null when the engine runs in the gateway namespace.
  returned: always
  type: str
pod_selector:
  description: Labels selecting the engine pods that serve HTTP (the leaders of a multi-node engine).
  returned: always
  type: dict
command:
  description: The engine's full argv (entrypoint and arguments).
  returned: always
  type: list
  elements: str
read_concurrency:
  description: Expected concurrent weight reads (pods, tp_ranks, threads_per_rank, concurrent_reads, summary).
  returned: always
  type: dict
  sample: {pods: 1, tp_ranks: 8, threads_per_rank: 2, concurrent_reads: 16, model_source: shared_fs}
probe_windows:
  description:
    - Seconds each probe tolerates failures (startup, readiness, liveness). The startup window is
      O(startup_timeout) plus max(300 s, 10 %), so a start that takes the whole timeout is reported, not killed.
  returned: always
  type: dict
staged_nodes:
  description: The nodes the engine pods are pinned to (sorted); null when O(staged_nodes) was not given.
  returned: always
  type: list
  elements: str
files:
  description: Files written (or that would be written) under O(render_dir).
  returned: always
  type: list
  elements: str
changed_files:
  description: Files of RV(files) whose content changes (or would change in check mode) under O(render_dir).
  returned: always
  type: list
  elements: str
removed:
  description: Files rendered before, no longer produced, and removed (or that would be removed) from O(render_dir).
  returned: always
  type: list
  elements: str
file:
  description: The file or directory a O(render_dir) error is about (for example the marker).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.kube import _aibrix_route, _k8s_checks, _k8s_engine, _render_dir

# Options rendered into the containers: kept out of the target's log (no_log), returned as rendered.
RENDERED_OPTIONS = ("engine_args", "extra_args", "command", "kernel_cache_env", "env")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            served_model_name=dict(type="str", required=True),
            namespace=dict(type="str", required=True),
            **_aibrix_route.gateway_argument_spec(),
            model_path=dict(type="path", required=True),
            model_source=dict(type="str", choices=["staged_nvme", "shared_fs"], default="staged_nvme"),
            model_pvc=dict(type="str"),
            model_pvc_sub_path=dict(type="str"),
            tp_size=dict(type="int", default=8),
            pp_size=dict(type="int", default=1),
            nodes=dict(type="int", default=1),
            dist_port=dict(type="int"),
            replicas=dict(type="int", default=1),
            image=dict(type="str", required=True),
            image_pull_policy=dict(type="str", choices=["Always", "IfNotPresent", "Never"], default="IfNotPresent"),
            image_pull_secret=dict(type="str", no_log=False),
            port=dict(type="int", default=8000),
            profile=dict(type="str", default="none"),
            profiles=dict(type="dict", default={}),
            engine_args=dict(type="dict", default={}, no_log=True),
            extra_args=dict(type="list", elements="str", default=[], no_log=True),
            command=dict(type="list", elements="str", no_log=True),
            init=dict(type="str"),
            resources=dict(type="dict", default={}),
            cpu_request=dict(type="str"),
            memory_request=dict(type="str"),
            node_selector=dict(type="dict", default={}),
            affinity=dict(type="dict", default={}),
            staged_nodes=dict(type="list", elements="str"),
            rdma=dict(type="dict", default={}),
            tolerations=dict(type="list", elements="dict", default=[]),
            priority_class_name=dict(type="str"),
            topology_spread=dict(type="list", elements="dict", default=[]),
            startup_timeout=dict(type="int", default=3600),
            kernel_cache_dir=dict(type="path"),
            kernel_cache_env=dict(type="dict", default={}, no_log=True),
            env=dict(type="list", elements="dict", default=[], no_log=True),
            hf_token_secret=dict(type="dict", no_log=False, options=dict(
                name=dict(type="str", required=True),
                key=dict(type="str", default="token", no_log=False),
            )),
            shm_size=dict(type="str", default="64Gi"),
            loader_threads=dict(type="int"),
            read_streams_warn=dict(type="int", default=16),
            service_name=dict(type="str"),
            manage_route=dict(type="bool", default=True),
            route_paths=dict(type="list", elements="str", default=list(_k8s_engine.AIBRIX_ROUTE_PATHS)),
            route_request_timeout=dict(type="str", default="0s", aliases=["route_timeout"],
                                       deprecated_aliases=[dict(name="route_timeout", version="1.0.0",
                                                                collection_name="llmops.serving")]),
            labels=dict(type="dict", default={}),
            annotations=dict(type="dict", default={}),
            **_k8s_engine.pod_argument_spec(),
            **_render_dir.argument_spec(),
        ),
        required_by={"model_pvc_sub_path": "model_pvc"},
        supports_check_mode=True,
    )
    _render_dir.run_module(module, _k8s_engine.build, _k8s_checks.SpecError, RENDERED_OPTIONS, always_list_files=True)


if __name__ == "__main__":
    main()
