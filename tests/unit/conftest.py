"""Shared helpers for module unit tests: run a module's main() in-process with given args."""
from __future__ import annotations

import json
from unittest import mock

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


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


def _exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise ModuleExit(json.loads(json.dumps(kwargs, default=str)))


def _fail_json(self, msg, **kwargs):
    kwargs["failed"] = True
    kwargs["msg"] = msg
    raise ModuleFail(json.loads(json.dumps(kwargs, default=str)))


@pytest.fixture
def run_module():
    """``run_module(module, args, check_mode=False, diff=False)`` -> result dict.

    A failing module returns its result with ``failed: True`` rather than raising, so tests assert on
    ``msg`` like a playbook author would.
    """

    def _run(module, args, check_mode=False, diff=False):
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        if diff:
            args["_ansible_diff"] = True
        with patch_module_args(args), mock.patch.multiple(
            basic.AnsibleModule, exit_json=_exit_json, fail_json=_fail_json
        ):
            try:
                module.main()
            except ModuleExit as e:
                return e.result
            except ModuleFail as e:
                return e.result
        raise AssertionError("module returned without exit_json/fail_json")

    return _run
