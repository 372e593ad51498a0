# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: whether an engine start used its kernel cache, from the engine's own log.

:func:`read_log` reads the tail of the log through ``_untrusted.open_regular`` (a FIFO or a device is refused, a
huge log costs at most the tail); :func:`analyze_log` judges the latest start (after the last ``engine_process``
banner): a miss when it compiled anything, poisoned when it met a corrupted artifact, and which cache
directories it used.
"""
from __future__ import annotations

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.cache._kcache import KCacheError
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import open_regular

#: Log lines that decide hit / miss after the engine started (substring match).
LOG_SIGNS = {
    "vllm": {
        "miss": (
            "Compiling model again due to a load failure",
            "Compiling a graph for compile range",
            "vLLM's torch.compile cache is disabled",
            "saved AOT compiled function to",
        ),
        "hit": (
            "Directly load the compiled graph(s)",
            "Directly load AOT compilation from path",
        ),
    },
    "sglang": {
        "miss": ("Entering DeepGEMM JIT Pre-Compile session",),
        "hit": (),
    },
}
POISON_SIGNS = (
    "corrupted compilation artifact",
    "AssertionError: expected size",
    "Compile cache file corrupted",
)
MOE_FALLBACK_SIGNS = (
    "Using default MoE config. Performance might be sub-optimal",
    "Using default MoE kernel config. Performance might be sub-optimal",
    "Fallback to triton version",
)
_VLLM_CACHE_DIR_RE = re.compile(r"(?:Using cache directory: (\S+) for vLLM's torch\.compile"
                                r"|Directly load AOT compilation from path (\S+)"
                                r"|saved AOT compiled function to (\S+))")


#: The engine log is judged on its last LOG_TAIL_BYTES (every start appends to one log; the latest start is at
#: the end).
LOG_TAIL_BYTES = 64 * 1024 * 1024


def read_log(path, tail=LOG_TAIL_BYTES):
    """The last ``tail`` bytes of the engine log ``path`` as text (undecodable bytes replaced).

    Opened through ``_untrusted.open_regular``: a FIFO, a device (``/dev/zero``), a socket or a directory is a
    :class:`KCacheError` naming ``log_path``, never a hang; a huge log costs at most ``tail`` bytes of memory.
    """
    try:
        with open_regular(path, "log_path") as f:
            size = os.fstat(f.fileno()).st_size
            if size > tail:
                f.seek(size - tail)
            data = f.read(tail)
    except ValueError as e:  # _untrusted.UntrustedInput: not a regular file; names log_path and the file
        raise KCacheError("%s; point log_path at the engine's log" % e)
    except OSError as e:
        raise KCacheError("log_path: cannot read %s (%s); point it at the engine's log" % (path, e.strerror or e))
    return data.decode("utf-8", "replace")


# ---- hit / miss from the engine log ------------------------------------------------------------------

START_BANNER = re.compile(r"^==== \S+ starting: ", re.M)


def analyze_log(text, engine, cache_dir=None):
    """Decide whether a start used the restored cache, from the engine's own log lines.

    A start that recompiled anything is a miss, even if some graphs loaded. ``unknown`` when the log
    holds neither kind of line (e.g. compile disabled by ``--enforce-eager``).
    """
    signs = LOG_SIGNS[engine]
    hits, misses, poison, moe, dirs = [], [], [], [], []
    # engine_process appends every start to one log behind a "==== <time> starting:" banner: judge only
    # the latest start, never an older one's compile lines.
    starts = [m.start() for m in START_BANNER.finditer(text)]
    if starts:
        text = text[starts[-1]:]
    for line in text.splitlines():
        if any(s in line for s in signs["miss"]):
            misses.append(line.strip()[-300:])
        elif any(s in line for s in signs["hit"]):
            hits.append(line.strip()[-300:])
        if any(s in line for s in POISON_SIGNS):
            poison.append(line.strip()[-300:])
        if any(s in line for s in MOE_FALLBACK_SIGNS):
            moe.append(line.strip()[-300:])
        m = _VLLM_CACHE_DIR_RE.search(line)
        if m:
            dirs.append(next(g for g in m.groups() if g).rstrip(","))
    outside = []
    if cache_dir:
        outside = [d for d in dirs if not _paths.is_within(d, cache_dir)]
    if misses or poison or outside:
        result = "miss"
    elif hits:
        result = "hit"
    else:
        result = "unknown"
    return {
        "result": result,
        "hit_lines": hits[:20],
        "miss_lines": misses[:20],
        "poisoned": bool(poison),
        "poison_lines": poison[:5],
        "moe_fallback_lines": moe[:10],
        "cache_dirs_used": sorted(set(dirs)),
        "cache_dirs_outside": sorted(set(outside)),
    }
