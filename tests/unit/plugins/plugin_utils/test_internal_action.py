"""The internal action is what the ``llmops.serving.attributes.internal_action`` fragment documents: every action
plugin whose module takes that fragment is one, and the base declares the attributes the fragment states."""
from __future__ import annotations

import glob
import importlib
import os

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.doc_fragments.attributes import ModuleDocFragment
from ansible_collections.llmops.serving.plugins.plugin_utils._internal_action import InternalAction

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FRAGMENT = "llmops.serving.attributes.internal_action"
ACTIONS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "plugins", "action", "*.py")))


def _documentation(name):
    module = importlib.import_module("ansible_collections.llmops.serving.plugins.modules." + name)
    return yaml.safe_load(module.DOCUMENTATION)


@pytest.mark.parametrize("name", ACTIONS)
def test_an_action_is_an_internal_action_exactly_when_its_module_takes_the_fragment(name):
    plugin = importlib.import_module("ansible_collections.llmops.serving.plugins.action." + name)
    documented = FRAGMENT in _documentation(name).get("extends_documentation_fragment", [])
    assert issubclass(plugin.ActionModule, InternalAction) is documented


def test_the_base_declares_what_the_fragment_documents():
    attributes = yaml.safe_load(ModuleDocFragment.INTERNAL_ACTION)["attributes"]
    assert InternalAction._supports_async is (attributes["async"]["support"] != "none")
    assert InternalAction._supports_check_mode is (attributes["check_mode"]["support"] == "full")
    assert InternalAction._requires_connection is False and InternalAction.TRANSFERS_FILES is False


def test_the_internal_actions_are_the_two_checks():
    assert [n for n in ACTIONS if FRAGMENT in _documentation(n).get("extends_documentation_fragment", [])] == [
        "deprecated_vars", "release_check"]
