"""fp8 weights at batched-decode sizes (17 <= M <= 256): tall-tile configs of the skinny
kernel (W8A16, the weight widened in registers) against dequantize + cuBLAS (today's path)
and bf16 cuBLAS, on one model's layers; then the per-M config with the least total time.

    python tools/fp8_tall_sweep.py [--model qwen3-0.6b] [--m 32,64,128,256] [--json out.json]

The json maps each M to its best config and the three paths' totals (us over the layers),
for fp8_gemm.TALL_CONFIGS / DEQUANT_FROM_M.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import fp8_gemm, skinny_gemm  # noqa: E402
from tools.bench_gemm import (best_complete, candidate_us, layer_sweep_args,  # noqa: E402
                              make_weights, tally, time_cublas, time_graph)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); SPLIT_K chosen by the kernel (None).
CANDIDATES = [(32, 64, 128, 4, 4), (32, 128, 128, 4, 4), (32, 64, 256, 4, 3),
              (64, 64, 128, 4, 4), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3),
              (64, 64, 256, 4, 3), (64, 128, 64, 4, 4), (128, 64, 128, 4, 3),
              (128, 64, 128, 8, 3), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3)]


def main():
    args, ms, layers = layer_sweep_args(__doc__, "qwen3-0.6b", "32,64,128,256")
    totals = {m: {"dequant": 0.0, "bf16": 0.0, "tall": {}} for m in ms}
    for name, (n, k) in layers.items():
        weights = make_weights(n, k, "fp8_row")
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t_deq = time_graph(lambda: [F.linear(x, fp8_gemm.dequantize(w, s, b, x.dtype))
                                        for w, s, b in weights], calls=len(weights)) * 1e3
            t_bf = time_cublas(m, n, k) * 1e3
            row = []
            for bm, bn, bk, warps, stages in CANDIDATES:
                if bm > max(m, 32):
                    continue
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=None, num_warps=warps,
                           num_stages=stages)
                t = candidate_us(lambda: [skinny_gemm.gemm(x, w, None, s, b, config=cfg,
                                                           block_m=bm)
                                          for w, s, b in weights], len(weights), cfg)
                if t is None:
                    continue
                key = (bm, bn, bk, warps, stages)
                tally(totals[m]["tall"], key, t)
                row.append((t, key))
            row.sort()
            best = ", ".join(f"{t:.1f} {key}" for t, key in row[:3])
            print(f"{name:8s} N={n:5d} K={k:5d} M={m:4d}  dequant+cuBLAS {t_deq:6.1f}  "
                  f"bf16 cuBLAS {t_bf:6.1f}  tall best {best}", flush=True)
            totals[m]["dequant"] += t_deq
            totals[m]["bf16"] += t_bf
        weights = None
        torch.cuda.empty_cache()
    out = {}
    for m in ms:
        key, t = best_complete(totals[m]["tall"], len(layers))
        out[m] = dict(config=dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps",
                                       "num_stages"), key)),
                      tall=t, dequant=totals[m]["dequant"], bf16=totals[m]["bf16"])
        print(f"M={m:4d} over the layers: tall {t:6.1f} us {key}   dequant+cuBLAS "
              f"{totals[m]['dequant']:6.1f}   bf16 cuBLAS {totals[m]['bf16']:6.1f}")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
