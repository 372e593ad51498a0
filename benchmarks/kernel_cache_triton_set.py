# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A set of real Triton kernels compiled (or loaded from TRITON_CACHE_DIR) in one fresh process.

The kernel is a fused-MoE-style grouped GEMM, the shape of vLLM's / SGLang's ``fused_moe_kernel``:
tokens are sorted by expert into blocks of BLOCK_M rows, each program looks up its block's expert and
multiplies the gathered token rows by that expert's weight. It is compiled for a grid of tuning
configurations (BLOCK_M x BLOCK_N x BLOCK_K x num_stages = 16 variants by default), each checked
against a torch reference. Writes ``{variants, jit_s (sum of first-launch times), per_variant, ...}``
as JSON to argv[1]. Needs a CUDA GPU, torch and triton.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def moe_grouped_gemm(a_ptr, w_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, num_valid, N, K, top_k,
                     stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    token = tl.load(sorted_ids_ptr + offs_m)
    mask_m = token < num_valid
    expert = tl.load(expert_ids_ptr + pid_m)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (token[:, None] // top_k) * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=kmask[:, None] & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, w)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    c_ptrs = c_ptr + token[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_n[None, :] < N))


def align(topk_ids, num_experts, block_m):
    """Sort (token, k) slots by expert and pad each expert's run to a multiple of block_m."""
    flat = topk_ids.flatten()
    sorted_ids, expert_ids = [], []
    pad = flat.numel()
    for e in range(num_experts):
        idx = (flat == e).nonzero().flatten().tolist()
        if not idx:
            continue
        n_blocks = (len(idx) + block_m - 1) // block_m
        idx += [pad] * (n_blocks * block_m - len(idx))
        sorted_ids += idx
        expert_ids += [e] * n_blocks
    dev = topk_ids.device
    return torch.tensor(sorted_ids, dtype=torch.int32, device=dev), torch.tensor(expert_ids, dtype=torch.int32, device=dev)


def main():
    out_path = sys.argv[1]
    torch.manual_seed(0)
    dev = "cuda"
    T, K, N, E, top_k = 256, 1024, 512, 16, 2
    a = torch.randn(T, K, device=dev, dtype=torch.bfloat16) / 8
    w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) / 8
    topk_ids = torch.stack([torch.randperm(E, device=dev)[:top_k] for _t in range(T)]).to(torch.int32)
    ref = torch.empty(T * top_k, N, device=dev, dtype=torch.float32)
    for slot in range(T * top_k):
        ref[slot] = a[slot // top_k].float() @ w[topk_ids.flatten()[slot]].float().t()
    grid_cfg = list(itertools.product((16, 64), (64, 128), (64, 128), (3, 4)))
    torch.cuda.synchronize()
    cache = os.environ.get("TRITON_CACHE_DIR", "")

    def n_files():
        return sum(len(f) for _d, _s, f in os.walk(cache)) if cache else 0

    per, total = [], 0.0
    for bm, bn, bk, stages in grid_cfg:
        before = n_files()
        sorted_ids, expert_ids = align(topk_ids, E, bm)
        c = torch.zeros(T * top_k, N, device=dev, dtype=torch.bfloat16)
        grid = (expert_ids.numel(), triton.cdiv(N, bn))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        moe_grouped_gemm[grid](a, w, c, sorted_ids, expert_ids, T * top_k, N, K, top_k,
                               a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
                               c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                               num_warps=4, num_stages=stages)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        moe_grouped_gemm[grid](a, w, c, sorted_ids, expert_ids, T * top_k, N, K, top_k,
                               a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
                               c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                               num_warps=4, num_stages=stages)
        torch.cuda.synchronize()
        second = time.perf_counter() - t1
        err = (c.float() - ref).abs().max().item()
        total += first
        per.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": stages,
                    "first_launch_s": round(first, 4), "second_launch_s": round(second, 5),
                    "new_cache_files": n_files() - before, "max_abs_err": err})
        if err > 5e-2:
            raise SystemExit("variant %s wrong: max abs err %g" % (per[-1], err))
    files = n_files()
    with open(out_path, "w") as f:
        json.dump({"variants": len(per), "jit_s": round(total, 4), "per_variant": per,
                   "triton_cache_dir": cache, "triton_cache_files": files, "triton": triton.__version__,
                   "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    print("%d variants, first-launch total %.3fs, cache %s (%d files)" % (len(per), total, cache, files))


if __name__ == "__main__":
    if os.environ.get("KC_PROFILE"):
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(main)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    else:
        main()
