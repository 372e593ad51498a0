# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the internal action, a controller-side check in no action group that changes nothing.

What the ``llmops.serving.attributes.internal_action`` fragment documents, in code: the action needs no connection to
the target, runs the same in check mode, is never async and never reports a change. Runs on the controller only
(``ansible.plugins``), so it is plugin_utils, not module_utils.

* :class:`InternalAction` - the base of such an action plugin (``deprecated_vars``, ``release_check``): its options
  validated against ``ARGUMENT_SPEC``, then its :meth:`InternalAction.check` gives the result.
"""
from __future__ import annotations

from abc import abstractmethod

from ansible.plugins.action import ActionBase


class InternalAction(ActionBase):
    """An action plugin that only reads on the controller: a subclass states ``ARGUMENT_SPEC`` and ``check``."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    ARGUMENT_SPEC = {}

    def run(self, tmp=None, task_vars=None):
        result = super(InternalAction, self).run(tmp, task_vars)
        del tmp
        dummy, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        result.update(changed=False)
        result.update(self.check(args, task_vars or {}))
        return result

    @abstractmethod
    def check(self, args, task_vars):
        """The result's keys for the validated ``args`` (``failed`` and ``msg`` when the check fails); a subclass
        without it cannot be instantiated (ActionBase is an ABC)."""
