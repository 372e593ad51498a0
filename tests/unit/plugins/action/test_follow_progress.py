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


# ---- numbers out of range and files that are not files ---------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"bytes_done": 1%s, "bytes_total": 2}' % ("0" * 400),      # before: OverflowError from math.isnan
    '{"bytes_done": 1e400, "bytes_total": 2}',
    '{"bytes_done": NaN, "bytes_total": 2}',
    '{"bytes_done": 1, "bytes_total": 2, "x": %s}' % ("[" * 100 + "]" * 100),
])
def test_progress_text_out_of_range_or_deep_is_no_progress(text):
    assert follow._load(text) is None


def test_progress_line_treats_python_integers_out_of_range_as_unknown_without_overflow():
    assert follow.progress_line({"bytes_done": 10 ** 400, "bytes_total": 2}) is None
    assert follow.progress_line(dict(GOOD, eta_seconds=10 ** 400)).endswith("ETA unknown")
    assert follow.progress_line(dict(GOOD, bytes_done=2 ** 64 - 1, bytes_total=2 ** 64)).startswith("copying: 16777216.0 TiB / 16777216.0 TiB")


class _Shell(object):
    @staticmethod
    def quote(s):
        import shlex
        return shlex.quote(s)

    @staticmethod
    def join_path(*parts):
        import os
        return os.path.join(*parts)


def _action(async_dir):
    """The action with its target shell replaced by a local ``sh -c`` (the command is the one sent to a host)."""
    import subprocess

    act = object.__new__(follow.ActionModule)
    act._async_dir = str(async_dir)

    class _Conn(object):
        _shell = _Shell()

    act._connection = _Conn()

    def run(cmd, sudoable=True):
        p = subprocess.run(["sh", "-c", cmd], capture_output=True, timeout=10, check=False)
        return {"rc": p.returncode, "stdout": p.stdout}

    act._low_level_execute_command = run
    return act


def test_peek_reads_a_regular_progress_file(tmp_path):
    (tmp_path / "j1").write_text(json.dumps({"started": 1, "finished": 0}))
    prog = tmp_path / "progress.json"
    prog.write_text(json.dumps(GOOD))
    assert _action(tmp_path)._peek("j1", str(prog)) == (True, GOOD)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_peek_does_not_read_a_progress_file_that_is_not_a_regular_file(tmp_path, kind):
    """Before: cat on a FIFO blocked the poll for ever; on /dev/zero it streamed until memory ran out."""
    import os
    (tmp_path / "j1").write_text(json.dumps({"started": 1, "finished": 0}))
    prog = tmp_path / "progress.json"
    {"fifo": lambda: os.mkfifo(prog), "dev-zero": lambda: prog.symlink_to("/dev/zero"), "directory": prog.mkdir}[kind]()
    assert _action(tmp_path)._peek("j1", str(prog)) == (True, None)


def test_peek_reads_at_most_the_cap_of_a_huge_progress_file(tmp_path, monkeypatch):
    monkeypatch.setattr(follow, "PROGRESS_MAX_BYTES", 64)
    (tmp_path / "j1").write_text(json.dumps({"started": 1, "finished": 0}))
    prog = tmp_path / "progress.json"
    prog.write_text(json.dumps(dict(GOOD, pad="x" * 1000)))
    assert _action(tmp_path)._peek("j1", str(prog)) == (True, None)


def test_job_file_that_is_a_fifo_fails_the_task_naming_it(tmp_path):
    import os
    os.mkfifo(tmp_path / "j1")
    act = _action(tmp_path)
    with pytest.raises(follow._NotAJobFile) as e:
        act._peek("j1", None)
    assert e.value.path == str(tmp_path / "j1")
    out = act._follow({"jid": "j1", "poll_interval": 0.01, "timeout": 5, "progress_file": None}, "stage")
    assert out["failed"] and out["reason"] == "not_regular" and out["file"] == str(tmp_path / "j1")
    assert out["msg"].startswith("stage: the async job file %s on the target is not a regular file" % (tmp_path / "j1"))
