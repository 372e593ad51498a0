# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: sizes and durations as people read them in messages and progress lines.

* :func:`human_bytes` - binary units, one decimal: ``512 B``, ``3.0 TiB`` (TiB is the largest unit).
* :func:`human_seconds` - ``42s``, ``27m20s``, ``5h03m`` (hours keep counting past a day).

Numbers only ever go into these; the exact figures stay in the result fields beside the message.
"""
from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n):
    """``n`` bytes (None counts as 0) in the largest binary unit below 1024 of it, TiB at most."""
    n = float(n or 0)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            break
        n /= 1024.0
    return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))


def human_seconds(s):
    """``s`` seconds, rounded to whole seconds: ``Ns`` under a minute, ``NmSSs`` under an hour, else ``NhMMm``."""
    s = int(round(s))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, (s % 3600) // 60)
