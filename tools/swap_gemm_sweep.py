"""A swapped-operand GEMM at batched-decode sizes (17 <= M <= 256), timed against cuBLAS.

y^T = W @ x^T: a program owns BLOCK_N rows of W (wgmma's M side, 64 a warpgroup) and
BLOCK_M rows of x (wgmma's N side, which may be as small as 8). W is the first dot operand,
so an fp8 tile widened to bf16 in registers feeds the tensor cores from registers, with no
trip through shared memory; the skinny kernel (skinny_gemm.py) takes W as the second operand,
which wgmma reads only from shared memory. Row scales multiply the accumulator's rows.

    python tools/swap_gemm_sweep.py [--model qwen3-0.6b] [--m 32,64,128,256] [--weights fp8]

Per layer and M: bf16 cuBLAS, the fp8 path of today (dequantize + cuBLAS) where --weights
fp8, and the swapped kernel's three best configs; then each config's sum over the layers.
Each call reads another copy of the weight (one CUDA graph), as a decode step would.
"""
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import fp8_gemm  # noqa: E402
from tools.bench_gemm import (best_complete, candidate_us, layer_sweep_args,  # noqa: E402
                              make_weights, tally, time_cublas, time_graph)


@triton.jit
def _swap_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 SCALED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n, mask_m = offs_n < N, offs_m < M
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    x_cols = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm + offs_k[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # K is a multiple of BLOCK_K (every model shape's is)
        w = tl.load(w_rows + k0, mask=mask_n[:, None], other=0.0)
        xt = tl.load(x_cols + k0, mask=mask_m[None, :], other=0.0)
        acc = tl.dot(w.to(xt.dtype), xt, acc)
    if SCALED:
        acc *= tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)[:, None]
    tl.store(y_ptr + offs_m.to(tl.int64)[None, :] * stride_ym + offs_n[:, None],
             acc.to(y_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


def swap_gemm(x, w, scale, cfg):
    """x[M, K] @ (w * scale[:, None])[N, K]^T in x's dtype, by _swap_kernel with cfg's tiles."""
    m, k = x.shape
    n = w.shape[0]
    assert k % cfg["BLOCK_K"] == 0
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
    _swap_kernel[grid](x, w, scale if scale is not None else x, y, m, n, k, x.stride(0),
                       w.stride(0), y.stride(0), SCALED=scale is not None,
                       BLOCK_N=cfg["BLOCK_N"], BLOCK_M=cfg["BLOCK_M"], BLOCK_K=cfg["BLOCK_K"],
                       num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y


# (BLOCK_N, BLOCK_M, BLOCK_K, num_warps, num_stages); BLOCK_M above M is skipped.
CANDIDATES = [(64, 32, 128, 4, 4), (64, 64, 128, 4, 4), (128, 32, 128, 4, 4),
              (128, 64, 128, 4, 4), (128, 64, 128, 8, 3), (64, 32, 256, 4, 3),
              (64, 64, 256, 4, 3), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3),
              (64, 128, 128, 4, 3), (128, 256, 64, 8, 3), (64, 256, 64, 4, 3)]


def main():
    args, ms, layers = layer_sweep_args(__doc__, "qwen3-0.6b", "32,64,128,256",
                                        weights=("fp8", "bf16"))
    kind = "fp8_row" if args.weights == "fp8" else "bf16"
    totals = {m: {"cublas": 0.0, "dequant": 0.0, "swap": {}, "best": 0.0} for m in ms}
    for name, (n, k) in layers.items():
        weights = make_weights(n, k, kind)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w0, s0, _ = weights[0]
            ref = F.linear(x, fp8_gemm.dequantize(w0, s0, None, x.dtype) if s0 is not None
                           else w0)
            t_bf = time_cublas(m, n, k) * 1e3
            t_deq = float("nan")
            if s0 is not None:
                t_deq = time_graph(lambda: [F.linear(x, fp8_gemm.dequantize(w, s, b, x.dtype))
                                            for w, s, b in weights], calls=len(weights)) * 1e3
            row = []
            for bn, bm, bk, warps, stages in CANDIDATES:
                if bm > max(m, 32) or k % bk:
                    continue
                cfg = dict(BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, num_warps=warps,
                           num_stages=stages)
                t = candidate_us(lambda: [swap_gemm(x, w, s, cfg) for w, s, _ in weights],
                                 len(weights), cfg)
                if t is None:
                    continue
                err = (swap_gemm(x, w0, s0, cfg).float() - ref.float()).abs().max().item()
                key = (bn, bm, bk, warps, stages)
                tally(totals[m]["swap"], key, t)
                row.append((t, key, err))
            row.sort()
            totals[m]["best"] += row[0][0]
            best = ", ".join(f"{t:.1f} {key} err {e:.2g}" for t, key, e in row[:3])
            print(f"{name:8s} N={n:5d} K={k:5d} M={m:4d}  cuBLAS bf16 {t_bf:5.1f}  dequant+cuBLAS "
                  f"{t_deq:5.1f}  swap {best}", flush=True)
            totals[m]["cublas"] += t_bf
            totals[m]["dequant"] += t_deq
        weights = None
        torch.cuda.empty_cache()
    for m in ms:
        key, t = best_complete(totals[m]["swap"], len(layers))
        print(f"M={m:4d} over the layers: swap {t:6.1f} us {key}   cuBLAS bf16 "
              f"{totals[m]['cublas']:6.1f}   dequant+cuBLAS {totals[m]['dequant']:6.1f}   "
              f"swap, each layer's best {totals[m]['best']:6.1f}")


if __name__ == "__main__":
    main()
