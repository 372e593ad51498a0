# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CPU seconds a command's work costs on this machine, all of it, and the wall time that leaves it at best.

``time make check`` counts only the processes ``make`` waits for. A check also starts processes that leave their
parent: engines started detached by the engine role, the sshd of every namespace node, the piece servers of a
fan-out, AWX jobs' processes under ansible-runner. So this samples every process of the machine (``/proc``) while the
command runs, keyed by pid and start time, and adds up each one's user + system CPU seconds by kind (vLLM engine,
ansible-playbook and its workers, module processes, pytest, ...). The machine's busy time (``/proc/stat``: all but idle
and iowait) over the same span is the cross-check, and the bound:

    wall time >= (busy CPU seconds - this sampler's own) / CPUs

A command whose work needs more than ``180 s x CPUs`` CPU seconds cannot end within three minutes on this machine,
however its tests are ordered or split.

    .venv/bin/python benchmarks/check_cpu.py --out docs/benchmarks/check_cpu_awx -- make check FILES=awx/controller_templates.yml

Writes ``<out>.json``, ``<out>.md`` and ``<out>.png``; the command's own output goes to ``<tmp>/<name of out>.log``
and a line every 30 s says how far it is. ``--report JSON`` only rebuilds the Markdown and the PNG.
What it does not see: a process that starts and ends between two samples (``--interval``, default 0.2 s; a shell or
``ip`` call), so the kinds add up to a lower bound; the busy time counts everything the machine did meanwhile, so
run it with nothing else running.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fanout_bench  # noqa: E402  pylint: disable=wrong-import-position

ROOT = fanout_bench.ROOT

#: (kind, words of which one must be in the command line); first match wins. A module run with pipelining is a bare
#: ``python`` reading its code from stdin; pytest-xdist's workers are ``python -c`` of execnet's bootstrap. (The runs
#: of ``docs/benchmarks/check_cpu_*`` counted ``vllm bench serve`` as a vLLM engine: its own kind came after them.)
KINDS = (
    ("vLLM bench client", ("vllm bench", "vllm.entrypoints.cli.main bench")),
    ("vLLM engine", ("vllm", "api_server")),
    ("ansible-playbook (controller and its workers)", ("ansible-playbook",)),
    ("ansible-runner", ("ansible-runner",)),
    ("other Ansible commands (ansible-inventory, ansible-galaxy, ...)",
     ("bin/ansible-inventory", "bin/ansible-galaxy", "bin/ansible-config", "bin/ansible-doc", "bin/ansible ")),
    ("Ansible module", ("AnsiballZ_", "async_wrapper.py")),
    ("pytest", ("pytest", "execnet", "import sys;exec(eval(sys.stdin.readline()))")),
    ("molecule", ("molecule",)),
    ("lint (ansible-lint, flake8, ansible-test)", ("ansible-lint", "flake8", "ansible-test", "pylint")),
    ("ssh, sshd", ("sshd", "/ssh ", "ssh ")),
)


def kind(argv, comm):
    """The kind of a process from its command line (``argv``: the list) and ``comm``."""
    if not argv:
        return "kernel threads" if comm else "other"
    line = " ".join(argv)
    for name, words in KINDS:
        if any(w in line for w in words):
            return name
    base = os.path.basename(argv[0])
    if base.startswith("python") and len([a for a in argv if a]) == 1:
        return "Ansible module"  # pipelined: the module's code comes on stdin
    if base.startswith("python"):
        args = argv[1:]
        while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):  # interpreter flags (-B, -u, -E)
            args = args[1:]
        if not args:
            return "Ansible module"
        what = " ".join(args[:2]) if args[0] in ("-m", "-c") else os.path.basename(args[0])
        return "other Python (%s)" % " ".join(what.split())[:40]
    return "other"


HZ = float(os.sysconf("SC_CLK_TCK"))


class Sampler(object):
    """Every process's CPU seconds, sampled every ``interval`` seconds: ``{(pid, start): [first, last, kind, argv,
    comm]}``, ``first`` what it had used when first seen (nonzero only for processes older than the run). A process
    seen between its fork and its exec is classified again when its ``comm`` changes. A ``python -c`` process (a
    ``multiprocessing`` child, a test's helper) takes the kind of its parent, as ``<kind>: python -c``."""

    def __init__(self, interval):
        self.interval = interval
        self.procs = {}
        self.parents = {}  # pid -> the kind of the live process of that pid (for its children)
        self.me = str(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.passes = 0

    def sample(self):
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == self.me:
                continue
            got = fanout_bench.proc_stat(pid)
            if got is None:
                continue
            comm, fields = got
            start, cpu = int(fields[19]), (int(fields[11]) + int(fields[12])) / HZ
            entry = self.procs.get((pid, start))
            if entry is None or entry[4] != comm:
                argv = [a for a in (fanout_bench.proc_cmdline(pid) or "").split("\0") if a]
                name = own = kind(argv, comm)
                if name.startswith("other Python (-c"):
                    own = self.parents.get(fields[1], "other")
                    name = "%s: python -c" % own
                if entry is None:
                    self.procs[(pid, start)] = [cpu if self.passes == 0 else 0.0, cpu, name, argv, comm]
                else:
                    entry[1:] = [cpu, name, argv, comm]
                self.parents[pid] = own
            else:
                entry[1] = cpu
        self.passes += 1

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self):
        self.sample()
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.sample()

    def by_kind(self):
        out = {}
        for first, last, name, _argv, _comm in self.procs.values():
            used = max(0.0, last - first)
            if used <= 0:
                continue
            k = out.setdefault(name, {"cpu_seconds": 0.0, "processes": 0})
            k["cpu_seconds"] += used
            k["processes"] += 1
        return dict((name, {"cpu_seconds": round(v["cpu_seconds"], 1), "processes": v["processes"]})
                    for name, v in out.items())

    def top(self, n=12):
        rows = sorted(self.procs.values(), key=lambda e: e[0] - e[1])[:n]  # the most CPU used first
        return [{"cpu_seconds": round(last - first, 1), "kind": name, "command": " ".join(argv)[:160]}
                for first, last, name, argv, _comm in rows if last - first >= 0.05]


def self_cpu():
    r = os.times()
    return r.user + r.system


def run(args, command):
    log_path = os.path.join(tempfile.gettempdir(), os.path.basename(args.out) + ".log")
    busy0, total0, _s = fanout_bench.cpu_times()
    me0 = self_cpu()
    sampler = Sampler(args.interval).start()
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                busy, _t, _s = fanout_bench.cpu_times()
                print("check_cpu: %4.0f s, %6.0f CPU-s busy so far, %d processes seen; log %s"
                      % (time.monotonic() - t0, busy - busy0, len(sampler.procs), log_path), flush=True)
    wall = time.monotonic() - t0
    sampler.stop()
    busy1, total1, _s = fanout_bench.cpu_times()
    sampler_cpu = self_cpu() - me0
    busy = busy1 - busy0
    cpus = os.cpu_count()
    kinds = sampler.by_kind()
    return {
        "command": shlex.join([".venv/bin/python", "benchmarks/check_cpu.py", "--interval", str(args.interval), "--out",
                               os.path.relpath(args.out, ROOT), "--"] + command),
        "work": shlex.join(command), "rc": proc.returncode, "machine": fanout_bench.machine(), "cpus": cpus,
        "wall_seconds": round(wall, 1), "busy_cpu_seconds": round(busy, 1),
        "idle_cpu_seconds": round((total1 - total0) - busy, 1), "sampler_cpu_seconds": round(sampler_cpu, 1),
        "processes_seen": len(sampler.procs), "kinds": kinds,
        "kinds_cpu_seconds": round(sum(v["cpu_seconds"] for v in kinds.values()), 1),
        "bound_seconds": round(max(0.0, busy - sampler_cpu) / cpus, 1), "budget_seconds": args.budget,
        "top": sampler.top(), "interval": args.interval,
    }


def ordered(kinds):
    """``kinds`` (``{kind: {cpu_seconds, processes}}``) as ``[(kind, figures)]``, the most CPU first (JSON keeps no
    order)."""
    return sorted(kinds.items(), key=lambda kv: (-kv[1]["cpu_seconds"], kv[0]))


def plot(doc, path):
    """CPU seconds by kind (bars) against what the budget allows on this machine's CPUs (the dashed line)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    kinds = ordered(doc["kinds"])[:9]
    fig, ax = plt.subplots(figsize=(12, 4.2))
    left = 0.0
    colors = plt.get_cmap("tab10")
    for i, (name, v) in enumerate(kinds):
        ax.barh(0, v["cpu_seconds"], left=left, color=colors(i), label="%s: %.0f s" % (name, v["cpu_seconds"]))
        left += v["cpu_seconds"]
    ax.barh(1, doc["busy_cpu_seconds"] - doc["sampler_cpu_seconds"], color="#2b2b2b",
            label="machine busy, less this sampler: %.0f s" % (doc["busy_cpu_seconds"] - doc["sampler_cpu_seconds"]))
    limit = doc["budget_seconds"] * doc["cpus"]
    ax.axvline(limit, color="tab:red", linestyle="--",
               label="%d s on %d CPUs: %.0f CPU-s" % (doc["budget_seconds"], doc["cpus"], limit))
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["processes, by kind", "/proc/stat"])
    ax.set_xlabel("CPU seconds (user + system)")
    ax.set_title("%s: %.0f s wall, at least %.0f s on %d CPUs" % (doc["work"][:70], doc["wall_seconds"],
                                                                  doc["bound_seconds"], doc["cpus"]), fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(doc, out, note=""):
    lines = ["# CPU of `%s`" % doc["work"], "",
             "Every process of the machine sampled every %.1f s while the command ran (`benchmarks/check_cpu.py`; its "
             "docstring says how), detached ones included, which `time` does not count." % doc["interval"], "",
             "Command (from the collection root):", "", "```", doc["command"], "```", "",
             "Machine: %(host)s; kernel %(kernel)s; Python %(python)s; load when it started %(load_start)s."
             % doc["machine"], ""]
    if note:
        lines += [note, ""]
    lines += ["| | seconds |", "|---|---|",
              "| wall (exit status %s) | %.1f |" % (doc["rc"], doc["wall_seconds"]),
              "| machine busy (`/proc/stat`, all CPUs) | %.1f |" % doc["busy_cpu_seconds"],
              "| of it, this sampler | %.1f |" % doc["sampler_cpu_seconds"],
              "| processes, by kind (below) | %.1f |" % doc["kinds_cpu_seconds"],
              "| **least wall time on %d CPUs**: (busy - sampler) / %d | **%.1f** |"
              % (doc["cpus"], doc["cpus"], doc["bound_seconds"]),
              "| budget | %d |" % doc["budget_seconds"], "",
              "| kind | CPU seconds | processes |", "|---|---|---|"]
    lines += ["| %s | %.1f | %d |" % (k, v["cpu_seconds"], v["processes"]) for k, v in ordered(doc["kinds"])]
    lines += ["", "The processes that used the most:", "", "| CPU seconds | kind | command line (first 160 characters) |",
              "|---|---|---|"]
    lines += ["| %.1f | %s | `%s` |" % (r["cpu_seconds"], r["kind"], r["command"].replace("|", "\\|")) for r in doc["top"]]
    lines += ["", "![CPU by kind](%s)" % (os.path.basename(out) + ".png"), "",
              "What this does not show: processes shorter than one sampling interval are missed (the kinds are a lower "
              "bound; the busy time is not); it is one run on one machine, and another machine's CPUs change every "
              "figure but not which kinds dominate; it says what the work costs, not whether all of that work is "
              "needed."]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(doc, out + ".png")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--out", required=True, help="output path without extension (.json, .md, .png)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples of /proc")
    ap.add_argument("--budget", type=int, default=180, help="the wall time the command should fit (s)")
    ap.add_argument("--report", metavar="JSON", help="only rebuild the Markdown and the PNG from this JSON")
    ap.add_argument("--note", default="", help="a paragraph for the Markdown")
    ap.add_argument("command", nargs="*", help="the command, after --")
    args = ap.parse_args(argv)
    args.out = os.path.abspath(args.out)
    if args.report:
        with open(args.report) as f:
            doc = json.load(f)
        report(doc, args.out, args.note)
        return 0
    if not args.command:
        ap.error("command: give the command to measure after --, for example -- make check FILES=awx/controller_templates.yml")
    if not 0.01 <= args.interval <= 5:
        ap.error("--interval: between 0.01 and 5 seconds")
    doc = run(args, args.command)
    with open(args.out + ".json", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    report(doc, args.out, args.note)
    print("%s: rc %s, %.0f s wall, %.0f CPU-s busy (%.0f of it this sampler), at least %.0f s on %d CPUs; wrote %s.{json,md,png}"
          % (doc["work"], doc["rc"], doc["wall_seconds"], doc["busy_cpu_seconds"], doc["sampler_cpu_seconds"],
             doc["bound_seconds"], doc["cpus"], args.out))
    for k, v in ordered(doc["kinds"]):
        print("  %-48s %8.1f CPU-s %6d processes" % (k, v["cpu_seconds"], v["processes"]))
    return 0 if doc["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
