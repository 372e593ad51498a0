# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fail a job whose collection (roles, modules) is not the release of its playbooks.

Runs on the controller (in AWX: the execution environment), where the collection's own files are: a module
shipped to a host would carry only its code, not the collection's MANIFEST.json. The comparison is in
``module_utils/common/_release.py``.
"""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.llmops.serving.plugins.module_utils.common._release import ReleaseError, compare


class ActionModule(ActionBase):
    """Compare the running collection's release with the playbooks' release."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    ARGUMENT_SPEC = {
        "playbook_release_dir": {"type": "path", "required": True},
        "collection_dir": {"type": "path"},
    }

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        dummy, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        try:
            result.update(compare(args["playbook_release_dir"], args["collection_dir"]))
        except ReleaseError as e:
            result.update(failed=True, msg=str(e), file=e.file, reason=e.reason)
            return result
        result.update(changed=False, msg="%s %s runs the playbooks of the same release"
                      % (result["collection"], result["collection_version"]))
        return result
