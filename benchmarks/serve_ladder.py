"""Concurrency ladder from the command line: a thin caller of the benchmark role's own code.

Runs exactly what ``playbooks/benchmark.yml`` runs (``plugins/module_utils/bench/``: ``_bench_inputs``,
``_bench_plan`` and ``_bench_round``: checks, probe, plan, rounds with ``vllm bench serve``; ``_bench_assemble``,
``_bench_stats``, ``_bench_report`` and ``_bench_render``: the report) without Ansible, for a developer at a shell.
The play is the supported interface; prefer it.

    .venv/bin/python benchmarks/serve_ladder.py --base-url http://127.0.0.1:8000 --model tiny-llama \
        --tokenizer /var/tmp/llmops/nvme/models/tiny-llama/<rev> --ladder 1,2 --seeds 1,2 --out-dir out/
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import conftest  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.llmops.serving.plugins.module_utils.bench import (  # noqa: E402
    _bench_assemble, _bench_inputs, _bench_outdir, _bench_plan, _bench_render, _bench_round,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--ladder", default="1,4,8")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--header", action="append", default=[], help="KEY=VALUE, e.g. routing-strategy=pd")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    target = {"name": "target", "url": args.base_url, "model": args.model,
              "headers": dict(h.split("=", 1) for h in args.header)}
    try:
        proto = _bench_inputs.check_inputs({
            "targets": [target], "concurrency": [int(c) for c in args.ladder.split(",")],
            "seeds": [int(s) for s in args.seeds.split(",")], "lengths": [[args.input_len, args.output_len]],
            "requests_per_round": args.requests, "warmup_rounds": args.warmup_rounds})
        _bench_inputs.check_tokenizer(args.tokenizer, "--tokenizer")
        _bench_inputs.check_target(proto["targets"][0], 0)
        probe = _bench_inputs.probe(proto["targets"][0], 0, args.input_len, args.output_len)
    except _bench_inputs.BenchError as e:
        raise SystemExit(str(e))
    out = os.path.abspath(args.out_dir)
    _bench_outdir.prepare_out_dir(out)
    plan = {"schema": _bench_outdir.PLAN_SCHEMA, "started_at": time.time(), "targets": proto["targets"],
            "protocol": dict((k, v) for k, v in proto.items() if k != "targets"),
            "rounds": _bench_plan.make_plan(proto), "tokenizer": args.tokenizer, "client": "control node",
            "probes": [{"target": "target", "input_len": args.input_len, "output_len": args.output_len,
                        "seconds": probe}]}
    _bench_outdir.write_plan(out, plan)
    for rnd in plan["rounds"]:
        rec, stopped = _bench_round.run_round(out, plan, rnd["index"], sys.executable, env=dict(os.environ),
                                              evidence_args=None)
        prog = _bench_plan.progress(plan, _bench_outdir.done_rounds(out), rnd["index"])
        print("%s; %s" % (_bench_round.describe_round(rec) if rec else stopped["message"], prog["line"]), flush=True)
        if stopped:
            break
    report = _bench_assemble.build_report(out, {"command": " ".join(sys.argv)})
    for path in _bench_render.write(report, out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
