"""Fleet-wide read slots: the cap holds across holders, dead and silent holders are taken over."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils import _fleet_slots as fs


def slots(tmp_path, cap=2, **kw):
    kw.setdefault("poll", 0.01)
    kw.setdefault("lock_dir", str(tmp_path))
    return fs.FleetSlots(str(tmp_path / "leases"), cap, **kw).open()


def test_cap_is_never_exceeded_by_concurrent_threads(tmp_path):
    a = slots(tmp_path, cap=3, host_id="a")
    b = slots(tmp_path, cap=3, host_id="b")
    active, peak, lock = [0], [0], threading.Lock()

    def worker(s):
        for dummy in range(15):
            lease = s.acquire(timeout=20)
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.002)
            with lock:
                active[0] -= 1
            s.release(lease)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (a, b) for dummy in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.close()
    b.close()
    assert peak[0] == 3
    assert a.wait_seconds > 0 or b.wait_seconds > 0
    assert not [n for n in os.listdir(tmp_path / "leases") if n.endswith(".lease")]


def test_host_never_holds_more_than_host_max(tmp_path):
    s = slots(tmp_path, cap=4, host_id="h", host_max=2)
    s.acquire(timeout=1)
    s.acquire(timeout=1)
    with pytest.raises(fs.FleetSlotError, match="no fleet read slot free"):
        s.acquire(timeout=0.2)
    s.close()


def test_lease_of_dead_local_process_is_taken_over_at_once(tmp_path):
    d = tmp_path / "leases"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    s = slots(tmp_path, cap=1, host_id="same", stale_after=3600)
    (d / "slot-0000.lease").write_text(json.dumps(
        {"host": "same", "pid": child.pid, "start_time": "1", "token": "x"}))
    t0 = time.monotonic()
    s.acquire(timeout=5)
    assert time.monotonic() - t0 < 2
    s.close()


def test_silent_remote_lease_expires_after_stale_seconds(tmp_path):
    d = tmp_path / "leases"
    s = slots(tmp_path, cap=1, host_id="me", stale_after=0.5)
    (d / "slot-0000.lease").write_text(json.dumps({"host": "other", "pid": 1, "token": "x"}))
    t0 = time.monotonic()
    lease = s.acquire(timeout=10)
    waited = time.monotonic() - t0
    assert 0.5 <= waited < 5
    assert json.loads(open(lease).read())["host"] == "me"
    s.close()


def test_heartbeating_lease_is_not_taken_over(tmp_path):
    holder = slots(tmp_path, cap=1, host_id="remote", heartbeat=0.1)
    holder.acquire(timeout=1)
    waiter = slots(tmp_path, cap=1, host_id="me", stale_after=0.5)
    with pytest.raises(fs.FleetSlotError):
        waiter.acquire(timeout=1.5)
    holder.close()
    waiter.acquire(timeout=2)
    waiter.close()


def test_cap_mismatch_is_refused_naming_the_option(tmp_path):
    slots(tmp_path, cap=2).close()
    with pytest.raises(fs.FleetSlotError, match="fleet_read_streams: .* cap of 2 .* asks for 3"):
        slots(tmp_path, cap=3)
