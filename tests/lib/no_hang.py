# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a read that might block (a FIFO, a device) in a daemon thread, and fail the test instead of hanging the run."""
from __future__ import annotations

import threading


def no_hang(fn, timeout=5):
    """``{"value": ...}`` or ``{"error": exception}`` of ``fn()``; an AssertionError when it has not returned within
    ``timeout`` seconds (the thread is a daemon: a blocked read does not keep the test process alive)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # the caller inspects what was raised
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked for over %ss" % timeout
    return box
