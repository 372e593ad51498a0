# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fail a job whose collection (roles, modules) is not the build of its playbooks.

Runs on the controller (in AWX: the execution environment), where the collection's own files are: a module
shipped to a host would carry only its code, not the collection's MANIFEST.json. The release comparison and the
build identity's verdict are in ``module_utils/common/_release.py``.
"""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.common._release import ReleaseError, check_identity, compare
from ansible_collections.llmops.serving.plugins.plugin_utils._internal_action import InternalAction


class ActionModule(InternalAction):
    """Compare the running collection's release and build commit with the playbooks' release and revision."""

    ARGUMENT_SPEC = {
        "playbook_release_dir": {"type": "path", "required": True},
        "collection_dir": {"type": "path"},
        "playbook_revision": {"type": "str"},
        "require_identity": {"type": "bool", "default": True},
    }

    def check(self, args, task_vars):
        try:
            result = compare(args["playbook_release_dir"], args["collection_dir"])
        except ReleaseError as e:
            return dict(failed=True, msg=str(e), file=e.file, reason=e.reason)
        identity = check_identity(args["playbook_release_dir"], args["collection_dir"], args["playbook_revision"])
        result.update((k, v) for k, v in identity.items() if k not in ("reason", "why"))
        result["verdict_reason"] = identity["reason"]
        name = "%s %s" % (result["collection"], result["collection_version"])
        if identity["verdict"] == "mismatch":
            result.update(failed=True, reason=identity["reason"], file=identity["build_identity_file"],
                          msg="%s is not the build of these playbooks: %s" % (name, identity["why"]))
        elif identity["verdict"] == "unknown":
            msg = ("cannot tell whether %s is the build of these playbooks (%s): %s"
                   % (name, identity["reason"], identity["why"]))
            if args["require_identity"]:
                result.update(failed=True, reason="identity_unknown", file=identity["build_identity_file"],
                              msg=msg + "; require_identity is on (an AWX job), so the job stops here")
            else:
                result.update(msg=msg, warnings=[msg + " (require_identity is off: the job goes on)"])
        else:
            result.update(msg="%s runs the playbooks of the same build (%s)" % (name, identity["reason"]))
        return result
