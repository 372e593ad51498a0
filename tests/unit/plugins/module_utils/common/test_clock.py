"""``_clock``: durations on the monotonic clock, ages from one clock, and an order no clock can invert."""
from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock


class FakeClock(object):
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def test_stopwatch_measures_on_its_clock_and_restarts():
    clock = FakeClock()
    sw = _clock.Stopwatch(clock)
    clock.t += 2.5
    assert sw.elapsed() == 2.5
    assert sw.restart() == 2.5
    clock.t += 1.0
    assert sw.elapsed() == 1.0


def test_stopwatch_defaults_to_the_monotonic_clock_not_the_wall_clock(monkeypatch):
    sw = _clock.Stopwatch()
    monkeypatch.setattr(time, "time", lambda: 0.0)  # the wall clock jumps to 1970: a duration does not care
    assert 0 <= sw.elapsed() < 5


def test_deadline_remaining_and_expired():
    clock = FakeClock()
    d = _clock.deadline(10, clock)
    assert d.at == 110.0 and d.remaining() == 10 and not d.expired()
    clock.t = 109.5
    assert d.remaining() == 0.5
    clock.t = 111
    assert d.remaining() == 0.0 and d.expired()


def test_age_is_the_difference_of_two_times_of_one_clock():
    assert _clock.age(1005.0, 1000.0) == 5.0
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    assert _clock.age(t0 + datetime.timedelta(seconds=5), t0) == 5.0


def test_age_of_an_unknown_time_is_unknown_and_never_negative():
    assert _clock.age(None, 1.0) is None and _clock.age(1.0, None) is None
    assert _clock.age(1000.0, 1005.0) == 0.0  # the one clock stepped back between the readings


def test_age_refuses_to_mix_a_number_and_a_datetime():
    with pytest.raises(TypeError):
        _clock.age(datetime.datetime.now(datetime.timezone.utc), 1.0)


def test_a_pending_pod_is_five_seconds_old_whatever_the_controller_clock_says(monkeypatch):
    """The defect the rule exists for: a controller 20 minutes ahead of the API server computed 1,205 s."""
    created, server_now = 1_800_000_000.0, 1_800_000_005.0  # both written by the API server
    monkeypatch.setattr(time, "time", lambda: server_now + 1200)
    assert _clock.age(server_now, created) == 5.0


def test_filesystem_now_is_the_clock_the_filesystem_stamps_files_with(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 4e9)  # this process's wall clock is 2096: the filesystem's is not
    before = os.stat(str(tmp_path)).st_mtime
    now = _clock.filesystem_now(str(tmp_path))
    (tmp_path / "f").write_bytes(b"x")
    assert before - 1 <= now <= os.stat(str(tmp_path / "f")).st_mtime + 1
    assert sorted(os.listdir(str(tmp_path))) == ["f"]  # nothing left behind


@pytest.mark.parametrize("existing, want", [
    ([], 1), ([None, None], 1), ([1, 2, 3], 4), ([7, None, 2], 8),
    ([True, 5], 6), (["9", 2.0, 0, -4], 1),  # not sequences: a bool, a string, a float, 0, negative
])
def test_next_sequence_is_one_more_than_the_largest_valid_one(existing, want):
    assert _clock.next_sequence(existing) == want


def test_order_key_puts_every_sequenced_entry_above_every_legacy_one():
    entries = [("legacy-future", _clock.order_key(None, legacy=4e9, name="a")),
               ("legacy-past", _clock.order_key(None, legacy=1e9, name="b")),
               ("seq-1", _clock.order_key(1, legacy=0.0, name="c")),
               ("seq-2", _clock.order_key(2, legacy=-5.0, name="d"))]
    assert [n for n, _k in sorted(entries, key=lambda e: e[1])] == ["legacy-past", "legacy-future", "seq-1", "seq-2"]


def test_order_key_breaks_a_tie_by_name():
    assert _clock.order_key(3, name="b") > _clock.order_key(3, name="a")


def _hold(directory, started, release):
    with _clock.sequence_lock(directory) as held:
        assert held
        started.set()
        release.wait(30)


def test_sequence_lock_excludes_a_second_publisher(tmp_path):
    ctx = multiprocessing.get_context("fork")
    started, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(str(tmp_path), started, release))
    p.start()
    try:
        assert started.wait(30)
        t0 = time.monotonic()
        with _clock.sequence_lock(str(tmp_path), timeout=0.3) as held:
            assert held is False  # the other publisher holds it: after the timeout, fall back to names
        assert time.monotonic() - t0 >= 0.3
    finally:
        release.set()
        p.join(30)
    with _clock.sequence_lock(str(tmp_path), timeout=5) as held:
        assert held is True
    assert os.listdir(str(tmp_path)) == []  # the lock is the directory itself: no file


def test_sequence_lock_on_a_directory_that_cannot_be_opened_yields_false(tmp_path):
    with _clock.sequence_lock(str(tmp_path / "missing")) as held:
        assert held is False


# ---- across processes of one host ----------------------------------------------------------------------

BOOT_A = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f"
BOOT_B = "0b2c4d6e-8f10-4a12-9b14-c16d18e20f22"
YEAR = 365 * 86400.0


def _proc(tmp_path, boot=BOOT_A, uptime=None):
    root = tmp_path / "proc"
    (root / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")
    if uptime is not None:
        (root / "uptime").write_text("%.2f 1234.56\n" % uptime)
    return str(root)


def test_elapsed_since_an_instant_of_this_boot_is_the_monotonic_difference(tmp_path):
    proc, clock = _proc(tmp_path), FakeClock(5000.0)
    instant = _clock.host_instant(proc, clock)
    assert instant == {"boot_id": BOOT_A, "monotonic": 5000.0, "time_ns": None}
    clock.t += 90.0
    assert _clock.elapsed_since(instant, proc, clock) == 90.0


def test_elapsed_since_an_instant_of_another_boot_or_none_is_unknown_never_negative(tmp_path):
    clock = FakeClock(10.0)  # the monotonic clock restarted with the boot: 10 s against the plan's 5000 s
    instant = {"boot_id": BOOT_A, "monotonic": 5000.0, "time_ns": None}
    assert _clock.elapsed_since(instant, _proc(tmp_path, boot=BOOT_B), clock) is None
    proc = _proc(tmp_path / "a")
    for bad in (None, {}, "5000", {"boot_id": BOOT_A}, {"boot_id": BOOT_A, "monotonic": True},
                {"boot_id": BOOT_A, "monotonic": float("nan")}, {"boot_id": BOOT_A, "monotonic": "5000"}):
        assert _clock.elapsed_since(bad, proc, clock) is None, bad
    # a time namespace offsets CLOCK_MONOTONIC (time_namespaces(7)): another one is unknown too
    (tmp_path / "a" / "proc" / "self" / "ns").mkdir(parents=True)
    os.symlink("time:[4026531834]", str(tmp_path / "a" / "proc" / "self" / "ns" / "time"))
    clock.t = 5060.0
    assert _clock.elapsed_since(dict(instant, time_ns="time:[4026532999]"), proc, clock) is None
    assert _clock.elapsed_since(dict(instant, time_ns="time:[4026531834]"), proc, clock) == 60.0
    assert _clock.host_instant(str(tmp_path / "no-proc"), clock) is None  # no boot id (not Linux): no instant


def test_elapsed_since_is_the_same_whatever_the_wall_clock_does_between_two_processes(tmp_path):
    """The plan's instant is written by one process and read by another; the real clocks, the wall clock stepped a
    year either way in between."""
    instant = json.loads(json.dumps(_clock.host_instant()))  # as a plan file carries it
    if instant is None:
        pytest.skip("no /proc/sys/kernel/random/boot_id on this system")
    script = ("import json, sys, time\nfrom ansible_collections.llmops.serving.plugins.module_utils.common import "
              "_clock\nstep = float(sys.argv[2])\nreal = time.time\ntime.time = lambda: real() + step\n"
              "print(json.dumps(_clock.elapsed_since(json.loads(sys.argv[1]))))\n")
    for step in (YEAR, -YEAR):
        out = subprocess.run([sys.executable, "-c", script, json.dumps(instant), str(step)], capture_output=True,
                             text=True, check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert 0.0 <= json.loads(out.stdout) < 60.0, (step, out.stdout)


def test_process_age_is_uptime_against_the_process_start(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    proc = _proc(tmp_path, uptime=1000.0)
    assert _clock.process_age(400 * hz, proc) == 600.0
    assert _clock.process_age(2000 * hz, proc) == 0.0  # a start after "now": 0, never negative
    for bad in (None, True, -1, "400", 4.5):
        assert _clock.process_age(bad, proc) is None
    assert _clock.process_age(400 * hz, str(tmp_path / "no-proc")) is None


def test_process_age_of_this_process_on_the_real_kernel(monkeypatch):
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    monkeypatch.setattr(time, "time", lambda: 0.0)  # no wall clock enters
    assert 0.0 <= _clock.process_age(start) < 24 * 3600.0
