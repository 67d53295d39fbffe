"""A tensor-core-free fp8 GEMV for one row (batch-1 decode), timed against the skinny GEMM.

y[N] = (W[N, K] * scale[:, None]) @ x[K]: a program owns BLOCK_N rows of W (and, split > 1,
one K range); each K tile of W is widened to fp32 and multiplied into an fp32 [BLOCK_N,
BLOCK_K] accumulator by plain FMAs, summed across K once after the loop. No dot operand
layout, so no padding of x to 16 rows and no register shuffles between the load and the
math; the products are exact in fp32 (a bf16 value times an e4m3 one), as the tensor cores'
are. Splits add their partial rows into a zeroed fp32 buffer (atomics: timing only).

    python tools/fp8_gemv_sweep.py [--models qwen3-8b,qwen3-0.6b] [--weights bf16] [--variants]

--variants also tries, unsplit with cvt widening, each thread summing GROUP adjacent products
at once (an accumulator of [BLOCK_N, BLOCK_K / GROUP]: fewer registers, as the layer
kernel's matvec) and W's loads marked evict-first (W is read once; x stays in L2).

Per layer: the skinny GEMM with the table's config at M = 1 (bf16 weights: cuBLAS), then
this kernel's five best (BLOCK_N, BLOCK_K, warps, stages, split, widening) and their error
against the reference.
"""
import argparse
import itertools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels._common import e4m3_to_bf16  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import (candidate_us, make_weights, time_cublas,  # noqa: E402
                              time_skinny)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, K, k_per_split, stride_wn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                 INT_WIDEN: tl.constexpr, GROUP: tl.constexpr, EVICT: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):  # K a multiple of BLOCK_K
        if EVICT:
            w = tl.load(w_rows + k0, mask=mask_n[:, None], other=0.0,
                        eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + k0, mask=mask_n[:, None], other=0.0)
        x = tl.load(x_ptr + k0 + offs_k).to(tl.float32)
        if INT_WIDEN:
            wf = e4m3_to_bf16(w).to(tl.float32)
        else:
            wf = w.to(tl.float32)
        if GROUP > 1:
            acc += tl.sum(tl.reshape(wf * x[None, :], [BLOCK_N, BLOCK_K // GROUP, GROUP]), 2)
        else:
            acc += wf * x[None, :]
    y = tl.sum(acc, axis=1) * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
    if SPLIT:
        tl.atomic_add(y_ptr + offs_n, y, mask=mask_n, sem="relaxed")
    else:
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)


def gemv(x, w, scale, cfg):
    """x[1, K] @ (w * scale[:, None])^T: bf16 [1, N] (split 1) or fp32 (split > 1)."""
    n, k = w.shape
    split = cfg["SPLIT"]
    assert k % (cfg["BLOCK_K"] * split) == 0
    y = (torch.zeros(1, n, dtype=torch.float32, device=x.device) if split > 1
         else torch.empty(1, n, dtype=x.dtype, device=x.device))
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split)
    _gemv_kernel[grid](x, w, scale, y, n, k, k // split, w.stride(0), BLOCK_N=cfg["BLOCK_N"],
                       BLOCK_K=cfg["BLOCK_K"], SPLIT=split > 1, INT_WIDEN=cfg["INT_WIDEN"],
                       GROUP=cfg.get("GROUP", 1), EVICT=cfg.get("EVICT", False),
                       num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y


# (BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = [(8, 512, 4, 3), (16, 256, 4, 3), (16, 512, 4, 3), (16, 512, 8, 3), (32, 256, 4, 3),
         (32, 256, 8, 3), (16, 256, 4, 4), (8, 1024, 4, 3), (32, 512, 8, 2), (64, 128, 4, 4)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3-8b")
    ap.add_argument("--weights", choices=("fp8", "bf16"), default="fp8",
                    help="bf16: the same kernel on bf16 weights (scales of 1), against cuBLAS")
    ap.add_argument("--variants", action="store_true",
                    help="also GROUP 8 / 16 and evict-first W loads (unsplit, cvt)")
    args = ap.parse_args()
    fp8 = args.weights == "fp8"
    for model in args.models.split(","):
        for name, (n, k) in linear_shapes(model).items():
            if name == "lm_head":
                continue
            weights = make_weights(n, k, "fp8_row" if fp8 else "bf16")
            if not fp8:  # scales of one: the kernel's multiply stays, as for fp8
                ones = torch.ones(n, device="cuda")
                weights = [(w, ones, b) for w, _, b in weights]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            w0, s0, _ = weights[0]
            ref = x.float() @ (w0.float() * s0[:, None]).t()
            t_base = (time_skinny(x, weights) if fp8 else time_cublas(1, n, k)) * 1e3
            row = []
            variants = [(s, w, 1, False) for s in (1, 2, 4) for w in (False, True)]
            if args.variants:  # GROUP 1 / 8 / 16, evict-first or not (but the plain one)
                variants += [(1, False, g, ev) for g in (1, 8, 16) for ev in (False, True)][1:]
            for (bn, bk, warps, stages), (split, widen, group, evict) in itertools.product(
                    TILES, variants):
                # integer widening: one tile, unsplit (more instructions than cvt's)
                if k % (bk * split) or (widen and (split > 1 or bn != 16 or not fp8)):
                    continue
                cfg = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
                           SPLIT=split, INT_WIDEN=widen, GROUP=group, EVICT=evict)
                key = (bn, bk, warps, stages, split, "int" if widen else "cvt", f"g{group}",
                       "evict" if evict else "")
                t = candidate_us(lambda: [gemv(x, w, s, cfg) for w, s, _ in weights],
                                 len(weights), key)
                if t is None:
                    continue
                y = gemv(x, w0, s0, cfg).float()
                err = ((y - ref).abs().max() / ref.abs().max()).item()
                row.append((t, key, err))
            row.sort()
            best = ", ".join(f"{t:.1f} {key} err {e:.1e}" for t, key, e in row[:5])
            gbs = n * k * (1 if fp8 else 2) / t_base / 1e3
            print(f"{model:10s} {name:8s} N={n:5d} K={k:5d}  {'skinny' if fp8 else 'cuBLAS'} "
                  f"{t_base:5.1f} ({gbs:4.0f} GB/s)  gemv {best}", flush=True)
            del weights
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
