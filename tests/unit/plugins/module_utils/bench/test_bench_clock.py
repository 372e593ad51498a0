"""The benchmark's time budget and progress line measure the time since the plan on this host's monotonic clock.

Before, ``run_round`` stopped a run when ``now() - plan["started_at"]`` passed the budget: two wall-clock readings
of two module runs (benchmark_plan, then each benchmark_round). A clock stepped a year ahead between them stopped
the first round as "over budget"; one stepped back let a run go on past its budget, and the progress line showed
a year, or a negative time, elapsed. Now the plan records ``_clock.host_instant`` (boot id and
``CLOCK_MONOTONIC``) and the rounds read ``_clock.elapsed_since``; another boot falls back to the rounds' own
measured time (a lower bound), said so.
"""
from __future__ import annotations

import json
import math
import os
import time

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_client, _bench_outdir, _bench_plan
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_round
from ansible_collections.llmops.serving.plugins.module_utils.common import _clock

YEAR = 365 * 86400.0
BOOT = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f"
OTHER_BOOT = "0b2c4d6e-8f10-4a12-9b14-c16d18e20f22"


class FakeClock(object):
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def _proc(tmp_path, boot=BOOT):
    d = tmp_path / ("proc-" + boot[:4]) / "sys" / "kernel" / "random"
    d.mkdir(parents=True, exist_ok=True)
    (d / "boot_id").write_text(boot + "\n")
    return str(tmp_path / ("proc-" + boot[:4]))


def _plan(tmp_path, budget, instant, n=3, started_at=None):
    out = str(tmp_path / "out")
    _bench_outdir.prepare_out_dir(out)
    rounds = [{"index": i + 1, "kind": "measure", "target": "a", "concurrency": 1, "request_rate": None,
               "input_len": 16, "output_len": 4, "seed": i, "rep": 0, "num_prompts": 1} for i in range(n)]
    doc = {"schema": _bench_outdir.PLAN_SCHEMA, "started_at": time.time() if started_at is None else started_at,
           "rounds": rounds, "protocol": {},
           "targets": [{"name": "a", "url": "http://127.0.0.1:9", "model": "m"}], "time_budget_s": budget,
           "tokenizer": "/nonexistent", "probes": []}
    if instant is not None:
        doc["started_host"] = instant
    return out, json.loads(json.dumps(doc))  # as benchmark_round reads it back from plan.json


def _job_log(duration):
    """A Job's log with the client's result (the round runs without a client on this host)."""
    return "bench\n" + _bench_client.RESULT_MARKER + json.dumps({
        "ttfts": [0.02], "itls": [[0.001] * 3], "latencies": [0.03], "input_lens": [16], "output_lens": [4],
        "errors": [""], "duration": duration})


def _round(out, plan, index, duration=0.05, **kw):
    return _bench_round.run_round(out, plan, index, "unused", client_output=_job_log(duration), **kw)


@pytest.mark.parametrize("step", [YEAR, -YEAR])
def test_a_wall_clock_stepped_a_year_between_plan_and_round_does_not_change_the_budget_decision(
        tmp_path, monkeypatch, step):
    """Real clocks: the plan's instant now, the round a moment later with the wall clock a year off (the plan's
    ``started_at`` read a year before, or after, what the round's clock reads now)."""
    instant = _clock.host_instant()
    if instant is None:
        pytest.skip("no /proc/sys/kernel/random/boot_id on this system")
    real = time.time
    out, plan = _plan(tmp_path, budget=3600, instant=instant, started_at=real() - step)
    monkeypatch.setattr(time, "time", lambda: real() + step)
    record, stopped = _round(out, plan, 1, now=time.time)
    assert stopped is None and record["failed"] == 0  # before: a year ahead stopped it as over_budget
    prog = _bench_plan.progress(plan, _bench_outdir.done_rounds(out), 1)
    assert 0.0 <= prog["elapsed_s"] < 60.0 and "at least" not in prog["line"], prog  # before: a year, or negative


def test_a_spent_budget_stops_the_run_whatever_the_wall_clock_says(tmp_path, monkeypatch):
    """Two hours on the monotonic clock since the plan, a budget of one: stopped, even with the wall clock stepped
    back a year (before: a negative elapsed time, the run went on)."""
    proc, clock = _proc(tmp_path), FakeClock(10000.0)
    real = time.time
    out, plan = _plan(tmp_path, budget=3600, instant=_clock.host_instant(proc, clock), started_at=real() + YEAR)
    clock.t += 7200.0
    monkeypatch.setattr(time, "time", lambda: real() - YEAR)
    record, stopped = _round(out, plan, 1, proc_root=proc, clock=clock)
    assert record is None and stopped["reason"] == "over_budget", stopped
    assert "benchmark_time_budget (1h00m) ran out before round 1 of 3" in stopped["message"]
    assert "(2h00m elapsed)" in stopped["message"]
    with open(os.path.join(out, "stopped.json")) as f:
        assert json.load(f)["reason"] == "over_budget"


def test_a_budget_not_spent_on_the_monotonic_clock_goes_on_with_the_wall_clock_a_year_ahead(tmp_path, monkeypatch):
    proc, clock = _proc(tmp_path), FakeClock(10000.0)
    real = time.time
    out, plan = _plan(tmp_path, budget=3600, instant=_clock.host_instant(proc, clock), started_at=real() - YEAR)
    clock.t += 60.0
    monkeypatch.setattr(time, "time", lambda: real() + YEAR)
    record, stopped = _round(out, plan, 1, proc_root=proc, clock=clock)
    assert stopped is None and record is not None
    prog = _bench_plan.progress(plan, _bench_outdir.done_rounds(out), 1, proc_root=proc, clock=clock)
    assert prog["elapsed_s"] == 60.0 and "done, 1m00s elapsed, ETA" in prog["line"], prog


@pytest.mark.parametrize("instant", ["other_boot", "missing"])
def test_an_unknown_time_since_the_plan_falls_back_to_the_rounds_own_time_and_says_so(tmp_path, instant):
    """Another boot (the monotonic clock restarted) or a plan an older version wrote: the rounds' measured
    durations added up, a lower bound, never a negative or absurd elapsed time."""
    clock = FakeClock(10000.0)
    written = _clock.host_instant(_proc(tmp_path, OTHER_BOOT), FakeClock(99999.0)) if instant == "other_boot" else None
    out, plan = _plan(tmp_path, budget=3600, instant=written)
    proc = _proc(tmp_path)  # this boot
    assert _bench_plan.elapsed(plan, {}, proc, clock) == (0.0, False)
    record, stopped = _round(out, plan, 1, duration=2500.0, proc_root=proc, clock=clock)
    assert stopped is None and record["wall_s"] == 2500.0
    prog = _bench_plan.progress(plan, _bench_outdir.done_rounds(out), 1, proc_root=proc, clock=clock)
    assert prog["elapsed_s"] == 2500.0 and "at least" in prog["line"] and "unknown" in prog["line"], prog
    record, stopped = _round(out, plan, 2, duration=1500.0, proc_root=proc, clock=clock)
    assert stopped is None  # 2500 s before it: within the budget
    record, stopped = _round(out, plan, 3, proc_root=proc, clock=clock)
    assert record is None and stopped["reason"] == "over_budget" and "(at least 1h06m elapsed" in stopped["message"], stopped


def test_a_round_run_again_does_not_count_its_own_earlier_time(tmp_path):
    clock = FakeClock(10000.0)
    out, plan = _plan(tmp_path, budget=3600, instant=None)
    proc = _proc(tmp_path)
    _round(out, plan, 1, duration=3000.0, proc_root=proc, clock=clock)
    record, stopped = _round(out, plan, 1, duration=3000.0, proc_root=proc, clock=clock)  # 1 again: 0 s before it
    assert stopped is None and record is not None


def test_elapsed_never_adds_a_round_time_that_cannot_be():
    done = {1: {"wall_s": 5.0}, 2: {"wall_s": float("inf")}, 3: {"wall_s": -4.0}, 4: {"wall_s": True}, 5: {}}
    assert _bench_plan.elapsed({"started_host": {"boot_id": "x"}}, done, "/nonexistent") == (5.0, False)


# ---- the class: whatever the wall clock does, the budget decision is the monotonic one --------------------- #

_HOSTILE = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=8),
                     st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@st.composite
def _instants(draw):
    """What a plan's ``started_host`` may hold: this boot's instant, another boot's, an older plan's nothing, or
    anything a damaged or hand-edited plan.json could carry."""
    kind = draw(st.sampled_from(["this", "other", "missing", "hostile", "fields"]))
    if kind in ("this", "other"):
        return kind, {"boot_id": BOOT if kind == "this" else OTHER_BOOT, "monotonic": 50000.0, "time_ns": None}
    if kind == "missing":
        return kind, None
    if kind == "hostile":
        return kind, draw(_HOSTILE)
    return kind, {"boot_id": draw(st.one_of(st.just(BOOT), _HOSTILE)), "monotonic": draw(_HOSTILE),
                  "time_ns": draw(_HOSTILE)}


@settings(max_examples=300, deadline=None)
@given(instant=_instants(), advance=st.floats(0, 30 * 86400.0), step=st.floats(-20 * YEAR, 20 * YEAR),
       budget=st.integers(1, 7 * 86400), walls=st.lists(st.one_of(st.floats(0, 86400.0), _HOSTILE), max_size=6))
def test_the_budget_decision_never_depends_on_the_wall_clock(tmp_path_factory, instant, advance, step, budget, walls):
    kind, started_host = instant
    proc = _proc(tmp_path_factory.getbasetemp())
    clock = FakeClock(50000.0 + advance)
    real = time.time
    plan = {"started_at": real() - step, "started_host": started_host}
    done = dict((i + 1, {"wall_s": w}) for i, w in enumerate(walls))
    seen = _bench_plan.elapsed(plan, done, proc, clock)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "time", lambda: real() + step)
        assert _bench_plan.elapsed(plan, done, proc, clock) == seen  # the wall clock is no input
    spent, exact = seen
    assert spent >= 0.0 and math.isfinite(spent)
    if kind == "this":
        assert exact and spent == pytest.approx(advance, abs=1e-6)
        if abs(advance - budget) > 1e-6:
            assert (spent > budget) == (advance > budget)
    elif kind in ("other", "missing", "hostile"):
        ok = [w for w in walls if isinstance(w, (int, float)) and not isinstance(w, bool) and 0 < w < float("inf")]
        # seconds are floats: an integer wall_s beyond 2**53 (a hostile plan) adds up to the nearest float
        assert not exact and spent == pytest.approx(sum(ok), rel=1e-12, abs=1e-9)
