# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the argument spec of the node options (doc fragment ``llmops.serving.node``).

Several modules read the node through the same injectable roots and GPU tool, and no single module_utils file
consumes all of them, so their spec lives here once, one entry per variant of the fragment (``doc_fragments/node.py``:
``SYSFS_ROOT``, ``PROC_ROOT``, ``NVIDIA_SMI``): a module that extends a variant takes the matching option with
:func:`node`. Option blocks read by one module_utils file keep their spec beside that code: the Kubernetes
authentication options in ``_k8s_client.argument_spec``, the output directory in ``_render_dir.argument_spec``, the
RDMA counter selection in ``_rdma.snapshot_argument_spec``, the engine pod in ``_k8s_engine.pod_argument_spec``, the
gateway in ``_aibrix_route.gateway_argument_spec`` (docs/development.md, "Option blocks").
"""
from __future__ import annotations

NODE = {
    "sysfs_root": {"type": "path", "default": "/sys"},
    "proc_root": {"type": "path", "default": "/proc"},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
}


def node(*names):
    """The spec of the named node options (``node("sysfs_root", "proc_root")``), fresh dicts to ``update()`` a
    module's argument spec with; an unknown name is a ``KeyError``."""
    return {name: dict(NODE[name]) for name in names}
