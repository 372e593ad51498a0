"""Filters used by the roles."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.serving.plugins.filter.serving import reference_checks, timeline_table


def test_reference_checks_demand_exact_tokens():
    refs = [{"prompt": "a", "token_ids": [1, 2]}, {"prompt": "b", "token_ids": [3]}]
    checks = reference_checks(refs, 2)
    assert checks[0] == {"type": "completion", "name": "reference-0", "prompt": "a", "max_tokens": 2,
                         "temperature": 0, "expect_token_ids": [1, 2]}
    assert [c["prompt"] for c in checks] == ["a", "b"]
    with pytest.raises(AnsibleFilterError, match=r"references\[0\] lacks"):
        reference_checks([{"prompt": "a"}])


def test_timeline_table_orders_milestones_and_steps():
    rows = timeline_table({"first_correct": 60.0, "port_open": 50.0, "health": 55.0, "probe_seconds": 3})
    assert rows[1].split() == ["port_open", "50.0", "50.0"]
    assert rows[2].split() == ["health", "55.0", "5.0"]
    assert rows[3].split() == ["first_correct", "60.0", "5.0"]
    assert len(rows) == 4
