# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU: a set of real Triton kernels compiled through the kernel_cache prebuild path, then restored.

Per run: (1) ``_kcache_build.prebuild`` on "node A" runs benchmarks/kernel_cache_triton_set.py as the
warm-up with every cache variable pointing into a private ``.partial-*`` dir, verifies and publishes
it; the script's own first-launch times are the cold JIT. (2) ``_kcache_build.sync`` copies it to "node B"
(hashing every file), ``_kcache.restore`` verifies it, and a fresh process runs the same kernels with
TRITON_CACHE_DIR inside the restored dir: the restored JIT. (3) A fingerprint with one changed
component (another triton version value) names a different directory, so the old cache is never
looked up; a copy of the old directory renamed to the new fingerprint is refused (components differ).

Needs a CUDA GPU with torch + triton; no Ansible. Run on the GPU host from the collection root:

    python3 benchmarks/kernel_cache_gpu.py --runs 3 --json $OUT/kernel_cache_gpu.json --plot $OUT/kernel_cache_gpu.png
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import conftest  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.llmops.serving.plugins.module_utils.cache import (  # noqa: E402
    _fingerprint, _kcache, _kcache_build,
)
from ansible_collections.llmops.serving.plugins.module_utils.engine import _preflight  # noqa: E402

KERNELS = os.path.join(ROOT, "benchmarks", "kernel_cache_triton_set.py")
MODEL_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}


def versions_here():
    import torch
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda or "none"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", required=True)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="kcache-gpu-")
    model = os.path.join(work, "model")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(MODEL_CONFIG, f)
    inv = _preflight.gpu_inventory("nvidia-smi")
    if inv["mode"] != "gpu":
        raise SystemExit("no GPU: %s" % inv["reason"])
    kw = dict(engine="vllm", engine_version="triton-kernel-set-1", versions=versions_here(),
              driver_version=inv["driver_version"], gpu_name=inv["names"][0],
              compute_capability=inv["compute_capability"], parallel={"tp": 1}, model_path=model,
              model_revision="bench", engine_args=[])
    fp = _fingerprint.compute(**kw)
    print("fingerprint %s  %s" % (fp["fingerprint"], fp["label"]), flush=True)
    res = {"fingerprint": fp["fingerprint"], "label": fp["label"], "components": fp["components"],
           "gpu": inv["names"][0], "cold": [], "restored": []}
    for r in range(a.runs):
        node_a, node_b = os.path.join(work, "r%d" % r, "node-a"), os.path.join(work, "r%d" % r, "node-b")
        cold_json = os.path.join(work, "cold%d.json" % r)
        t0 = time.monotonic()
        pb = _kcache_build.prebuild(node_a, "vllm", fp["fingerprint"], fp["components"],
                                    {"command": [sys.executable, KERNELS, cold_json], "mode": "run", "timeout": 300},
                                    label=fp["label"])
        wall = time.monotonic() - t0
        with open(cold_json) as f:
            cold = json.load(f)
        cold.update(prebuild_wall_s=round(wall, 2), published_files=pb["file_count"], published_bytes=pb["total_bytes"])
        res["cold"].append(cold)
        sy = _kcache_build.sync(node_a, node_b, "vllm", fp["fingerprint"], fp["components"])
        rv = _kcache.restore(node_b, "vllm", fp["fingerprint"], fp["components"])
        assert rv["status"] == "hit", rv
        hot_json = os.path.join(work, "hot%d.json" % r)
        env = dict(os.environ)
        env.update(_kcache.cache_env("vllm", rv["cache_dir"]))
        t0 = time.monotonic()
        subprocess.run([sys.executable, KERNELS, hot_json], env=env, check=True)
        hot_wall = time.monotonic() - t0
        with open(hot_json) as f:
            hot = json.load(f)
        hot.update(process_wall_s=round(hot_wall, 2), sync_s=sy["duration_s"], sync_bytes=sy["bytes"],
                   relocated_files=rv["relocated_files"])
        res["restored"].append(hot)
        # control: a plain recursive copy (no relocation of Triton's group files) on "node C", where
        # node A's paths do not exist (node A's dir is moved aside while it runs)
        naive_dir = os.path.join(work, "r%d" % r, "node-c", "vllm", fp["fingerprint"])
        src_a = os.path.join(node_a, "vllm", fp["fingerprint"])
        shutil.copytree(src_a, naive_dir)
        naive_json = os.path.join(work, "naive%d.json" % r)
        env = dict(os.environ)
        env.update(_kcache.cache_env("vllm", naive_dir))
        os.rename(src_a, src_a + ".away")
        try:
            subprocess.run([sys.executable, KERNELS, naive_json], env=env, check=True)
        finally:
            os.rename(src_a + ".away", src_a)
        with open(naive_json) as f:
            res.setdefault("naive_copy", []).append(json.load(f))
        print("run %d: cold JIT %.3fs (%d variants), restored JIT %.3fs, ratio %.3f; plain copy %.3fs" % (
            r, cold["jit_s"], cold["variants"], hot["jit_s"], hot["jit_s"] / cold["jit_s"],
            res["naive_copy"][-1]["jit_s"]), flush=True)

    # a changed component names another directory; a renamed old dir is refused
    kw2 = dict(kw)
    kw2["versions"] = dict(kw["versions"], triton="3.5.1")
    fp2 = _fingerprint.compute(**kw2)
    last_b = os.path.join(work, "r%d" % (a.runs - 1), "node-b")
    lookup = _kcache.restore(last_b, "vllm", fp2["fingerprint"], fp2["components"])
    shutil.copytree(os.path.join(last_b, "vllm", fp["fingerprint"]), os.path.join(last_b, "vllm", fp2["fingerprint"]))
    renamed = _kcache.restore(last_b, "vllm", fp2["fingerprint"], fp2["components"])
    res["changed_component"] = {
        "component": "triton", "value": "3.5.1", "fingerprint": fp2["fingerprint"],
        "differs": fp2["fingerprint"] != fp["fingerprint"], "lookup_status": lookup["status"],
        "renamed_old_dir_status": renamed["status"], "renamed_old_dir_problems": renamed["verify"]["problems"],
    }
    cold_s = sorted(x["jit_s"] for x in res["cold"])
    hot_s = sorted(x["jit_s"] for x in res["restored"])
    naive_s = sorted(x["jit_s"] for x in res["naive_copy"])
    res["summary"] = {"cold_jit_median_s": cold_s[len(cold_s) // 2], "restored_jit_median_s": hot_s[len(hot_s) // 2],
                      "plain_copy_jit_median_s": naive_s[len(naive_s) // 2],
                      "restored_new_cache_files": sum(v["new_cache_files"] for x in res["restored"] for v in x["per_variant"]),
                      "ratio": round(hot_s[len(hot_s) // 2] / cold_s[len(cold_s) // 2], 4), "runs": a.runs}
    print(json.dumps({"summary": res["summary"], "changed_component": res["changed_component"]}, indent=1))
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        xs = range(a.runs)
        ax.bar([x - 0.27 for x in xs], [c["jit_s"] for c in res["cold"]], 0.27, label="cold (prebuild into .partial)")
        ax.bar(list(xs), [n["jit_s"] for n in res["naive_copy"]], 0.27, label="plain cp -r copy (not relocated)")
        ax.bar([x + 0.27 for x in xs], [h["jit_s"] for h in res["restored"]], 0.27, label="restored (sync + verify)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(["run %d" % (x + 1) for x in xs])
        ax.set_ylabel("first-launch time, %d variants (s)" % res["cold"][0]["variants"])
        ax.set_title("%s: fused-MoE-style Triton kernels, cold vs restored" % inv["names"][0])
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
