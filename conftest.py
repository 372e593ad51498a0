"""Make the working tree importable as ``ansible_collections.llmops.serving`` for pytest.

The collection must live at ``ansible_collections/llmops/serving``; a symlink under ``.build`` points
there so the tests always exercise the working tree, never an installed copy.
"""
from __future__ import annotations

import os
import sys

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
