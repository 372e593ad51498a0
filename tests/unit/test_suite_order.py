"""The units and the order of a parallel run (conftest.py): a module's tests never split across workers, the session
engine's modules share one worker, and the tables name real modules. A wrong table starts a P/D pair or the session
engine twice on the same ports, or leaves the longest module to run alone at the end."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(name="suite")
def root_conftest(pytestconfig):
    """The repository's root conftest.py, as pytest loaded it."""
    for plugin in pytestconfig.pluginmanager.get_plugins():
        if os.path.abspath(getattr(plugin, "__file__", "") or "") == os.path.join(ROOT, "conftest.py"):
            return plugin
    raise AssertionError("the root conftest.py is not loaded")


def _uses_local_engine(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return any(isinstance(n, ast.FunctionDef) and any(a.arg == "local_engine" for a in n.args.args)
               for n in ast.walk(tree))


def test_the_session_engine_modules_are_exactly_those_that_use_it(suite):
    integration = sorted("tests/integration/" + f for f in os.listdir(os.path.join(ROOT, "tests", "integration"))
                         if f.startswith("test_") and f.endswith(".py"))
    users = [p for p in integration if _uses_local_engine(p)]
    assert sorted(suite.SESSION_ENGINE_MODULES) == users


def test_every_listed_module_exists_once(suite):
    for path in suite.LONGEST_FIRST + suite.SESSION_ENGINE_MODULES:
        assert os.path.isfile(os.path.join(ROOT, path)), path
    assert len(set(suite.LONGEST_FIRST)) == len(suite.LONGEST_FIRST)


class _Config:
    """What pytest-xdist's scheduler reads of the config: the dist mode, the workers, the reorder flag."""

    class option:  # pylint: disable=invalid-name,too-few-public-methods
        loadscopereorder = False

    def __init__(self, dist):
        self.dist = dist

    def getvalue(self, name):
        return {"dist": self.dist, "tx": ["3*popen"]}[name]


def test_the_scheduler_keeps_a_module_together_and_the_engine_modules_in_one_unit(suite):
    pytest.importorskip("xdist")
    sched = suite.pytest_xdist_make_scheduler(_Config("loadfile"), None)
    split = sched._split_scope  # pylint: disable=protected-access
    assert split("tests/integration/test_pd_local.py::test_tcp_round") == split(
        "tests/integration/test_pd_local.py::test_role_is_idempotent_while_the_pair_runs")
    units = set(split(m + "::test_x[param]") for m in suite.SESSION_ENGINE_MODULES)
    assert units == {suite.SESSION_ENGINE_GROUP}
    assert split("tests/unit/test_layout.py::test_a") != split("tests/unit/test_areas.py::test_a")
    assert suite.pytest_xdist_make_scheduler(_Config("load"), None) is None


def test_the_longest_modules_come_first_and_a_module_stays_contiguous(suite):
    class Item:  # pylint: disable=too-few-public-methods
        def __init__(self, nodeid):
            self.nodeid = nodeid

    ids = ["tests/unit/test_a.py::t1", "tests/integration/test_stage_copy.py::t1", "tests/unit/test_a.py::t2",
           "tests/integration/test_pd_local.py::t1", "tests/integration/test_stage_copy.py::t2"]
    items = [Item(i) for i in ids]
    suite.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        "tests/integration/test_pd_local.py::t1", "tests/integration/test_stage_copy.py::t1",
        "tests/integration/test_stage_copy.py::t2", "tests/unit/test_a.py::t1", "tests/unit/test_a.py::t2"]
