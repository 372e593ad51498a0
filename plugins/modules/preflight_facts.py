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
options:
  nvidia_smi:
    description: Name or path of the C(nvidia-smi) binary.
    type: str
    default: nvidia-smi
  sysfs_root:
    description: Root of sysfs; tests point this at a fixture tree.
    type: path
    default: /sys
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
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Read-only; runs the same in check mode.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in diff mode).
    support: none
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
"""

RETURN = r"""
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
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils import _preflight


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            sysfs_root=dict(type="path", default="/sys"),
            paths=dict(type="list", elements="path", default=[]),
            engine_python=dict(type="path"),
            engine_modules=dict(type="list", elements="str", default=["vllm"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        gpu = _preflight.gpu_inventory(p["nvidia_smi"])
    except ValueError as e:
        module.fail_json(msg="nvidia_smi: cannot parse its output: %s" % e)
    result = dict(
        changed=False,
        gpu=gpu,
        rdma=_preflight.rdma_devices(p["sysfs_root"]),
        disk=[_preflight.disk_space(path) for path in p["paths"]],
        engine_runtime={},
    )
    if p["engine_python"]:
        result["engine_runtime"] = _preflight.engine_runtime(p["engine_python"], p["engine_modules"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
