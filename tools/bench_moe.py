"""Time the fused-MoE kernel (CUDA-graph replays, median) over token counts and tile configs,
for one MoE shape; prints achieved bandwidth against the bytes a call must read.

    python tools/bench_moe.py                       # Qwen3-30B-A3B experts at TP=1
    python tools/bench_moe.py --hidden 2048 --inter 384 --experts 128 --top-k 8

Bytes counted: the distinct experts the routing touches (gate, up and down rows), the
activations in and out; FLOPs: 2 * 3 * hidden * inter per (token, expert) pair.
"""
import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import triton_moe  # noqa: E402
from nanovllm.layers.fused_moe import select_experts  # noqa: E402

CONFIGS = {
    "s16x64x128": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    "s16x128x128": dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=3),
    "s16x64x256": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=2),
    "s16x32x128w2": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=2, num_stages=4),
    "s32x64x128": dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3),
    "l64x128x64": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
    "l64x128x64w8": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
    "l128x128x64w8": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
    "l64x64x64": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", default="1,8,32,64,128,256,1024,4096,16384")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    h, i, e, k = args.hidden, args.inter, args.experts, args.top_k
    w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5
    w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5
    names = args.configs.split(",")
    print(f"hidden {h}, inter {i}, experts {e}, top_k {k}; us per call (GB/s achieved)")
    print("tokens experts_hit auto " + " ".join(names))
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        weights, ids = select_experts(torch.randn(t, e, device="cuda"), k, True)
        hit = int(ids.unique().numel())
        nbytes = 2 * (hit * 3 * h * i + t * h * 2 + t * k * (i + h) * 2)
        row = [str(t), str(hit)]
        for name in ["auto"] + names:
            cfg = None if name == "auto" else CONFIGS[name]
            try:
                ms = triton.testing.do_bench_cudagraph(
                    lambda: triton_moe.fused_moe(x, w13, w2, weights, ids, config=cfg),
                    rep=50, return_mode="median")
                row.append(f"{ms * 1e3:.0f}({nbytes / ms / 1e6:.0f})")
            except Exception as ex:  # a config the chip cannot run (shared memory)
                row.append(f"err:{type(ex).__name__}")
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
