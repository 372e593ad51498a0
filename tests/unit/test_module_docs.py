"""Module documentation agrees with what the collection does: the action group the shared attributes claim.

``llmops.serving.attributes`` documents every module that extends it as a member of the action group
``llmops.serving.serving`` (``group/llmops.serving.serving`` in ``module_defaults``); meta/runtime.yml is what
makes that true (https://docs.ansible.com/ansible/latest/dev_guide/developing_collections_structure.html#meta-directory-and-runtime-yml).
"""
from __future__ import annotations

import glob
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules():
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))):
        yield os.path.basename(path)[:-3], path


def _fragments(path):
    with open(path) as f:
        text = f.read()
    start = text.index('DOCUMENTATION = r"""') + len('DOCUMENTATION = r"""')
    doc = yaml.safe_load(text[start:text.index('"""', start)])
    frags = doc.get("extends_documentation_fragment") or []
    return [frags] if isinstance(frags, str) else frags


def test_every_module_documented_in_the_action_group_is_in_it():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as f:
        group = set(yaml.safe_load(f)["action_groups"]["serving"])
    claimed = {name for name, path in _modules() if "llmops.serving.attributes" in _fragments(path)}
    assert claimed, "no module extends llmops.serving.attributes"
    assert sorted(claimed - group) == []
