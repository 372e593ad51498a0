# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Data transforms used by the roles, so that branching stays out of Jinja."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.serving.plugins.module_utils.common import _timeline


def reference_checks(references, max_tokens=16, prefix="reference"):
    """engine_probe completion checks that demand the reference's greedy token ids (and text)."""
    if not isinstance(references, list):
        raise AnsibleFilterError("reference_checks: expected the 'references' list of reference_generate")
    checks = []
    for i, ref in enumerate(references):
        try:
            checks.append({
                "type": "completion",
                "name": "%s-%d" % (prefix, i),
                "prompt": ref["prompt"],
                "max_tokens": int(max_tokens),
                "temperature": 0,
                "expect_token_ids": list(ref["token_ids"]),
            })
        except (KeyError, TypeError) as e:
            raise AnsibleFilterError("reference_checks: references[%d] lacks %s" % (i, e))
    return checks


def timeline_table(timeline, title="cold start"):
    """Render a {milestone: seconds} dict as an aligned text table (``_timeline.relative_rows``)."""
    if not isinstance(timeline, dict):
        raise AnsibleFilterError("timeline_table: expected a dict of milestone -> seconds")
    return _timeline.relative_rows(timeline, title)


class FilterModule(object):
    def filters(self):
        return {"reference_checks": reference_checks, "timeline_table": timeline_table}
