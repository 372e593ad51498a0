"""model_stage as real processes on a multi-GB synthetic checkpoint: kills and resumes (from the same source
and from another), broken shards, no space, concurrent runs and the fleet-wide reader cap.

The checkpoint (``LLMOPS_STAGE_TEST_BYTES``, default 2 GiB in 8 shards) is generated once per session.
Every case runs the module the way Ansible does (``python model_stage.py args.json``) so it can be
killed, raced and sampled through /proc.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = os.path.join(ROOT, "plugins", "modules", "model_stage.py")
TOTAL = int(os.environ.get("LLMOPS_STAGE_TEST_BYTES", str(2 * 1024 ** 3)))
SHARDS = 8
MARKER = ".llmops-staged.json"
# Peak disk use: the shared checkpoint plus the largest case (three hosts staging half of it each, or a killed
# copy, its partial files and a second source's shard), with a margin. Passed cases' directories are removed as
# they end (pytest.ini: tmp_path_retention_policy = failed), so this is the whole need, not a sum over cases.
DISK_FACTOR = 3
DISK_NEED = DISK_FACTOR * TOTAL


@pytest.fixture(scope="session")
def pycoll(tmp_path_factory):
    """A private ansible_collections tree pointing at the working tree, for the module subprocesses."""
    tree = tmp_path_factory.mktemp("pycoll")
    os.makedirs(str(tree / "ansible_collections" / "llmops"))
    os.symlink(ROOT, str(tree / "ansible_collections" / "llmops" / "serving"))
    return str(tree)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory, pycoll):
    root = tmp_path_factory.mktemp("stage-shared")
    free = shutil.disk_usage(str(root)).free
    if free < DISK_NEED:
        pytest.fail("the staging tests need %.1f GiB free under %s (LLMOPS_STAGE_TEST_BYTES=%d x %d) and %.1f GiB "
                    "is free; free space there, or set LLMOPS_STAGE_TEST_BYTES smaller (the cases still kill and "
                    "resume mid-copy at 512 MiB)" % (DISK_NEED / 2 ** 30, root, TOTAL, DISK_FACTOR, free / 2 ** 30),
                    pytrace=False)
    src = str(root / "big" / "rev-a")
    info = _stage_synth.write_checkpoint(src, TOTAL, shards=SHARDS, seed=7)
    sums = {}
    with open(os.path.join(src, "SHA256SUMS")) as f:
        for line in f:
            digest, name = line.split()
            sums[name] = digest
    _PYCOLL[:] = [pycoll]
    return {"src": src, "info": info, "sums": sums}


_PYCOLL = []


def start(tmp_path, args, tag="run"):
    path = tmp_path / ("%s-args.json" % tag)
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=_PYCOLL[0])
    return subprocess.Popen([sys.executable, MODULE, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    try:
        return json.loads(out[out.index("{"):])
    except ValueError:
        raise AssertionError("module printed no JSON (rc %s): %s %s" % (proc.returncode, out[-2000:], err[-2000:]))


def run(tmp_path, args, tag="run"):
    return finish(start(tmp_path, args, tag))


def derived_src(ckpt, tmp_path, replace=None, drop=()):
    """A sibling revision: hard links to the big shards, except real copies for files we break."""
    src = str(tmp_path / "shared" / "rev-x")
    os.makedirs(src)
    for name in ckpt["info"]["files"]:
        if name in drop:
            continue
        if replace and name in replace:
            shutil.copyfile(os.path.join(ckpt["src"], name), os.path.join(src, name))
            replace[name](os.path.join(src, name))
        else:
            os.link(os.path.join(ckpt["src"], name), os.path.join(src, name))
    return src


def assert_identical(src, dest, sums):
    names = sorted(n for n in os.listdir(dest) if n != MARKER)
    assert names == sorted(os.listdir(src))
    for name in names:
        if name == "SHA256SUMS":
            continue
        h = hashlib.sha256()
        with open(os.path.join(dest, name), "rb") as f:
            for block in iter(lambda: f.read(16 << 20), b""):
                h.update(block)
        assert h.hexdigest() == sums[name], name


SHARD1 = "model-00001-of-00008.safetensors"
#: The run that is killed reads at most this per stream (read_rate_limit): two streams copy the checkpoint in about
#: 8 s whatever the disk and the page cache, so the kill at 40 % always lands mid-copy (a fast disk copied it whole
#: between two polls). The run after it reads unlimited.
KILL_RATE = TOTAL // 16


def test_sigkill_mid_copy_then_resume_is_byte_identical(ckpt, tmp_path):
    dest = str(tmp_path / "nvme" / "rev-a")
    prog = str(tmp_path / "progress.json")
    args = {"src": ckpt["src"], "dest": dest, "read_streams": 2, "progress_file": prog}
    proc = start(tmp_path, dict(args, read_rate_limit=KILL_RATE))
    deadline = time.monotonic() + 120
    killed_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            p = json.load(open(prog))
        except (OSError, ValueError):
            p = {}
        complete = os.listdir(dest + ".partial") if os.path.isdir(dest + ".partial") else []
        complete = [n for n in complete if not n.endswith(".llmops-part")]
        if p.get("bytes_done", 0) >= 0.4 * TOTAL and complete:
            proc.send_signal(signal.SIGKILL)
            killed_at = p["bytes_done"]
            break
        time.sleep(0.05)
    proc.wait()
    assert killed_at is not None, "copy finished before it could be killed; raise LLMOPS_STAGE_TEST_BYTES"
    assert not os.path.exists(dest), "a killed copy must not be visible at dest"
    r = run(tmp_path, args)
    assert r["changed"] is True and r["files_skipped"] >= 1, r
    assert r["bytes_copied"] < r["bytes_total"]
    assert_identical(ckpt["src"], dest, ckpt["sums"])
    assert not os.path.exists(dest + ".partial")
    again = run(tmp_path, args)
    assert again["changed"] is False and again["bytes_copied"] == 0, again


def _kill_mid_copy(tmp_path, args):
    """Start a run and SIGKILL it once 40% is copied and at least one file is complete in the partial dir."""
    dest, prog = args["dest"], args["progress_file"]
    proc = start(tmp_path, dict(args, read_rate_limit=KILL_RATE))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            p = json.load(open(prog))
        except (OSError, ValueError):
            p = {}
        complete = os.listdir(dest + ".partial") if os.path.isdir(dest + ".partial") else []
        complete = [n for n in complete if not n.endswith(".llmops-part") and not n.startswith(".llmops")]
        if p.get("bytes_done", 0) >= 0.4 * TOTAL and complete:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return sorted(complete)
        time.sleep(0.05)
    proc.wait()
    raise AssertionError("copy finished before it could be killed; raise LLMOPS_STAGE_TEST_BYTES")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            h.update(block)
    return h.hexdigest()


def test_sigkill_mid_copy_then_another_source_publishes_only_that_source(ckpt, tmp_path):
    dest = str(tmp_path / "nvme" / "rev")
    args = {"src": ckpt["src"], "dest": dest, "read_streams": 2, "progress_file": str(tmp_path / "progress.json")}
    complete = [n for n in _kill_mid_copy(tmp_path, args) if n.endswith(".safetensors")]
    assert complete, "no shard was complete when the copy was killed"
    shard = complete[0]

    # another revision: the same files, except that shard has other bytes with the same size and mtime
    def other_bytes(path):
        st = os.stat(os.path.join(ckpt["src"], shard))
        with open(path, "r+b") as f:
            f.seek(st.st_size // 2)
            f.write(b"\x00\x01\x02\x03")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    other = derived_src(ckpt, tmp_path, replace={shard: other_bytes})
    want = _sha256(os.path.join(other, shard))
    assert want != ckpt["sums"][shard]
    r = run(tmp_path, dict(args, src=other))
    assert r["changed"] is True and not r.get("failed"), r
    assert _sha256(os.path.join(dest, shard)) == want, "a file of the killed run's source was published"
    sums = dict(ckpt["sums"], **{shard: want})
    assert_identical(other, dest, sums)
    marker = json.load(open(os.path.join(dest, MARKER)))
    assert marker["source"] == other and not os.path.exists(dest + ".partial")
    assert run(tmp_path, dict(args, src=other))["changed"] is False


def _corrupt_header(path):
    with open(path, "r+b") as f:
        f.seek(9)  # inside the JSON, after its opening brace
        f.write(b"#")


def _corrupt_data(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\x00\x01\x02\x03")


def _truncate(path):
    os.truncate(path, os.path.getsize(path) - 4096)


@pytest.mark.parametrize("case,verify,needle", [
    ("header", "headers", "header is not valid UTF-8 JSON"),
    ("truncated", "headers", "truncated"),
    ("data", "sha256", "checksum mismatch"),
])
def test_broken_shard_is_named_and_dest_untouched(ckpt, tmp_path, case, verify, needle):
    fn = {"header": _corrupt_header, "truncated": _truncate, "data": _corrupt_data}[case]
    src = derived_src(ckpt, tmp_path, replace={SHARD1: fn})
    dest = str(tmp_path / "nvme" / "rev-x")
    r = run(tmp_path, {"src": src, "dest": dest, "verify": verify})
    assert r.get("failed") is True, r
    assert SHARD1 in r["msg"] and needle in r["msg"], r["msg"]
    assert not os.path.exists(dest)
    if os.path.isdir(dest + ".partial"):  # only complete, good files are kept for a resume
        assert SHARD1 not in os.listdir(dest + ".partial")


def test_shard_missing_from_src(ckpt, tmp_path):
    src = derived_src(ckpt, tmp_path, drop=("model-00005-of-00008.safetensors",))
    dest = str(tmp_path / "nvme" / "rev-x")
    r = run(tmp_path, {"src": src, "dest": dest})
    assert r.get("failed") and "model-00005-of-00008.safetensors" in r["msg"] and "missing shard" in r["msg"]
    assert not os.path.exists(dest) and not os.path.exists(dest + ".partial")


def test_no_space_on_small_tmpfs(ckpt, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    rc = subprocess.call(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                         stderr=subprocess.DEVNULL)
    if rc != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        dest = str(mnt / "m" / "rev-a")
        r = run(tmp_path, {"src": ckpt["src"], "dest": dest})
        assert r.get("failed") and r["msg"].startswith("no space:"), r
        assert not os.path.exists(dest) and not os.path.exists(dest + ".partial")
    finally:
        subprocess.call(["umount", str(mnt)])


def test_two_concurrent_runs_on_one_dest(ckpt, tmp_path):
    dest = str(tmp_path / "nvme" / "rev-a")
    args = {"src": ckpt["src"], "dest": dest, "read_streams": 2, "fsync": False}
    a = start(tmp_path, args, "a")
    b = start(tmp_path, args, "b")
    ra, rb = finish(a), finish(b)
    assert not ra.get("failed") and not rb.get("failed"), (ra, rb)
    assert sorted([ra["changed"], rb["changed"]]) == [False, True]
    src_bytes = sum(os.path.getsize(os.path.join(ckpt["src"], n)) for n in os.listdir(ckpt["src"]))
    assert sorted([ra["bytes_copied"], rb["bytes_copied"]]) == [0, src_bytes]
    assert_identical(ckpt["src"], dest, ckpt["sums"])


#: An open of a source file held at least this long is a copy stream, not a header read (a few KiB).
BULK_S = 0.05


def _fds_under(pids, prefix):
    """``{(pid, fd, target)}`` of the open files of ``pids`` under ``prefix``."""
    out = set()
    for pid in pids:
        d = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(d)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(d, fd))
            except OSError:
                continue
            if target.startswith(prefix):
                out.add((pid, fd, target))
    return out


def test_fleet_cap_holds_across_contending_hosts(ckpt, tmp_path):
    cap, hosts = 2, 3
    keep = {"model-0000%d-of-00008.safetensors" % i for i in (1, 2, 3, 4)}
    src = derived_src(ckpt, tmp_path, drop=[n for n in ckpt["info"]["files"]
                                            if n.endswith(".safetensors") and n not in keep]
                      + ["model.safetensors.index.json", "SHA256SUMS"])
    slots = str(tmp_path / "shared" / ".slots")
    procs = [start(tmp_path, {"src": src, "dest": str(tmp_path / ("nvme%d" % h) / "rev"), "read_streams": 2,
                              "fleet_slots_dir": slots, "fleet_read_streams": cap, "fleet_host_id": "host%d" % h,
                              "fsync": False, "verify": "headers"}, "h%d" % h)
             for h in range(hosts)]
    pids = [p.pid for p in procs]
    peak, samples, stop = [0], [0], threading.Event()
    # The cap bounds the copy streams; the headers, index and manifest (a few KiB each) are read without a slot by
    # design (_stage.py). So a reader is an open of a file under src that stays open: each open is followed from
    # the sample it appears in to the one it is gone from, and only opens held for BULK_S or more count.
    opens, held_now, per_sample = [], {}, []

    def sampler():
        while not stop.is_set():
            now = time.monotonic()
            seen = _fds_under(pids, src + "/")
            for key in list(held_now):
                if key not in seen:
                    opens[held_now.pop(key)][1] = now
            for key in seen:
                if key not in held_now:
                    held_now[key] = len(opens)
                    opens.append([now, None])
            per_sample.append(list(held_now.values()))
            samples[0] += 1

    t = threading.Thread(target=sampler)
    t.start()
    try:
        results = [finish(p) for p in procs]
    finally:
        stop.set()
        t.join()
    end = time.monotonic()
    bulk = {i for i, (t0, t1) in enumerate(opens) if (t1 or end) - t0 >= BULK_S}
    peak[0] = max(len([i for i in ids if i in bulk]) for ids in per_sample)
    assert all(r.get("changed") is True for r in results), results
    assert samples[0] > 50
    assert peak[0] <= cap, "saw %d concurrent readers of src with a fleet cap of %d" % (peak[0], cap)
    assert peak[0] == cap, "the cap should be reached with %d hosts x 2 streams" % hosts
    assert sum(r["fleet_wait_seconds"] for r in results) > 0
    assert not [n for n in os.listdir(slots) if n.endswith(".lease")], "leases must be released"
