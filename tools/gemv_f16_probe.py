"""How much the fp8 GEMV (nanovllm/kernels/gemv.py) would gain from packed fp16 products: an
upper bound, timed before anything is built into the engine.

    python tools/gemv_f16_probe.py [--models qwen3-8b] [--tiles 8x1024,16x512,16x256]

The engine's GEMV widens each e4m3 weight to fp32 (F2FP to f16x2, then HADD2.F32 an element)
and sums fp32 products: ~3.7 SASS instructions an element a thread in its K loop (sm_90,
8 x 1024 tile). Here, one row of x, row scales, three probe modes of one loop:
  f32   the engine's arithmetic (the baseline, in this file's kernel);
  f16   x given in fp16 (converted outside, untimed), products and GROUP-sums in f16x2
        (HFMA2): ~2.1 instructions an element. Overflow-unsafe in general: the bound only;
  f16s  as f16, x's K tile scaled in the kernel by a power of two from its max (|x| * s in
        [4, 8), so sixteen products of |w| <= 448 fit f16), the sums scaled back in fp32:
        what a safe version would cost.
each beside the engine's kernel at its tiles, µs a call over weight copies past L2 in one
CUDA graph, and the error against the fp32 reference.

H200, 2026-11-30, Qwen3-8B's four layers summed, µs (best tile of each): engine 57.8, f32
56.6, f16 54.8, f16s 58.9. Halving the loop's instructions buys ~5% even unsafe, and the
safe form loses: the one-row fp8 GEMV is not issue-bound, so nothing was built
(docs/PERF_NOTES.md, fiftieth session).
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import gemv  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import candidate_us, make_weights  # noqa: E402

MODES = {"f32": 0, "f16": 1, "f16s": 2}


@triton.jit
def _probe(x_ptr, w_ptr, s_ptr, y_ptr, N, K, stride_wn, MODE: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_rows + k0, mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
        x = tl.load(x_ptr + k0 + offs_k)
        if MODE == 0:
            p = w.to(tl.float32) * x.to(tl.float32)[None, :]
            acc += tl.sum(tl.reshape(p, [BLOCK_N, BLOCK_K // GROUP, GROUP]), 2)
        elif MODE == 1:
            p = w.to(tl.float16) * x[None, :]
            acc += tl.sum(tl.reshape(p, [BLOCK_N, BLOCK_K // GROUP, GROUP]), 2).to(tl.float32)
        else:
            xf = x.to(tl.float32)
            amax = tl.max(tl.abs(xf), 0)
            # 2^(2 - floor(log2 amax)) from amax's exponent bits (amax 0: any finite scale)
            e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
            e = tl.minimum(tl.maximum(e, 2), 250)
            s = ((256 - e) << 23).to(tl.float32, bitcast=True)  # 2^(2 - (e - 127))
            p = w.to(tl.float16) * (xf * s).to(tl.float16)[None, :]
            g = tl.sum(tl.reshape(p, [BLOCK_N, BLOCK_K // GROUP, GROUP]), 2).to(tl.float32)
            acc += g * (1.0 / s)
    y = tl.sum(acc, 1) * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)


def probe(x, w, s, mode: str, bn: int, bk: int) -> torch.Tensor:
    """y[1, N] of one row of x (fp16 already for mode f16) through the probe kernel."""
    n, k = w.shape
    y = torch.empty(1, n, device=w.device, dtype=torch.bfloat16)
    _probe[(triton.cdiv(n, bn),)](x, w, s, y, n, k, w.stride(0), MODE=MODES[mode],
                                  BLOCK_N=bn, BLOCK_K=bk, GROUP=16, num_warps=4, num_stages=3)
    return y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3-8b")
    ap.add_argument("--tiles", default="8x1024,16x512,16x256,4x1024")
    args = ap.parse_args()
    tiles = [tuple(map(int, t.split("x"))) for t in args.tiles.split(",")]
    for model in args.models.split(","):
        totals = {}
        for name, (n, k) in linear_shapes(model).items():
            if name == "lm_head":
                continue
            weights = make_weights(n, k, "fp8_row")
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            x16 = x.half()
            w0, s0, _ = weights[0]
            ref = (x.float() @ (w0.float() * s0[:, None]).t())
            cfg = gemv.choose_config(n, k, 1, 1)
            t = candidate_us(lambda: [gemv.gemv(x, w, s, b) for w, s, b in weights],
                             len(weights), "engine")
            line = [f"engine {t:5.1f}"]
            totals["engine"] = totals.get("engine", 0.0) + t
            for (bn, bk) in tiles:
                if bk > k:
                    continue
                for mode in MODES:
                    xm = x16 if mode == "f16" else x
                    t = candidate_us(lambda: [probe(xm, w, s, mode, bn, bk)
                                              for w, s, _ in weights], len(weights), mode)
                    if t is None:
                        continue
                    err = ((probe(xm, w0, s0, mode, bn, bk).float() - ref).abs().max()
                           / ref.abs().max()).item()
                    line.append(f"{mode}@{bn}x{bk} {t:5.1f} ({err:.0e})")
                    key = (mode, bn, bk)
                    totals[key] = totals.get(key, 0.0) + t
            print(f"{model} {name:8s} N={n:5d} K={k:5d} default {cfg['BLOCK_N']}x"
                  f"{cfg['BLOCK_K']}: " + "  ".join(line), flush=True)
            weights = None  # (freed before the next layer's copies)
            torch.cuda.empty_cache()
        print(f"{model} summed over the four layers: " + ", ".join(
            f"{k if isinstance(k, str) else '%s@%dx%d' % k} {v:.1f}"
            for k, v in sorted(totals.items(), key=lambda kv: kv[1])), flush=True)


if __name__ == "__main__":
    main()
