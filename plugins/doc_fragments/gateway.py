# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the AIBrix gateway is: the type and default of O(gateway_namespace) and O(gateway_name).

The argument spec is ``_aibrix_route.gateway_argument_spec()`` (module_utils/kube/_aibrix_route.py, defaults
``DEFAULT_GATEWAY_NAMESPACE`` and ``DEFAULT_GATEWAY_NAME``); validate-modules compares the two. Each module
describes the options itself, in its own ``options`` (the fragment's entries merge with them): what a renderer
attaches to the gateway differs from what a check reads of it.

- ``llmops.serving.gateway``: O(gateway_namespace) and O(gateway_name).
- ``llmops.serving.gateway.namespace``: O(gateway_namespace) only (``gateway_argument_spec(name=False)``).
"""
from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  gateway_namespace:
    type: str
    default: aibrix-system
  gateway_name:
    type: str
    default: aibrix-eg
"""

    NAMESPACE = r"""
options:
  gateway_namespace:
    type: str
    default: aibrix-system
"""
