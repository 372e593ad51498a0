#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: deprecated_vars
short_description: Warn about renamed role variables that a play still sets
version_added: "0.1.0"
description:
  - Used by the roles of this collection at their start. For each rename in O(renamed) whose old name is a
    variable of the play (inventory, play or role vars, extra vars, ...), returns a deprecation that Ansible
    shows as C([DEPRECATION WARNING]), naming the new variable and removal in llmops.serving 1.0.0.
  - Reads variable names only, never their values; changes nothing.
  - This is an action plugin; it runs on the controller and needs no connection to the target.
options:
  renamed:
    description: The role's renames.
    type: list
    elements: dict
    required: true
    suboptions:
      old:
        description: The deprecated variable name.
        type: str
        required: true
      new:
        description: The variable that replaces it.
        type: str
        required: true
      meaning:
        description: What the variable means, shown in the warning (for example C(the HTTPRoute request timeout)).
        type: str
        required: true
extends_documentation_fragment:
  - llmops.serving.attributes.internal_action
attributes:
  check_mode:
    details: Only reads variable names; runs the same in check mode.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Report deprecated variable names still in use
  llmops.serving.deprecated_vars:
    renamed:
      - old: engine_k8s_route_timeout
        new: engine_k8s_route_request_timeout
        meaning: the HTTPRoute request timeout, a duration such as 120s
"""

RETURN = r"""
deprecated:
  description: The old names of O(renamed) that are set, in the order given.
  returned: always
  type: list
  elements: str
  sample: [engine_k8s_route_timeout]
deprecations:
  description: One deprecation per name in RV(deprecated); Ansible shows each as a deprecation warning.
  returned: when a deprecated name is set
  type: list
  elements: dict
"""
