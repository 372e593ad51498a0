# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine options that the renderers of engine pods take alike (module_utils/kube/_k8s_engine.py).

``llmops.serving.engine_pod``: O(engine), O(gpu_resource) and O(probe_period), for M(llmops.serving.engine_manifests)
and M(llmops.serving.pd_manifests). The argument spec is ``_k8s_engine.pod_argument_spec()``; validate-modules
compares the two.
"""
from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  engine:
    description: Inference engine.
    type: str
    choices: [vllm, sglang]
    default: vllm
  gpu_resource:
    description: Extended resource name of the GPUs.
    type: str
    default: nvidia.com/gpu
  probe_period:
    description: Startup probe period in seconds.
    type: int
    default: 10
"""
