# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet staging time and shared-filesystem bytes against fleet size, with peer fan-out off and on.

N nodes are network namespaces on this machine (tests/lib/netns.py): one sshd each, so ansible-playbook
reaches them over SSH as real hosts and runs the model_stage role on all of them at once. Each node's link
is shaped with tc to ``--rate-mbit`` each way; the shared filesystem is an ext4 loop device whose reads
are throttled to the same rate for the whole fleet together (a blkio cgroup holding every process the nodes
run), and model_stage's own fleet cap (lease directory) and ``read_rate_limit`` (where the module has it) are
set to that rate as well. The bytes read from the shared filesystem are counted at its block device.

    sudo .venv/bin/python benchmarks/fanout_bench.py --size-mib 256 --rate-mbit 200 --nodes 1,2,4,8 --runs 2

Modes: ``off`` is today's behaviour (every node reads the whole revision from the shared filesystem, under
the cap); ``on`` is ``model_stage_fanout: true`` with ``model_stage_fanout_seeds`` seeds. Runs alternate
the modes (off, on, on, off, ...) so a noisy period of the shared machine hits both. Writes
``<out>.json``, ``<out>.png`` and ``<out>.md``.

With ``--checkpoint DIR`` the revision is a real checkpoint (copied once onto the fleet's shared filesystem; no
synthetic data) and every run prints each node's GiB/s, its bytes from the shared filesystem and from peers, the
fleet's shared-filesystem bytes and the time to the last node:

    sudo .venv/bin/python benchmarks/fanout_bench.py --checkpoint /models/m/rev --nodes 1,8 --runs 3 --off-single

With ``--base-collections TREE`` the mode ``on@base`` (fan-out on, run by that tree) is alternated with the others
in the same run, so two versions are compared under the same load; each run records the fleet's CPU seconds.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the working tree as ansible_collections.llmops.serving (the same tree the root conftest makes)
_PYCOLL = os.path.join(ROOT, ".build", "pycoll")
if not os.path.islink(os.path.join(_PYCOLL, "ansible_collections", "llmops", "serving")):
    os.makedirs(os.path.join(_PYCOLL, "ansible_collections", "llmops"), exist_ok=True)
    os.symlink(ROOT, os.path.join(_PYCOLL, "ansible_collections", "llmops", "serving"))
sys.path.insert(0, _PYCOLL)

from ansible_collections.llmops.serving.tests.lib import netns  # noqa: E402
from ansible_collections.llmops.serving.tests.lib import stage_synth  # noqa: E402

MIB = 1 << 20
MODEL, REVISION = "synth", "rev-1"
MARKER = ".llmops-staged.json"


def capabilities():
    """What the model_stage role and module of this tree support (fan-out, read_rate_limit)."""
    with open(os.path.join(ROOT, "roles", "model_stage", "defaults", "main.yml")) as f:
        defaults = f.read()
    with open(os.path.join(ROOT, "plugins", "modules", "model_stage.py")) as f:
        module = f.read()
    return {"fanout": bool(re.search(r"^model_stage_fanout:", defaults, re.M)),
            "read_rate_limit": bool(re.search(r"^model_stage_read_rate_limit:", defaults, re.M)) and "read_rate_limit" in module}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 * MIB), b""):
            h.update(block)
    return h.hexdigest()


def check_copies(nodes, src, sums):
    """Every node's copy is byte-identical to the source (sha256 of every file); returns the problems."""
    problems = []
    for node in nodes:
        dest = os.path.join(node.nvme, MODEL, REVISION)
        if not os.path.isdir(dest):
            problems.append("%s: no staged revision at %s" % (node.name, dest))
            continue
        names = sorted(n for n in os.listdir(dest) if n != MARKER)
        if names != sorted(os.listdir(src)):
            problems.append("%s: files differ from the source" % node.name)
            continue
        for name, digest in sums.items():
            if sha256_file(os.path.join(dest, name)) != digest:
                problems.append("%s: %s differs from the source" % (node.name, name))
    return problems


def checkpoint_bytes(directory):
    """Bytes of the regular files under ``directory`` (a real checkpoint; symlinks are not followed)."""
    total = 0
    for dirpath, dummy, names in os.walk(directory):
        for n in names:
            path = os.path.join(dirpath, n)
            if os.path.isfile(path) and not os.path.islink(path):
                total += os.path.getsize(path)
    return total


def copy_checkpoint(directory, src):
    """Copy the checkpoint ``directory`` to ``src`` on the fleet's shared filesystem (the original is only read)
    and give it a ``SHA256SUMS`` when it has none (every run's copies are checked against it); ``{"bytes"}``."""
    shutil.copytree(directory, src, symlinks=False)
    manifest = os.path.join(src, "SHA256SUMS")
    if not os.path.exists(manifest):
        lines = []
        for dirpath, dummy, names in os.walk(src):
            for n in sorted(names):
                path = os.path.join(dirpath, n)
                lines.append("%s  %s\n" % (sha256_file(path), os.path.relpath(path, src)))
        with open(manifest, "w") as f:
            f.writelines(sorted(lines, key=lambda ln: ln.split("  ", 1)[1]))
    return {"bytes": checkpoint_bytes(src)}


def per_node_lines(entry, size):
    """Per node: its copy's GiB/s (the revision over the module's own seconds), bytes from the shared filesystem
    and from peers; then the shared-filesystem bytes of the fleet and the time to the last node."""
    out = []
    for name, h in sorted(entry["hosts"].items()):
        if not h.get("seconds"):
            continue
        out.append("    %-7s %7.3f GiB/s  %6.1f s  from shared FS %8.1f MiB  from peers %8.1f MiB  ends at %s s" % (
            name, size / h["seconds"] / 2 ** 30, h["seconds"],
            (h["bytes_from_source"] if h.get("bytes_from_source") is not None else h.get("bytes_copied") or 0) / MIB,
            (h.get("bytes_from_peers") or 0) / MIB, h.get("end_offset")))
    out.append("    fleet: shared FS %.1f MiB (%.2f× revision), time to the last node %s s (first copy start to last end)"
               % (entry["shared_bytes"] / MIB, entry["shared_bytes"] / size, entry.get("copy_span_seconds")))
    return "\n".join(out)


def reset(fleet, nodes):
    for node in fleet.nodes:
        for sub in ("nvme", "progress"):
            shutil.rmtree(os.path.join(node.dir, sub), ignore_errors=True)
        os.makedirs(node.nvme)
    shutil.rmtree(os.path.join(fleet.root, "slots"), ignore_errors=True)
    os.makedirs(os.path.join(fleet.root, "slots"))
    fleet.remount_shared()  # cold: the page cache of the shared filesystem is dropped


def group_vars(fleet, args, mode, caps):
    rate_bps = int(args.rate_mbit * 1e6 / 8)
    gv = {"model_stage_src_root": fleet.shared, "model_stage_models": [{"name": MODEL, "revision": REVISION}],
          "model_stage_fleet_slots_dir": os.path.join(fleet.root, "slots"),
          "model_stage_fleet_read_streams": args.streams, "model_stage_read_streams": args.streams,
          "model_stage_poll_interval": 2, "model_stage_keep_revisions": 1, "model_stage_verify": args.verify}
    if caps["read_rate_limit"]:
        gv["model_stage_read_rate_limit"] = rate_bps // args.streams
    if mode == "on":
        gv.update({"model_stage_fanout": True, "model_stage_fanout_seeds": args.seeds,
                   "model_stage_fanout_port": args.port, "model_stage_fanout_piece_size": args.piece_kib * 1024,
                   "model_stage_fanout_summary_file": os.path.join(fleet.root, "fanout-summary.json")})
    elif caps["fanout"]:
        gv["model_stage_fanout"] = False
    return gv


def one_run(fleet, args, mode, n, caps, sums, tag):
    nodes = fleet.nodes[:n]
    reset(fleet, nodes)
    before = fleet.shared_read_bytes()
    links_before = dict((node.name, fleet.link_counters(node)) for node in nodes) if args.rate_mbit else None
    sampler = RunSampler(progress=dict((node.name, progress_path(node)) for node in nodes),
                         namespaces=fleet_namespaces(fleet)).start()
    # "on@base": fan-out on, run by the tree of --base-collections (an A/B of two versions in one run)
    base = mode.endswith("@base")
    play = netns.run_stage_play(fleet, nodes, group_vars(fleet, args, mode.split("@")[0], caps), timeout=args.timeout,
                                tag=tag, collections=args.base_collections if base else args.collections)
    shared = fleet.shared_read_bytes() - before
    sampler.stop()
    entry = {"mode": mode, "nodes": n, "rc": play["rc"], "fleet_seconds": round(play["wall"], 2),
             "shared_bytes": shared, "hosts": {}}
    if links_before:  # what each shaped link carried and dropped during the play (its SSH traffic included)
        entry["links"] = dict((node.name, link_delta(links_before[node.name], fleet.link_counters(node)))
                              for node in nodes)
    for name, results in sorted(play["results"].items()):
        res = (results or [{}])[0].get("result", {}) if results else {}
        entry["hosts"][name] = {k: res.get(k) for k in (
            "seconds", "bytes_copied", "bytes_from_source", "bytes_from_peers", "peers_used", "bad_pieces_rejected",
            "bytes_per_peer", "peers_dropped")}
    copy_secs = [h["seconds"] for h in entry["hosts"].values() if h.get("seconds") is not None]
    entry["copy_seconds_max"] = max(copy_secs) if len(copy_secs) == n else None
    window = copy_window(nodes, entry["hosts"]) if len(copy_secs) == n else None
    entry["copy_span_seconds"] = round(window[1] - window[0], 2) if window else None
    entry["sent_by_host"] = sent_by_host(nodes, entry["hosts"])
    entry["cpu_busy_copy"] = sampler.busy(*window) if window else None
    entry["fleet_cpu_seconds"] = sampler.fleet_cpu(*window) if window else None
    entry["softirq_seconds"] = sampler.softirq(*window) if window else None
    entry["load_1min"] = sampler.load(*window) if window else None
    entry["timeline"] = sampler.timeline(window[0]) if window else None
    entry["problems"] = check_copies(nodes, os.path.join(fleet.shared, MODEL, REVISION), sums) if play["rc"] == 0 else [
        "ansible-playbook rc %s: %s" % (play["rc"], play["output"][-3000:])]
    return entry


def link_delta(before, after):
    """Per direction of a node's link, what its shaper counted between two ``Fleet.link_counters`` readings."""
    return dict((way, dict((k, after[way][k] - before[way][k]) for k in after[way])) for way in after)


def link_bound(run, size, link, piece, seeds):
    """The earliest the fleet could end given when Ansible started each copy (``start_offset``) and what the links
    allow: a receiver takes the whole revision through its own link (``size / link`` seconds from its start) and
    the seed's last piece after the seed read it (``piece / link`` after the seed's end). None without offsets."""
    hosts = run["hosts"]
    if not all("start_offset" in h and "end_offset" in h for h in hosts.values()):
        return None
    seeds = seed_hosts(seeds)
    seed_end = max(hosts[name]["end_offset"] for name in seeds if name in hosts)
    receivers = [h["start_offset"] + size / link for name, h in hosts.items() if name not in seeds]
    return max([seed_end] + receivers + ([seed_end + piece / link] if receivers else []))


def progress_path(node):
    return os.path.join(node.dir, "progress", MODEL + ".json")


def copy_window(nodes, hosts):
    """``(first start, last end)`` of the copies in wall-clock seconds (progress file's last write, minus the
    module's own seconds for the start), the fleet time without Ansible's connection and task start-up; each host
    gets its ``start_offset`` and ``end_offset`` from the first start. None when a progress file is missing."""
    starts, ends = [], []
    for node in nodes:
        try:
            with open(progress_path(node)) as f:
                end = json.load(f)["updated"]
        except (OSError, ValueError, KeyError):
            return None
        ends.append(end)
        starts.append(end - hosts[node.name]["seconds"])
    t0 = min(starts)
    for node, start, end in zip(nodes, starts, ends):
        hosts[node.name]["start_offset"] = round(start - t0, 2)
        hosts[node.name]["end_offset"] = round(end - t0, 2)
    return t0, max(ends)


def sent_by_host(nodes, hosts):
    """Bytes each node's server sent to the others (from the receivers' ``bytes_per_peer``)."""
    by_addr = dict((node.address, node.name) for node in nodes)
    out = dict((node.name, 0) for node in nodes)
    for h in hosts.values():
        for url, n in (h.get("bytes_per_peer") or {}).items():
            name = by_addr.get(url.split("//", 1)[-1].split(":", 1)[0])
            if name:
                out[name] += n
    return out


class RunSampler(object):
    """Samples, twice a second, the machine's CPU use (so the share of both CPUs busy while the copies ran can be
    told from the Ansible start-up around them) and each node's progress file (bytes over time)."""

    def __init__(self, interval=0.5, progress=None, namespaces=None):
        self.interval = interval
        self.namespaces = namespaces
        self.loads = []   # [(time, 1-minute load average)]
        self.samples = []
        self.procs = []   # [(time, {pid: (kind, cpu seconds so far)})] of the fleet's processes
        self.progress = progress or {}
        self.bytes = dict((name, []) for name in self.progress)   # name -> [(time, bytes_done)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _loop(self):
        while True:
            self.samples.append((time.time(),) + cpu_times())
            self.procs.append((time.time(), fleet_process_cpu(self.namespaces)))
            self.loads.append((time.time(), load_1min()))
            for name, path in self.progress.items():
                try:
                    with open(path) as f:
                        doc = json.load(f)
                    self.bytes[name].append((doc["updated"], doc["bytes_done"]))
                except (OSError, ValueError, KeyError):
                    pass
            if self._stop.wait(self.interval):
                self.samples.append((time.time(),) + cpu_times())
                return

    def stop(self):
        self._stop.set()
        self._thread.join()

    def timeline(self, t0):
        """Per node, ``[seconds since t0, bytes done]`` as its progress file said (once a second), deduplicated."""
        out = {}
        for name, points in self.bytes.items():
            seen = sorted(set(points))
            out[name] = [[round(t - t0, 2), b] for t, b in seen]
        return out

    def fleet_cpu(self, t0, t1):
        """CPU seconds the fleet's own processes (those in the nodes' network namespaces: sshd, Ansible's module
        processes, the copies, the piece servers) used from ``t0`` to ``t1``, per kind and in all. Sampled twice a
        second, so a process that lived less than that is missed, and one that ended inside the window counts up
        to its last sample: a lower bound, the same for every version compared."""
        inside = [(t, p) for t, p in self.procs if t0 - self.interval <= t <= t1 + self.interval]
        if len(inside) < 2:
            return None
        first = inside[0][1]
        last = {}
        for dummy, procs in inside:
            last.update(procs)
        kinds = {}
        system = 0.0
        for pid, (kind, cpu, sys_cpu) in last.items():
            used = cpu - (first[pid][1] if pid in first else 0.0)
            kinds[kind] = kinds.get(kind, 0.0) + max(0.0, used)
            system += max(0.0, sys_cpu - (first[pid][2] if pid in first else 0.0))
        out = dict((k, round(v, 2)) for k, v in sorted(kinds.items()))
        out["total"] = round(sum(kinds.values()), 2)
        out["system"] = round(system, 2)  # of the total, in the kernel on the processes' behalf (syscalls)
        return out

    def load(self, t0, t1):
        """The machine's 1-minute load average while the copies ran: ``[lowest, median, highest]`` of the samples."""
        vals = sorted(v for t, v in self.loads if t0 <= t <= t1 and v is not None)
        return [vals[0], round(statistics.median(vals), 2), vals[-1]] if vals else None

    def softirq(self, t0, t1):
        """CPU seconds the whole machine spent in softirq from ``t0`` to ``t1`` (packets, mostly)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        return round(inside[-1][3] - inside[0][3], 2)

    def busy(self, t0, t1):
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        a, b = inside[0], inside[-1]
        return round((b[1] - a[1]) / max(1e-9, b[2] - a[2]), 3)


_OWN_NET = None


def _process_kind(cmdline):
    for needle, kind in (("model_stage_peer", "piece server"), ("model_stage_follow", "progress poll"),
                         ("model_stage", "copy"), ("sshd", "sshd"), ("async_wrapper", "ansible async")):
        if needle in cmdline:
            return kind
    return "other"  # with Ansible's pipelining a module's process is a bare python: the piece servers land here


def fleet_namespaces(fleet):
    """The network namespaces of ``fleet``'s nodes as ``/proc/<pid>/ns/net`` names them (``net:[<inode>]``), so
    that processes of other work on the machine in namespaces of their own are not counted as the fleet's."""
    out = set()
    for node in fleet.nodes:
        try:
            out.add("net:[%d]" % os.stat(os.path.join("/run/netns", node.ns)).st_ino)
        except OSError:
            pass
    return out or None


def proc_stat(pid):
    """``(comm, fields)`` of ``/proc/<pid>/stat``, ``fields`` the words after the command name (``fields[1]`` the
    parent pid, ``[11]``/``[12]`` user/system ticks, ``[19]`` the start time); None when the process is gone."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            head, _sep, rest = f.read().rpartition(")")
    except OSError:
        return None
    return head.partition("(")[2], rest.split()


def proc_cmdline(pid):
    """The first 4 KiB of ``pid``'s command line as text ("" for a kernel thread), None when the process is gone."""
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            return f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None


def fleet_process_cpu(namespaces=None):
    """``{pid: (kind, user + system CPU seconds, system CPU seconds)}`` of every process in one of ``namespaces``
    (the fleet's nodes; None: every namespace other than this one's), from ``/proc``."""
    global _OWN_NET
    if _OWN_NET is None:
        _OWN_NET = os.readlink("/proc/self/ns/net")
    hz = float(os.sysconf("SC_CLK_TCK"))
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            net = os.readlink("/proc/%s/ns/net" % pid)
        except OSError:
            continue
        if net == _OWN_NET or (namespaces is not None and net not in namespaces):
            continue
        stat = proc_stat(pid)
        if stat is None:
            continue
        fields, cmdline = stat[1], proc_cmdline(pid)
        if cmdline is None:
            continue
        out[int(pid)] = (_process_kind(cmdline), (int(fields[11]) + int(fields[12])) / hz, int(fields[12]) / hz)
    return out


def link_mbit(args):
    """The node links' rate (Mbit/s): ``--link-mbit``, else the shared filesystem's ``--rate-mbit``."""
    return args.get("link_mbit") or args["rate_mbit"]


def load_1min():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_times():
    """``(busy, total, softirq)`` CPU seconds of the whole machine so far (``/proc/stat``; busy: all but idle and
    iowait; softirq: the kernel's deferred work, most of it the packets of the veth links and the bridge, which no
    process is charged with), so a run's CPU use is the difference of two readings."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    hz = float(os.sysconf("SC_CLK_TCK"))
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return (total - idle) / hz, total / hz, (vals[6] if len(vals) > 6 else 0) / hz


def machine():
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"host": "%s, %d CPUs, %s" % (platform.machine(), os.cpu_count(), cpu), "kernel": platform.release(),
            "python": platform.python_version(), "load_start": load}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs, size, seeds):
    table = {}
    for r in runs:
        table.setdefault((r["mode"], r["nodes"]), []).append(r)
    rows = []
    for (mode, n), rs in sorted(table.items()):
        ok = [r for r in rs if not r["problems"]]
        rows.append({"mode": mode, "nodes": n, "runs": len(rs), "ok": len(ok),
                     "fleet_seconds": [r["fleet_seconds"] for r in rs],
                     "fleet_seconds_median": median([r["fleet_seconds"] for r in ok]),
                     "copy_seconds_median": median([r["copy_seconds_max"] for r in ok]),
                     "copy_span": [r["copy_span_seconds"] for r in rs],
                     "copy_span_median": median([r["copy_span_seconds"] for r in ok]),
                     "shared_bytes": [r["shared_bytes"] for r in rs],
                     "fleet_cpu": [(r.get("fleet_cpu_seconds") or {}).get("total") for r in rs],
                     "fleet_cpu_median": median([(r.get("fleet_cpu_seconds") or {}).get("total") for r in ok]),
                     "shared_copies_max": max(r["shared_bytes"] for r in rs) / size})
    # the single-node time is the one node staging alone from the shared filesystem (fan-out off, N=1)
    single = {key: next((r[key] for r in rows if r["mode"] == "off" and r["nodes"] == 1), None)
              for key in ("fleet_seconds_median", "copy_span_median")}
    for r in rows:
        for key, out in (("fleet_seconds_median", "vs_single"), ("copy_span_median", "span_vs_single")):
            base = single.get(key)
            r[out] = round(r[key] / base, 2) if base and r[key] else None
    return rows, single


def plot(rows, size, seeds, path, title, runs=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n_big, big = _largest_on_runs({"runs": runs or []})
    run = _typical(big)
    timeline = run.get("timeline") if run else None
    if timeline:
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.4))
    else:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    styles = {"off": ("tab:red", "fan-out off"), "on": ("tab:blue", "fan-out on, %d seed(s)" % seeds),
              "on@base": ("tab:gray", "fan-out on, base version")}
    single = None
    for mode, (color, label) in styles.items():
        rs = [r for r in rows if r["mode"] == mode and r["copy_span_median"]]
        if not rs:
            continue
        ns = [r["nodes"] for r in rs]
        ax1.plot(ns, [r["copy_span_median"] for r in rs], "o-", color=color, label=label + ": staging (median)")
        for r in rs:
            pts = [v for v in r["copy_span"] if v is not None]
            ax1.scatter([r["nodes"]] * len(pts), pts, color=color, alpha=0.35, s=14)
        ax1.plot(ns, [r["fleet_seconds_median"] for r in rs], "s:", color=color, alpha=0.5, ms=4,
                 label=label + ": whole playbook")
        ax2.plot(ns, [max(r["shared_bytes"]) / MIB for r in rs], "o-", color=color, label=label)
        if mode == "off" and 1 in ns:
            single = rs[ns.index(1)]["copy_span_median"]
    allns = sorted({r["nodes"] for r in rows})
    if single:
        ax1.plot(allns, [single * n for n in allns], "--", color="gray", lw=0.8, label="N × single-node staging")
        ax1.axhline(1.2 * single, ls="--", color="tab:green", lw=0.8, label="target: 1.2 × single-node staging")
    ax1.set_xlabel("nodes")
    ax1.set_ylabel("seconds")
    ax1.set_title("fleet time (first copy start to last copy end; playbook wall dotted)", fontsize=9)
    ax1.set_xticks(allns)
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    ax2.axhline(1.05 * size * seeds / MIB, ls="--", color="tab:green", lw=0.8, label="target: 1.05 × revision × seeds")
    ax2.set_xlabel("nodes")
    ax2.set_ylabel("MiB")
    ax2.set_title("bytes read from the shared filesystem (block device count, max of runs)", fontsize=9)
    ax2.set_xticks(allns)
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    if timeline:
        seed_names = seed_hosts(seeds)
        for name in sorted(timeline, key=lambda x: int(x[4:]) if x[4:].isdigit() else 0):
            pts = timeline[name]
            if not pts:
                continue
            is_seed = name in seed_names
            ax3.plot([p[0] for p in pts], [p[1] / MIB for p in pts], "-", lw=2.2 if is_seed else 1,
                     color="black" if is_seed else None, label=name + (" (seed)" if is_seed else ""))
        ax3.axhline(size / MIB, ls=":", color="gray", lw=0.8)
        ax3.set_xlabel("seconds since the first copy start")
        ax3.set_ylabel("MiB staged")
        ax3.set_title("fan-out on, N=%d: each node's bytes over time (the median run)" % n_big, fontsize=9)
        ax3.legend(fontsize=6, ncol=2)
        ax3.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fmt(v, spec="%.1f"):
    return spec % v if v is not None else "-"


def write_markdown(path, doc):
    a = doc["args"]
    size = doc["revision_bytes"]
    caps = doc["capabilities"]
    lines = ["# Peer fan-out benchmark", "",
             "Fleet staging time and bytes read from the shared filesystem against the number of nodes, with "
             "`model_stage_fanout` off (today: every node reads the whole revision from the shared filesystem under "
             "the fleet cap) and on (`model_stage_fanout_seeds: %d`)." % a["seeds"], "",
             "Command (from the collection root, as root):", "", "```", doc["command"], "```", ""]
    if doc.get("note"):
        lines += [doc["note"], ""]
    lines += [
        "- Revision: %s; `model_stage_verify: %s`; fan-out piece size %d KiB. After every run each "
        "node's copy is compared with `SHA256SUMS` (sha256 of every file)."
        % (("the checkpoint directory `%s`, %.0f MiB" % (a["checkpoint"], size / MIB)) if a.get("checkpoint") else
           ("synthetic safetensors checkpoint, %.0f MiB in %d shards + index, config and `SHA256SUMS` "
            "(`tests/lib/stage_synth.py`)" % (size / MIB, a["shards"])), a["verify"], a["piece_kib"]),
        "- Fleet CPU: user + system CPU seconds of every process in the nodes' network namespaces (sshd, Ansible's "
        "module processes, the copies and the piece servers, sampled from `/proc` twice a second) from the first "
        "copy start to the last copy end: a lower bound (a process that lived under half a second is missed), "
        "the same for every version compared; the kernel's work for the veth links outside those processes "
        "is not in it.",
        "- Nodes: network namespaces (`tests/lib/netns.py`) on one bridge, one sshd each; `ansible-playbook` runs "
        "the `model_stage` role on all of them over SSH (forks ≥ N). Each node's link is shaped with `tc tbf` to "
        "%d Mbit/s in each direction." % link_mbit(a),
        "- Shared filesystem: ext4 on a loop device. Reads from it are throttled to %d Mbit/s for the whole fleet "
        "together (one blkio cgroup holds every process the nodes' sshd start); model_stage's fleet cap is %d "
        "streams%s. Bytes read are counted at the loop device (`/sys/block/loopN/stat`); the filesystem is "
        "remounted (its page cache dropped) before every run."
        % (a["rate_mbit"], a["streams"], " with `model_stage_read_rate_limit` %d B/s per stream (the same %d Mbit/s "
           "in all)" % (a["rate_mbit"] * 1e6 / 8 // a["streams"], a["rate_mbit"]) if caps["read_rate_limit"] else ""),
        "- Fleet time: from the first node's copy start to the last node's copy end (each node's progress file "
        "and the module's own `seconds`): the staging itself. The whole `ansible-playbook` wall time is shown "
        "beside it; on this loaded machine it is dominated by Ansible's per-task cost over SSH (tens of seconds "
        "for the role's ~20 tasks), which does not grow with the revision size.",
        "- Machine: %s; kernel %s; Python %s; load average (1 min) %s at the start and %s at the end (a 1-minute "
        "average also carries what ran just before)%s. Runs alternate the modes (off, on, on, off, ...)." % (
            doc["machine"]["host"], doc["machine"]["kernel"], doc["machine"]["python"],
            doc["machine"]["load_start"], doc["machine"]["load_end"], _load_during(doc)), ""]
    if not caps["fanout"]:
        lines += ["This tree's `model_stage` role has no `model_stage_fanout` yet: only the `off` curve is measured.", ""]
    lines += ["| mode | nodes | staging, runs (s) | staging, median (s) | × single node | playbook wall, median (s) | "
              "shared-FS MiB (max) | × revision | from peers (MiB, max) | fleet CPU, runs (s) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append("| %s | %d | %s | %s | %s | %s | %.0f | %.2f | %s | %s |" % (
            r["mode"], r["nodes"], " / ".join(_fmt(v) for v in r["copy_span"]), _fmt(r["copy_span_median"]),
            _fmt(r["span_vs_single"], "%.2f×"), _fmt(r["fleet_seconds_median"]),
            max(r["shared_bytes"]) / MIB, r["shared_copies_max"], _fmt(r.get("peer_mib_max"), "%.0f"),
            " / ".join(_fmt(v) for v in r.get("fleet_cpu") or [])))
    lines += [""]
    failed = [r for r in doc["runs"] if r["problems"]]
    if failed:
        lines += ["Failed runs: " + "; ".join("%s N=%d: %s" % (r["mode"], r["nodes"], r["problems"][0][:300].replace("\n", " "))
                                              for r in failed), ""]
    lines += ["| target | measured | met |", "|---|---|---|"]
    for t in doc["targets"]:
        lines.append("| %s | %s | %s |" % (t["target"], t["measured"], t["met"]))
    lines += [""] + _peer_throughput(doc)
    lines += ["", "![fleet time and shared-filesystem bytes against nodes](%s)" % os.path.basename(doc["png"]), "",
              "What this does not show: all nodes share one kernel, one page cache, one disk and %d CPUs, so "
              "the peers' HTTP serving, hashing and O_DIRECT writes compete for the same cores and the same "
              "device, where a real node has its own; the links are veth pairs through one bridge, shaped by tc, "
              "not NICs and switches (no real latency, loss, MTU or oversubscription of a fabric); the shared "
              "filesystem is a throttled local loop device, not NFS/Lustre with its own caching, metadata load "
              "and per-client behaviour; and %.0f MiB at %d Mbit/s stands in for hundreds of GiB at tens of "
              "Gbit/s, so fixed costs (SSH, task start-up, polling, the seed's first piece) weigh more here "
              "than on a real fleet." % (os.cpu_count(), size / MIB, a["rate_mbit"]), ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _load_during(doc):
    """``; while the copies ran: median 9.1 (2.0-15.3)`` from the runs' load samples, or nothing."""
    vals = [r["load_1min"] for r in doc["runs"] if r.get("load_1min")]
    if not vals:
        return ""
    return "; while the copies ran, sampled twice a second: median of the runs' medians %.1f, lowest %.1f, highest %.1f" % (
        statistics.median(v[1] for v in vals), min(v[0] for v in vals), max(v[2] for v in vals))


def _largest_on_runs(doc):
    on = [r for r in doc["runs"] if r["mode"] == "on" and not r["problems"] and r["copy_span_seconds"]]
    if not on:
        return None, []
    n = max(r["nodes"] for r in on)
    return n, [r for r in on if r["nodes"] == n]


def seed_hosts(seeds):
    """The fleet's seeds: the role makes the first ``model_stage_fanout_seeds`` hosts of the play seeds."""
    return ["node%d" % (i + 1) for i in range(seeds)]


def _typical(runs):
    """The run whose staging time is the median's (the lower one of an even count)."""
    runs = sorted(runs, key=lambda r: r["copy_span_seconds"])
    return runs[(len(runs) - 1) // 2] if runs else None


def _peer_throughput(doc):
    """What bounded the largest fan-out run, from its own data: rates, CPU, the seed's upload, start skew."""
    n, runs = _largest_on_runs(doc)
    if not runs:
        return []
    size = doc["revision_bytes"]
    seeds = doc["args"]["seeds"]
    link = link_mbit(doc["args"]) * 1e6 / 8
    rates = [sum((h.get("bytes_from_peers") or 0) for h in r["hosts"].values()) / r["copy_span_seconds"]
             for r in runs]
    recv = [h["seconds"] for r in runs for h in r["hosts"].values() if h.get("bytes_from_peers")]
    out = ["At N=%d with fan-out the receivers took %.0f-%.0f s each and the peers moved %.1f MB/s in all (%.1f× "
           "one link; the %d links could carry %d×)."
           % (n, min(recv), max(recv), statistics.median(rates) / 1e6, statistics.median(rates) / link, n, n)]
    cpu = [r["cpu_busy_copy"] for r in runs if r.get("cpu_busy_copy") is not None]
    if cpu:
        out.append("Both CPUs were %.0f%% busy (median of runs, %.0f-%.0f%%) from the first copy start to the last "
                   "copy end: every node's piece server, hashing, O_DIRECT writes and piece-list polling share the "
                   "machine's %d CPUs, which bounds the fleet time here before the links do."
                   % (100 * statistics.median(cpu), 100 * min(cpu), 100 * max(cpu), os.cpu_count()))
    split = [(r["fleet_cpu_seconds"]["total"], r["fleet_cpu_seconds"].get("system"), r.get("softirq_seconds"))
             for r in runs if r.get("fleet_cpu_seconds") and r["fleet_cpu_seconds"].get("system") is not None]
    if split:
        out.append("Of the fleet's CPU (median %.1f s), %.1f s (median) was system time, the kernel sending, receiving "
                   "and writing on the processes' behalf, and the machine spent %s s in softirq besides (the veth "
                   "links' and the bridge's packets, charged to no process, so in no fleet CPU figure)."
                   % (statistics.median(t for t, _s, _q in split), statistics.median(s_ for _t, s_, _q in split),
                      _fmt(median([q for _t, _s, q in split if q is not None]))))
    seed_names = seed_hosts(seeds)
    sent = [sum(r["sent_by_host"].get(name, 0) for name in seed_names) / size
            for r in runs if r.get("sent_by_host")]
    if sent:
        out.append("The seed%s uploaded %.2f× the revision (median; %.2f-%.2f×), the receivers traded the rest."
                   % ("s" if seeds > 1 else "", statistics.median(sent), min(sent), max(sent)))
    timed = [r for r in runs if all("start_offset" in h for h in r["hosts"].values())]
    if timed:
        starts = [max(h["start_offset"] for h in r["hosts"].values()) for r in timed]
        lag = [r["copy_span_seconds"] - max(r["hosts"][name]["end_offset"] for name in seed_names if name in r["hosts"])
               for r in timed]
        out.append("Ansible started the %d copies within %.1f s of each other (median of runs; the async launch "
                   "over %d SSH connections on %d CPUs), and the last receiver finished %.1f s after the seed "
                   "(median)." % (n, statistics.median(starts), n, os.cpu_count(), statistics.median(lag)))
        piece = doc["args"]["piece_kib"] * 1024
        bounds = [link_bound(r, size, link, piece, seeds) for r in timed]
        single = (doc.get("single_node_seconds") or {}).get("copy_span_median")
        if single and all(bounds):
            out.append("From those starts, the links alone allowed the fleet to end at %.1f s at the earliest (each "
                       "receiver takes the whole revision through its own %.0f MB/s link from its own start, and the "
                       "seed's last piece after the seed read it): %.2f× the single node (median of runs; %.2f-%.2f×), "
                       "against the %.2f× measured, so the launch stagger explains %.2f of the ratio and the piece "
                       "exchange the rest." % (
                           statistics.median(bounds), link / 1e6, statistics.median(bounds) / single,
                           min(bounds) / single, max(bounds) / single,
                           statistics.median(r["copy_span_seconds"] for r in timed) / single,
                           statistics.median(bounds) / single - 1))
    carried = [r for r in runs if r.get("links")]
    if carried:
        recv = [name for name in carried[0]["links"] if name not in seed_names]
        down = [statistics.median(r["links"][name]["down"]["bytes"] for name in recv) / (r["copy_span_seconds"] * link)
                for r in carried]
        up = [statistics.median(r["links"][name]["up"]["bytes"] for name in r["links"]) / (r["copy_span_seconds"] * link)
              for r in carried]
        seed_up = [max(r["links"][name]["up"]["bytes"] for name in seed_names if name in r["links"])
                   / (r["copy_span_seconds"] * link) for r in carried]
        drops = [sum(v[way]["dropped"] for v in r["links"].values() for way in v) for r in carried]
        packets = [sum(v[way]["packets"] for v in r["links"].values() for way in v) for r in carried]
        out.append("The shaped links (tc's own counters, the whole play: SSH included) carried, over the span, %.0f%% "
                   "of a receiver's downlink (median receiver, median of runs; %.0f-%.0f%%) and %.0f%% of a node's "
                   "uplink (%.0f-%.0f%%), the seed's uplink %.0f%%; the shapers dropped %d packets of %d (median run) "
                   "when their 200 ms queue was full." % (
                       100 * statistics.median(down), 100 * min(down), 100 * max(down), 100 * statistics.median(up),
                       100 * min(up), 100 * max(up), 100 * statistics.median(seed_up), statistics.median(drops),
                       statistics.median(packets)))
    return [" ".join(out)]


def _spread(values, single):
    """The runs of a row as ratios to the single-node time, lowest to highest (``1.31-1.42×``)."""
    ratios = sorted(v / single for v in values if v)
    return "%.2f-%.2f×" % (ratios[0], ratios[-1]) if ratios else "-"


def targets(rows, size, seeds, caps):
    out = []
    on = [r for r in rows if r["mode"] == "on"]
    off = {r["nodes"]: r for r in rows if r["mode"] == "off"}
    single = off.get(1, {}).get("copy_span_median")
    if on:
        worst = max(r["shared_copies_max"] for r in on)
        out.append({"target": "fan-out: shared-FS bytes ≤ 1.05 × revision × seeds (every N)",
                    "measured": "%.3f × revision (worst N, worst run), seeds %d" % (worst, seeds),
                    "met": "yes" if worst <= 1.05 * seeds else "no"})
        base = dict((r["nodes"], r) for r in rows if r["mode"] == "on@base")
        for row in sorted(on, key=lambda r: r["nodes"]):  # every fleet size measured, the smallest first
            if row["nodes"] < 2:
                continue
            if single and row["copy_span_median"]:
                ratio = row["copy_span_median"] / single
                out.append({"target": "fan-out: fleet staging time at N=%d ≤ 1.2 × single-node time" % row["nodes"],
                            "measured": "%.2f× (%.1f s vs %.1f s; runs %s)" % (
                                ratio, row["copy_span_median"], single, _spread(row["copy_span"], single)),
                            "met": "yes" if ratio <= 1.2 else "no"})
            b = base.get(row["nodes"])
            if b and b.get("fleet_cpu_median") and row.get("fleet_cpu_median"):
                cpu = row["fleet_cpu_median"] / b["fleet_cpu_median"]
                out.append({"target": "fan-out: fleet CPU at N=%d < 0.5 × the base version's" % row["nodes"],
                            "measured": "%.2f× (%.1f s vs %.1f s, medians; runs %s vs %s s)" % (
                                cpu, row["fleet_cpu_median"], b["fleet_cpu_median"],
                                " / ".join(_fmt(v) for v in row["fleet_cpu"]), " / ".join(_fmt(v) for v in b["fleet_cpu"])),
                            "met": "yes" if cpu < 0.5 else "no"})
                out.append({"target": "fan-out: fleet time at N=%d, this version / base" % row["nodes"],
                            "measured": "%.2f× (%.1f s vs %.1f s, medians)" % (
                                row["copy_span_median"] / b["copy_span_median"], row["copy_span_median"],
                                b["copy_span_median"]), "met": "-"})
    if single and off:
        n = max(off)
        if off[n]["copy_span_median"]:
            out.append({"target": "fan-out off: fleet time at N=%d ≈ N × single node (for comparison)" % n,
                        "measured": "%.2f×" % (off[n]["copy_span_median"] / single), "met": "-"})
    return out


def report(doc, out):
    """Tables, targets, PNG and Markdown from the runs in ``doc``."""
    size = doc["revision_bytes"]
    doc["rows"], doc["single_node_seconds"] = summarize(doc["runs"], size, doc["args"]["seeds"])
    for r in doc["rows"]:
        peers = [sum((h.get("bytes_from_peers") or 0) for h in run["hosts"].values())
                 for run in doc["runs"] if run["mode"] == r["mode"] and run["nodes"] == r["nodes"]]
        r["peer_mib_max"] = max(peers) / MIB if peers else None
    doc["targets"] = targets(doc["rows"], size, doc["args"]["seeds"], doc["capabilities"])
    doc["png"] = out + ".png"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    plot(doc["rows"], size, doc["args"]["seeds"], doc["png"],
         "%d MiB revision; node links and shared FS at %d Mbit/s; %s"
         % (size // MIB, doc["args"]["rate_mbit"], doc["machine"]["host"]), runs=doc["runs"])
    write_markdown(out + ".md", doc)
    for t in doc["targets"]:
        print("%s: %s (%s)" % (t["target"], t["measured"], t["met"]))
    print("wrote %s.json, %s.png, %s.md" % (out, out, out))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--size-mib", type=int, default=256, help="revision size (MiB)")
    ap.add_argument("--checkpoint", default=None, metavar="DIR",
                    help="stage this real checkpoint directory (copied once onto the fleet's shared filesystem, read "
                         "only here) instead of a synthetic one; --size-mib and --shards are then ignored")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rate-mbit", type=int, default=200, help="each node link and the shared filesystem (Mbit/s)")
    ap.add_argument("--link-mbit", type=int, default=None,
                    help="each node link (Mbit/s) when it differs from the shared filesystem's --rate-mbit: at the "
                         "same rate the fleet's uplinks have 8/7 of the capacity 8 nodes need (every piece crosses "
                         "the seed's once and 6 receivers' uplinks), where a fleet's NICs are usually faster than "
                         "its share of the shared filesystem")
    ap.add_argument("--nodes", default="1,2,4,8", help="fleet sizes, comma separated")
    ap.add_argument("--runs", type=int, default=2, help="runs of each mode and fleet size")
    ap.add_argument("--modes", default=None, help="off,on (default: both where the role supports fan-out)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--streams", type=int, default=4, help="read streams per host and fleet-wide cap")
    ap.add_argument("--verify", default="headers", choices=["size", "headers", "sha256"])
    ap.add_argument("--piece-kib", type=int, default=1024,
                    help="model_stage_fanout_piece_size (KiB). A piece's hop from node to node delays the fleet by its "
                         "time on a link, and that delay's share of the staging falls with the pieces per revision: "
                         "1 MiB gives 192 MiB at 128 Mbit/s 192 pieces of 66 ms each (the module's 64 MiB default "
                         "gives 704 GiB 11,264 pieces of 54 ms each on 10 Gbit/s)")
    ap.add_argument("--port", type=int, default=18780, help="model_stage_fanout_port")
    ap.add_argument("--timeout", type=int, default=900, help="per playbook run (s)")
    ap.add_argument("--on-single", action="store_true", help="also run fan-out on at N=1")
    ap.add_argument("--off-single", action="store_true", help="run fan-out off only at N=1 (the single-node time)")
    ap.add_argument("--collections", default=None,
                    help="ansible_collections tree holding llmops.serving (default: this working tree)")
    ap.add_argument("--base-collections", default=None,
                    help="a second ansible_collections tree (e.g. the last release): adds the mode 'on@base', fan-out "
                         "on with that tree, alternated with the others in the same run")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "fanout"), help="output path without extension")
    ap.add_argument("--report", metavar="JSON", help="only rebuild the PNG and Markdown (next to --out) from a JSON of runs")
    ap.add_argument("--note", default="", help="a paragraph for the Markdown (with --report)")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        if args.note:
            doc["note"] = args.note
        report(doc, args.out)
        return 0
    reason = netns.unavailable()
    if reason:
        sys.exit("fanout_bench: cannot build the namespace fleet: %s" % reason)
    caps = capabilities()
    modes = args.modes.split(",") if args.modes else (["off", "on"] if caps["fanout"] else ["off"])
    if args.base_collections and "on@base" not in modes:
        modes.append("on@base")
    if "on" in modes and not caps["fanout"]:
        sys.exit("fanout_bench: roles/model_stage has no model_stage_fanout in this tree; run with --modes off")
    sizes = sorted(int(n) for n in args.nodes.split(","))
    order = []
    for k in range(args.runs):
        ms = modes if k % 2 == 0 else list(reversed(modes))
        for mode in ms:
            # one node with fan-out is the seed alone: the single-node time is fan-out off at N=1
            order += [(k, mode, n) for n in sizes if not (mode.startswith("on") and n == 1 and not args.on_single)
                      and not (mode == "off" and n > 1 and args.off_single)]
    doc = {"command": " ".join([".venv/bin/python", "benchmarks/fanout_bench.py"] + (argv if argv is not None else sys.argv[1:])),
           "args": vars(args), "capabilities": caps, "machine": machine(), "runs": []}
    if args.checkpoint:
        args.size_mib = -(-checkpoint_bytes(args.checkpoint) // MIB)
    with netns.Fleet(max(sizes), rate_mbit=link_mbit(vars(args)), shared_device_mib=args.size_mib + max(64, args.size_mib // 4),
                     shared_read_mbit=args.rate_mbit) as fleet:
        src = os.path.join(fleet.shared, MODEL, REVISION)
        if args.checkpoint:
            info = copy_checkpoint(args.checkpoint, src)
        else:
            info = stage_synth.write_checkpoint(src, args.size_mib * MIB, shards=args.shards, seed=11)
        os.sync()
        with open(os.path.join(src, "SHA256SUMS")) as f:
            sums = {ln.split()[1]: ln.split()[0] for ln in f if ln.strip()}
        doc["revision_bytes"] = size = info["bytes"]
        t_start = time.monotonic()
        for i, (k, mode, n) in enumerate(order, 1):
            entry = one_run(fleet, args, mode, n, caps, sums, "run%d" % i)
            entry["round"] = k + 1
            doc["runs"].append(entry)
            elapsed = time.monotonic() - t_start
            eta = elapsed / i * (len(order) - i)
            print("[%d/%d] fan-out %-3s N=%d  fleet %6.1f s  shared %7.1f MiB (%.2f× revision)  %s  ETA %.0f s" % (
                i, len(order), mode, n, entry["fleet_seconds"], entry["shared_bytes"] / MIB, entry["shared_bytes"] / size,
                "ok" if not entry["problems"] else "FAILED: " + entry["problems"][0][:400], eta), flush=True)
            print(per_node_lines(entry, size), flush=True)
        for node in fleet.nodes:
            shutil.rmtree(node.nvme, ignore_errors=True)
    doc["machine"]["load_end"] = machine()["load_start"]
    report(doc, args.out)
    return 0 if not any(r["problems"] for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
