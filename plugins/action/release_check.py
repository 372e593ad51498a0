# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fail a job whose collection (roles, modules) is not the release of its playbooks.

Runs on the controller (in AWX: the execution environment), where the collection's own files are: a module
shipped to a host would carry only its code, not the collection's MANIFEST.json. The comparison is in
``module_utils/common/_release.py``.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.common._release import ReleaseError, compare
from ansible_collections.llmops.serving.plugins.plugin_utils._internal_action import InternalAction


class ActionModule(InternalAction):
    """Compare the running collection's release with the playbooks' release."""

    ARGUMENT_SPEC = {
        "playbook_release_dir": {"type": "path", "required": True},
        "collection_dir": {"type": "path"},
    }

    def check(self, args, task_vars):
        try:
            result = compare(args["playbook_release_dir"], args["collection_dir"])
        except ReleaseError as e:
            return dict(failed=True, msg=str(e), file=e.file, reason=e.reason)
        result.update(msg="%s %s runs the playbooks of the same release" % (result["collection"], result["collection_version"]))
        return result
