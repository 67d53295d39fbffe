"""fp8 weights at batched-decode sizes (17 <= M <= 256): tall-tile configs of the skinny
kernel (W8A16, the weight widened in registers) against dequantize + cuBLAS (today's path)
and bf16 cuBLAS, on one model's layers; then the per-M config with the least total time.

    python tools/fp8_tall_sweep.py [--model qwen3-0.6b] [--m 32,64,128,256] [--json out.json]
        [--swap both|only|off]

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

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SWAP); SPLIT_K chosen by the kernel
# (None). SWAP: y^T's tiles, the widened W tile as the dot's first operand (Hopper's wgmma
# can keep it in registers; its M side, BLOCK_N here, wants 64 a warpgroup).
CANDIDATES = [(32, 64, 128, 4, 4, 0), (32, 128, 128, 4, 4, 0), (32, 64, 256, 4, 3, 0),
              (64, 64, 128, 4, 4, 0), (64, 128, 128, 4, 3, 0), (64, 128, 128, 8, 3, 0),
              (64, 64, 256, 4, 3, 0), (64, 128, 64, 4, 4, 0), (128, 64, 128, 4, 3, 0),
              (128, 64, 128, 8, 3, 0), (128, 128, 64, 8, 4, 0), (128, 128, 128, 8, 3, 0),
              (16, 64, 128, 4, 4, 1), (32, 64, 128, 4, 4, 1), (32, 64, 256, 4, 3, 1),
              (32, 128, 128, 4, 3, 1), (64, 64, 128, 4, 4, 1), (64, 128, 128, 4, 3, 1),
              (64, 128, 128, 8, 3, 1), (128, 128, 64, 8, 4, 1), (128, 128, 128, 8, 3, 1)]
KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SWAP")


def main():
    args, ms, layers = layer_sweep_args(__doc__, "qwen3-0.6b", "32,64,128,256", swap=True)
    totals = {m: {"dequant": 0.0, "bf16": 0.0, "tall": {}} for m in ms}
    for name, (n, k) in layers.items():
        weights = make_weights(n, k, "fp8_row")
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t_deq = time_graph(lambda: [F.linear(x, fp8_gemm.dequantize(w, s, b, x.dtype))
                                        for w, s, b in weights], calls=len(weights)) * 1e3
            t_bf = time_cublas(m, n, k) * 1e3
            row = []
            for key in CANDIDATES:
                bm = key[0]
                if bm > max(m, 32) or (args.swap == "only" and not key[-1]) or (
                        args.swap == "off" and key[-1]):
                    continue
                cfg = dict(zip(KEYS, key), SPLIT_K=None, SWAP=bool(key[-1]))
                t = candidate_us(lambda: [skinny_gemm.gemm(x, w, None, s, b, config=cfg,
                                                           block_m=bm)
                                          for w, s, b in weights], len(weights), cfg)
                if t is None:
                    continue
                tally(totals[m]["tall"], key, t)
                row.append((t, key))
            row.sort()
            best = ", ".join(f"{t:.1f} {key}" for t, key in row[:3])
            print(f"{name:8s} N={n:5d} K={k:5d} M={m:4d}  dequant+cuBLAS {t_deq:6.1f}  "
                  f"bf16 cuBLAS {t_bf:6.1f}  tall best {best}", flush=True)
            totals[m]["dequant"] += t_deq
            totals[m]["bf16"] += t_bf
        del weights
        torch.cuda.empty_cache()
    out = {}
    for m in ms:
        key, t = best_complete(totals[m]["tall"], len(layers))
        out[m] = dict(config=dict(zip(KEYS, key)),
                      tall=t, dequant=totals[m]["dequant"], bf16=totals[m]["bf16"])
        print(f"M={m:4d} over the layers: tall {t:6.1f} us {key}   dequant+cuBLAS "
              f"{totals[m]['dequant']:6.1f}   bf16 cuBLAS {totals[m]['bf16']:6.1f}")
        for form in (0, 1):  # each tile form's own best (y's tiles, y^T's)
            part = {k: v for k, v in totals[m]["tall"].items() if k[-1] == form}
            if any(seen == len(layers) for _, seen in part.values()):
                print(f"         SWAP={form}: {best_complete(part, len(layers))}")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
