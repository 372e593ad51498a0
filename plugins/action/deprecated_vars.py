# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Report renamed role variables that are still set, as Ansible deprecation warnings.

A role passes its list of renames (``old``, ``new``, ``meaning``); every ``old`` name the play still sets
(inventory, play, extra vars, ...) becomes one entry of the result's ``deprecations``, which Ansible shows as
``[DEPRECATION WARNING]`` (and the ``deprecation_warnings`` setting can silence). The check runs on the
controller, reads names only (never values), and changes nothing.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.plugin_utils._internal_action import InternalAction

REMOVED_IN = "1.0.0"
COLLECTION = "llmops.serving"


def deprecation(item):
    """The deprecation of one rename (``old``, ``new``, ``meaning``), as a module result carries it."""
    return dict(msg="%s is renamed %s (%s); its value is used while %s is unset. Rename it"
                % (item["old"], item["new"], item["meaning"], item["new"]),
                version=REMOVED_IN, collection_name=COLLECTION)


class ActionModule(InternalAction):
    """Deprecation warnings for the renamed variables of a role that a play still sets."""

    ARGUMENT_SPEC = {
        "renamed": {"type": "list", "elements": "dict", "required": True, "options": {
            "old": {"type": "str", "required": True},
            "new": {"type": "str", "required": True},
            "meaning": {"type": "str", "required": True},
        }},
    }

    def check(self, args, task_vars):
        still = [item for item in args["renamed"] if item["old"] in task_vars]
        result = dict(deprecated=[item["old"] for item in still])
        if still:
            result["deprecations"] = [deprecation(item) for item in still]
        return result
