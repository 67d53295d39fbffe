"""GPU sweep of the unsplit TMA GEMM's tiles for qkv and the gated gate_up at 17-256 rows:
fp8 weights with e4m3 rows (W8A8, kernels/tma_config.W8A8_TILES or its rule) and bf16 weights'
gated gate_up (tma_config.GATED_TILES), against what the engine runs there today.

    python tools/tile_sweep.py                                # Qwen3-0.6B, both paths
    python tools/tile_sweep.py --models qwen2.5-0.5b,qwen3-8b --paths w8a8 --m 64,128
    python tools/tile_sweep.py --models qwen3-8b --tp 2 --paths w8a8   # one rank's layers

Per layer, path and M (the decode graphs' sizes by default) it prints the shipped choice and
the five fastest candidates (BLOCK_M 64 / 128, BLOCK_N 32 / 64 / 128, BLOCK_K (64 /) 128 / 256,
STAGES 3-5, 4 warps; 8 with 128-row tiles), µs a call (CUDA graph over rotated weight copies,
so weights come from HBM), and beside them bf16 cuBLAS (+ the SiLU-and-mul launch where
gated). Last, the winners as {(path, N, K, gated): {rows: (BLOCK_M, BLOCK_N, BLOCK_K,
STAGES, warps)}}. Configs out of shared memory are skipped.
"""
import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import tma_config, tma_gemm  # noqa: E402
from nanovllm.kernels.fp8_w8a8 import quantize_tokens  # noqa: E402
from nanovllm.kernels.triton_norm import silu_and_mul  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import candidate_us, make_weights, time_graph  # noqa: E402
from tools.split_sweep import GRAPH_ROWS, print_table, report  # noqa: E402


def candidates(path: str):
    """(BLOCK_M, BLOCK_N, BLOCK_K, STAGES, warps) tried (bf16: 64-column K steps too, which
    GATED_TILES holds)."""
    bks = (64, 128, 256) if path == "bf16" else (128, 256)
    for bm, bn, bk, stages in itertools.product((64, 128), (32, 64, 128), bks, (3, 4, 5)):
        yield bm, bn, bk, stages, 8 if bm == 128 else 4


def shipped(path: str, m: int, n: int, k: int, gated: bool):
    """The engine's config for this call as a candidate tuple, or None (cuBLAS)."""
    cfg = (tma_config.w8a8_config(m, n, k, gated) if path == "w8a8"
           else tma_config.choose_config(m, n, k, gated))
    if cfg is None:
        return None
    return cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["STAGES"], cfg["num_warps"]


def sweep_layer(path: str, n: int, k: int, gated: bool, ms) -> dict:
    """{m: best candidate or "cublas"} for one layer (n: outputs; gated: [2n, k] weights)."""
    bf16 = torch.bfloat16
    rows = 2 * n if gated else n
    ws = make_weights(rows, k, "fp8_row" if path == "w8a8" else "bf16")
    wb = ws if path == "bf16" else make_weights(rows, k, "bf16")
    best = {}
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=bf16)
        xq, xs = quantize_tokens(x)
        xs = xs.view(-1).contiguous()

        def call(c):
            cfg = dict(BLOCK_M=c[0], BLOCK_N=c[1], BLOCK_K=c[2], SPLIT=1, STAGES=c[3],
                       num_warps=c[4])
            if path == "w8a8":
                return lambda: [tma_gemm.w8a8_gemm(xq, xs, w, s, None, bf16, gated=gated,
                                                   config=cfg) for w, s, _ in ws]
            return lambda: [tma_gemm.tma_gemm(x, w, gated=gated, config=cfg) for w, _, _ in ws]

        def cublas():
            for w, _, _ in wb:
                y = F.linear(x, w)
                if gated:
                    silu_and_mul(y)

        times = {}
        for c in candidates(path):
            if c[2] <= k:
                t = candidate_us(call(c), len(ws), c)
                if t is not None:
                    times[c] = t
        times["cublas"] = time_graph(cublas, len(wb)) * 1e3
        best[m] = report(m, shipped(path, m, n, k, gated) or "cublas", times)
    return best


def main():
    """Sweep the layers and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3-0.6b")
    ap.add_argument("--paths", default="w8a8,bf16", help="w8a8 (qkv, gate_up), bf16 (gate_up)")
    ap.add_argument("--m", default=GRAPH_ROWS)
    ap.add_argument("--tp", type=int, default=1, help="one rank's layers at this TP size")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    assert all(tma_gemm.MIN_M <= m <= tma_gemm.MAX_M for m in ms), ms
    table = {}
    for model, path in itertools.product(args.models.split(","), args.paths.split(",")):
        shapes = linear_shapes(model, args.tp)
        for name in ("qkv", "gate_up") if path == "w8a8" else ("gate_up",):
            if name not in shapes:  # MoE: experts, not a gate_up layer
                continue
            gated = name == "gate_up"
            n, k = shapes[name]
            n = n // 2 if gated else n
            print(f"{model} {name} N={n} K={k} {path}", flush=True)
            table[(path, n, k, gated)] = sweep_layer(path, n, k, gated, ms)
    print_table("TILES", table)


if __name__ == "__main__":
    main()
