"""The decode kernel alone, at tools/bench_splits.py's mixed contexts, for Nsight Compute.

    ncu -k regex:_decode_partial --launch-skip 2 --launch-count 1 \
        python tools/ncu_decode.py qwen3-fp8 [--batch 256] [--config KEY=INT ...]

Two layers, three rounds over them (the first compiles): skip two launches to profile a
warm one. --config sets decode tunables as bench_splits.py's does.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench_splits  # noqa: E402
from nanovllm.kernels import triton_decode  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=list(bench_splits.MODELS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--config", nargs="*", default=[], metavar="KEY=INT")
    ap.add_argument("--max-ctx", type=int, default=2048,
                    help="contexts drawn from 100 to this (the engine's mid-run: ~1,100)")
    args = ap.parse_args()
    bench_splits.apply_config(args.config)
    h, hkv, d, dtype, _ = bench_splits.MODELS[args.model]
    bench_splits.MODELS[args.model] = (h, hkv, d, dtype, 2)
    ctx, order, tables, layers = bench_splits.make_layers(args.model, args.batch,
                                                          contexts=(100, args.max_ctx))
    for _ in range(3):
        for q, kc, vc, sc in layers:
            triton_decode.decode_attention(q, kc, vc, ctx, tables, d ** -0.5, order=order, **sc)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
