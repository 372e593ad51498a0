# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A/B of model_stage's copy time: this checkout against an earlier commit, interleaved on one checkpoint.

A change that adds checks to staging (content identity, overlap refusals, journals) must not slow the copy.
Absolute times on a shared, noisy disk say little; this runs both versions of the module in alternating
order, round after round, with the page cache dropped before every run, and reports each version's median,
spread, and the per-round ratio B/A (so a noisy period hits both sides of a ratio).

    .venv/bin/python benchmarks/stage_ab.py --base f59851a --bytes 2GiB --rounds 5

The earlier commit is checked out with ``git worktree`` into a temporary directory; nothing in this checkout
changes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stage_bench  # noqa: E402  (parse_size, drop_caches, the synthetic checkpoint)

__all__ = ["main", "plot"]


def pycoll_for(tree):
    d = tempfile.mkdtemp(prefix="llmops-ab-pycoll-")
    os.makedirs(os.path.join(d, "ansible_collections", "llmops"))
    os.symlink(tree, os.path.join(d, "ansible_collections", "llmops", "serving"))
    return d


def run_module(tree, pycoll, args):
    path = os.path.join(os.path.dirname(args["dest"]), ".ab-args.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, f)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(tree, "plugins", "modules", "model_stage.py"), path],
                          capture_output=True, text=True, check=False, env=dict(os.environ, PYTHONPATH=pycoll))
    subprocess.run(["sync"], check=True)
    wall = time.monotonic() - t0
    out = proc.stdout
    result = json.loads(out[out.index("{"):]) if "{" in out else {"failed": True, "msg": proc.stderr[-2000:]}
    if result.get("failed"):
        raise SystemExit("model_stage (%s) failed: %s" % (tree, result.get("msg")))
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the earlier commit (A)")
    ap.add_argument("--root", default="/var/tmp/llmops-bench/stage-ab")
    ap.add_argument("--bytes", default="2GiB")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--read-streams", type=int, default=4)
    ap.add_argument("--verify", default="headers", choices=["headers", "sha256", "size"])
    ap.add_argument("--json", default="")
    ap.add_argument("--png", default="", help="plot both sides' runs per round (appends a panel per --verify)")
    a = ap.parse_args()

    base_tree = tempfile.mkdtemp(prefix="llmops-ab-base-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", base_tree, a.base], check=True,
                   capture_output=True)
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    sides = {"A %s" % a.base: base_tree, "B %s (this checkout)" % head: ROOT}
    pycolls = {k: pycoll_for(v) for k, v in sides.items()}
    src = os.path.join(a.root, "shared", "rev")
    total = stage_bench.parse_size(a.bytes)
    try:
        if not os.path.isfile(os.path.join(src, "SHA256SUMS")):
            shutil.rmtree(src, ignore_errors=True)
            stage_bench._stage_synth.write_checkpoint(src, total, shards=a.shards, seed=5)
        times = {k: [] for k in sides}
        order = list(sides)
        load0 = os.getloadavg()[0]
        for r in range(a.rounds):
            for k in (order if r % 2 == 0 else order[::-1]):
                dest = os.path.join(a.root, "nvme", "rev")
                shutil.rmtree(os.path.dirname(dest), ignore_errors=True)
                stage_bench.drop_caches()
                times[k].append(run_module(sides[k], pycolls[k], {
                    "src": src, "dest": dest, "verify": a.verify, "read_streams": a.read_streams}))
                print("round %d %s: %.2f s" % (r + 1, k, times[k][-1]), flush=True)
        load1 = os.getloadavg()[0]
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_tree], check=False,
                       capture_output=True)
    ka, kb = order
    ratios = [b / x for x, b in zip(times[ka], times[kb])]
    summary = {
        "bytes": total, "shards": a.shards, "verify": a.verify, "rounds": a.rounds, "read_streams": a.read_streams,
        "load_1min_start": round(load0, 1), "load_1min_end": round(load1, 1),
        "sides": {k: {"runs_s": [round(t, 2) for t in v], "median_s": round(statistics.median(v), 2),
                      "min_s": round(min(v), 2), "max_s": round(max(v), 2)} for k, v in times.items()},
        "ratio_b_over_a": {"per_round": [round(x, 3) for x in ratios], "median": round(statistics.median(ratios), 3),
                           "min": round(min(ratios), 3), "max": round(max(ratios), 3)},
    }
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    if a.png:
        plot([summary], a.png)


def plot(summaries, png):
    """One panel per summary: each side's wall time per round, and the median B/A ratio in the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(summaries), figsize=(5 * len(summaries), 3.6), squeeze=False)
    for ax, sm in zip(axes[0], summaries):
        for label, side in sm["sides"].items():
            ax.plot(range(1, len(side["runs_s"]) + 1), side["runs_s"], marker="o", label=label)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("round (order alternates)")
        ax.set_ylabel("wall time incl. sync (s)")
        ax.set_title("verify %s, %.1f GiB: B/A median %.3f" % (sm["verify"], sm["bytes"] / 2 ** 30,
                                                               sm["ratio_b_over_a"]["median"]))
        ax.legend(fontsize=7)
    fig.suptitle("model_stage A/B, busy 2-CPU VM: compare the ratio, not absolute times", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
