"""The CUDA an engine image's tag names, and a declared CUDA that contradicts it (common/_image_cuda).

The tag rules restate vllm-project/vllm PR #39878 (merged 2026-04-15, first in v0.20.0): "CUDA 13.0 wheels and
Docker images are now the unsuffixed default"; the variant tag of CUDA 12.9 is ``-cu129``. Before it the unsuffixed
tag was the CUDA 12 build and ``-cu130`` the variant.
"""
from __future__ import annotations

import ast
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.common import _image_cuda

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize("image, cuda, exact", [
    ("vllm/vllm-openai:v0.26.0", "13.0", True),  # review M3: the example's pin, declared 12.9
    ("vllm/vllm-openai:v0.26.0-cu129", "12.9", True),
    ("vllm/vllm-openai:v0.20.0", "13.0", True),
    ("vllm/vllm-openai:v0.20.0-cu130", "13.0", True),
    ("vllm/vllm-openai:v0.19.1", "12", False),
    ("vllm/vllm-openai:v0.19.1-cu130", "13.0", True),
    ("vllm/vllm-openai:v0.26.0-cu129@" + DIGEST, "12.9", True),
    ("registry.example:5000/mirror/vllm-openai:v0.26.0", "13.0", True),  # a mirror keeps the name
    ("vllm/vllm-openai:v0.20.0-ubuntu2404", "13.0", True),
    ("lmsysorg/sglang:v0.5.16-cu129", "12.9", True),  # an explicit variant, whatever the project
    ("vllm/vllm-openai@" + DIGEST, None, False),  # digest alone: no tag to read
    ("vllm/vllm-openai:latest", None, False),  # moves
    ("lmsysorg/sglang:v0.5.16", None, False),  # another project's unsuffixed tag
    ("registry.example:5000/vllm-openai", None, False),  # a registry port is not a tag
])
def test_the_tag_names_the_cuda_or_says_it_cannot(image, cuda, exact):
    out = _image_cuda.tag_cuda(image)
    assert (out["cuda"], out["exact"]) == (cuda, exact), out
    assert out["reason"]


def test_the_examples_old_pin_with_cuda_12_9_declared_is_refused_naming_both_and_the_fixes():
    """Review M3: vllm/vllm-openai:v0.26.0 declared as CUDA 12.9 passed preflight on R570 nodes."""
    with pytest.raises(_image_cuda.ImageCudaError) as e:
        _image_cuda.check_declared("vllm/vllm-openai:v0.26.0", "12.9")
    msg = str(e.value)
    assert e.value.reason == "image_cuda_mismatch" and e.value.field == "image_cuda_version"
    assert msg.startswith("image_cuda_version: 12.9 contradicts the image vllm/vllm-openai:v0.26.0, a CUDA 13.0 build")
    assert "vllm/vllm-openai:v0.26.0-cu129" in msg and "engine_image_versions: cuda 13.0" in msg


@pytest.mark.parametrize("image, declared", [
    ("vllm/vllm-openai:v0.26.0-cu129", "12.9"),
    ("vllm/vllm-openai:v0.26.0", "13.0"),
    ("vllm/vllm-openai:v0.26.0", "13"),
    ("vllm/vllm-openai:v0.19.1", "12.8"),  # only the major is known before v0.20.0
    ("vllm/vllm-openai@" + DIGEST, "12.9"),  # cannot be read: not refused, the caller warns
])
def test_a_declared_cuda_the_tag_allows_passes(image, declared):
    assert _image_cuda.check_declared(image, declared)["image"] == image


@pytest.mark.parametrize("image, declared", [
    ("vllm/vllm-openai:v0.26.0-cu129", "13.0"),
    ("vllm/vllm-openai:v0.26.0-cu129", "12.8"),  # the tag names the minor too
    ("vllm/vllm-openai:v0.19.1", "13.0"),
    ("vllm/vllm-openai:v0.26.0-cu129", "twelve"),
])
def test_a_declared_cuda_the_tag_contradicts_is_refused(image, declared):
    with pytest.raises(_image_cuda.ImageCudaError) as e:
        _image_cuda.check_declared(image, declared, field="engine_image_versions.cuda")
    assert e.value.reason == "image_cuda_mismatch" and str(e.value).startswith("engine_image_versions.cuda: ")


_REPO = st.sampled_from(["vllm/vllm-openai", "registry.example:5000/vllm/vllm-openai", "mirror.example/vllm-openai"])
_RELEASE = st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 9))


@given(repo=_REPO, release=_RELEASE, variant=st.sampled_from(["", "-cu126", "-cu128", "-cu129", "-cu130"]),
       digest=st.booleans(), declared=st.sampled_from(["12.6", "12.8", "12.9", "13.0", "12", "13"]))
def test_a_declared_cuda_passes_exactly_when_the_tag_allows_it(repo, release, variant, digest, declared):
    """The property: refused iff the tag's CUDA (variant, else the release default) differs in major, or in minor
    where both name one; a refusal names the declared version and the image."""
    image = "%s:v%d.%d.%d%s%s" % (repo, release[0], release[1], release[2], variant, "@" + DIGEST if digest else "")
    if variant:
        have = (int(variant[3:5]), int(variant[5]))
    else:
        have = (13, 0) if release[:2] >= (0, 20) else (12,)
    want = tuple(int(p) for p in declared.split("."))
    agrees = want[0] == have[0] and (len(want) < 2 or len(have) < 2 or want[1] == have[1])
    try:
        _image_cuda.check_declared(image, declared)
    except _image_cuda.ImageCudaError as e:
        assert not agrees and ("%s contradicts the image %s" % (declared, image)) in str(e)
    else:
        assert agrees


# ---- cannot bypass: one reading of an image tag's CUDA, and no driver check on an unchecked version ---------- #

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))))
#: The file that reads a tag's CUDA (the ``-cuNNN`` pattern) and the one that checks a driver against a CUDA
#: version, after checking that version against the image (``_preflight.node_facts`` -> ``image_cuda_of``).
TAG_READER = os.path.join("plugins", "module_utils", "common", "_image_cuda.py")
DRIVER_CHECK = os.path.join("plugins", "module_utils", "engine", "_preflight.py")


def _python_files():
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "plugins")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def bypasses(tag_reader=TAG_READER, driver_check=DRIVER_CHECK):
    """``file:line`` of every regular expression over a ``cuNNN`` tag outside :data:`TAG_READER`, and of every call
    of ``driver_fits_cuda`` outside :data:`DRIVER_CHECK` (a driver checked against a version nobody compared with
    the image)."""
    bad = []
    for rel, tree in _python_files():
        for node in ast.walk(tree):
            if (rel != tag_reader and isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.search(r"cu\(?\\d|cu\[0-9\]", node.value)):
                bad.append("%s:%d reads a CUDA from an image tag; use common/_image_cuda.tag_cuda" % (rel, node.lineno))
            if (rel != driver_check and isinstance(node, ast.Call)
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) == "driver_fits_cuda"):
                bad.append("%s:%d checks a driver against a CUDA version not checked against the image; use "
                           "_preflight.node_facts (image_cuda_of first)" % (rel, node.lineno))
    return bad


def test_no_plugin_reads_a_tags_cuda_or_checks_a_driver_around_the_one_rule():
    assert bypasses() == []


def test_the_driver_check_runs_only_after_the_image_check():
    """In node_facts, image_cuda_of (the refusal) comes before any read of the node and before driver_fits_cuda."""
    tree = next(t for rel, t in _python_files() if rel == DRIVER_CHECK)
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "node_facts")
    calls = [getattr(c.func, "attr", getattr(c.func, "id", None))
             for c in sorted((n for n in ast.walk(body) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))]
    calls = [c for c in calls if c in ("image_cuda_of", "gpu_inventory", "driver_fits_cuda")]
    assert calls[0] == "image_cuda_of" and "driver_fits_cuda" in calls, calls


def test_the_scan_sees_a_tag_read_and_a_driver_check_outside_their_owners():
    found = bypasses(tag_reader="nowhere.py", driver_check="nowhere.py")
    assert any(b.startswith(TAG_READER + ":") and "reads a CUDA" in b for b in found), found
    assert any(b.startswith(DRIVER_CHECK + ":") and "checks a driver" in b for b in found), found
