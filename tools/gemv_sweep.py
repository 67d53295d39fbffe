"""Tiles for the GEMV (nanovllm/kernels/gemv.py) at one to four rows, timed against the path
it would replace: the skinny GEMM for fp8 weights and the int8 LM head copy, cuBLAS for bf16
ones.

    python tools/gemv_sweep.py [--models qwen3-8b] [--weights fp8|bf16|int8] [--rows 1,2,3,4]
                               [--layers qkv,o,gate_up,down,lm_head] [--top 5]
                               [--tiles 4x2048x4x1,...] [--groups 1,16] [--evict ,evict_first]
                               [--w-vec 0,8]

--tiles (BLOCK_N x BLOCK_K x warps x stages), --groups and --evict replace TILES and the
GROUP / eviction choices swept; --w-vec 0,8 tries fp8 W in 8-byte vectors too (gemv.W_VEC).

--weights int8: layers/quant/int8_head's codes and per-row block scales (the LM head copy;
pass --layers lm_head).

Per layer and row count: the baseline, the GEMV at choose_config's tiles ("default"), and
the five best of TILES x GROUP (1 / 16 products summed per thread) x W's eviction (normal /
evict-first), each with its error against the fp32 reference. Each call reads another copy
of the weights (256 MB in all, so nothing stays in L2), in one CUDA graph.

The split-K and integer-widening variants of the first sweeps (docs/PERF_NOTES.md, 44th
session) lost on every layer and are gone.
"""
import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import gemv  # noqa: E402
from nanovllm.layers.quant import int8_head  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import (candidate_us, make_weights, time_cublas,  # noqa: E402
                              time_skinny)

# (BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = [(8, 512, 4, 3), (16, 256, 4, 3), (16, 512, 4, 3), (16, 512, 8, 3), (32, 256, 4, 3),
         (32, 256, 8, 3), (16, 256, 4, 4), (8, 1024, 4, 3), (32, 512, 8, 2), (64, 128, 4, 4),
         (8, 256, 4, 4), (4, 1024, 4, 3)]


def time_gemv(x, weights, cfg, label):
    """µs a call of the GEMV at this config over the weight copies (None: did not compile)."""
    return candidate_us(lambda: [gemv.gemv(x, w, s, b, config=cfg) for w, s, b in weights],
                        len(weights), label)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3-8b")
    ap.add_argument("--weights", choices=("fp8", "bf16", "int8"), default="fp8")
    ap.add_argument("--rows", default="1,2,3,4")
    ap.add_argument("--layers", default="qkv,o,gate_up,down", help="lm_head too, if asked")
    ap.add_argument("--tiles", help="BLOCK_N x BLOCK_K x warps x stages,... instead of TILES")
    ap.add_argument("--top", type=int, default=5, help="how many of the best to print")
    ap.add_argument("--groups", default="1,16", help="GROUP values to try")
    ap.add_argument("--evict", default=",evict_first", help="W's eviction policies to try")
    ap.add_argument("--w-vec", default="0", help="W_VEC values to try (8: 8-byte W vectors, "
                    "GROUP at most 8)")
    args = ap.parse_args()
    tiles = ([tuple(map(int, t.split("x"))) for t in args.tiles.split(",")] if args.tiles
             else TILES)
    fp8 = args.weights == "fp8"
    skinny = args.weights != "bf16"  # the baseline: the skinny GEMM or cuBLAS
    for model, m in itertools.product(args.models.split(","),
                                      [int(r) for r in args.rows.split(",")]):
        for name, (n, k) in linear_shapes(model).items():
            if name not in args.layers.split(","):
                continue
            weights = make_weights(n, k, "fp8_row" if fp8 else "bf16")
            if args.weights == "int8":
                weights = [int8_head.quantize(w) for w, _, _ in weights]
                weights = [(c, s, (1, b)) for c, s, b in weights]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w0, s0, b0 = weights[0]
            if args.weights == "int8":
                wf = int8_head.dequantize(w0, s0, b0[1], torch.float32)
            else:
                wf = w0.float() * (s0[:, None] if fp8 else 1)
            ref = x.float() @ wf.t()
            t_base = (time_skinny(x, weights) if skinny else time_cublas(m, n, k)) * 1e3
            default = gemv.choose_config(n, k, w0.element_size(), m,
                                         grouped=args.weights == "int8")
            t_default = time_gemv(x, weights, default, "default")
            row = []
            for (bn, bk, warps, stages), group, evict, vec in itertools.product(
                    tiles, [int(g) for g in args.groups.split(",")],
                    args.evict.split(","), [int(v) for v in args.w_vec.split(",")]):
                if bk > k or (m > 1 and group == 1):  # (an fp32 accumulator a row: too big)
                    continue
                group = min(group, vec or group)
                cfg = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
                           GROUP=group, W_EVICT=evict, W_VEC=vec)
                key = (bn, bk, warps, stages, f"g{group}", "evict" if evict else "",
                       f"v{vec}")
                t = time_gemv(x, weights, cfg, key)
                if t is None:
                    continue
                y = gemv.gemv(x, w0, s0, b0, config=cfg).float()
                row.append((t, key, ((y - ref).abs().max() / ref.abs().max()).item()))
            row.sort()
            best = ", ".join(f"{t:.1f} {key} err {e:.1e}" for t, key, e in row[:args.top])
            gbs = n * k * (1 if skinny else 2) / t_base / 1e3
            print(f"{model:10s} M={m} {name:8s} N={n:5d} K={k:5d}  "
                  f"{'skinny' if skinny else 'cuBLAS'} {t_base:5.1f} ({gbs:4.0f} GB/s)  "
                  f"default {t_default or float('nan'):5.1f}  best {best}", flush=True)
            del weights
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
