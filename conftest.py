"""Make the working tree importable as ``ansible_collections.llmops.serving`` for pytest.

The collection must live at ``ansible_collections/llmops/serving``; a symlink under ``.build`` points
there so the tests always exercise the working tree, never an installed copy.
"""
from __future__ import annotations

import json
import os
import sys
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))
_TREE = os.path.join(ROOT, ".build", "pycoll")
_LINK = os.path.join(_TREE, "ansible_collections", "llmops", "serving")
if not os.path.islink(_LINK):
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    try:
        os.symlink(ROOT, _LINK)
    except FileExistsError:
        pass
if _TREE not in sys.path:
    sys.path.insert(0, _TREE)


class ModuleExit(Exception):
    """exit_json was called."""

    def __init__(self, result):
        super().__init__(result)
        self.result = result


class ModuleFail(Exception):
    """fail_json was called."""

    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


def _warnings():
    from ansible.module_utils.common import warnings as w

    return list(w.get_warning_messages())


def _exit_json(self, **kwargs):  # pylint: disable=unused-argument
    kwargs.setdefault("changed", False)
    kwargs.setdefault("warnings", _warnings())
    raise ModuleExit(json.loads(json.dumps(kwargs, default=str)))


def _fail_json(self, msg, **kwargs):
    kwargs["failed"] = True
    kwargs.setdefault("warnings", _warnings())
    kwargs["msg"] = msg
    raise ModuleFail(json.loads(json.dumps(kwargs, default=str)))


@pytest.fixture
def run_module():
    """``run_module(module, args, check_mode=False, diff=False)`` -> result dict.

    A failing module returns its result with ``failed: True`` rather than raising, so tests assert on
    ``msg`` like a playbook author would.
    """

    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    from ansible.module_utils.common import warnings as ans_warnings

    def _run(module, args, check_mode=False, diff=False):
        ans_warnings._global_warnings.clear()  # pylint: disable=protected-access
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        if diff:
            args["_ansible_diff"] = True
        from ansible.module_utils import _internal

        with patch_module_args(args), mock.patch.multiple(
            basic.AnsibleModule, exit_json=_exit_json, fail_json=_fail_json
        ), mock.patch.object(_internal, "is_controller", False):
            try:
                module.main()
            except ModuleExit as e:
                return e.result
            except ModuleFail as e:
                return e.result
        raise AssertionError("module returned without exit_json/fail_json")

    return _run
