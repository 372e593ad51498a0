"""model_stage_follow reads two files it does not own (the async job file, the progress file): whatever
they hold, a poll prints a line built from numbers only, or waits, and never raises."""
from __future__ import annotations

import json

import pytest

from ansible_collections.llmops.serving.plugins.action import model_stage_follow as follow

GOOD = {"state": "copying", "bytes_done": 3 * 1024 ** 4, "bytes_total": 7 * 1024 ** 4, "files_done": 60,
        "files_total": 141, "rate_bytes_per_second": 2.5 * 1024 ** 3, "eta_seconds": 1640.0,
        "message": "hf_SECRET"}


def test_progress_line_shows_bytes_percent_files_rate_and_eta():
    assert follow.progress_line(GOOD) == ("copying: 3.0 TiB / 7.0 TiB (42.9%), 60/141 files, 2.5 GiB/s, "
                                          "ETA 27m20s")


def test_fan_out_progress_shows_bytes_from_the_shared_filesystem_and_from_peers():
    # the receiver's progress file (_stage_fanout) carries both counts: an operator sees whether the fleet is
    # reading the shared filesystem or the peers
    line = follow.progress_line(dict(GOOD, bytes_from_source=2 ** 30, bytes_from_peers=3 * 2 ** 40))
    assert "1.0 GiB from the shared filesystem, 3.0 TiB from peers" in line
    assert "from peers" not in follow.progress_line(dict(GOOD, bytes_from_source="x", bytes_from_peers=1))


@pytest.mark.parametrize("record", [
    None, [], "hf_SECRET", 5, {}, {"bytes_done": "1", "bytes_total": 2}, {"bytes_done": True, "bytes_total": 2},
    {"bytes_done": float("nan"), "bytes_total": 2}, {"bytes_done": -1, "bytes_total": 2},
], ids=["none", "list", "string", "number", "empty", "str-bytes", "bool-bytes", "nan", "negative"])
def test_a_record_without_usable_byte_counts_gives_no_line(record):
    assert follow.progress_line(record) is None


def test_optional_fields_of_the_wrong_type_are_left_out_and_state_is_never_echoed_raw():
    rec = dict(GOOD, rate_bytes_per_second="fast", eta_seconds=float("inf"), files_done=None,
               state="hf_SECRET\x1b[2J" + "x" * 100)
    assert follow.progress_line(rec) == "running: 3.0 TiB / 7.0 TiB (42.9%), rate unknown, ETA unknown"
    assert follow.progress_line(dict(GOOD, state="publishing")).startswith("publishing: 3.0 TiB")


@pytest.mark.parametrize("text,running", [
    ("", None),                                                      # the wrapper has not written it yet
    (json.dumps({"started": 1, "finished": 0, "ansible_job_id": "j1"}), True),
    (json.dumps({"started": 1, "finished": 1, "rc": 0}), False),
    (json.dumps({"changed": True, "rc": 0}), False),                 # a result: async_status reads it
    ("{not json", False),                                             # async_status reports it as a failure
    ("[" * 5000, False),
    (json.dumps(["started"]), False),
], ids=["empty", "running", "finished", "result", "garbage", "deep", "list"])
def test_job_file_is_read_as_async_status_reads_it(text, running):
    assert follow._job_running(text) is running
