"""Make the working tree importable as ``ansible_collections.llmops.serving`` for pytest.

The collection must live at ``ansible_collections/llmops/serving``; a symlink under ``.build`` points
there so the tests always exercise the working tree, never an installed copy.
"""
from __future__ import annotations

import importlib.util
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


# ---- the order and grouping of a parallel run ---------------------------------------------------------------------
# `make test` runs pytest on several workers (pytest-xdist, ``--dist loadfile --no-loadscope-reorder``): a worker takes
# one unit at a time, in collection order, and runs the whole unit. Two rules make that both correct and short:
# * a unit is a test module (so a module's fixtures - a P/D pair on fixed ports, a network-namespace fleet - are built
#   once, on one worker, as in a serial run), except that the modules using the session's real engine
#   (``local_engine``, tests/integration/conftest.py: SESSION_ENGINE_MODULES) are one unit, so one worker starts that
#   engine once and their tests take turns on it. The unit is decided by the scheduler below from the test's id:
#   pytest-xdist's own ``xdist_group`` marks have no effect with pytest 9.2 (xdist 3.8 renames ``item._nodeid``, which
#   ``item.nodeid`` no longer reads), so they are not used;
# * the longest modules start first, so the run does not end with one long module running alone. LONGEST_FIRST is
#   their order, measured with ``--durations`` on the 2-core machine of docs/development.md (seconds of a serial run in
#   the comments; the session engine's unit starts with test_benchmark_local, whose first test starts the engine).
#   The order changes only the wall time, never a result: every module not listed keeps its place after them.
# tests/unit/test_suite_order.py checks both tables against the tests.
SESSION_ENGINE_GROUP = "local_engine"
SESSION_ENGINE_MODULES = (
    "tests/integration/test_benchmark_local.py",
    "tests/integration/test_site_local.py",
    "tests/integration/test_diagnose_local.py",
)
LONGEST_FIRST = (
    "tests/integration/test_upgrade_local.py",  # about 600 s under load: its own engine, started four times
    "tests/integration/test_awx_upgrade_netns.py",  # 550 s (load 4-10), 737 s (10-28): six engine starts, 10 jobs
    "tests/integration/test_benchmark_local.py",  # 182 s, with the session engine's start
    "tests/integration/test_pd_local.py",  # 259 s: two vLLM engines and the proxy
    "tests/integration/test_awx_configure_api.py",  # 126 s alone, 320 s in make test: six runs of awx_configure.yml
    "tests/integration/test_awx_runner.py",  # 66 s alone, 140-180 s in make test
    "tests/integration/test_site_local.py",  # 58 s (session engine)
    "tests/integration/test_awx_deploy_netns.py",  # 46 s
    "tests/integration/test_stage_copy.py",  # 46 s
    "tests/integration/test_awx_jobs_netns.py",  # 40 s
    "tests/integration/test_stage_fanout.py",  # 29 s
    "tests/integration/test_fanout_netns.py",  # 28 s
    "tests/integration/test_kernel_cache_role.py",  # 27 s
    "tests/unit/plugins/module_utils/stage/test_stage_fanout_peers.py",  # 24 s
    "tests/integration/test_diagnose_local.py",  # 23 s (session engine)
    "tests/integration/test_engine_render.py",  # 21 s
    "tests/integration/test_renamed_variables.py",  # 20 s
    "tests/integration/test_engine_argv.py",  # 20 s
    "tests/integration/test_example_fleet.py",  # 19 s
    "tests/integration/test_model_stage_follow.py",  # 17 s
    "tests/integration/test_awx_netns.py",  # 16 s
    "tests/property/test_peer_properties.py",  # 14 s
)


def unit_of(nodeid):
    """The scheduling unit of a test id: its module, or the session engine's group."""
    module = nodeid.split("::", 1)[0]
    return SESSION_ENGINE_GROUP if module in SESSION_ENGINE_MODULES else module


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
    """The longest modules first (see LONGEST_FIRST)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    order = sorted(enumerate(items), key=lambda pair: (rank.get(pair[1].nodeid.split("::", 1)[0], len(rank)), pair[0]))
    items[:] = [pair[1] for pair in order]


if importlib.util.find_spec("xdist") is not None:
    def pytest_xdist_make_scheduler(config, log):
        """``--dist loadfile``, with the session engine's modules as one unit (see above)."""
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling  # pylint: disable=import-outside-toplevel

        class ModuleScheduling(LoadFileScheduling):
            def _split_scope(self, nodeid):
                return unit_of(nodeid)

        return ModuleScheduling(config, log)
