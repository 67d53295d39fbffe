"""bf16 weights at batched-decode sizes (32 <= M <= 256): the skinny kernel with tall tiles
(and its prologues: residual add + RMSNorm before qkv / gate_up, SiluAndMul before down)
against what the engine runs there today, the op's own kernel then cuBLAS.

    python tools/mid_gemm_sweep.py [--model qwen2.5-0.5b] [--m 64,128,256] [--json out.json]

Every call reads another copy of the weight (from HBM, as a forward does). Per layer and M
it prints cuBLAS alone, the op kernel + cuBLAS, and the three best tall configs without and
with the prologue (us a call); then per M the totals over the layers.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import skinny_gemm  # noqa: E402
from nanovllm.kernels.triton_norm import rms_norm, silu_and_mul  # noqa: E402
from tools.bench_gemm import layer_sweep_args, make_weights, time_graph  # noqa: E402

PROLOGUES = {"qkv": "norm", "gate_up": "norm", "down": "silu_mul"}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K); None: the kernel's rule.
CANDIDATES = [(64, 64, 64, 4, 4, None), (64, 64, 128, 4, 3, None), (64, 128, 64, 4, 4, None),
              (64, 128, 64, 8, 4, None), (64, 128, 128, 8, 3, None), (128, 64, 64, 4, 4, None),
              (128, 128, 64, 8, 4, None), (128, 128, 64, 8, 3, 1), (64, 64, 64, 4, 4, 1),
              (64, 64, 64, 4, 4, 2), (64, 128, 64, 4, 4, 2), (32, 64, 128, 4, 4, None),
              (64, 256, 64, 8, 3, None), (128, 256, 64, 8, 3, 1)]


def layer_calls(name, n, k, m):
    """(inputs maker, cuBLAS-after-op fn, fused fn) for one layer at M rows."""
    kind = PROLOGUES.get(name)
    g = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    if kind == "silu_mul":
        x = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
        return (lambda w: F.linear(silu_and_mul(x), w),
                lambda w, cfg: skinny_gemm.gemm(x, w, config=cfg, block_m=cfg["BLOCK_M"],
                                                act="silu_mul"), x)
    x, r = torch.randn(2, m, k, device="cuda", dtype=torch.bfloat16)
    if kind == "norm":
        return (lambda w: F.linear(rms_norm(x, g, 1e-6, r)[0], w),
                lambda w, cfg: skinny_gemm.gemm(x, w, config=cfg, block_m=cfg["BLOCK_M"],
                                                norm_weight=g, residual=r, eps=1e-6)[0], x)
    return None, None, x


def best_tall(x, weights, fused=None):
    """[(us, config key)] of every candidate that compiles, fastest first."""
    row = []
    for bm, bn, bk, warps, stages, split in CANDIDATES:
        if bm > max(x.shape[0], 32):
            continue
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps,
                   num_stages=stages)
        if fused is None:
            fn = (lambda: [skinny_gemm.gemm(x, w, config=cfg, block_m=bm)
                           for w, _, _ in weights])
        else:
            fn = (lambda: [fused(w, cfg) for w, _, _ in weights])
        try:
            row.append((time_graph(fn, calls=len(weights)) * 1e3,
                        (bm, bn, bk, warps, stages, split)))
        except Exception as e:  # out of shared memory or registers: skip it
            print(f"    skip {cfg}: {type(e).__name__}", flush=True)
    return sorted(row)


def main():
    args, ms, layers = layer_sweep_args(__doc__, "qwen2.5-0.5b", "64,128,256")
    out = {}
    for name, (n, k) in layers.items():
        weights = make_weights(n, k, "bf16")
        for m in ms:
            unfused, fused, x = layer_calls(name, n, k, m)
            xk = x[:, :k] if name == "down" else x
            t_cub = time_graph(lambda: [F.linear(xk, w) for w, _, _ in weights],
                               calls=len(weights)) * 1e3
            t_unf = (time_graph(lambda: [unfused(w) for w, _, _ in weights],
                                calls=len(weights)) * 1e3 if unfused else t_cub)
            plain = best_tall(xk.contiguous(), weights)
            pro = best_tall(x, weights, fused) if fused else plain
            out[f"{name} {m}"] = dict(cublas=t_cub, op_cublas=t_unf, tall=plain[:3],
                                      tall_fused=pro[:3])
            fmt = ", ".join
            print(f"{name:8s} N={n:5d} K={k:5d} M={m:4d}  cuBLAS {t_cub:6.1f}  op+cuBLAS "
                  f"{t_unf:6.1f}  tall {fmt(f'{t:.1f} {c}' for t, c in plain[:3])}  fused "
                  f"{fmt(f'{t:.1f} {c}' for t, c in pro[:3])}", flush=True)
        weights = None
        torch.cuda.empty_cache()
    for m in ms:
        rows = [v for key, v in out.items() if key.endswith(f" {m}")]
        print(f"M={m:4d} over the layers: cuBLAS {sum(r['cublas'] for r in rows):6.1f}  "
              f"op+cuBLAS {sum(r['op_cublas'] for r in rows):6.1f}  best tall "
              f"{sum(r['tall'][0][0] for r in rows):6.1f}  best fused "
              f"{sum(r['tall_fused'][0][0] for r in rows):6.1f} us")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
