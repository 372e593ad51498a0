# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the moment a Kubernetes verdict is judged at - the API server's clock, never
this host's.

Every age the collection judges on a cluster (a pod pending, a condition held, a mount failing, a controller
failing to create pods) is one API time minus another. The API server stamps ``creationTimestamp``, the
scheduler, kubelet and controllers stamp conditions and Events; the controller running Ansible may be minutes
off all of them. With its wall clock 20 minutes ahead, "now minus creationTimestamp" read a pod pending for
5 s as pending for 1,205 s and failed it.

* :func:`http_date` - the ``Date`` header of an API answer (RFC 9110 section 6.6.1: the origin server's clock
  when it answered; kube-apiserver sends it on every answer through Go's net/http server).
* :func:`read_time` - the API server's time of one read: the newest of its answers' ``Date`` and of the times
  its objects carry (``_k8s_shape.recorded_at``; alone that is a lower bound, so an age read from it is never
  longer than the real one).
* :class:`ServerClock` - a wait's clock over many reads: the server time of the first read carried forward by
  this process's monotonic clock, raised by every later read that knows better. Between reads whose objects
  hold no newer stamp, a pod still ages by the seconds this module watched it.
* :func:`age` - ``later - earlier`` of two API times (None when either is unknown; never negative): the
  collection's one rule for the age of what another host timestamps (``common/_clock.age``).

No wall clock here, and none in any other ``kube/`` file: ``tests/unit/plugins/module_utils/kube/test_k8s_clock.py``
scans for it.
"""
from __future__ import annotations

import email.utils
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_shape


def http_date(value):
    """Epoch seconds of an HTTP-date (``Sun, 06 Dec 2026 02:33:07 GMT``), None when absent or malformed."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        dt = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if dt is None or dt.tzinfo is None:
        return None  # an HTTP-date is always GMT; a zone-less one is not a server's
    return dt.timestamp()


def read_time(objects=None, dates=()):
    """The API server's time of one read (epoch seconds, None when nothing tells): the newest of the ``Date``
    headers of its answers (``dates``) and of the times its ``objects`` carry."""
    times = [t for t in (http_date(d) for d in dates or ()) if t is not None]
    newest = _k8s_shape.recorded_at(objects) if objects is not None else None
    if newest is not None:
        times.append(newest)
    return max(times) if times else None


def age(later, earlier):
    """Seconds from ``earlier`` to ``later``, two API times (None when either is unknown; 0 when ``later`` is
    older: two components' clocks may disagree by a little, and a negative age means none)."""
    return _clock.age(later, earlier)


class ServerClock(object):
    """The API server's now across the reads of one wait.

    ``at(read_at)`` answers for a read whose own time is ``read_at`` (:func:`read_time`, None when it told
    nothing): the larger of ``read_at`` and the best earlier read carried forward by ``monotonic`` (the seconds
    this process measured since). None until some read told a time.
    """

    def __init__(self, monotonic=None):
        self._watch = _clock.Stopwatch(monotonic or time.monotonic)
        self._anchor = None  # (server time, seconds on the stopwatch) of the best read so far

    def at(self, read_at):
        mono = self._watch.elapsed()
        projected = None if self._anchor is None else self._anchor[0] + (mono - self._anchor[1])
        if read_at is not None and (projected is None or read_at > projected):
            self._anchor = (read_at, mono)
            return read_at
        return projected
