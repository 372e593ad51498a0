#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: moe_config_check
short_description: Preflight the tuned fused-MoE Triton config file vLLM or SGLang will look for
version_added: "0.1.0"
description:
  - From the model's C(config.json), TP/EP and the GPU name, computes the exact tuned-config file name
    the engine looks up, for example vLLM's
    C(E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128,128].json) or SGLang's
    C(triton_3_6_0/E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json).
  - Checks the engine's installed package (found through O(engine_python), or O(configs_dir)) and
    O(tuned_config_folder) (C(VLLM_TUNED_CONFIG_FOLDER) / C(SGLANG_MOE_CONFIG_DIR)) in the engine's own
    search order. SGLang configs tuned for another Triton version are reported as a fallback, which
    the engine uses with a "Performance might be sub-optimal" warning.
  - With O(policy=fail) a missing (or fallback-only) file fails the task; with O(policy=warn) it warns.
  - A model without routed experts passes with RV(status=not_moe).
options:
  engine:
    description: Serving engine.
    type: str
    required: true
    choices: [vllm, sglang]
  model_path:
    description: Staged model directory holding C(config.json).
    type: path
    required: true
  tp:
    description: Tensor-parallel size of one engine instance.
    type: int
    required: true
  ep:
    description: Expert-parallel size (1 when experts are tensor-sharded).
    type: int
    default: 1
  gpu_name:
    description: GPU name as C(nvidia-smi) / C(torch.cuda.get_device_name()) prints it (C(NVIDIA H20)).
    type: str
    required: true
  fused_shared_experts:
    description: SGLang C(--num-fused-shared-experts) (shared experts fused into the routed set, adds to E).
    type: int
    default: 0
  dtype:
    description: Kernel dtype label (C(fp8_w8a8), C(int8_w8a8), ...); read from C(quantization_config) when empty.
    type: str
  engine_python:
    description: The engine's Python; used to find the installed configs directory and Triton version.
    type: path
  configs_dir:
    description: The engine's fused-MoE C(configs) directory; overrides the one found through O(engine_python).
    type: path
  triton_version:
    description: Triton version of the engine (SGLang keys its configs by it); read through O(engine_python) when empty.
    type: str
  tuned_config_folder:
    description: Value of C(VLLM_TUNED_CONFIG_FOLDER) (vLLM, searched first) or C(SGLANG_MOE_CONFIG_DIR) (SGLang, replaces O(configs_dir)).
    type: path
  policy:
    description: What a missing tuned config does.
    type: str
    default: warn
    choices: [warn, fail]
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
author:
  - llmops.serving maintainers (@llmops)
"""

EXAMPLES = r"""
- name: Fail before start when the H20 FP8 MoE config is missing
  llmops.serving.moe_config_check:
    engine: sglang
    model_path: /mnt/nvme/models/glm-5.2-fp8/3f2a9c1
    tp: 8
    gpu_name: NVIDIA H20
    engine_python: /opt/sglang/bin/python
    policy: fail
"""

RETURN = r"""
status:
  description: V(found), V(fallback) (SGLang, another Triton version's file), V(missing) or V(not_moe).
  returned: always
  type: str
file_name:
  description: The exact file name the engine looks for.
  returned: always
  type: str
  sample: E=256,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128,128].json
searched:
  description: Full paths checked, in the engine's order.
  returned: always
  type: list
  elements: str
found:
  description: The path the engine will load, or null.
  returned: always
  type: str
fallbacks:
  description: SGLang files for other Triton versions that it would fall back to.
  returned: always
  type: list
  elements: str
message:
  description: What is missing and how to provide it (also emitted as a warning with O(policy=warn)).
  returned: when RV(status) is V(missing) or V(fallback)
  type: str
details:
  description: E, N, dtype, block_shape, device_name, triton_dir and the expert counts behind the name.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.cache import _moe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine=dict(type="str", required=True, choices=["vllm", "sglang"]),
            model_path=dict(type="path", required=True),
            tp=dict(type="int", required=True),
            ep=dict(type="int", default=1),
            gpu_name=dict(type="str", required=True),
            fused_shared_experts=dict(type="int", default=0),
            dtype=dict(type="str"),
            engine_python=dict(type="path"),
            configs_dir=dict(type="path"),
            triton_version=dict(type="str"),
            tuned_config_folder=dict(type="path"),
            policy=dict(type="str", default="warn", choices=["warn", "fail"]),
        ),
        required_one_of=[("engine_python", "configs_dir")],
        supports_check_mode=True,
    )
    p = module.params
    for name in ("tp", "ep"):
        if p[name] < 1:
            module.fail_json(msg="%s: %d is not a positive integer" % (name, p[name]))
    if not p["gpu_name"].strip():
        module.fail_json(msg="gpu_name: empty; pass the GPU name nvidia-smi prints (e.g. 'NVIDIA H20')")
    try:
        configs_dir, triton_version = p["configs_dir"], p["triton_version"]
        if p["engine_python"] and (not configs_dir or not triton_version):
            found_dir, found_triton = _moe.locate_engine(p["engine"], p["engine_python"])
            configs_dir = configs_dir or found_dir
            triton_version = triton_version or found_triton
        cfg = _moe.load_config(p["model_path"])
        res = _moe.check(p["engine"], cfg, p["tp"], p["gpu_name"], configs_dir, ep=p["ep"],
                         tuned_config_folder=p["tuned_config_folder"], triton_version=triton_version,
                         dtype=p["dtype"], fused_shared_experts=p["fused_shared_experts"])
    except ValueError as e:
        module.fail_json(msg=str(e))
    out = dict(changed=False, status=res["status"], file_name=res["file_name"], searched=res["searched"],
               found=res["found"], fallbacks=res["fallbacks"],
               details=dict((k, v) for k, v in res.items()
                            if k not in ("status", "file_name", "searched", "found", "fallbacks")))
    if res["status"] in ("missing", "fallback"):
        what = ("no tuned fused-MoE config %s for %s (searched %s)%s; the engine will use %s. Tune it with the "
                "engine's fused_moe benchmark and ship it through %s"
                % (res["file_name"], p["engine"], ", ".join(res["searched"]),
                   " - only other Triton versions have it: %s" % ", ".join(res["fallbacks"]) if res["fallbacks"] else "",
                   "another Triton version's tuning" if res["fallbacks"] else "default kernel parameters",
                   "VLLM_TUNED_CONFIG_FOLDER" if p["engine"] == "vllm" else "SGLANG_MOE_CONFIG_DIR"))
        out["message"] = what
        if p["policy"] == "fail":
            module.fail_json(msg="policy=fail: " + what, **out)
        module.warn(what)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
