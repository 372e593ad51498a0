"""diagnose on recorded evidence: the SGLang engine that restarts as Completed is named crash_exit_zero with the
real cause from its previous log (not the misleading last line), and the healthy vLLM engine is healthy; nothing
from a cluster was read (the objects option)."""
from __future__ import annotations

import pytest


@pytest.fixture
def result(tree, root):
    return tree.json(root + "/diagnose.json")


def test_the_engine_restarting_as_completed_is_a_crash_with_its_real_cause(result):
    crashed = result["crashed"]
    assert crashed["verdict"] == "crash_exit_zero"
    assert crashed["summary"].startswith("crash_exit_zero: pod llm-prod/qwen35-397b-sglang-")
    first = crashed["findings"][0]
    assert (first["code"], first["severity"]) == ("crash_exit_zero", "error")
    assert first["object"].endswith("container engine")
    assert "exited with status 0 (Completed)" in first["evidence"][0]
    assert "TypeError: 'NoneType' object cannot be interpreted as an integer" in first["evidence"][1]
    assert first["hint"]


def test_the_healthy_engine_has_no_error_finding(result):
    healthy = result["healthy"]
    assert healthy["verdict"] == "healthy"
    assert [f["severity"] for f in healthy["findings"]] == ["info"]
    assert any("rolled out" in e for e in healthy["findings"][0]["evidence"])
