# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the engine role's Kubernetes platform: the cold-start timeline of a rolled-out pod."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_wait


def k8s_cold_start(pod, probe_timeline=None):
    """Cold-start timeline of one pod: created -> scheduled -> started -> port -> /health -> listed -> correct."""
    if not isinstance(pod, dict) or "created" not in pod:
        raise AnsibleFilterError("k8s_cold_start: expected one item of k8s_engine_wait's 'pods' (with 'created')")
    marks = _k8s_wait.pod_marks(pod)
    marks.update(_timeline.from_relative(probe_timeline, pod.get("created")))
    try:
        return _timeline.staged(marks)
    except ValueError as e:
        raise AnsibleFilterError("k8s_cold_start: %s" % e)


def k8s_timeline_lines(timeline, title="cold start"):
    """A k8s_cold_start result as table lines (for debug output)."""
    if not isinstance(timeline, dict) or "stages" not in timeline:
        raise AnsibleFilterError("k8s_timeline_lines: expected the result of k8s_cold_start")
    return _timeline.format_staged(timeline, title).splitlines()


class FilterModule(object):
    def filters(self):
        return {"k8s_cold_start": k8s_cold_start, "k8s_timeline_lines": k8s_timeline_lines}
