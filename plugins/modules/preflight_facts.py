#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Gather GPU, disk, RDMA and engine-runtime facts a serving node must have
version_added: "0.1.0"
description:
  - Reads the GPU inventory from C(nvidia-smi) (name, count, compute capability, driver) or reports
    C(cpu-only) when there is none.
  - Reads RDMA devices, their ports, link layer and state from C(<sysfs_root>/class/infiniband).
  - Measures free space for each path in O(paths) (the nearest existing parent when a path does not
    exist yet).
  - Checks that the engine's Python can import O(engine_modules) and reports their versions.
  - Only reads; the role decides what is fatal.
  - Fails, naming O(nvidia_smi), when C(nvidia-smi) does not list the GPUs within 60 seconds (a hung driver) or
    prints something that is not its CSV; fails, naming O(engine_python), when that interpreter cannot be
    started, does not finish the import check within 600 seconds, or prints no import report (not a Python).
  - Returns what it gathered as the host fact C(preflight_node) (C(ansible_facts.preflight_node)), and the
    same values as top-level return values (C(gpu), C(rdma), C(disk), C(engine_runtime)) for C(register).
  - Each call replaces C(ansible_facts.preflight_node) with what that call gathered.
options:
  paths:
    description: Paths whose filesystem free space is reported (model root, cache root, ...).
    type: list
    elements: path
    default: []
  engine_python:
    description: Python interpreter of the engine environment. Skipped when not set.
    type: path
  engine_modules:
    description: Modules that must import in O(engine_python).
    type: list
    elements: str
    default: [vllm]
  image_cuda_version:
    description:
      - CUDA version the engine image is built for (for example C(12.9) or C(13.0)). Set, RV(image_cuda) says
        whether the node's driver runs it (CUDA 13 images need R580 or newer, 12.x R525, 11.x 450.80.02; NVIDIA's
        CUDA Toolkit Release Notes). On Kubernetes the engine runs in the image, so its CUDA, not this host's, counts.
      - With O(image), a version that contradicts the CUDA the image's tag names fails before anything is read
        (C(reason=image_cuda_mismatch)), naming both.
    type: str
  image:
    description:
      - The engine image (C(engine_image)) that O(image_cuda_version) describes. Its tag names its CUDA, as a
        C(-cuNNN) variant (C(-cu129) is 12.9, C(-cu130) 13.0), or an unsuffixed C(vllm/vllm-openai) release tag, the
        CUDA 13.0 build from v0.20.0 on and a CUDA 12 build before (vllm-project/vllm pull request 39878).
      - An image pinned by digest alone, a moving tag (C(latest)) or another project's unsuffixed tag cannot be read
        this way; the module warns and checks the driver against O(image_cuda_version) as declared.
    type: str
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.attributes.facts
  - llmops.serving.node.nvidia_smi
  - llmops.serving.node.sysfs_root
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Gather node facts
  llmops.serving.preflight_facts:
    paths:
      - /mnt/nvme/models
      - /mnt/nvme/kernel-cache
    engine_python: /opt/vllm/bin/python
  register: node

- name: Gather node facts and read them as host facts
  llmops.serving.preflight_facts:
    paths: [/mnt/nvme/models]

- name: Require eight GPUs
  ansible.builtin.assert:
    that: ansible_facts.preflight_node.gpu.count >= 8
"""

RETURN = r"""
ansible_facts:
  description: Host facts set by this module.
  returned: always
  type: dict
  contains:
    preflight_node:
      description:
        - What this call gathered, keyed C(gpu), C(rdma), C(disk) and C(engine_runtime) (the same values as
          the top-level return values of those names).
      returned: always
      type: dict
      sample:
        gpu: {mode: cpu-only, count: 0, devices: [], reason: nvidia-smi not found}
        rdma: {present: false, devices: [], reason: /sys/class/infiniband does not exist (no RDMA devices)}
        disk: [{path: /mnt/nvme/models, measured_at: /mnt/nvme, free_bytes: 3840755982336, total_bytes: 3840755982336}]
        engine_runtime: {}
gpu:
  description: GPU inventory; C(mode) is C(gpu) or C(cpu-only) with C(reason).
  returned: always
  type: dict
  sample: {mode: gpu, count: 8, names: [NVIDIA H20], compute_capability: "9.0", driver_version: "570.86.15"}
rdma:
  description: RDMA devices with per-port C(link_layer) (C(InfiniBand) or C(Ethernet) = RoCE), C(state), C(rate).
  returned: always
  type: dict
disk:
  description: Free and total bytes per requested path.
  returned: always
  type: list
  elements: dict
engine_runtime:
  description: Import check of O(engine_modules) in O(engine_python); empty when not requested.
  returned: always
  type: dict
image_cuda:
  description:
    - The node's driver against O(image_cuda_version) - C(cuda), C(driver), C(min_driver), C(ok) (true, false, or
      null where it cannot be told) and C(reason).
    - With O(image), C(image_tag) - what its tag names (C(image), C(tag), C(cuda), null where the tag cannot say,
      C(exact), C(reason)).
  returned: when O(image_cuda_version) is set
  type: dict
  sample: {cuda: "13.0", driver: "570.86.15", min_driver: "580", ok: false, reason: "driver 570.86.15 is older ..."}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.common import _option_specs
from ansible_collections.llmops.serving.plugins.module_utils.engine import _preflight


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **_option_specs.node("nvidia_smi", "sysfs_root"),
            paths=dict(type="list", elements="path", default=[]),
            engine_python=dict(type="path"),
            engine_modules=dict(type="list", elements="str", default=["vllm"]),
            image_cuda_version=dict(type="str"),
            image=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        facts = _preflight.node_facts(p["nvidia_smi"], p["sysfs_root"], p["paths"],
                                      engine_python=p["engine_python"], engine_modules=p["engine_modules"],
                                      which=module.get_bin_path, image_cuda_version=p["image_cuda_version"],
                                      image=p["image"])
    except _preflight.PreflightError as e:
        fail = {"msg": str(e), "field": e.option}
        if e.reason:
            fail["reason"] = e.reason
        module.fail_json(**fail)
    tag = facts.get("image_cuda", {}).get("image_tag")
    if tag is not None and tag["cuda"] is None:
        module.warn("image: the CUDA of %s is not checked against image_cuda_version %s: %s"
                    % (p["image"], p["image_cuda_version"], tag["reason"]))
    module.exit_json(changed=False, ansible_facts={_preflight.FACT_NAME: facts}, **facts)


if __name__ == "__main__":
    main()
