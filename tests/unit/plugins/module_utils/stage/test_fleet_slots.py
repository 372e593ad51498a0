"""Fleet-wide read slots: the cap holds across holders, dead and silent holders are taken over."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots as fs


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
    with pytest.raises(fs.FleetSlotError, match=r"this host \(h\) already holds 2 slot\(s\), its read_streams limit \(2\)"):
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


# ---- waiting is bounded, and says who holds the slots -------------------------------------------
PYTHONPATH = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(fs.__file__))))))))

# A stager in its own process: takes one slot, says so, then keeps it (heartbeating), execs another
# program (same pid and start time, other command line) or exits without being reaped (a zombie).
HOLDER = r"""
import os, sys
from ansible_collections.llmops.serving.plugins.module_utils.stage import _fleet_slots as fs
d, cap, host, lock_dir, then = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
s = fs.FleetSlots(d, cap, host_id=host, lock_dir=lock_dir, heartbeat=0.05, poll=0.01).open()
s.acquire(timeout=10)
sys.stdout.write("held\n")
sys.stdout.flush()
if then == "exec":
    os.execv("/bin/sleep", ["sleep", "30"])
if then == "exit":
    os._exit(0)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    procs = []

    def start(host, then="hold", cap=1):
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "leases"), str(cap), host,
                                 str(tmp_path), then], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=dict(os.environ, PYTHONPATH=PYTHONPATH), text=True)
        procs.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_acquire_gives_up_after_acquire_timeout_naming_dir_holders_and_fix(tmp_path, holder):
    holder("gpu-b")
    s = slots(tmp_path, cap=1, host_id="gpu-a", acquire_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(fs.FleetSlotError) as e:
        s.acquire()  # the stager's call: no timeout of its own
    assert 0.5 <= time.monotonic() - t0 < 3
    msg = str(e.value)
    assert msg.startswith("fleet_slots_dir: no read slot free in %s after 0.5 s: 1 of 1 slots are held (gpu-b: 1)"
                          % (tmp_path / "leases")), msg
    assert "raise lock_timeout" in msg and "fleet_stale_seconds (60 s)" in msg
    assert (e.value.file, e.value.reason) == (str(tmp_path / "leases"), "slot_timeout")
    s.close()


def test_timeout_message_counts_malformed_leases_without_quoting_them(tmp_path, holder):
    holder("same", cap=3)
    d = tmp_path / "leases"
    s = slots(tmp_path, cap=3, host_id="same", acquire_timeout=0.3)
    free = sorted(set("slot-%04d.lease" % i for i in range(3)) - set(os.listdir(str(d))))
    (d / free[0]).write_text(json.dumps({"host": "hf_SECRET token", "pid": 1, "token": "x"}))
    (d / free[1]).write_text("[\"hf_SECRET\"]")
    held = [p for p in os.listdir(str(d)) if p.endswith(".lease")]
    assert len(held) == 3
    with pytest.raises(fs.FleetSlotError) as e:
        s.acquire()
    msg = str(e.value)
    assert "3 of 3 slots are held (same: 1, unnamed: 1; on this host pid " in msg, msg
    assert "1 lease(s) unreadable or malformed" in msg
    assert "SECRET" not in msg
    s.close()


# ---- leases of this host whose process is no longer the stager are taken over at once ----------
def test_lease_of_a_stager_that_exec_d_another_program_is_taken_over_at_once(tmp_path, holder):
    proc = holder("same", then="exec")
    deadline = time.monotonic() + 5
    while open("/proc/%d/cmdline" % proc.pid, "rb").read().split(b"\0")[0] != b"sleep" and time.monotonic() < deadline:
        time.sleep(0.01)
    s = slots(tmp_path, cap=1, host_id="same", stale_after=3600)
    t0 = time.monotonic()
    lease = s.acquire(timeout=3)
    assert time.monotonic() - t0 < 2
    assert json.loads(open(lease).read())["pid"] == os.getpid()
    assert proc.poll() is None, "the exec'd program is alive; only its lease was taken over"
    s.close()


def test_lease_of_a_zombie_stager_is_taken_over_at_once(tmp_path, holder):
    proc = holder("same", then="exit")
    deadline = time.monotonic() + 5
    while open("/proc/%d/stat" % proc.pid).read().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    s = slots(tmp_path, cap=1, host_id="same", stale_after=3600)
    t0 = time.monotonic()
    s.acquire(timeout=3)
    assert time.monotonic() - t0 < 2
    s.close()


def test_live_local_stager_keeps_its_lease(tmp_path, holder):
    holder("same")
    s = slots(tmp_path, cap=1, host_id="same", stale_after=0.3)
    with pytest.raises(fs.FleetSlotError, match="1 of 1 slots are held"):
        s.acquire(timeout=1)
    s.close()


def _fake_proc(root, pid, start, cmdline, state="S"):
    os.makedirs(str(root / str(pid) / "ns"), exist_ok=True)
    (root / str(pid) / "stat").write_text("%d (x) %s 1 %d %s\n" % (pid, state, pid, " ".join(["0"] * 16 + [start] + ["0"] * 5)))
    (root / str(pid) / "cmdline").write_bytes(b"\0".join(cmdline) + b"\0")
    os.symlink("pid:[4026531836]", str(root / str(pid) / "ns" / "pid"))
    os.makedirs(str(root / "sys" / "kernel" / "random"), exist_ok=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text("b0b0b0b0-0000-4000-8000-000000000001\n")


@pytest.mark.parametrize("now_cmdline,taken", [
    ([b"/usr/bin/python3", b"-m", b"http.server"], True),   # pid and start time reused, another program
    ([b"python3", b"AnsiballZ_model_stage.py"], False),    # the stager itself
], ids=["pid-reused-other-program", "same-stager"])
def test_pid_reuse_is_judged_by_start_time_and_cmdline_in_proc_root(tmp_path, now_cmdline, taken):
    proc = tmp_path / "proc"
    _fake_proc(proc, 4242, "777", now_cmdline)
    digest = fs.hashlib.sha256(b"python3\0AnsiballZ_model_stage.py\0").hexdigest()[:16]
    s = slots(tmp_path, cap=1, host_id="same", stale_after=3600, proc_root=str(proc))
    (tmp_path / "leases" / "slot-0000.lease").write_text(json.dumps(
        {"host": "same", "pid": 4242, "start_time": "777", "cmdline": digest, "token": "x",
         "boot_id": "b0b0b0b0-0000-4000-8000-000000000001", "pid_ns": "pid:[4026531836]"}))
    if taken:
        s.acquire(timeout=2)
    else:
        with pytest.raises(fs.FleetSlotError, match="1 of 1 slots are held"):
            s.acquire(timeout=0.3)
    s.close()


@pytest.mark.parametrize("field,value", [("pid_ns", "pid:[1]"), ("boot_id", "another-boot")])
def test_lease_from_another_pid_namespace_or_boot_is_not_judged_by_our_proc(tmp_path, field, value):
    # Same host name, but its pid means nothing here (another container, or before a reboot): a pid
    # that does not exist here proves nothing; the lease is taken over only once it stops changing.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    s = slots(tmp_path, cap=1, host_id="same", stale_after=0.4)
    lease = {"host": "same", "pid": child.pid, "start_time": "1", "token": "x", "boot_id": s.boot_id,
             "pid_ns": s.pid_ns}
    lease[field] = value
    (tmp_path / "leases" / "slot-0000.lease").write_text(json.dumps(lease))
    t0 = time.monotonic()
    s.acquire(timeout=5)
    assert time.monotonic() - t0 >= 0.4
    s.close()


# ---- malformed fleet.json: a clean error or, when it holds nothing, a safe rewrite ---------------
@pytest.fixture
def fast_settle(monkeypatch):
    monkeypatch.setattr(fs.FleetSlots, "CAP_SETTLE_SECONDS", 0.05)


def _cap(tmp_path, content):
    d = tmp_path / "leases"
    d.mkdir(exist_ok=True)
    (d / "fleet.json").write_bytes(content)
    return d / "fleet.json"


@pytest.mark.parametrize("content,cap,says", [
    (b'["hf_SECRET"]', 2, "it holds a JSON list"),
    (b'"hf_SECRET"', 2, "it holds a JSON string"),
    (b'16', 2, "it holds a JSON number"),
    (b'null', 2, "it holds JSON null"),
    (b'{"cap": "hf_SECRET"}', 2, "it has no fleet_read_streams"),
    (b'{"fleet_read_streams": "hf_SECRET"}', 2, "its fleet_read_streams is a JSON string, not a positive integer"),
    (b'{"fleet_read_streams": true}', 1, "its fleet_read_streams is a JSON boolean, not a positive integer"),
    (b'{"fleet_read_streams": 0}', 2, "its fleet_read_streams is a JSON number, not a positive integer"),
    (b'{"fleet_read_streams": 2.0}', 2, "its fleet_read_streams is a JSON number, not a positive integer"),
    (b'{"fleet_read_streams": 2, "pad": "%s"}' % (b"hf_SECRET" * 600), 2, "it is 5436 bytes"),
], ids=["list", "string", "number", "null", "no-field", "field-string", "field-bool", "field-zero", "field-float",
        "too-large"])
def test_cap_file_of_another_shape_is_a_clean_error_and_kept(tmp_path, fast_settle, content, cap, says):
    path = _cap(tmp_path, content)
    with pytest.raises(fs.FleetSlotError) as e:
        slots(tmp_path, cap=cap)
    msg = str(e.value)
    assert msg.startswith('fleet_slots_dir: %s is not the cap record {"fleet_read_streams": <int>} this collection '
                          'writes (%s); ' % (path, says)), msg
    assert "remove it when no copy uses" in msg and "SECRET" not in msg
    assert e.value.file == str(path)
    assert path.read_bytes() == content, "a file we did not write is never removed"


@pytest.mark.parametrize("content", [
    b"", b'{"fleet_read_streams": 2', b"hf_SECRET not json", b"\xff\xfe\x00\x01", b"[" * 3000,
], ids=["empty", "truncated", "not-json", "binary", "deep-nesting"])
def test_cap_file_holding_no_record_is_rewritten_with_this_runs_cap(tmp_path, fast_settle, content):
    path = _cap(tmp_path, content)
    s = slots(tmp_path, cap=3)
    assert json.loads(path.read_text()) == {"fleet_read_streams": 3}
    assert sorted(os.listdir(str(tmp_path / "leases"))) == ["fleet.json"]
    s.acquire(timeout=1)
    s.close()


def test_concurrent_rewrites_of_a_broken_cap_file_leave_one_cap(tmp_path, fast_settle):
    for round_ in range(8):
        base = tmp_path / str(round_)
        base.mkdir()
        _cap(base, b'{"fleet_read_streams": ')
        outcome = {}

        def run(cap):
            try:
                slots(base, cap=cap).close()
                outcome[cap] = "ok"
            except fs.FleetSlotError as e:
                outcome[cap] = e.reason

        threads = [threading.Thread(target=run, args=(cap,)) for cap in (2, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        winner = json.loads((base / "leases" / "fleet.json").read_text())["fleet_read_streams"]
        assert outcome == {winner: "ok", 7 - winner: "cap_mismatch"}, outcome


def _in_thread(fn):
    """Run fn in a thread; fail (instead of hanging the suite) if it blocks."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: B902 - handed to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "blocked"
    return box


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_cap_path_that_is_not_a_regular_file_is_a_clean_error_without_blocking(tmp_path, kind):
    d = tmp_path / "leases"
    d.mkdir()
    if kind == "directory":
        (d / "fleet.json").mkdir()
    else:
        os.mkfifo(str(d / "fleet.json"))
    box = _in_thread(lambda: slots(tmp_path, cap=2))
    assert isinstance(box.get("error"), fs.FleetSlotError), box
    assert "fleet.json is not the cap record" in str(box["error"]) and "(it is not a regular file)" in str(box["error"])


# ---- malformed leases never raise: their holder cannot be judged, so they go stale --------------
@pytest.mark.parametrize("make", [
    lambda p: p.write_text('["hf_SECRET"]'),
    lambda p: p.write_text('"hf_SECRET"'),
    lambda p: p.write_text("5"),
    lambda p: p.write_text('{"host": 5, "pid": "x"}'),
    lambda p: p.write_text('{"host": "same"}'),
    lambda p: p.write_text('{"host": "same", "pid": true, "start_time": "1"}'),
    lambda p: p.write_text(json.dumps({"host": "same", "pid": os.getppid(), "start_time": 1, "cmdline": []})),
    lambda p: p.write_text('{"host": "same", "pid": 12'),
    lambda p: p.write_text(""),
    lambda p: p.write_bytes(b"\xff\xfe"),
    lambda p: p.write_text("[" * 3000),
    lambda p: p.write_text(json.dumps({"host": "same", "pad": "x" * 5000})),
    lambda p: p.mkdir(),
    lambda p: os.mkfifo(str(p)),
], ids=["list", "string", "number", "wrong-field-types", "no-pid", "bool-pid", "field-types-of-a-live-pid", "truncated", "empty", "binary",
        "deep-nesting", "too-large", "directory", "fifo"])
def test_malformed_lease_is_taken_over_once_stale_never_a_traceback(tmp_path, make):
    s = slots(tmp_path, cap=1, host_id="same", host_max=1, stale_after=0.3)
    make(tmp_path / "leases" / "slot-0000.lease")
    t0 = time.monotonic()
    box = _in_thread(lambda: s.acquire(timeout=4))
    assert "error" not in box, box
    assert time.monotonic() - t0 >= 0.3
    assert json.loads(open(box["value"]).read())["host"] == "same"
    s.close()
    assert sorted(os.listdir(str(tmp_path / "leases"))) == ["fleet.json"]


@pytest.mark.parametrize("content,state", [
    (b'{"pid": 1' + b"0" * 400 + b"}", "unparsable"),       # a number out of range
    (b"[" * 100 + b"]" * 100, "unparsable"),                 # nesting
    (b'{"pid": NaN}', "unparsable"),
    (b"\xff\xfe", "unparsable"),
    (b'{"pid": 7}', "ok"),
])
def test_lease_and_cap_records_go_through_the_shared_reader(tmp_path, content, state):
    """Records other hosts write into the shared lease directory are untrusted input: a number out of range, a
    nesting bomb, NaN or bytes that are not UTF-8 read as unparsable (reclaimed), never a traceback."""
    p = tmp_path / "lease.json"
    p.write_bytes(content)
    assert fs._read_record(str(p))[0] == state
    os.mkfifo(str(tmp_path / "fifo"))
    assert fs._read_record(str(tmp_path / "fifo")) == ("special", None)
    (tmp_path / "big").write_bytes(b" " * (fs.MAX_RECORD_BYTES + 10))
    assert fs._read_record(str(tmp_path / "big")) == ("large", fs.MAX_RECORD_BYTES + 10)
