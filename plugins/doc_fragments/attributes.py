# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attribute documentation shared by the modules of this collection.

A module extends ``llmops.serving.attributes`` (the descriptions, the action group and the platform) and
states in its own ``attributes`` only what is particular to it: the ``support`` of check_mode and diff_mode
and their ``details``. Keys a module states win over the fragment's.

- ``llmops.serving.attributes.info_module``: the module only reads (check mode full, diff mode N/A).
- ``llmops.serving.attributes.facts``: the module returns ``ansible_facts``.
- ``llmops.serving.attributes.flow``: an action plugin that runs on the controller.
- ``llmops.serving.attributes.k8s_group``: a Kubernetes module, also in the ``llmops.serving.k8s`` action group
  (listed *before* ``llmops.serving.attributes``: of two fragments stating one attribute the first one wins).
- ``llmops.serving.attributes.internal_action``: *instead of* ``llmops.serving.attributes``, an action plugin the
  roles and playbooks call that is in no action group and changes nothing; the module states its check mode
  ``details``.
"""
from __future__ import annotations


class ModuleDocFragment(object):

    # Every module: the attribute descriptions, the action group of meta/runtime.yml and the platform.
    DOCUMENTATION = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/llmops.serving.serving) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - llmops.serving.serving
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
"""

    # With DOCUMENTATION: a module that never changes the target (it returns changed=false).
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Only reads; runs the same in check mode.
  diff_mode:
    support: N/A
    details: Changes nothing, so there is nothing to show.
"""

    # With DOCUMENTATION: a module that returns ansible_facts.
    FACTS = r"""
options: {}
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
"""

    # With DOCUMENTATION: an action plugin (the module file only documents it).
    FLOW = r"""
options: {}
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
  async:
    description: Supports being used with the C(async) keyword.
"""

    # Before DOCUMENTATION: a module of the k8s action group (which extends kubernetes.core's k8s group).
    K8S_GROUP = r"""
options: {}
attributes:
  action_group:
    description:
      - Use C(group/llmops.serving.k8s) in C(module_defaults) to give the Kubernetes modules of this collection and
        those of kubernetes.core's C(k8s) group the same O(host), O(api_key) and other authentication options.
      - C(group/llmops.serving.serving) reaches it too, but sets the options for every module of the collection.
    support: full
    membership:
      - llmops.serving.serving
      - llmops.serving.k8s
"""

    # Instead of DOCUMENTATION: an action plugin outside the action groups that only reads.
    INTERNAL_ACTION = r"""
options: {}
attributes:
  action:
    description: Runs on the controller as an action plugin.
    support: full
  async:
    description: Whether the C(async) keyword applies.
    support: none
  check_mode:
    description: Behaviour in check mode.
    support: full
  diff_mode:
    description: Behaviour in diff mode.
    support: N/A
    details: Changes nothing.
  platform:
    description: Targets it runs against.
    support: full
    platforms: posix
"""
