# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options that select the RDMA port counters of a snapshot and the direction its verdict counts.

The argument spec is ``_rdma.snapshot_argument_spec()`` (module_utils/transport/_rdma.py); validate-modules compares the two.

- ``llmops.serving.rdma``: O(devices), O(ports), O(direction), for a module that snapshots the ports itself
  (``snapshot_argument_spec()``).
- ``llmops.serving.rdma.evidence``: O(rdma_devices), O(rdma_ports), O(direction), for a module that takes the
  snapshots as evidence around its own work (``snapshot_argument_spec("rdma_")``).
"""
from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  devices:
    description:
      - RDMA device names to read (for example V(mlx5_0)). Empty reads every device under
        C(class/infiniband).
      - A name that does not exist fails the module with the list of devices present.
    type: list
    elements: str
    default: []
  ports:
    description: Port numbers to read on each device. Empty reads every port.
    type: list
    elements: int
    default: []
  direction:
    description:
      - Which counters count toward the verdict. With a NIXL pull (READ) the prefill host transmits
        (V(tx)) and the decode host receives (V(rx)). V(both) adds the two.
    type: str
    choices: [tx, rx, both]
    default: both
"""

    EVIDENCE = r"""
options:
  rdma_devices:
    description: RDMA devices whose counters are read for the evidence (empty = all).
    type: list
    elements: str
    default: []
  rdma_ports:
    description: Ports read on each device (empty = all).
    type: list
    elements: int
    default: []
  direction:
    description: Which RDMA counters count toward the verdict (C(rx) on the decode host of a NIXL pull).
    type: str
    choices: [tx, rx, both]
    default: both
"""
