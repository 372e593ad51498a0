"""_units: one way to write sizes and durations, so model_stage's progress message, model_stage_follow's poll
line and the RDMA and disk-space messages read the same figures the same way."""
from __future__ import annotations

import pytest

from ansible_collections.llmops.serving.plugins.action import model_stage_follow as follow
from ansible_collections.llmops.serving.plugins.module_utils.common import _units
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_progress


@pytest.mark.parametrize("n, text", [
    (None, "0 B"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (4 << 20, "4.0 MiB"), (int(2.3 * 1024 ** 3), "2.3 GiB"), (7 * 1024 ** 4, "7.0 TiB"),
    (2048 * 1024 ** 4, "2048.0 TiB"),  # TiB is the largest unit: a fleet total is never written in PiB
])
def test_bytes_in_binary_units_with_one_decimal(n, text):
    assert _units.human_bytes(n) == text


@pytest.mark.parametrize("s, text", [
    (0, "0s"), (59.4, "59s"), (59.6, "1m00s"), (1640, "27m20s"), (3599, "59m59s"), (3600, "1h00m"),
    (26 * 3600 + 5 * 60 + 59, "26h05m"),
])
def test_durations_in_seconds_minutes_or_hours(s, text):
    assert _units.human_seconds(s) == text


def test_progress_file_message_and_follow_line_agree():
    """The message model_stage writes into its progress file is the line model_stage_follow prints from the
    file's numbers: a user reading either sees the same figures written the same way."""
    t = iter([0.0, 1228.8])  # 3 TiB in 1228.8 s = 2.5 GiB/s; 4 TiB left = 1638.4 s
    p = _stage_progress.Progress("/nonexistent/progress.json", "/dest", 7 * 1024 ** 4, 141, clock=lambda: next(t))
    p.add(3 * 1024 ** 4, 60)
    snap = p.snapshot()
    assert snap["message"] == "copying: 3.0 TiB / 7.0 TiB (42.9%), 60/141 files, 2.5 GiB/s, ETA 27m18s"
    assert follow.progress_line(snap) == snap["message"]
