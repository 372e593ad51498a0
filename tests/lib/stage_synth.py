# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A synthetic, valid, multi-GB sharded safetensors checkpoint, for the staging tests and benchmarks.

Real shard files, a ``model.safetensors.index.json`` and a ``SHA256SUMS`` manifest, written quickly (a random
block repeated with a per-shard rotation, so every shard has different bytes) and deterministically for a given
seed. Not shipped (``tests/`` is in ``build_ignore``); import it as
``ansible_collections.llmops.serving.tests.lib.stage_synth``.

For the copy engine's own tests, :func:`write_tree` makes a source of plain files of given sizes (with its
``SHA256SUMS``) and an empty ``<dest>.partial``, and :func:`copier` a ``_stage_copy.Copier`` over them.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import struct

BLOCK = 8 * 1024 * 1024


def _shard_header(shard_index, tensor_bytes, tensors_per_shard):
    header, off = {}, 0
    names = []
    for t in range(tensors_per_shard):
        name = "model.layers.%d.mlp.w%d.weight" % (shard_index, t)
        elems = tensor_bytes // 2
        header[name] = {"dtype": "BF16", "shape": [elems // 1024, 1024], "data_offsets": [off, off + elems * 2]}
        off += elems * 2
        names.append(name)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)  # align data to 8 bytes like the reference writer
    return raw, names, off


def write_checkpoint(root, total_bytes, shards=8, tensors_per_shard=4, seed=0, extra_files=True):
    """Write the checkpoint into ``root`` (created); returns ``{files, bytes, shards}``.

    Shard sizes are ``total_bytes // shards`` rounded down to whole 2 KiB tensors.
    """
    os.makedirs(root, exist_ok=True)
    rng = random.Random(seed)
    block = bytes(rng.getrandbits(8) for dummy in range(4096)) * (BLOCK // 4096)
    per_tensor = max(2048, (total_bytes // shards // tensors_per_shard) // 2048 * 2048)
    sums, weight_map, written = {}, {}, 0
    names = []
    for s in range(shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        raw, tnames, data_len = _shard_header(s, per_tensor, tensors_per_shard)
        h = hashlib.sha256()
        rot = (s * 7919) % 4096
        rotated = block[rot:] + block[:rot]
        with open(os.path.join(root, fn), "wb") as f:
            head = struct.pack("<Q", len(raw)) + raw
            f.write(head)
            h.update(head)
            left = data_len
            while left:
                chunk = rotated if left >= len(rotated) else rotated[:left]
                f.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        sums[fn] = h.hexdigest()
        written += len(head) + data_len
        for t in tnames:
            weight_map[t] = fn
        names.append(fn)
    small = {
        "model.safetensors.index.json": json.dumps(
            {"metadata": {"total_size": written}, "weight_map": weight_map}, indent=2, sort_keys=True),
    }
    if extra_files:
        small["config.json"] = json.dumps({"architectures": ["SyntheticForCausalLM"], "seed": seed})
        small["tokenizer_config.json"] = json.dumps({"model_max_length": 4096})
    for fn, text in small.items():
        data = (text + "\n").encode("utf-8")
        with open(os.path.join(root, fn), "wb") as f:
            f.write(data)
        sums[fn] = hashlib.sha256(data).hexdigest()
        written += len(data)
    with open(os.path.join(root, "SHA256SUMS"), "w", encoding="utf-8") as f:
        for fn in sorted(sums):
            f.write("%s  %s\n" % (sums[fn], fn))
    return {"files": sorted(sums) + ["SHA256SUMS"], "bytes": written, "shards": names}


def write_twins(root_a, root_b, total_bytes, shards=2, seed=1):
    """Two revisions with identical shapes, names, sizes and mtimes but different tensor bytes (a fine-tune).

    ``root_b`` gets ``root_a``'s mtimes on every file, so only content (and ctime/inode) tells them apart.
    Returns ``(info_a, info_b)`` as :func:`write_checkpoint` does.
    """
    info_a = write_checkpoint(root_a, total_bytes, shards=shards, seed=seed)
    info_b = write_checkpoint(root_b, total_bytes, shards=shards, seed=seed + 1)
    for name in info_a["files"]:
        st = os.stat(os.path.join(root_a, name))
        if os.path.getsize(os.path.join(root_b, name)) != st.st_size:
            raise AssertionError("twin %s differs in size" % name)
        os.utime(os.path.join(root_b, name), ns=(st.st_atime_ns, st.st_mtime_ns))
    return info_a, info_b


def write_tree(root, sizes):
    """``root/shared/rev`` with one file of random bytes per ``{name: size}`` (each starting with a distinct
    byte) and their ``SHA256SUMS``, and an empty ``root/nvme/rev.partial``; returns ``(src, partial)``."""
    src = os.path.join(str(root), "shared", "rev")
    os.makedirs(src)
    sums = []
    for i, (name, size) in enumerate(sorted(sizes.items())):
        data = (bytes([i + 1]) + os.urandom(max(size - 1, 0)))[:size]
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
        sums.append("%s  %s\n" % (hashlib.sha256(data).hexdigest(), name))
    with open(os.path.join(src, "SHA256SUMS"), "w") as f:
        f.write("".join(sums))
    partial = os.path.join(str(root), "nvme", "rev.partial")
    os.makedirs(partial)
    return src, partial


def copier(src, partial, mode, streams, piece=None, direct_io=True, journal=None, progress=None, on_piece=None):
    """``(files, Copier)`` for every file under ``src`` into ``partial`` (verify ``mode``, fsync on)."""
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_copy
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_layout
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_progress
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify
    files = _stage_layout.scan_src(src)
    content = _stage_verify.verify_source(src, files, mode, os.path.join(src, "SHA256SUMS"))
    progress = progress or _stage_progress.Progress(None, partial, sum(f["size"] for f in files), len(files))
    return files, _stage_copy.Copier(src, partial, mode, content, streams, None, progress, True,
                                     direct_io=direct_io, journal=journal, piece_size=piece, on_piece=on_piece)
