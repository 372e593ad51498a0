# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM-CPU engine start on the tiny demo model: cold (empty cache, built through the kernel_cache
prebuild path) vs restored (a fresh process on a copy synced into another cache root, as a second
node would get it).

Each start is measured from process spawn to the first correct completion, plus the engine's own
"init engine (...) took X s" and "torch.compile took X s" lines; hit/miss is decided from the log by
the same code the role uses. Results go to a JSON file (and a PNG when --plot is given).

    .venv/bin/python benchmarks/kernel_cache_cpu.py --runs 2 --port 18201 \
        --json docs/benchmarks/kernel_cache_cpu.json --plot docs/benchmarks/kernel_cache_cpu.png
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import conftest  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.llmops.serving.plugins.module_utils.cache import (  # noqa: E402
    _fingerprint, _kcache, _kcache_build, _kcache_log,
)
from ansible_collections.llmops.serving.plugins.module_utils.engine import _demo_model  # noqa: E402

INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)")
COMPILE_RE = re.compile(r"torch\.compile take[s]? ([0-9.]+) ?s in total")
LOAD_RE = re.compile(r"Directly load the compiled graph\(s\) for compile range (\S+) from the cache, took ([0-9.]+) s")
COMPILE_RANGE_RE = re.compile(r"Compiling a graph for compile range (\S+) takes ([0-9.]+) s")


def engine_cmd(model, port):
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", "tiny", "--port", str(port), "--host", "127.0.0.1",
            "--max-model-len", "256"]


def warmup_spec(model, port, timeout):
    return {
        "command": engine_cmd(model, port), "mode": "serve", "timeout": timeout,
        "url": "http://127.0.0.1:%d/v1/completions" % port,
        "body": {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0},
    }


def parse_log(text, engine="vllm", cache_dir=None):
    out = _kcache_log.analyze_log(text, engine, cache_dir)
    m = INIT_RE.findall(text)
    out["init_engine_s"] = float(m[-1]) if m else None
    m = COMPILE_RE.findall(text)
    out["torch_compile_s"] = float(m[-1]) if m else None
    out["graphs_loaded"] = len(LOAD_RE.findall(text))
    out["graphs_compiled"] = len(COMPILE_RANGE_RE.findall(text))
    return out


def restored_start(cache_dir, model, port, timeout, logfile, extra_env):
    """A fresh engine process whose caches point into a published fingerprint dir."""
    env = dict(os.environ)
    env.update(extra_env)
    env.update(_kcache.cache_env("vllm", cache_dir))
    log = _kcache_build._Log(logfile)
    try:
        t0 = time.monotonic()
        w = _kcache_build.run_warmup(warmup_spec(model, port, timeout), env, log, logfile)
        return time.monotonic() - t0, w
    finally:
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--work", default=None, help="scratch dir (default: a new temp dir, removed at the end)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--port", type=int, default=18201)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--keep-logs", default=None, help="copy engine logs into this dir")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra engine environment for both starts, e.g. VLLM_USE_AOT_COMPILE=0")
    a = ap.parse_args()

    work = a.work or tempfile.mkdtemp(prefix="kcache-cpu-")
    extra_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    extra_env.update(kv.split("=", 1) for kv in a.env)
    info = _demo_model.generate_model(os.path.join(work, "models"), name="tiny-llama", seed=0)
    fp = _fingerprint.compute("vllm", model_path=info["path"], model_revision=info["revision"], gather=True,
                              engine_python=sys.executable, gpu_inventory={"mode": "cpu-only"},
                              engine_args=engine_cmd(info["path"], a.port)[3:])
    print("fingerprint %s  %s" % (fp["fingerprint"], fp["label"]), flush=True)
    results = {"fingerprint": fp["fingerprint"], "label": fp["label"], "components": fp["components"],
               "cold": [], "restored": [], "cpu_count": os.cpu_count(), "extra_env": extra_env}
    for r in range(a.runs):
        node_a = os.path.join(work, "run%d" % r, "node-a")  # canary: builds
        node_b = os.path.join(work, "run%d" % r, "node-b")  # another node: copies, then starts
        t0 = time.monotonic()
        pb = _kcache_build.prebuild(node_a, "vllm", fp["fingerprint"], fp["components"],
                                    warmup_spec(info["path"], a.port, a.timeout), label=fp["label"], extra_env=extra_env)
        cold_wall = time.monotonic() - t0
        with open(pb["log_path"]) as f:
            cold = parse_log(f.read())
        cold.update(ready_s=pb["warmup_s"], prebuild_wall_s=round(cold_wall, 2), files=pb["file_count"],
                    bytes=pb["total_bytes"])
        results["cold"].append(cold)
        print("cold #%d: ready %.1fs init %s compile %s result %s files %d bytes %d" % (
            r, cold["ready_s"], cold["init_engine_s"], cold["torch_compile_s"], cold["result"],
            cold["files"], cold["bytes"]), flush=True)

        sy = _kcache_build.sync(node_a, node_b, "vllm", fp["fingerprint"], fp["components"])
        rv = _kcache.restore(node_b, "vllm", fp["fingerprint"], fp["components"])
        assert rv["status"] == "hit", rv
        # the engine runs on its own copy, as the role starts it: the published directory is only read
        co = _kcache_build.checkout(node_b, "vllm", fp["fingerprint"], fp["components"])
        logfile = os.path.join(node_b, "vllm", ".logs", "%s.restored.log" % fp["fingerprint"])
        ready, _w = restored_start(co["engine_dir"], info["path"], a.port, a.timeout, logfile, extra_env)
        with open(logfile) as f:
            hot = parse_log(f.read(), cache_dir=co["engine_dir"])
        hot.update(ready_s=round(ready, 2), sync_s=sy["duration_s"], sync_bytes=sy["bytes"])
        results["restored"].append(hot)
        print("restored #%d: ready %.1fs init %s compile %s result %s (loaded %d, compiled %d)" % (
            r, hot["ready_s"], hot["init_engine_s"], hot["torch_compile_s"], hot["result"],
            hot["graphs_loaded"], hot["graphs_compiled"]), flush=True)
        if a.keep_logs:
            os.makedirs(a.keep_logs, exist_ok=True)
            shutil.copy(pb["log_path"], os.path.join(a.keep_logs, "cold%d.log" % r))
            shutil.copy(logfile, os.path.join(a.keep_logs, "restored%d.log" % r))

    def med(rows, key):
        vals = sorted(x[key] for x in rows if x.get(key) is not None)
        return vals[len(vals) // 2] if vals else None

    summary = {k: {"cold": med(results["cold"], k), "restored": med(results["restored"], k)}
               for k in ("ready_s", "init_engine_s", "torch_compile_s")}
    for k, v in summary.items():
        v["ratio"] = round(v["restored"] / v["cold"], 3) if v["cold"] and v["restored"] is not None else None
    results["summary"] = summary
    results["restored_results"] = [x["result"] for x in results["restored"]]
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        keys = [k for k in ("ready_s", "init_engine_s", "torch_compile_s") if summary[k]["cold"] is not None]
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        xs = range(len(keys))
        ax.bar([x - 0.2 for x in xs], [summary[k]["cold"] for k in keys], 0.4, label="cold (empty cache)")
        ax.bar([x + 0.2 for x in xs], [summary[k]["restored"] or 0 for k in keys], 0.4,
               label="restored (%s)" % "/".join(sorted(set(results["restored_results"]))))
        ax.set_xticks(list(xs))
        ax.set_xticklabels(["spawn to first\ncorrect response", "engine init", "torch.compile"][:len(keys)])
        ax.set_ylabel("seconds (median of %d)" % a.runs)
        ax.set_title("vLLM-CPU %s, tiny Llama: kernel cache cold vs restored" % fp["components"]["engine_version"])
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
