"""Concurrency ladder measured the way the field runs were: warm-up, fixed seeds, exact random lengths.

For every concurrency C: one warm-up round at C (discarded), then one official round per seed with
``vllm bench serve`` (random dataset, exact lengths, temperature 0, ignore-eos, unlimited arrival rate).
The summary reports, per C, the arithmetic mean across seeds of each metric and its min..max spread.
p95 values are the mean of per-round p95s, not a p95 of pooled samples; a spread wider than 20 % of the mean
is flagged as unstable. Outputs: per-round JSON, ``summary.json``, ``summary.md`` and ``ladder.png``.

    python benchmarks/serve_ladder.py --base-url http://127.0.0.1:8000 --model tiny-llama \
        --tokenizer /var/tmp/llmops/nvme/models/tiny-llama/<rev> --ladder 1,4,8 --seeds 1,2 --out-dir out/
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

METRICS = ("output_throughput", "p95_ttft_ms", "p95_tpot_ms", "p95_e2el_ms", "mean_ttft_ms")
HERE = os.path.dirname(os.path.abspath(__file__))


def requests_for(c, base):
    """The field runs used 16 requests at C=1, 32 at C=4, 64 at C=8: max(base, 8 x C)."""
    return max(base, 8 * c)


def bench(args, concurrency, seed, num_prompts, result_file=None):
    cmd = [sys.executable, os.path.join(HERE, "bench_serve.py"),
           "--base-url", args.base_url, "--model", args.model, "--served-model-name", args.model,
           "--tokenizer", args.tokenizer, "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--random-range-ratio", "0", "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
           "--request-rate", "inf", "--seed", str(seed), "--temperature", "0", "--ignore-eos",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99", "--disable-tqdm"]
    for h in args.header:
        cmd += ["--header", h]
    if result_file:
        cmd += ["--save-result", "--result-dir", os.path.dirname(result_file),
                "--result-filename", os.path.basename(result_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit("bench failed at C=%d seed=%d:\n%s" % (concurrency, seed, proc.stderr[-3000:]))
    if result_file:
        with open(result_file) as f:
            return json.load(f)
    return None


def summarize(rounds):
    out = {}
    for m in METRICS:
        vals = [r[m] for r in rounds if r.get(m) is not None]
        if not vals:
            continue
        mean = statistics.fmean(vals)
        out[m] = {"mean": round(mean, 3), "min": round(min(vals), 3), "max": round(max(vals), 3),
                  "unstable": bool(mean and (max(vals) - min(vals)) > 0.2 * abs(mean))}
    out["failed"] = sum(int(r.get("failed", 0) or 0) for r in rounds)
    out["completed"] = sum(int(r.get("completed", 0) or 0) for r in rounds)
    return out


def plot(summary, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = sorted(int(c) for c in summary)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in ((axes[0], "output_throughput", "output tok/s"), (axes[1], "p95_ttft_ms", "p95 TTFT (ms)")):
        means = [summary[str(c)][metric]["mean"] for c in cs]
        lo = [summary[str(c)][metric]["mean"] - summary[str(c)][metric]["min"] for c in cs]
        hi = [summary[str(c)][metric]["max"] - summary[str(c)][metric]["mean"] for c in cs]
        ax.errorbar(cs, means, yerr=[lo, hi], marker="o", capsize=4)
        ax.set_xlabel("client concurrency C")
        ax.set_ylabel(label)
        ax.set_xticks(cs)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title + " (mean of seeds, bars = min..max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


CAVEATS = [
    "p95 is the mean of per-round p95 values, not a p95 of pooled samples; with 16-64 requests per round the "
    "tail is a trend indicator, not a stability result.",
    "Rounds flagged unstable (min..max spread > 20 % of the mean) support no claim of a gain or a regression.",
    "C is the client's maximum in-flight requests, not users and not the server batch size.",
    "Output throughput includes TTFT and the round trip; it is not the steady decode rate (1000 / TPOT).",
    "One client, one server, sequential rounds: queueing, routing and KV-transfer phases are not separated.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--ladder", default="1,4,8")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--base-requests", type=int, default=16)
    ap.add_argument("--header", action="append", default=[], help="KEY=VALUE, e.g. routing-strategy=pd")
    ap.add_argument("--label", default="serve ladder")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    ladder = [int(c) for c in args.ladder.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = {}
    t0 = time.monotonic()
    for c in ladder:
        n = requests_for(c, args.base_requests)
        print("C=%d: warm-up (%d requests)" % (c, c), flush=True)
        bench(args, c, 0, c)
        rounds = []
        for s in seeds:
            r = bench(args, c, s, n, os.path.join(os.path.abspath(args.out_dir), "c%d_seed%d.json" % (c, s)))
            rounds.append(r)
            print("C=%d seed=%d: %d requests, %.1f out tok/s, p95 TTFT %.1f ms, failed %s (%.0fs elapsed)"
                  % (c, s, n, r["output_throughput"], r["p95_ttft_ms"], r.get("failed", 0), time.monotonic() - t0),
                  flush=True)
        summary[str(c)] = summarize(rounds)
        summary[str(c)]["requests_per_round"] = n
    meta = {"label": args.label, "base_url": args.base_url, "model": args.model, "input_len": args.input_len,
            "output_len": args.output_len, "seeds": seeds, "ladder": ladder, "caveats": CAVEATS}
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary}, f, indent=2, sort_keys=True)
    rows = ["| C | requests/round | out tok/s | p95 TTFT ms | p95 TPOT ms | p95 E2EL ms | failed |", "|---|---|---|---|---|---|---|"]
    for c in ladder:
        s = summary[str(c)]

        def cell(m):
            v = s.get(m)
            return "n/a" if not v else "%.1f (%.1f..%.1f)%s" % (v["mean"], v["min"], v["max"], " ⚠" if v["unstable"] else "")
        cells = (c, s["requests_per_round"], cell("output_throughput"), cell("p95_ttft_ms"), cell("p95_tpot_ms"),
                 cell("p95_e2el_ms"), s["failed"])
        rows.append("| %d | %d | %s | %s | %s | %s | %d |" % cells)
    md = "\n".join(rows) + "\n\n⚠ = unstable across seeds.\n\nWhat this data does not prove:\n" + \
        "\n".join("- " + c for c in CAVEATS) + "\n"
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(md)
    plot(summary, os.path.join(args.out_dir, "ladder.png"), args.label)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
