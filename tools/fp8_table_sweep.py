"""The skinny GEMM's fp8 tile table (skinny_config.FP8_TABLE) on this GPU: candidate tiles,
stages and splits on each layer of the models at a few rows, against the table's pick.

    python tools/fp8_table_sweep.py [--models qwen3-8b,qwen3-0.6b] [--m 1,16] [--kind fp8_row]

Per (layer, M): the table's µs and the five best candidates. Then, per weight-width bucket
(N <= 16384 and wider, the table's rows), each candidate's µs summed over the bucket's
layers and M values against the table's sum: what a table row would give.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import skinny_config, skinny_gemm  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import candidate_us, make_weights, tally, time_skinny  # noqa: E402

# (BLOCK_N, BLOCK_K, num_warps, num_stages); each with SPLIT_K None (the rule), 1, 2 and 4.
TILES = [(32, 256, 4, 4), (32, 512, 4, 3), (32, 256, 4, 6), (32, 512, 4, 4), (32, 128, 4, 6),
         (64, 256, 4, 4), (64, 256, 4, 3), (64, 256, 4, 5), (64, 128, 4, 6), (64, 512, 8, 3),
         (64, 256, 8, 4), (128, 128, 4, 4), (128, 256, 8, 3), (16, 512, 4, 4)]


def candidates(kind: str, n: int, k: int):
    """Configs for an [N, K] weight: block scales cap BLOCK_K at the 128-column block."""
    seen = set()
    for bn, bk, warps, stages in TILES:
        bk = min(bk, 128) if kind == "fp8_block" else bk
        for split in (None, 1, 2, 4):
            key = (bn, bk, warps, stages, split)
            if key in seen or (split and k // split < bk):
                continue
            seen.add(key)
            yield key, dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps,
                            num_stages=stages)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-0.6b")
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--kind", default="fp8_row", choices=("fp8_row", "fp8_block"))
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    buckets: dict = {}  # bucket -> {"table": us, key: (us, count)}
    for model in args.models.split(","):
        for name, (n, k) in linear_shapes(model).items():
            if name == "lm_head":
                continue
            weights = make_weights(n, k, args.kind)
            bucket = buckets.setdefault("N<=16384" if n <= 16384 else "N>16384", {"table": 0.0})
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                t_table = time_skinny(x, weights) * 1e3
                bucket["table"] += t_table
                row = []
                for key, cfg in candidates(args.kind, n, k):
                    t = candidate_us(lambda: [skinny_gemm.gemm(x, w, None, s, b, config=cfg)
                                              for w, s, b in weights], len(weights), key)
                    if t is None:
                        continue
                    row.append((t, key))
                    tally(bucket, key, t)
                row.sort()
                best = ", ".join(f"{t:.1f} {key}" for t, key in row[:5])
                print(f"{model:10s} {name:8s} N={n:5d} K={k:5d} M={m:2d}  table {t_table:5.1f}  "
                      f"best {best}", flush=True)
            weights = None
            torch.cuda.empty_cache()
    table_cfgs = {b: c for b, c in zip(("N<=16384", "N>16384"),
                                       (c for _, _, c in skinny_config.FP8_TABLE))}
    for bucket, sums in buckets.items():
        full = max(v[1] for key, v in sums.items() if key != "table")
        ranked = sorted((v[0], key) for key, v in sums.items() if key != "table" and v[1] == full)
        print(f"{bucket}: table {sums['table']:.1f} us ({table_cfgs[bucket]}); best: "
              + ", ".join(f"{t:.1f} {key}" for t, key in ranked[:5]))


if __name__ == "__main__":
    main()
