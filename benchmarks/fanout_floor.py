# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The floor under the fan-out's fleet CPU on the namespace fleet: the same bytes over the same shaped links, moved
by the simplest programs that can move them.

``fanout_bench.py`` charges a fan-out run with the CPU of every process in the nodes' namespaces. Part of it is the
collection's (piece lists, choosing, HTTP, Ansible's module start), part is what moving the bytes costs whatever
program moves them: the kernel's TCP over the veth links, the ``tbf`` shapers and the bridge (much of it run as
softirq on whichever process the CPU was in, and charged to that process), reading the pieces back from disk to
send them, hashing them, writing them with O_DIRECT. This measures the second part alone, on the same fleet
(``tests/lib/netns.py``, links shaped to ``--rate-mbit``): ``--nodes`` N nodes in a chain, node k sending a
``--size-mib`` file to node k+1 with ``os.sendfile`` (N-1 transfers at once: the bytes a fan-out moves between
peers, each node's uplink and downlink carrying one revision at most), the file dropped from the page cache first
(a fan-out's pieces are read back from disk: written with O_DIRECT). Each receiver, in 1 MiB reads:

* ``recv``: the bytes read and dropped;
* ``sha256``: each read hashed (a fan-out receiver checks every piece against the seed's digest);
* ``write``: hashed and written to the node's disk with O_DIRECT in 1 MiB pieces (what a receiver does).

``--flows K`` splits each transfer over K connections at once (its pieces dealt out in K runs), as a fan-out
receiver pulls over several: on links this slow each flow's pacing rate is a fraction of the link's, and the kernel
sends it in smaller bursts, so the same bytes cost more packets.

Each process reports its own CPU (``getrusage``: user and system, softirq charged to it included) from the moment
its connection is up to its last byte; interpreter start-up is not in it. Modes alternate round by round.

    sudo .venv/bin/python benchmarks/fanout_floor.py --nodes 8 --size-mib 192 --rate-mbit 128 --runs 3 \
        --compare docs/benchmarks/fanout.json

``--compare`` draws a ``fanout_bench.py`` run's fleet CPU at the same N beside the floor (this version's and the base's
medians, and half the base's: the target); ``--report JSON`` rebuilds the Markdown and the PNG from a JSON of runs.

What it does not show: the seed's own copy from the shared filesystem (one node's copy, the same with or without
fan-out) and anything above the byte stream (requests, lists, choosing): the floor is not a fan-out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fanout_bench  # noqa: E402  (the working tree as a collection, netns, machine facts, CPU readings, medians)
MIB = 1 << 20
CHUNK = MIB
MODES = ("recv", "sha256", "write")

# The worker: run in a node's namespace as ``python -c WORKER role ...``; prints one JSON line.
WORKER = r"""
import hashlib, json, mmap, os, resource, socket, sys, threading, time
role = sys.argv[1]
def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime
def report(u0, wall0, n):
    u1 = usage()
    print(json.dumps({"role": role, "bytes": n, "user": u1[0] - u0[0], "sys": u1[1] - u0[1],
                      "seconds": time.monotonic() - wall0}), flush=True)
def slices(size, flows):  # flow k carries [start, end): 1 MiB pieces, dealt out in order
    pieces = -(-size // 1048576)
    per = -(-pieces // flows)
    return [(min(size, k * per * 1048576), min(size, (k + 1) * per * 1048576)) for k in range(flows)]
def run_all(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
if role == "send":
    host, port, path, flows = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read back from disk, as a fan-out's pieces are
    size = os.fstat(fd).st_size
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind((host, port)); ls.listen(flows)
    print(json.dumps({"role": "listening"}), flush=True)
    conns = []
    for _k in range(flows):
        conn, _a = ls.accept()
        conns.append((conn, int(conn.recv(16).split()[1])))  # "GO <flow>"
    u0, wall0 = usage(), time.monotonic()
    sent = [0] * flows
    def send(conn, k, span):
        off, end = span
        while off < end:
            n = os.sendfile(conn.fileno(), fd, off, min(4 * 1048576, end - off))
            off += n
            sent[k] += n
        conn.shutdown(socket.SHUT_WR); conn.recv(1); conn.close()
    spans = slices(size, flows)
    run_all([(lambda c=c, k=k: send(c, k, spans[k])) for c, k in conns])
    report(u0, wall0, sum(sent))
else:
    host, port, size, mode, out, flows = (sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6],
                                          int(sys.argv[7]))
    wfd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600) if mode == "write" else None
    socks = []
    for k in range(flows):
        for attempt in range(200):
            try:
                s = socket.create_connection((host, port), timeout=60); break
            except OSError:
                time.sleep(0.05)
        s.settimeout(None)
        socks.append(s)
    for k, s in enumerate(socks):
        s.sendall(b"GO %d\n" % k)
    u0, wall0 = usage(), time.monotonic()
    got_all = [0] * flows
    def receive(k, span):
        s = socks[k]
        buf = mmap.mmap(-1, 1048576, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mv = memoryview(buf)
        pos, end = span
        while pos < end:
            fill, want = 0, min(1048576, end - pos)
            while fill < want:
                n = s.recv_into(mv[fill:want])
                if not n:
                    raise SystemExit("the sender closed after %d bytes" % (pos + fill))
                fill += n
            if mode in ("sha256", "write"):
                hashlib.sha256(mv[:fill]).digest()
            if wfd is not None:
                os.pwrite(wfd, mv[:fill + (-fill % 4096)], pos)
            pos += fill
            got_all[k] += fill
        s.close()
    spans = slices(size, flows)
    run_all([(lambda k=k: receive(k, spans[k])) for k in range(flows)])
    if wfd is not None:
        os.close(wfd)
    report(u0, wall0, sum(got_all))
"""


def softirq_seconds():
    return fanout_bench.cpu_times()[2]


def one_run(fleet, args, mode, files, port):
    """One transfer of every chain link at once in ``mode``; the processes' reports and the wall time."""
    nodes = fleet.nodes[:args.nodes]
    size = args.size_mib * MIB
    senders, receivers = [], []
    for k in range(len(nodes) - 1):
        p = fleet.popen(nodes[k], [sys.executable, "-c", WORKER, "send", nodes[k].address, str(port), files[k],
                                   str(args.flows)], stdout=subprocess.PIPE, text=True)
        senders.append(p)
    for p in senders:
        json.loads(p.stdout.readline())  # listening
    s0, t0 = softirq_seconds(), time.monotonic()
    for k in range(1, len(nodes)):
        out = os.path.join(nodes[k].nvme, "floor.out")
        receivers.append(fleet.popen(nodes[k], [sys.executable, "-c", WORKER, "recv", nodes[k - 1].address, str(port),
                                                str(size), mode, out, str(args.flows)],
                                     stdout=subprocess.PIPE, text=True))
    reports = []
    for p in receivers + senders:
        line, _err = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            who = "receiver" if p in receivers else "sender"
            raise SystemExit("fanout_floor: a %s process failed (rc %s)" % (who, p.returncode))
        reports.append(json.loads(line.strip().splitlines()[-1]))
    wall = time.monotonic() - t0
    rx = [r for r in reports if r["role"] == "recv"]
    tx = [r for r in reports if r["role"] == "send"]
    if any(r["bytes"] != size for r in reports):
        raise SystemExit("fanout_floor: a transfer moved the wrong number of bytes")
    return {"mode": mode, "nodes": len(nodes), "wall": round(wall, 2), "softirq_seconds": round(softirq_seconds() - s0, 2),
            "receivers_user": round(sum(r["user"] for r in rx), 2), "receivers_sys": round(sum(r["sys"] for r in rx), 2),
            "senders_user": round(sum(r["user"] for r in tx), 2), "senders_sys": round(sum(r["sys"] for r in tx), 2),
            "cpu": round(sum(r["user"] + r["sys"] for r in reports), 2),
            "receiver_seconds": [round(r["seconds"], 2) for r in rx]}


def fanout_cpu(path, nodes):
    """Medians of a ``fanout_bench.py`` JSON's fleet CPU at ``nodes``: ``{mode: seconds}`` (``on``, ``on@base``)."""
    with open(path) as f:
        doc = json.load(f)
    rows, _single = fanout_bench.summarize(doc["runs"], doc["revision_bytes"], doc["args"]["seeds"])
    return dict((r["mode"], r["fleet_cpu_median"]) for r in rows
                if r["mode"] in ("on", "on@base") and r["nodes"] == nodes and r["fleet_cpu_median"] is not None)


def plot(doc, path):
    """Each mode's CPU (median bar, receivers and senders stacked; the runs as dots) beside the fan-out's fleet CPU
    at the same N (``--compare``) and the target (half the base's)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    modes = [m for m in MODES if any(r["mode"] == m for r in doc["runs"])]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for x, mode in enumerate(modes):
        rs = [r for r in doc["runs"] if r["mode"] == mode]
        rx = statistics.median(r["receivers_user"] + r["receivers_sys"] for r in rs)
        tx = statistics.median(r["senders_user"] + r["senders_sys"] for r in rs)
        ax.bar(x, rx, color="tab:blue", label="receivers (median)" if x == 0 else None)
        ax.bar(x, tx, bottom=rx, color="tab:orange", label="senders (median)" if x == 0 else None)
        ax.plot([x] * len(rs), [r["cpu"] for r in rs], "k.", label="runs (all processes)" if x == 0 else None)
    cmp_ = doc.get("compare") or {}
    styles = {"on": ("tab:green", "fan-out, this version: fleet CPU (median)"),
              "on@base": ("tab:gray", "fan-out, base version: fleet CPU (median)")}
    for mode, (color, label) in styles.items():
        if mode in cmp_:
            ax.axhline(cmp_[mode], color=color, linestyle="-", label=label)
    if "on@base" in cmp_:
        ax.axhline(cmp_["on@base"] / 2, color="tab:red", linestyle="--", label="target: 0.5 × the base's")
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(modes)
    ax.set_ylabel("CPU seconds (user + system)")
    ax.set_ylim(bottom=0)
    a = doc["args"]
    ax.set_title("N=%d: %d × %d MiB over links of %d Mbit/s, %d connection(s) each" % (
        a["nodes"], a["nodes"] - 1, a["size_mib"], a["rate_mbit"], a.get("flows", 1)))
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(doc, out):
    lines = ["# Fan-out CPU floor", "",
             "The bytes a fan-out moves between peers at N = %d (%d transfers of %d MiB at once, node k to node k+1, "
             "each over %d TCP connection(s)), over the namespace fleet's links shaped to %d Mbit/s, by the simplest "
             "programs that move them "
             "(`benchmarks/fanout_floor.py`; its docstring says what each mode does). CPU: user + system seconds of "
             "every sender and receiver from its connection to its last byte (getrusage; the kernel's softirq work "
             "done while a process ran is charged to it)." % (doc["args"]["nodes"], doc["args"]["nodes"] - 1,
                                                              doc["args"]["size_mib"], doc["args"].get("flows", 1),
                                                              doc["args"]["rate_mbit"]), "",
             "Command (from the collection root, as root):", "", "```", doc["command"], "```", "",
             "Machine: %(host)s; kernel %(kernel)s; Python %(python)s." % doc["machine"], "",
             "| mode | CPU, runs (s) | CPU, median (s) | receivers user / sys (median, s) | senders user / sys (median, s) "
             "| softirq outside (median, s) | wall, median (s) |", "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        rs = [r for r in doc["runs"] if r["mode"] == mode]
        if not rs:
            continue

        def med(key):
            return statistics.median(r[key] for r in rs)
        lines.append("| %s | %s | %.2f | %.2f / %.2f | %.2f / %.2f | %.2f | %.2f |" % (
            mode, " / ".join("%.2f" % r["cpu"] for r in rs), med("cpu"), med("receivers_user"), med("receivers_sys"),
            med("senders_user"), med("senders_sys"), med("softirq_seconds"), med("wall")))
    cmp_ = doc.get("compare") or {}
    if cmp_:
        lines += ["", "The fan-out's fleet CPU at the same N (medians of `%s`): %s." % (
            doc["compare_file"], ", ".join("`%s` %.1f s (the floor's `write` median is %.2f × that)" % (
                mode, v, statistics.median(r["cpu"] for r in doc["runs"] if r["mode"] == "write") / v)
                for mode, v in sorted(cmp_.items()) if any(r["mode"] == "write" for r in doc["runs"])))]
    plot(doc, out + ".png")
    lines += ["", "![CPU of each mode against the fan-out's fleet CPU](%s.png)" % os.path.basename(out)]
    lines += ["", "What this does not show: the seed's copy from the shared filesystem and everything above the byte "
              "stream (requests, piece lists, choosing, Ansible); the machine's softirq column counts only the "
              "kernel work no process was charged with. The floor is this machine's and these links': on a real "
              "fleet (NICs with segmentation and receive offloads, a CPU set per node) the bytes cost less CPU."]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(out + ".json", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    print("\n".join(lines[-len(MODES) - 4:]))
    print("wrote %s.md, %s.json, %s.png" % (out, out, out))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--nodes", type=int, default=8, help="nodes in the chain (N-1 transfers)")
    ap.add_argument("--size-mib", type=int, default=192, help="bytes each transfer moves (MiB)")
    ap.add_argument("--rate-mbit", type=int, default=128, help="each node link, each way (Mbit/s)")
    ap.add_argument("--runs", type=int, default=3, help="rounds; each runs every mode once, the order alternating")
    ap.add_argument("--flows", type=int, default=1,
                    help="TCP connections per transfer, each carrying its share of the pieces (a fan-out receiver "
                         "pulls over 8 at once)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--port", type=int, default=18790)
    ap.add_argument("--timeout", type=int, default=600, help="per transfer (s)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "fanout_floor"), help="output path without extension")
    ap.add_argument("--compare", metavar="JSON", help="a fanout_bench.py JSON: its fleet CPU at --nodes is shown beside")
    ap.add_argument("--report", metavar="JSON", help="only rebuild the Markdown and the PNG (next to --out) from a JSON of runs")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        if args.compare:
            doc["compare"], doc["compare_file"] = fanout_cpu(args.compare, doc["args"]["nodes"]), args.compare
        report(doc, args.out)
        return 0
    if args.nodes < 2:
        ap.error("--nodes: at least 2 (one transfer)")
    if not 1 <= args.flows <= 64:
        ap.error("--flows: 1-64 connections per transfer")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error("--modes: a comma-separated list of %s" % ", ".join(MODES))
    netns = fanout_bench.netns
    reason = netns.unavailable()
    if reason:
        sys.exit("fanout_floor: cannot build the namespace fleet: %s" % reason)
    doc = {"command": " ".join([".venv/bin/python", "benchmarks/fanout_floor.py"] + (argv if argv is not None else sys.argv[1:])),
           "args": vars(args), "runs": [],
           "compare": fanout_cpu(args.compare, args.nodes) if args.compare else None, "compare_file": args.compare,
           "machine": fanout_bench.machine()}
    with netns.Fleet(args.nodes, rate_mbit=args.rate_mbit) as fleet:
        files = []
        for node in fleet.nodes[:-1]:
            os.makedirs(node.nvme, exist_ok=True)
            path = os.path.join(node.nvme, "floor.src")
            with open(path, "wb") as f:
                for _mib in range(args.size_mib):
                    f.write(os.urandom(MIB))
                f.flush()
                os.fsync(f.fileno())
            files.append(path)
        for node in fleet.nodes[1:]:
            os.makedirs(node.nvme, exist_ok=True)
        for k in range(args.runs):
            for mode in (modes if k % 2 == 0 else list(reversed(modes))):
                r = one_run(fleet, args, mode, files, args.port)
                r["round"] = k + 1
                doc["runs"].append(r)
                print("round %d %-6s CPU %6.2f s (receivers %.2f+%.2f, senders %.2f+%.2f)  softirq outside %.2f s  "
                      "wall %.1f s" % (k + 1, mode, r["cpu"], r["receivers_user"], r["receivers_sys"], r["senders_user"],
                                       r["senders_sys"], r["softirq_seconds"], r["wall"]), flush=True)
    report(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
