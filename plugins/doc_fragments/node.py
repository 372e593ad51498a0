# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options that say where a module reads the node: the injectable kernel roots and the GPU tool.

One variant per option, so that a module takes exactly the ones it has:

- ``llmops.serving.node.sysfs_root``: O(sysfs_root).
- ``llmops.serving.node.proc_root``: O(proc_root).
- ``llmops.serving.node.nvidia_smi``: O(nvidia_smi).

A module's argument spec keeps the same type and default (validate-modules compares the two). What a module
reads under a root belongs in its own description.
"""
from __future__ import annotations


class ModuleDocFragment(object):

    SYSFS_ROOT = r"""
options:
  sysfs_root:
    description: Root of sysfs, read instead of C(/sys); tests point it at a fixture tree.
    type: path
    default: /sys
"""

    PROC_ROOT = r"""
options:
  proc_root:
    description: Root of procfs, read instead of C(/proc); tests point it at a fixture tree.
    type: path
    default: /proc
"""

    NVIDIA_SMI = r"""
options:
  nvidia_smi:
    description: Name or path of the C(nvidia-smi) binary.
    type: str
    default: nvidia-smi
"""
