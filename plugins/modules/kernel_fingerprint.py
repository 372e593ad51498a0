#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_fingerprint
short_description: Compute the compile fingerprint that names an engine's kernel-cache directory
version_added: "0.1.0"
description:
  - Hashes every input that changes the kernels an engine JIT-compiles (DeepGEMM, Triton, Inductor /
    torch.compile, tvm-ffi, FlashInfer) into one short hex RV(fingerprint).
  - Components are the engine and its version or commit; torch, triton, deep_gemm, sgl-kernel,
    flashinfer and CUDA runtime versions; the driver version; GPU name and compute capability;
    TP/PP/DP/EP sizes; model revision, architecture and quantization (read from the model's
    C(config.json)); kv-cache dtype; the kernel-affecting engine arguments; and the toolchain the
    compilers put in their own cache keys (see O(toolchain)).
  - The toolchain makes a second installation a different fingerprint. Inductor's C++ kernels embed
    the torch install path and the Python include directory in their compile command line, and its
    precompiled headers key on the C++ compiler's C(-v) banner. DeepGEMM's JIT keys embed its install
    path. So another checkout with its own C(.venv), or another C(CXX), never shares a published
    directory with the first.
  - Engine arguments are read with the engine's own flag grammar. A boolean flag never takes the next
    positional. C(--no-x), C(--x=false) and C(--x false) are one spelling, and so are C(--f=v) and
    C(--f v). List flags (C(--cuda-graph-bs 1 2 4)) take every value that follows. vLLM's
    C(--json-arg.key value) pieces, its short aliases (C(-q), C(-sc), C(-cc), C(-ep), C(-O3)) and
    unambiguous prefixes (C(--tp) for SGLang's C(--tp-size)) resolve as the engine resolves them, and
    flag order does not matter.
  - Only flags on the engine's allow list count (speculative settings, C(--max-num-batched-tokens),
    compilation config, CUDA-graph sizes, attention/MoE backends, ...). Any other flag is listed in
    RV(ignored_args) and never counts, whatever follows it.
  - Hostnames, IPs, ports, absolute paths and dict order never change the fingerprint. Paths inside
    counted values are reduced to their last component. A draft model (vLLM C(--speculative-config)
    C(model), C(--spec-model); SGLang C(--speculative-draft-model-path)) counts by its identity, that is
    its architecture, quantization and a digest of its C(config.json), as for the main model. Its path
    never counts. A hub id (C(org/name)) counts as the id.
  - A C(--config) file counts by a digest of its bytes. A parallel size set in O(engine_args)
    (C(--tensor-parallel-size), C(-tp), C(--tp-size), ...) is used when O(parallel) leaves it at 1. A
    different value in both is an error.
  - With O(gather=true) the versions and the toolchain are read from the engine's Python environment
    (package metadata and import specs, nothing imported) and the GPU from C(nvidia-smi); explicit
    values always win. On a host without a GPU the CPU architecture and ISA features stand in for the
    GPU.
options:
  engine:
    description: Serving engine whose caches are fingerprinted.
    type: str
    required: true
    choices: [vllm, sglang]
  engine_version:
    description: Engine version or commit (e.g. C(0.11.2) or C(0.5.16b1+g1a2b3c4)). Gathered when empty and O(gather=true).
    type: str
  versions:
    description:
      - Library versions. C(torch), C(triton) and C(cuda) must be known (given or gathered); use C(none)
        for one that does not exist on the host (CUDA on a CPU build). The others default to C(absent).
    type: dict
    default: {}
    suboptions:
      torch:
        description: PyTorch version.
        type: str
      triton:
        description: Triton version.
        type: str
      deep_gemm:
        description: DeepGEMM version.
        type: str
      sgl_kernel:
        description: sgl-kernel version.
        type: str
      flashinfer:
        description: FlashInfer version.
        type: str
      cuda:
        description: CUDA runtime version the engine's torch was built for.
        type: str
  driver_version:
    description: NVIDIA driver version. Gathered from C(nvidia-smi) when empty and O(gather=true).
    type: str
  gpu_name:
    description: GPU name as C(nvidia-smi) prints it (C(NVIDIA H20)). Gathered when empty and O(gather=true).
    type: str
  compute_capability:
    description: GPU compute capability (C(9.0)). Gathered when empty and O(gather=true).
    type: str
  parallel:
    description: Parallel layout of one engine instance.
    type: dict
    default: {}
    suboptions:
      tp:
        description: Tensor-parallel size.
        type: int
        default: 1
      pp:
        description: Pipeline-parallel size.
        type: int
        default: 1
      dp:
        description: Data-parallel size.
        type: int
        default: 1
      ep:
        description: Expert-parallel size.
        type: int
        default: 1
  model_path:
    description: Staged model directory; its C(config.json) gives architecture and quantization.
    type: path
    required: true
  model_revision:
    description:
      - Model revision (commit SHA). When empty, a hash of the canonical C(config.json) stands in, so a
        changed config still changes the fingerprint.
    type: str
  kv_cache_dtype:
    description: KV-cache dtype the engine runs with (C(auto), C(fp8), C(fp8_e4m3), ...).
    type: str
    default: auto
  engine_args:
    description:
      - The engine's launch arguments; only kernel-affecting ones are counted (see RV(ignored_args)).
      - A boolean flag with a value other than true/false, a flag that needs a value and has none, an
        ambiguous abbreviation, a draft model directory without C(config.json) and an unreadable
        C(--config) file are errors that name the flag.
    type: list
    elements: str
    default: []
  draft_model_path:
    description:
      - The staged draft model directory on this host, read for the draft's identity instead of the path
        that O(engine_args) give. Use it when the engine sees the draft under another path (a container
        mount).
      - An error when O(engine_args) name no draft model.
    type: path
  toolchain:
    description:
      - Toolchain components, gathered when O(gather=true); explicit values win. Without O(gather) the
        ones not given are recorded as C(unspecified).
    type: dict
    default: {}
    suboptions:
      torch_path:
        description: The torch package directory as the engine imports it (Inductor's C(_TORCH_PATH)).
        type: str
      torch_git:
        description: The torch build's C(git_version) (C(torch/version.py)).
        type: str
      python_include:
        description: The engine Python's C(sysconfig.get_path("include")).
        type: str
      deep_gemm_path:
        description: The C(deep_gemm) package directory, or C(absent).
        type: str
      cxx_version:
        description: Identity of the C++ compiler Inductor runs, as RV(components) records it.
        type: str
  cxx:
    description:
      - The C++ compiler command the engine's Inductor runs (its C(cpp.cxx) setting). Default C($CXX) on
        the target, else C(g++).
      - Probed with C(-v) for the C(cxx_version) component when O(gather=true), or when it is set and
        O(toolchain.cxx_version) is not.
    type: str
  gather:
    description: Read missing versions on the target (O(engine_python) package metadata, O(nvidia_smi)).
    type: bool
    default: false
  engine_python:
    description: The engine's Python interpreter, used when O(gather=true).
    type: path
    default: python3
  image:
    description:
      - The engine image the caches are for (C(vllm/vllm-openai:v0.26.0-cu129)). A declared O(versions.cuda)
        that contradicts the CUDA the image's tag names (its C(-cuNNN) variant, or the default build of an
        unsuffixed vLLM release tag) is refused before anything is read, as M(llmops.serving.preflight_facts)
        refuses the same declaration in its O(llmops.serving.preflight_facts#module:image_cuda_version).
      - A tag that names no CUDA (a digest-only pin, C(latest), another project's unsuffixed tag) checks nothing.
    type: str
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.node.nvidia_smi
author:
  - llmops.serving maintainers (@llmops)
"""

EXAMPLES = r"""
- name: Fingerprint the SGLang kernel caches of a TP=8 FP8 deployment
  llmops.serving.kernel_fingerprint:
    engine: sglang
    model_path: /mnt/nvme/models/glm-5.2-fp8/3f2a9c1
    model_revision: 3f2a9c1e0b7d4c55aa01f4b9e2d8c7a6b5f4e3d2
    parallel: {tp: 8}
    kv_cache_dtype: fp8_e4m3
    engine_args: [--speculative-algorithm, EAGLE, --speculative-num-steps, "3", --port, "30000"]
    gather: true
    engine_python: /opt/sglang/bin/python
  register: fp

- name: EAGLE3 draft mounted at /models/draft in the pod, staged on the node under /mnt/nvme
  llmops.serving.kernel_fingerprint:
    engine: sglang
    model_path: /mnt/nvme/models/glm-5.2-fp8/3f2a9c1
    parallel: {tp: 8}
    engine_args: [--speculative-algorithm, EAGLE3, --speculative-draft-model-path, /models/draft, --enable-torch-compile]
    draft_model_path: /mnt/nvme/models/glm-5.2-eagle3/7d1e0f2
    gather: true
    engine_python: /opt/sglang/bin/python
    cxx: g++-12

- name: Explicit values, nothing gathered
  llmops.serving.kernel_fingerprint:
    engine: vllm
    engine_version: 0.11.2
    versions: {torch: 2.9.0, triton: 3.5.0, cuda: "12.8", deep_gemm: 2.1.0, flashinfer: 0.5.2}
    driver_version: 570.86.15
    gpu_name: NVIDIA H20
    compute_capability: "9.0"
    parallel: {tp: 8}
    model_path: /mnt/nvme/models/dsv3/abc123
    model_revision: abc123
"""

RETURN = r"""
fingerprint:
  description: Short hex digest (16 characters) naming the cache directory C(<cache_root>/<engine>/<fingerprint>).
  returned: success
  type: str
  sample: 9f3c2a51d07e4b18
components:
  description:
    - Every input of the hash, sorted by name. C(engine_args) holds the counted flags by canonical name
      with canonical values (C(true)/C(false), sorted-key JSON, integers, a draft model's identity).
    - C(torch_path), C(torch_git), C(python_include), C(deep_gemm_path) and C(cxx_version) are the
      toolchain (see O(toolchain)).
  returned: success
  type: dict
  sample:
    engine: sglang
    engine_version: 0.5.16b1
    tp: 8
    triton: 3.6.0
    quantization: "fp8:fmt=e4m3:block=128x128"
    torch_path: /opt/sglang/lib/python3.12/site-packages/torch
    cxx_version: "g++: gcc version 12.2.0 (Debian 12.2.0-14) #3f0c2a9b1d4e5f60"
    engine_args: {speculative-algorithm: EAGLE, speculative-draft-model-path: "model:LlamaForCausalLMEagle3|none|config:9a1b2c3d4e5f6a7b"}
label:
  description: Readable summary of the main components (not unique; use RV(fingerprint) as the key).
  returned: success
  type: str
  sample: sglang0.5.16b1-torch2.9.1-triton3.6.0-cuda12.9-NVIDIA_H20-cc9.0-tp8pp1dp1ep1-fp8-kvfp8_e4m3-3f2a9c1e0b7d
ignored_args:
  description: Engine argument names that were not counted because they do not affect kernels.
  returned: success
  type: list
  elements: str
  sample: [host, port, served-model-name]
gathered:
  description:
    - What O(gather=true) found on the target before explicit values were applied (versions, toolchain,
      GPU); empty otherwise.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.cache import _fingerprint
from ansible_collections.llmops.serving.plugins.module_utils.common import _image_cuda, _option_specs
from ansible_collections.llmops.serving.plugins.module_utils.engine import _preflight

_VERSION_OPTS = dict((k, dict(type="str")) for k in _fingerprint.VERSION_KEYS)
_PARALLEL_OPTS = dict((k, dict(type="int", default=1)) for k in _fingerprint.PARALLEL_KEYS)
_TOOLCHAIN_OPTS = dict((k, dict(type="str")) for k in _fingerprint.TOOLCHAIN_KEYS)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine=dict(type="str", required=True, choices=list(_fingerprint.ENGINES)),
            engine_version=dict(type="str"),
            versions=dict(type="dict", default={}, options=_VERSION_OPTS),
            driver_version=dict(type="str"),
            gpu_name=dict(type="str"),
            compute_capability=dict(type="str"),
            parallel=dict(type="dict", default={}, options=_PARALLEL_OPTS),
            model_path=dict(type="path", required=True),
            model_revision=dict(type="str"),
            kv_cache_dtype=dict(type="str", default="auto"),
            engine_args=dict(type="list", elements="str", default=[]),
            draft_model_path=dict(type="path"),
            toolchain=dict(type="dict", default={}, options=_TOOLCHAIN_OPTS),
            cxx=dict(type="str"),
            gather=dict(type="bool", default=False),
            engine_python=dict(type="path", default="python3"),
            image=dict(type="str"),
            **_option_specs.node("nvidia_smi"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    inventory = None
    try:
        # the declared CUDA against the image's tag first: nothing is read for a declaration the image contradicts
        _fingerprint.check_image_cuda(p["image"], p["versions"])
        if p["gather"]:
            inventory = _preflight.gpu_inventory(p["nvidia_smi"], which=module.get_bin_path)
        result = _fingerprint.compute(
            engine=p["engine"], engine_version=p["engine_version"], versions=p["versions"],
            driver_version=p["driver_version"], gpu_name=p["gpu_name"],
            compute_capability=p["compute_capability"], parallel=p["parallel"],
            model_path=p["model_path"], model_revision=p["model_revision"],
            kv_cache_dtype=p["kv_cache_dtype"], engine_args=p["engine_args"], gather=p["gather"],
            engine_python=p["engine_python"], gpu_inventory=inventory, toolchain=p["toolchain"],
            cxx=p["cxx"], draft_model_path=p["draft_model_path"], image=p["image"],
        )
    except _image_cuda.ImageCudaError as e:
        module.fail_json(msg=str(e), reason=e.reason, field=e.field)
    except ValueError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
