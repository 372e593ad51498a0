# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: cheap integrity checks of safetensors checkpoints.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON header
(``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``) + the byte
buffer the offsets point into. Everything here reads only the 8 + N header bytes, never the tensor
data, so a 700 GiB checkpoint is checked in well under a second per shard.
"""
from __future__ import annotations

import os
import struct

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, load_json, loads_json, open_regular)

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1000 * 1000  # the safetensors reference implementation's cap
#: Nesting a header may have: safe_open parses it with serde_json, whose recursion limit is 128
#: (serde-rs/json src/de.rs, ``remaining_depth: 128``); a deeper header is refused there too.
MAX_HEADER_DEPTH = 128
#: An index file maps tensor names to shard names: a few MiB for the largest checkpoints.
MAX_INDEX_BYTES = 64 * 1024 * 1024

# Bits per element. Sub-byte types (F4, F6_*) are packed; a tensor's byte length must be whole.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


class CheckpointError(ValueError):
    """A checkpoint file is broken; ``path`` names it and ``reason`` says how."""

    def __init__(self, path, reason):
        super().__init__("%s: %s" % (path, reason))
        self.path = path
        self.reason = reason


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError("duplicate key %r" % key)
        out[key] = value
    return out


def _short(err):
    """A JSON error without the document text (``json`` errors carry only a position, but stay bounded)."""
    return str(err)[:160]


def untrusted_reason(path, err):
    """The shared reader's message without its leading file name (CheckpointError puts it first)."""
    text = str(err)
    return text[len(str(path)) + 1:] if text.startswith(str(path) + " ") else text


def read_header_bytes(fobj, path, file_size):
    """Read the raw header from an open binary file; returns ``(N, header_bytes)``."""
    if file_size < 8:
        raise CheckpointError(path, "file is %d bytes, shorter than the 8-byte header length" % file_size)
    raw = fobj.read(8)
    if len(raw) != 8:
        raise CheckpointError(path, "could not read the 8-byte header length")
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER_BYTES:
        raise CheckpointError(path, "header length %d exceeds the %d-byte limit" % (n, MAX_HEADER_BYTES))
    if 8 + n > file_size:
        raise CheckpointError(
            path, "header length %d points past end of file (file is %d bytes)" % (n, file_size))
    data = fobj.read(n)
    if len(data) != n:
        raise CheckpointError(path, "file ended inside the %d-byte header" % n)
    return n, data


def parse_header(path, n, data):
    """Decode the JSON header; returns the dict of tensors (without ``__metadata__``)."""
    if not data.startswith(b"{"):
        # safetensors/src/tensor.rs: SafeTensorError::InvalidHeaderStart
        raise CheckpointError(path, "header does not start with '{'")
    try:
        header = loads_json(data, "header", max_depth=MAX_HEADER_DEPTH, max_bytes=MAX_HEADER_BYTES,
                            object_pairs_hook=_no_duplicates)
    except UntrustedInput as e:
        if e.limit == "depth":
            raise CheckpointError(path, "header JSON is nested too deeply to be a safetensors header (over %d "
                                  "levels)" % MAX_HEADER_DEPTH)
        if e.limit == "number":
            raise CheckpointError(path, "header holds a number that is not a finite value within +/-2**64")
        raise CheckpointError(path, "header is not valid UTF-8 JSON (%s)" % _short(e))
    if not isinstance(header, dict):
        raise CheckpointError(path, "header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        raise CheckpointError(path, "__metadata__ must map strings to strings")
    return header


def tensor_nbytes(path, name, info):
    """Byte length a tensor must have from its dtype and shape."""
    if not isinstance(info, dict):
        raise CheckpointError(path, "tensor %s: entry is not an object" % name)
    dtype = info.get("dtype")
    if dtype not in DTYPE_BITS:
        raise CheckpointError(path, "tensor %s: unknown dtype %r" % (name, dtype))
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise CheckpointError(path, "tensor %s: shape must be a list of non-negative integers" % name)
    count = 1
    for d in shape:
        count *= d
    bits = count * DTYPE_BITS[dtype]
    if bits % 8:
        raise CheckpointError(path, "tensor %s: %d x %s is not a whole number of bytes" % (name, count, dtype))
    return bits // 8


def check_header(path, n, header, file_size):
    """Validate offsets against dtype x shape and the file size; returns a summary dict."""
    spans = []
    for name, info in header.items():
        want = tensor_nbytes(path, name, info)
        offs = info.get("data_offsets")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)
                or offs[1] < offs[0]):
            raise CheckpointError(path, "tensor %s: data_offsets must be [begin, end] with 0 <= begin <= end" % name)
        if offs[1] - offs[0] != want:
            raise CheckpointError(
                path, "tensor %s: data_offsets span %d bytes but shape %s x %s needs %d"
                % (name, offs[1] - offs[0], info["shape"], info["dtype"], want))
        spans.append((offs[0], offs[1], name))
    # Upstream rule (huggingface/safetensors, safetensors/src/tensor.rs, Metadata::validate): sorted by offset,
    # each tensor starts exactly where the previous one ended and the last one ends at the end of the buffer,
    # so there is neither an overlap nor a hole (bytes no tensor owns) for safe_open to refuse later.
    spans.sort()
    prev_end, prev_name = 0, None
    for begin, end, name in spans:
        if begin < prev_end:
            raise CheckpointError(path, "tensor %s overlaps tensor %s" % (name, prev_name))
        if begin > prev_end:
            raise CheckpointError(
                path, "tensor %s starts at byte %d but %s ends at %d: a hole of %d bytes no tensor owns "
                "(safe_open refuses such a file)" % (name, begin, prev_name or "the data buffer's start", prev_end,
                                                     begin - prev_end))
        prev_end, prev_name = end, name
    data_end = max((s[1] for s in spans), default=0)
    expected = 8 + n + data_end
    if file_size != expected:
        what = "truncated" if file_size < expected else "has trailing bytes"
        raise CheckpointError(
            path, "file is %d bytes but its header says %d (8 + %d header + %d data): %s"
            % (file_size, expected, n, data_end, what))
    return {"tensors": sorted(header), "header_bytes": n, "data_bytes": data_end}


def verify_file(path, file_size=None):
    """Read and validate one safetensors file's header; returns ``(summary, raw_header_bytes)``."""
    try:
        # a FIFO or a device in the file's place is refused without blocking (it has no header to read)
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size if file_size is None else file_size
            n, data = read_header_bytes(f, path, size)
    except UntrustedInput as e:
        raise CheckpointError(path, untrusted_reason(path, e))
    except OSError as e:
        raise CheckpointError(path, "cannot read: %s" % e.strerror)
    header = parse_header(path, n, data)
    return check_header(path, n, header, size), data


def load_index(path):
    """``weight_map`` of a ``model.safetensors.index.json`` (tensor -> shard file name)."""
    try:
        doc = load_json(path, max_bytes=MAX_INDEX_BYTES)
    except UntrustedInput as e:
        # a FIFO, /dev/zero, a nesting bomb, 1e400: named with its limit (never hung on, never a traceback)
        raise CheckpointError(path, untrusted_reason(path, e))
    except OSError as e:
        raise CheckpointError(path, "cannot read: %s" % e.strerror)
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise CheckpointError(path, "weight_map must be an object of tensor name -> shard file")
    return wmap


def check_index(index_path, weight_map, shard_tensors):
    """Every tensor the index names must exist in the shard it names.

    ``shard_tensors`` maps a shard path relative to the index's directory to the set of its tensor
    names. ``total_size`` is deliberately not compared with file sizes: producers disagree on it.
    """
    for tensor, shard in sorted(weight_map.items()):
        if shard not in shard_tensors:
            raise CheckpointError(
                os.path.join(os.path.dirname(index_path), shard),
                "missing shard: %s maps tensor %s to it but the file is not there" % (INDEX_NAME, tensor))
        if tensor not in shard_tensors[shard]:
            raise CheckpointError(
                os.path.join(os.path.dirname(index_path), shard),
                "tensor %s is missing from its shard (%s names this shard)" % (tensor, INDEX_NAME))
