# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark model_stage against the device's limit, cp -r and rsync -a on one synthetic multi-GB checkpoint.

The device limit is measured in the same rounds: ``dd oflag=direct`` writes of as many bytes (one writer per file), parallel
reads of the revision, and both at once. Every run is timed up to and including an fsync of every file it wrote
(so the page cache cannot hide the writes; not a global ``sync``, which would wait for other tenants' writeback)
and the page cache is dropped before each run when the kernel allows it. Results go to
a Markdown file, a JSON file and a PNG.

    .venv/bin/python benchmarks/stage_bench.py --bytes 3GiB --shards 48 --repeat 3 --ram-src /dev/shm/llmops-bench

The same-disk limit of a round is the slowest of the parallel direct write, the parallel read and both at once (a
copy within one disk does all three). ``--checkpoint DIR`` stages a real checkpoint directory instead of the
synthetic one (read only); ``--also-streams 8`` adds model_stage with other ``read_streams`` to the same rounds.
``--profile N`` times model_stage's phases instead (start-up, checks, copy, the per-file steps beside the streams,
publish, CPU), over N runs of this checkout and of ``--base`` when given:

    .venv/bin/python benchmarks/stage_bench.py --bytes 3GiB --shards 48 --ram-src /dev/shm/llmops-bench --profile 5 --base <commit>
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A private ansible_collections tree pointing at this checkout (the module runs as a subprocess).
PYCOLL = tempfile.mkdtemp(prefix="llmops-bench-pycoll-")
atexit.register(shutil.rmtree, PYCOLL, True)
os.makedirs(os.path.join(PYCOLL, "ansible_collections", "llmops"))
os.symlink(ROOT, os.path.join(PYCOLL, "ansible_collections", "llmops", "serving"))
sys.path.insert(0, PYCOLL)

from ansible_collections.llmops.serving.tests.lib import stage_synth as _stage_synth  # noqa: E402


def parse_size(text):
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def drop_caches():
    """True when the page cache was dropped; False when the kernel refused."""
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def cpu_steal():
    """Seconds of CPU time the hypervisor took from this VM so far (``steal`` in /proc/stat), 0 elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_module(args, pycoll=PYCOLL):
    env = dict(os.environ, PYTHONPATH=pycoll)
    module = os.path.join(pycoll, "ansible_collections", "llmops", "serving", "plugins", "modules", "model_stage.py")
    path = os.path.join(os.path.dirname(args["dest"]), ".bench-args.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, f)
    proc = subprocess.run([sys.executable, module, path], capture_output=True, text=True, check=False, env=env)
    out = proc.stdout
    if "{" not in out:
        raise SystemExit("model_stage printed no result (rc %d): %s" % (proc.returncode, proc.stderr[-3000:]))
    result = json.loads(out[out.index("{"):])
    if result.get("failed"):
        raise SystemExit("model_stage failed: %s" % result["msg"])
    return result


def pycoll_at(commit):
    """An ansible_collections tree holding this repository's plugins/ and tests/lib as of ``commit`` (git archive;
    nothing in the checkout changes)."""
    d = tempfile.mkdtemp(prefix="llmops-bench-base-")
    tree = os.path.join(d, "ansible_collections", "llmops", "serving")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "plugins", "tests/lib"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return d


def flush_tree(d):
    """fsync every file under ``d`` and the directories: what the method wrote is on disk, and only that (a global
    ``sync`` would also wait for the writeback of whatever else runs on the host)."""
    for dirpath, dummy, names in os.walk(d):
        for n in names + ["."]:
            path = os.path.join(dirpath, n)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def timed(fn, d):
    t0 = time.monotonic()
    extra = fn()
    if os.path.isdir(d):
        flush_tree(d)
    return time.monotonic() - t0, extra


def parallel(cmds):
    """Run the commands at once (output discarded); raise if one fails."""
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL) for c in cmds]
    for c, p in zip(cmds, procs):
        if p.wait():
            raise SystemExit("%s failed (rc %d)" % (" ".join(c), p.returncode))


def device_write_cmds(d, total, writers, src=None):
    """dd processes writing zeros with O_DIRECT, 16 MiB per request; returns (commands, bytes written).

    ``writers`` 0 (the default): one writer per file of ``src``, each writing that file's size (rounded up to 4 KiB,
    the direct-I/O unit): the deepest queue a copy of this revision can have, which on this disk writes faster than
    a few large writers, so the limit is the strictest. ``writers`` N: N writers sharing ``total`` bytes."""
    os.makedirs(d, exist_ok=True)
    if writers == 0:
        cmds, written = [], 0
        for i, (dirpath, dummy, names) in enumerate(os.walk(src)):
            for j, n in enumerate(sorted(names)):
                size = -(-os.path.getsize(os.path.join(dirpath, n)) // 4096) * 4096 or 4096
                cmds.append(["dd", "if=/dev/zero", "of=%s" % os.path.join(d, "w%d-%d" % (i, j)), "bs=%d" % DD_BS,
                             "count=%d" % size, "iflag=count_bytes", "oflag=direct", "status=none"])
                written += size
        return cmds, written
    count = max(1, int(round(total / writers / DD_BS)))
    return [["dd", "if=/dev/zero", "of=%s" % os.path.join(d, "w%d" % i), "bs=%d" % DD_BS, "count=%d" % count,
             "oflag=direct", "status=none"] for i in range(writers)], count * DD_BS * writers


def device_read_cmds(src, direct=False):
    """One reader per file of the revision, all at once: ``cat`` (buffered, with the kernel's readahead), or
    ``dd iflag=direct`` with 16 MiB requests."""
    out = []
    for dirpath, dummy, names in os.walk(src):
        for n in sorted(names):
            path = os.path.join(dirpath, n)
            out.append(["dd", "if=%s" % path, "of=/dev/null", "bs=%d" % DD_BS, "iflag=direct", "status=none"]
                       if direct else ["cat", path])
    return out


# Runs model_stage as the benchmark does (its file as __main__, arguments in a JSON file), with clocks on its phases:
# start-up (interpreter, ansible.module_utils.basic, the collection), the checks before the copy, the copy, and
# inside it the per-file steps that run beside the streams (summed over threads), publish and exit; then the CPU
# time of the whole process. Only names both versions have are timed, so a --base commit is profiled the same way.
PROFILE_WRAPPER = r"""
import time
T0 = time.monotonic()
import collections, json, os, resource, runpy, sys, threading
marks, acc, lock = {}, collections.defaultdict(lambda: [0.0, 0]), threading.Lock()
from ansible.module_utils import basic
marks["import ansible.module_utils.basic"] = time.monotonic() - T0
module, args_path, out_path = sys.argv[1:4]
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage, _stage_copy, _stage_publish
marks["import the collection"] = time.monotonic() - T0 - marks["import ansible.module_utils.basic"]


def timed(owner, name, label, total=False):
    real = getattr(owner, name, None)
    if real is None:
        return

    def wrapper(*a, **k):
        t = time.monotonic()
        try:
            return real(*a, **k)
        finally:
            with lock:
                acc[label][0] += time.monotonic() - t
                acc[label][1] += 1
    setattr(owner, name, wrapper)


timed(_stage_copy.Copier, "run", "copy (wall)")
timed(_stage_copy.Copier, "_copy", "stream time, summed over streams")
timed(_stage_copy.Copier, "_finish", "per-file finish beside the streams, summed")
timed(_stage_copy._verify, "check_copy_header", "header read back from the copy, summed")
timed(_stage_copy.os, "fsync", "fsync (files, then dirs at publish), summed")
timed(_stage._verify, "verify_source", "source headers and index checked")
timed(_stage._publish, "publish", "publish")
timed(_stage, "stage", "stage() in all")
timed(basic.AnsibleModule, "__init__", "AnsibleModule (arguments)")


def report():
    r = resource.getrusage(resource.RUSAGE_SELF)
    doc = {"marks": marks, "acc": dict(acc), "total": time.monotonic() - T0, "user": r.ru_utime, "sys": r.ru_stime}
    with open(out_path, "w") as f:
        json.dump(doc, f)


import atexit
atexit.register(report)
sys.argv = [module, args_path]
runpy.run_path(module, run_name="__main__")
"""

PROFILE_ROWS = [
    "import ansible.module_utils.basic", "import the collection", "AnsibleModule (arguments)",
    "source headers and index checked", "copy (wall)", "stream time, summed over streams",
    "per-file finish beside the streams, summed", "fsync (files, then dirs at publish), summed",
    "header read back from the copy, summed", "publish", "stage() in all"]


def profile_module(args, pycoll=PYCOLL):
    """One model_stage run under PROFILE_WRAPPER; returns its phases, wall time, user and system CPU."""
    env = dict(os.environ, PYTHONPATH=pycoll)
    module = os.path.join(pycoll, "ansible_collections", "llmops", "serving", "plugins", "modules", "model_stage.py")
    path = os.path.join(os.path.dirname(args["dest"]), ".bench-args.json")
    out = os.path.join(os.path.dirname(args["dest"]), ".bench-profile.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, f)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PROFILE_WRAPPER, module, path, out], capture_output=True, text=True,
                          check=False, env=env)
    wall = time.monotonic() - t0
    if '"failed": true' in proc.stdout or not os.path.isfile(out):
        raise SystemExit("model_stage failed under the profiler: %s %s" % (proc.stdout[-2000:], proc.stderr[-2000:]))
    with open(out) as f:
        doc = json.load(f)
    doc["wall"] = wall
    return doc


def profile(a, src, dest_root, versions):
    """``--profile N``: N runs per version, alternated, page cache dropped before each; prints a Markdown table of
    the median of every phase."""
    runs = {name: [] for name, dummy in versions}
    for rep in range(a.profile):
        for name, pycoll in versions[rep % len(versions):] + versions[:rep % len(versions)]:
            d = os.path.join(dest_root, "profile", "rev")
            shutil.rmtree(os.path.dirname(d), ignore_errors=True)
            drop_caches()
            runs[name].append(profile_module({"src": src, "dest": d}, pycoll))
            shutil.rmtree(os.path.dirname(d), ignore_errors=True)
            r = runs[name][-1]
            print("profile %d/%d %-10s wall %.2f s, copy %.2f s, CPU %.2f user + %.2f system" % (
                rep + 1, a.profile, name, r["wall"], r["acc"]["copy (wall)"][0], r["user"], r["sys"]), flush=True)

    def cell(name, row):
        vals = []
        for r in runs[name]:
            if row in r["marks"]:
                vals.append((r["marks"][row], None))
            elif row in r["acc"]:
                vals.append(tuple(r["acc"][row]))
        if not vals:
            return "-"
        n = statistics.median(v[1] for v in vals) if vals[0][1] is not None else None
        return "%.3f%s" % (statistics.median(v[0] for v in vals), " (%d calls)" % n if n is not None else "")

    names = [n for n, dummy in versions]
    lines = ["| phase (median of %d runs, s) | %s |" % (a.profile, " | ".join(names)),
             "|---|" + "---|" * len(names)]
    for row in PROFILE_ROWS:
        lines.append("| %s | %s |" % (row, " | ".join(cell(n, row) for n in names)))
    for label, key in (("whole process (wall, as the benchmark times it)", "wall"), ("CPU, user", "user"),
                       ("CPU, system", "sys")):
        meds = ["%.3f" % statistics.median(r[key] for r in runs[n]) for n in names]
        lines.append("| %s | %s |" % (label, " | ".join(meds)))
    print("\nsrc %s, load average (1 min) %.1f at the end\n" % (src, os.getloadavg()[0]))
    print("\n".join(lines))


DD_BS = 16 << 20
END = "<!-- end of the part stage_bench.py writes -->"
DEVICE = ("device: write", "device: read, cat", "device: read, O_DIRECT", "device: read + write at once")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/var/tmp/llmops-bench/stage")
    ap.add_argument("--bytes", default="3GiB", help="checkpoint size (e.g. 3GiB)")
    ap.add_argument("--shards", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; every method runs once per round")
    ap.add_argument("--read-streams", type=int, default=0, help="model_stage read_streams (0: the module's default)")
    ap.add_argument("--also-streams", default="", help="also run model_stage headers with these read_streams "
                    "(comma separated), alternated with the rest: the measurement behind the default")
    ap.add_argument("--skip", default="", help="methods left out, comma separated (e.g. 'rsync -a')")
    ap.add_argument("--checkpoint", default="", help="a real checkpoint directory to stage instead of the synthetic "
                    "one (read only; --bytes and --shards are then ignored)")
    ap.add_argument("--writers", type=int, default=0, help="parallel dd writers measuring the write limit; 0: one "
                    "per file of the revision, each its file's size (the deepest queue)")
    ap.add_argument("--buffered", action="store_true", help="also run model_stage with direct_io off")
    ap.add_argument("--ram-src", default="", help="a tmpfs directory (e.g. /dev/shm/llmops-bench): also stage "
                    "from a copy of the revision there, so reads do not compete with writes for the disk")
    ap.add_argument("--base", default="", help="also run model_stage headers as of this commit (A/B in the same "
                    "rounds)")
    ap.add_argument("--keep-src", action="store_true", help="keep the generated revision for the next run")
    ap.add_argument("--profile", type=int, default=0, help="instead of the comparison: profile model_stage's phases "
                    "over this many runs (of this checkout, and of --base when given, alternated) from --ram-src "
                    "when given, else from the revision on disk; prints a table, writes no file")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "model_stage.md"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "benchmarks", "model_stage.png"))
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "benchmarks", "model_stage.json"))
    a = ap.parse_args()

    total = parse_size(a.bytes)
    src = os.path.join(a.root, "shared", "bench", "rev")
    many = os.path.join(a.root, "shared", "bench141", "rev")
    dest_root = os.path.join(a.root, "nvme")
    stamp = os.path.join(a.root, "shared", "bench", "shape.json")
    shape = {"bytes": total, "shards": a.shards}
    try:
        with open(stamp) as f:
            fresh = json.load(f) == shape and os.path.isfile(os.path.join(src, "SHA256SUMS"))
    except (OSError, ValueError):
        fresh = False
    if a.checkpoint:  # the user's own revision, read as it is
        src = os.path.abspath(a.checkpoint)
        a.shards = len([n for n in os.listdir(src) if n.endswith(".safetensors")])
        fresh = True
    if not fresh:
        print("generating %d bytes in %d shards under %s" % (total, a.shards, src), flush=True)
        shutil.rmtree(src, ignore_errors=True)
        _stage_synth.write_checkpoint(src, total, shards=a.shards, seed=3)
        with open(stamp, "w") as f:
            json.dump(shape, f)
    if not os.path.isfile(os.path.join(many, "SHA256SUMS")):
        shutil.rmtree(many, ignore_errors=True)
        _stage_synth.write_checkpoint(many, 141 * (1 << 20), shards=141, tensors_per_shard=2, seed=4)
    size = sum(os.path.getsize(os.path.join(src, n)) for n in os.listdir(src))
    nfiles = len(os.listdir(src))
    ram_src = None
    if a.ram_src:
        ram_src = os.path.join(a.ram_src, "rev")
        shutil.rmtree(a.ram_src, ignore_errors=True)
        shutil.copytree(src, ram_src)

    def dest(name):
        return os.path.join(dest_root, name, "rev")

    if a.profile:
        versions = [("this", PYCOLL)] + ([(a.base, pycoll_at(a.base))] if a.base else [])
        try:
            profile(a, ram_src or src, dest_root, versions)
        finally:
            for dummy, pycoll in versions[1:]:
                shutil.rmtree(pycoll, ignore_errors=True)
            if ram_src:
                shutil.rmtree(a.ram_src, ignore_errors=True)
            shutil.rmtree(dest_root, ignore_errors=True)
        return

    def stage(mode, source=src, pycoll=PYCOLL, **extra):
        args = {"src": source, "verify": mode}
        if a.read_streams:
            args["read_streams"] = a.read_streams
        return lambda d: run_module(dict(args, dest=d, **extra), pycoll)

    write_bytes = [0]

    def dev_write(d):
        cmds, write_bytes[0] = device_write_cmds(d, size, a.writers, src)
        parallel(cmds)

    def dev_both(d):
        cmds, dummy = device_write_cmds(d, size, a.writers, src)
        parallel(cmds + device_read_cmds(src, direct=True))

    methods = {
        DEVICE[0]: dev_write,
        DEVICE[1]: lambda d: parallel(device_read_cmds(src)),
        DEVICE[2]: lambda d: parallel(device_read_cmds(src, direct=True)),
        DEVICE[3]: dev_both,
        "cp -r": lambda d: subprocess.run(["cp", "-r", src, d], check=True),
        "rsync -a": lambda d: subprocess.run(["rsync", "-a", src + "/", d + "/"], check=True),
        "model_stage headers": stage("headers"),
        "model_stage sha256": stage("sha256"),
    }
    if a.buffered:
        methods["model_stage headers, buffered"] = stage("headers", direct_io=False)
        methods["model_stage sha256, buffered"] = stage("sha256", direct_io=False)
    for n in filter(None, (x.strip() for x in a.also_streams.split(","))):
        methods["model_stage headers, read_streams %d" % int(n)] = stage("headers", read_streams=int(n))
    if ram_src:
        methods["model_stage headers, src in RAM"] = stage("headers", source=ram_src)
        for n in filter(None, (x.strip() for x in a.also_streams.split(","))):
            methods["model_stage headers, src in RAM, read_streams %d" % int(n)] = stage(
                "headers", source=ram_src, read_streams=int(n))
    base_pycoll = None
    if a.base:
        base_pycoll = pycoll_at(a.base)
        methods["model_stage headers @%s" % a.base] = stage("headers", pycoll=base_pycoll)
    if not shutil.which("rsync"):
        del methods["rsync -a"]
    for m in filter(None, (x.strip() for x in a.skip.split(","))):
        methods.pop(m, None)
    if not os.path.isfile(os.path.join(src, "SHA256SUMS")):  # a real checkpoint without a manifest
        print("no SHA256SUMS in %s: model_stage sha256 is left out" % src, flush=True)
        methods.pop("model_stage sha256", None)
    names = list(methods)
    load_before = os.getloadavg()[0]
    times = {m: [] for m in methods}
    steal = {m: [] for m in methods}
    module_secs = {}  # model_stage's own time (its result's seconds): the process less Python start-up
    dropped = []
    for rep in range(a.repeat):
        # a different order every round, so no method always runs right after the same other one
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            d = dest(name.replace(" ", "_").replace(",", "").replace(":", "").replace("+", "and"))
            shutil.rmtree(os.path.dirname(d), ignore_errors=True)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            dropped.append(drop_caches())
            steal0 = cpu_steal()
            secs, res = timed(lambda: methods[name](d), os.path.dirname(d))
            times[name].append(secs)
            if isinstance(res, dict) and "seconds" in res:
                module_secs.setdefault(name, []).append(res["seconds"])
            steal[name].append(cpu_steal() - steal0)
            shutil.rmtree(os.path.dirname(d), ignore_errors=True)  # only one copy on disk at a time
            print("round %d/%d %-34s %7.2f s  %6.0f MiB/s  steal %.2f s" % (
                rep + 1, a.repeat, name, secs, size / secs / 2 ** 20, steal[name][-1]), flush=True)
    if ram_src:
        shutil.rmtree(a.ram_src, ignore_errors=True)
    if base_pycoll:
        shutil.rmtree(base_pycoll, ignore_errors=True)

    # Re-run on a published revision: the 141-shard tree, marker compare only.
    d141 = dest("rerun141")
    shutil.rmtree(os.path.dirname(d141), ignore_errors=True)
    run_module({"src": many, "dest": d141})
    drop_caches()
    rerun = []
    for dummy in range(5):
        t0 = time.monotonic()
        r = run_module({"src": many, "dest": d141})
        rerun.append((time.monotonic() - t0, r["seconds"], r["changed"]))
    assert not any(r[2] for r in rerun), "re-run reported changed"
    shutil.rmtree(dest_root, ignore_errors=True)
    if not a.keep_src:
        shutil.rmtree(os.path.join(a.root, "shared"), ignore_errors=True)

    load_after = os.getloadavg()[0]
    med = {m: statistics.median(v) for m, v in times.items()}
    # the device limit of each round: the slower of writing and reading the same bytes (the yardstick),
    # and reading and writing them at once (what a copy within one disk has to do)
    limit = [max(w, min(rc, rd)) for w, rc, rd in zip(times[DEVICE[0]], times[DEVICE[1]], times[DEVICE[2]])]
    both = times[DEVICE[3]]
    # the same-disk limit: the slowest of the parallel write, the parallel read and both at once (a copy within
    # one disk does all three), per round
    same = [max(lim, b) for lim, b in zip(limit, both)]
    ratio_same = {m: [t / x for t, x in zip(times[m], same)] for m in methods if m not in DEVICE}
    ratio = {m: [t / lim for t, lim in zip(times[m], limit)] for m in methods if m not in DEVICE}
    ratio_both = {m: [t / b for t, b in zip(times[m], both)] for m in methods if m not in DEVICE}
    cp = med["cp -r"]

    def spread(v):
        return "%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))

    rows = []
    for m in methods:
        rows.append("| %s | %s | %.2f | %s | %.0f | %s | %s | %s | %s | %.2f |" % (
            m, " / ".join("%.2f" % t for t in times[m]), med[m],
            "%.2f" % statistics.median(module_secs[m]) if m in module_secs else "", size / med[m] / 2 ** 20,
            "%.2f×" % (med[m] / cp) if m not in DEVICE else "",
            spread(ratio_same[m]) if m in ratio_same else "",
            spread(ratio[m]) if m in ratio else "", spread(ratio_both[m]) if m in ratio_both else "",
            statistics.median(steal[m])))
    r_h = statistics.median(ratio["model_stage headers"])
    r_s = statistics.median(ratio["model_stage sha256"]) if "model_stage sha256" in ratio else None
    s_h = statistics.median(ratio_same["model_stage headers"])
    checks = [
        ("headers (module defaults) ≤ 1.2× same-disk limit (slowest of write, read, both at once)", s_h, s_h <= 1.2),
        ("headers ≤ 1.3× device limit (slower of parallel write, parallel read)", r_h, r_h <= 1.3)]
    if r_s is not None:
        s_s = statistics.median(ratio_same["model_stage sha256"])
        checks += [("sha256 ≤ 1.2× same-disk limit", s_s, s_s <= 1.2), ("sha256 ≤ 1.3× device limit", r_s, r_s <= 1.3)]
    checks += [
        ("headers ≤ 1.3× read + write at once", statistics.median(ratio_both["model_stage headers"]),
         statistics.median(ratio_both["model_stage headers"]) <= 1.3),
        ("headers ≤ 1.05× cp", med["model_stage headers"] / cp, med["model_stage headers"] <= 1.05 * cp),
    ]
    if r_s is not None:
        checks.append(("sha256 ≤ 1.3× cp", med["model_stage sha256"] / cp, med["model_stage sha256"] <= 1.3 * cp))
    if "rsync -a" in med:
        for mode in ("headers", "sha256"):
            m = "model_stage " + mode
            if m not in med:
                continue
            checks.append(("%s ≥ 2× faster than rsync" % mode, med["rsync -a"] / med[m], med["rsync -a"] >= 2 * med[m]))
    ram = "model_stage headers, src in RAM"
    if ram in times:
        r_ram = [t / w for t, w in zip(times[ram], times[DEVICE[0]])]
        checks.append(("headers, src in RAM ≤ 1.3× parallel write", statistics.median(r_ram),
                       statistics.median(r_ram) <= 1.3))
    if a.base:
        ab = [t / b for t, b in zip(times["model_stage headers"], times["model_stage headers @%s" % a.base])]
        checks.append(("headers: this version / %s, per round" % a.base, statistics.median(ab),
                       statistics.median(ab) < 1.0))
    rerun_max_module = max(r[1] for r in rerun)
    rerun_max_proc = max(r[0] for r in rerun)
    checks.append(("re-run < 1 s (141 shards, module time)", rerun_max_module, rerun_max_module < 1.0))

    with open(a.json, "w") as f:
        json.dump({"bytes": size, "files": nfiles, "shards": a.shards, "read_streams": a.read_streams,
                   "writers": a.writers, "rounds": a.repeat, "seconds": times, "cpu_steal_seconds": steal,
                   "module_seconds": module_secs,
                   "ratio_to_device_limit": ratio, "ratio_to_read_and_write_at_once": ratio_both,
                   "same_disk_limit_seconds": same, "ratio_to_same_disk_limit": ratio_same,
                   "rerun": [{"process_seconds": p, "module_seconds": s} for p, s, dummy in rerun],
                   "load_1min": [load_before, load_after], "caches_dropped": all(dropped),
                   "checks": [{"target": n, "measured": v, "met": ok} for n, v, ok in checks]},
                  f, indent=1, sort_keys=True)
        f.write("\n")
    plot(a.png, names, times, ratio, size, a.shards, a.repeat)

    cache_note = ("dropped before every run (`sync; echo 3 > /proc/sys/vm/drop_caches` succeeded)" if all(dropped)
                  else "NOT dropped: the kernel refused `echo 3 > /proc/sys/vm/drop_caches`, so reads may be "
                       "served from the page cache")
    lines = [
        "# model_stage benchmark",
        "",
        "Command (from the collection root):",
        "",
        "```",
        "%s benchmarks/stage_bench.py %s --repeat %d%s%s"
        % (os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable,
           ("--checkpoint %s" % a.checkpoint) if a.checkpoint else ("--bytes %s --shards %d" % (a.bytes, a.shards)),
           a.repeat, (" --read-streams %d" % a.read_streams) if a.read_streams else "",
           (" --ram-src %s" % a.ram_src if a.ram_src else "") + (" --base %s" % a.base if a.base else "")
           + (" --also-streams %s" % a.also_streams if a.also_streams else "")
           + (" --skip '%s'" % a.skip if a.skip else "")),
        "```",
        "",
        ("- Tree: the checkpoint directory `%s`, %.2f GiB in %d shards (%d files, read only). "
         % (a.checkpoint, size / 2 ** 30, a.shards, nfiles) if a.checkpoint else
         "- Tree: synthetic safetensors checkpoint, %.2f GiB in %d shards + index, config and `SHA256SUMS` "
         "(%d files, `tests/lib/stage_synth.py`). " % (size / 2 ** 30, a.shards, nfiles))
        + "Source and destination on the same filesystem here.",
        "- Device limit, measured in the same rounds as the copies: **write** = %s `dd if=/dev/zero "
        "oflag=direct bs=16M` writing %.2f GiB in all; **read** = one reader per file of the revision, all %d at "
        "once, either `cat` or `dd iflag=direct bs=16M`; **read + write at once** = the direct readers and the "
        "writers together, which is what any copy within one disk has to do. Per round, the device limit is the "
        "slower of write and read (read: the faster of the two readers); the ratio columns are per round "
        "(median, min-max)." % ("one writer per file of the revision (%d at once, each its file's size)" % nfiles
                                if a.writers == 0 else "%d parallel" % a.writers, write_bytes[0] / 2 ** 30, nfiles),
        "- Each run is timed up to and including an fsync of every file and directory it wrote, so written data "
        "is on disk for every method (model_stage fsyncs each file before publishing anyway); not a global "
        "`sync`, which would also wait for the writeback of other work on the host. Page cache: %s." % cache_note,
        "- Host: %s, %d CPUs, Python %s, kernel %s." % (
            platform.machine(), os.cpu_count(), platform.python_version(), platform.release()),
        "- Load average (1 min) %.1f at the start and %.1f at the end; CPU time taken by the hypervisor (steal) "
        "during the timed runs: %.1f s in all. Every method runs once per round, in a rotated order each round, "
        "so a noisy period hits all of them; the per-run columns show the spread."
        % (load_before, load_after, sum(sum(v) for v in steal.values())),
        "- model_stage ran with `read_streams: %s` as a separate process, as Ansible runs it (runs and ratios: "
        "the whole process, Python start-up included; module time: the copy, checks and publish alone); "
        "`direct_io` on (the default) unless the row says buffered." % (a.read_streams or "the module's default"),
        "",
        "| method | runs (s) | median (s) | module time, median (s) | MiB/s | vs cp | vs same-disk limit "
        "| vs device limit | vs read + write at once | CPU steal, median (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ] + rows + [
        "",
        "Re-run on a published 141-shard revision (marker and copies checked with stat only, no data read), "
        "5 runs after a cache drop: module time max %.3f s, whole process (Python start-up included) max %.3f s."
        % (rerun_max_module, rerun_max_proc),
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ] + ["| %s | %.3f | %s |" % (n, v, "yes" if ok else "**no**") for n, v, ok in checks] + [
        "",
        "![model_stage vs the device, cp and rsync](%s) (data: `%s`)" % (os.path.basename(a.png),
                                                                         os.path.basename(a.json)),
        "",
    ]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    kept = ""
    try:  # what follows the generated part (other measurements, written by hand) stays
        with open(a.out) as f:
            old = f.read()
        if END in old:
            kept = old[old.index(END) + len(END):]
    except OSError:
        pass
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n" + END + kept)
    print("\n".join(lines))


def plot(png, names, times, ratio, size, shards, rounds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    med = {m: statistics.median(v) for m, v in times.items()}
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6))
    colors = ["#444" if n in DEVICE else "#888" if not n.startswith("model_stage") else "#37a" for n in names]
    ax.barh(names, [med[n] for n in names], color=colors)
    for i, n in enumerate(names):
        ax.plot(times[n], [i] * len(times[n]), "k|", markersize=12)  # every run: the spread
        label = " %.1f s" % med[n]
        if n in ratio:
            label += " (%.2f× device limit)" % statistics.median(ratio[n])
        ax.text(max(times[n]), i, label, va="center")
    ax.set_xlabel("seconds incl. fsync of what it wrote, page cache dropped (bar: median of %d rounds, ticks: runs)" % rounds)
    ax.set_title("Staging %.1f GiB in %d shards on one local disk" % (size / 2 ** 30, shards))
    ax.set_xlim(0, max(max(v) for v in times.values()) * 1.5)
    ax.invert_yaxis()
    fig.tight_layout()
    os.makedirs(os.path.dirname(png), exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
