"""A kernel cache is published only through ``_kcache.publish``, under the fingerprint lock, after its own check.

Every way a fingerprint directory comes into being (prebuild, sync, and the capture of an engine's first start)
must hold the per-fingerprint lock (one publisher; a later one re-checks and finds it), verify the directory it is
about to publish against its fresh manifest with no extra file allowed, and rename it into place through
``_kcache.publish`` (the publish sequence gc orders by). The scan below fails when a file under plugins/ publishes
outside the lock, without that check, or renames into a fingerprint directory itself.
"""
from __future__ import annotations

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))))
KCACHE = "ansible_collections.llmops.serving.plugins.module_utils.cache._kcache"
#: The one file that renames a directory onto its fingerprint's published path: ``_kcache.publish``.
RENAME_OWNER = "plugins/module_utils/cache/_kcache.py"


def _sources():
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def _publish_names(tree):
    """Names under which ``_kcache.publish`` is reachable in this file."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == KCACHE:
            names |= {a.asname or a.name for a in node.names if a.name == "publish"}
    return names


def _is_publish(call, names):
    f = call.func
    return (isinstance(f, ast.Name) and f.id in names) or (
        isinstance(f, ast.Attribute) and f.attr == "publish" and isinstance(f.value, ast.Name) and f.value.id == "_kcache")


def _callee(call):
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _locked_withs(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                              and _callee(i.context_expr) == "fingerprint_lock" for i in node.items):
            yield node


def _checked_before(block, call):
    """A ``verify_dir(<publish's first argument>, ..., allow_extra=False)`` in ``block`` before ``call``."""
    first = call.args[0] if call.args else None
    for node in ast.walk(block):
        if not (isinstance(node, ast.Call) and _callee(node) == "verify_dir" and node.lineno < call.lineno):
            continue
        strict = any(k.arg == "allow_extra" and isinstance(k.value, ast.Constant) and k.value.value is False
                     for k in node.keywords)
        if strict and node.args and isinstance(first, ast.Name) and isinstance(node.args[0], ast.Name) \
                and node.args[0].id == first.id:
            return True
    return False


def violations():
    out, seen = [], 0
    for rel, tree in _sources():
        names = _publish_names(tree)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_publish(n, names)]
        seen += len(calls)
        locked = list(_locked_withs(tree))
        for call in calls:
            holders = [w for w in locked if any(n is call for n in ast.walk(w))]
            if not holders:
                out.append("%s:%d publishes outside fingerprint_lock" % (rel, call.lineno))
            elif not any(_checked_before(w, call) for w in holders):
                out.append("%s:%d publishes without verify_dir(<dir>, ..., allow_extra=False) first"
                           % (rel, call.lineno))
        if rel == RENAME_OWNER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "rename", "replace") and len(node.args) == 2 and isinstance(node.args[1], ast.Name) \
                    and node.args[1].id == "final":
                out.append("%s:%d renames onto a published fingerprint directory itself; go through "
                           "_kcache.publish" % (rel, node.lineno))
    return out, seen


def test_every_publish_holds_the_lock_checks_first_and_goes_through_kcache_publish():
    found, seen = violations()
    assert found == []
    assert seen >= 3  # prebuild, sync and publish_capture


def test_the_scan_sees_a_publish_that_bypasses_the_lock(tmp_path):
    bad = ast.parse(
        "from %s import publish, verify_dir\n"
        "def f(partial, final):\n"
        "    verify_dir(partial, 'fp', allow_extra=False)\n"
        "    publish(partial, final, '/r', 'vllm')\n"
        "    os.rename(partial, final)\n" % KCACHE)
    names = _publish_names(bad)
    calls = [n for n in ast.walk(bad) if isinstance(n, ast.Call) and _is_publish(n, names)]
    assert len(calls) == 1 and not list(_locked_withs(bad))
    unchecked = ast.parse(
        "from %s import publish\n"
        "def f(partial, final):\n"
        "    with fingerprint_lock('/r', 'vllm', 'fp', 1):\n"
        "        publish(partial, final, '/r', 'vllm')\n" % KCACHE)
    call = next(n for n in ast.walk(unchecked) if isinstance(n, ast.Call) and _is_publish(n, {"publish"}))
    (held,) = _locked_withs(unchecked)
    assert not _checked_before(held, call)
