# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the CUDA an engine image's tag names, against the CUDA a site declares for it.

The engine runs in its image, so the node's driver is checked against the image's CUDA and the kernel caches are
keyed by the image's versions; both read a hand-typed block (``engine_image_versions``). The tag is the one thing
about the image a check can read without pulling it:

* :func:`tag_cuda` - the CUDA a tag names: an explicit ``-cuNNN`` variant (``-cu129`` = 12.9, ``-cu130`` = 13.0),
  or, for an unsuffixed ``vllm/vllm-openai`` release tag, the release's default build: CUDA 13.0 from v0.20.0 on,
  CUDA 12 before (vllm-project/vllm PR #39878, merged 2026-04-15: "CUDA 13.0 wheels and Docker images are now the
  unsuffixed default"; "Variant Docker tag ... latest-cu129"). An image pinned by digest alone, a moving tag
  (``latest``, ``nightly``) and another project's unsuffixed tag cannot be read: ``cuda`` is None and ``reason``
  says why, never a guess.
* :func:`check_declared` - refuses (:class:`ImageCudaError`, reason ``image_cuda_mismatch``) a declared CUDA that
  contradicts the tag, naming both and the two fixes (pin the variant of the declared CUDA, or declare the tag's).
"""
from __future__ import annotations

import re

#: The first vLLM release whose unsuffixed image tag is the CUDA 13.0 build (vllm-project/vllm PR #39878).
VLLM_CUDA13_DEFAULT_FROM = (0, 20)
_VARIANT = re.compile(r"(?:^|[-_.])cu(\d{2})(\d)(?=$|[-_.])")
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")
_MOVING = ("latest", "nightly", "main", "dev")


class ImageCudaError(ValueError):
    """A declared CUDA that contradicts the image's tag; ``field`` names the option to fix."""

    def __init__(self, msg, field):
        super(ImageCudaError, self).__init__(msg)
        self.field = field
        self.reason = "image_cuda_mismatch"


def split_image(image):
    """``(repository, tag, digest)`` of an image reference (``[registry/]repo[:tag][@digest]``); tag and digest
    are None where absent. A registry's port (``host:5000/repo``) is not a tag."""
    ref = (image or "").strip()
    ref, _at, digest = ref.partition("@")
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        return ref[:colon], ref[colon + 1:] or None, digest or None
    return ref, None, digest or None


def _version(text):
    parts = text.strip().split(".")
    if len(parts) > 2 or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def tag_cuda(image):
    """``{image, tag, cuda, exact, reason}``: the CUDA ``image``'s tag names (``cuda`` like ``"12.9"``, or ``"12"``
    where only the major is known, ``exact`` False then), or ``cuda`` None and ``reason`` saying why it cannot be
    read from the tag."""
    repo, tag, digest = split_image(image)
    out = {"image": image, "tag": tag, "cuda": None, "exact": False, "reason": ""}
    if not tag:
        out["reason"] = ("%s has no tag%s, so its CUDA cannot be read from the name; keep the tag beside the digest "
                         "(for example vllm/vllm-openai:v0.26.0-cu129@sha256:...) or check engine_image_versions "
                         "against the image itself (python3 -c 'import torch; print(torch.version.cuda)' in it)"
                         % (image, " (pinned by digest alone)" if digest else ""))
        return out
    variant = _VARIANT.search(tag)
    if variant:
        out.update(cuda="%d.%s" % (int(variant.group(1)), variant.group(2)), exact=True,
                   reason="the tag's -cu%s%s variant" % (variant.group(1), variant.group(2)))
        return out
    if repo.rsplit("/", 1)[-1] != "vllm-openai":
        out["reason"] = ("the tag %s names no -cuNNN variant and %s is not vLLM's image, whose unsuffixed tags this "
                         "check knows" % (tag, repo))
        return out
    release = _RELEASE.match(tag)
    if not release:
        out["reason"] = ("the tag %s is %s, not a release: its CUDA changes when it moves; pin a release tag "
                         "(v0.26.0-cu129)" % (tag, "a moving tag" if tag.split("-")[0] in _MOVING else "not a release"))
        return out
    if (int(release.group(1)), int(release.group(2))) >= VLLM_CUDA13_DEFAULT_FROM:
        out.update(cuda="13.0", exact=True,
                   reason="an unsuffixed vLLM release tag from v0.20.0 on is the CUDA 13.0 build (vllm-project/vllm "
                          "PR #39878; CUDA 12.9 is the -cu129 variant)")
    else:
        out.update(cuda="12", reason="an unsuffixed vLLM release tag before v0.20.0 is a CUDA 12 build")
    return out


def check_declared(image, declared, field="image_cuda_version"):
    """:func:`tag_cuda` of ``image``, after refusing a ``declared`` CUDA (``"12.9"``) that contradicts it: another
    major, or another minor where the tag names one. Raises :class:`ImageCudaError` naming ``field``, the image,
    both versions and the fixes; a ``declared`` that is not a version is refused the same way."""
    want = _version(str(declared or ""))
    if want is None:
        raise ImageCudaError("%s: %r is not a CUDA version such as 12.9 or 13.0" % (field, declared), field)
    found = tag_cuda(image)
    if found["cuda"] is None:
        return found
    have = _version(found["cuda"])
    if want[0] == have[0] and (len(want) < 2 or len(have) < 2 or want[1] == have[1]):
        return found
    repo, tag, digest = split_image(image)
    base = _VARIANT.sub("", tag)
    variant = "%s:%s-cu%d%d%s" % (repo, base, want[0], want[1] if len(want) > 1 else 0,
                                  "@<its digest>" if digest else "")
    raise ImageCudaError(
        "%s: %s contradicts the image %s, a CUDA %s build (%s); either pin the image of CUDA %s (%s, if the project "
        "publishes that variant) or declare what the image holds (engine_image_versions: cuda %s with its torch and "
        "triton, read in the image: python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, "
        "torch.version.cuda)'). The node driver check and the kernel-cache keys read the declared version"
        % (field, declared, image, found["cuda"], found["reason"], declared, variant, found["cuda"]), field)
