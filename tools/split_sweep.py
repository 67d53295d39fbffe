"""GPU sweep of the split-K TMA GEMM's tiles for o / down (kernels/tma_config.SPLIT_TILES), each
call timed with the residual-add RMSNorm that adds its partials, as the engine runs them.

    python tools/split_sweep.py                               # Qwen3-0.6B, bf16 and fp8 rows
    python tools/split_sweep.py --models qwen2.5-0.5b,smollm2-135m --m 64,128
    python tools/split_sweep.py --refine      # the table's tiles at other K steps / stages

Per layer, weights and M (the decode graphs' sizes in 17-256 by default) it prints the shipped
choice (tma_config.split_config, "-": cuBLAS + the norm) and the five fastest candidates,
BLOCK_M 64 / 128 x BLOCK_N 32 / 64 x SPLIT 2 / 4 / 8, µs a call (CUDA graph over rotated
weight copies, so weights come from HBM); cuBLAS + the norm beside them. Last, the winners as
SPLIT_TILES entries: {(fp8, N, K): {rows: (BLOCK_M, BLOCK_N, SPLIT)}}, "cublas" where no
split beat it. fp8 rows' norm writes e4m3 rows (W8A8's), as the engine's does. --refine keeps
each call's tiles (split_config's) and tries the K steps and stages of REFINE instead,
printing 5-tuples (BLOCK_M, BLOCK_N, SPLIT, BLOCK_K, STAGES).
"""
import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import fp8_gemm, tma_config, tma_gemm  # noqa: E402
from nanovllm.kernels.triton_norm import rms_norm  # noqa: E402
from nanovllm.utils.model_shapes import linear_shapes  # noqa: E402
from tools.bench_gemm import candidate_us, make_weights, time_graph  # noqa: E402

GRAPH_ROWS = "24,32,48,64,96,128,160,192,224,256"
REFINE = ((128, 4), (128, 3), (128, 6), (256, 3), (256, 4))  # (BLOCK_K, STAGES)


def candidates(m: int, k: int, base: dict | None = None):
    """(BLOCK_M, BLOCK_N, SPLIT, BLOCK_K, STAGES) tried at m rows: 128-row tiles only past 64
    rows, every split keeping at least one K step; given a base config, its tiles at REFINE's
    K steps and stages."""
    if base is not None:
        for bk, stages in REFINE:
            if k >= base["SPLIT"] * bk:
                yield base["BLOCK_M"], base["BLOCK_N"], base["SPLIT"], bk, stages
        return
    for bm, bn, split in itertools.product((64, 128), (32, 64), (2, 4, 8)):
        if k >= split * 128 and (bm == 64 or m > 64):
            yield bm, bn, split, 128, 4


def sweep_layer(n: int, k: int, kind: str, ms, refine: bool = False) -> dict:
    """{m: (BLOCK_M, BLOCK_N, SPLIT) or "cublas"} for one layer, printing each M's line."""
    fp8, bf16 = kind != "bf16", torch.bfloat16
    ws = make_weights(n, k, kind)
    gain = torch.rand(n, device="cuda", dtype=bf16) + 0.5
    best = {}
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=bf16)
        r = torch.randn(m, n, device="cuda", dtype=bf16)

        def split(cfg):
            return lambda: [rms_norm(tma_gemm.tma_partials(x, w, s, None, config=cfg), gain,
                                     1e-6, r, dtype=bf16, quantize=fp8) for w, s, _ in ws]

        def cublas():
            for w, s, _ in ws:
                wt = fp8_gemm.dequantize(w, s, None, bf16) if fp8 else w
                rms_norm(F.linear(x, wt), gain, 1e-6, r, quantize=fp8)

        ship = tma_config.split_config(m, n, k, fp8)
        if refine and ship is None:
            continue
        times = {}
        for c in candidates(m, k, ship if refine else None):
            t = candidate_us(split(dict(BLOCK_M=c[0], BLOCK_N=c[1], SPLIT=c[2], BLOCK_K=c[3],
                                        STAGES=c[4], num_warps=4)), len(ws), c)
            if t is not None:  # (None: out of shared memory)
                times[c] = t
        times["cublas"] = time_graph(cublas, len(ws)) * 1e3
        ship_key = (ship["BLOCK_M"], ship["BLOCK_N"], ship["SPLIT"], ship["BLOCK_K"],
                    ship["STAGES"]) if ship else "cublas"
        best[m] = report(m, ship_key, times)
    return best


def report(m: int, ship_key, times: dict):
    """Prints one M's line (the shipped choice's µs, the five fastest, cuBLAS's) and returns
    the fastest candidate (or "cublas")."""
    top = sorted(times.items(), key=lambda kv: kv[1])[:5]
    print(f"  M={m:4d} shipped {ship_key} {times.get(ship_key, float('nan')):6.2f} | "
          + "  ".join(f"{c} {t:.2f}" for c, t in top)
          + f" | cublas {times['cublas']:.2f}", flush=True)
    return top[0][0]


def print_table(name: str, table: dict) -> None:
    """The winners as a Python dict literal named name."""
    print(f"{name} = {{")
    for key, rows in table.items():
        print(f"    {key}: {rows},")
    print("}")


def main():
    """Sweep the layers and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3-0.6b")
    ap.add_argument("--weights", default="bf16,fp8_row")
    ap.add_argument("--m", default=GRAPH_ROWS)
    ap.add_argument("--refine", action="store_true", help="K steps / stages of the table's tiles")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    assert all(tma_gemm.MIN_M <= m <= tma_gemm.MAX_M for m in ms), ms
    table = {}
    for model, kind in itertools.product(args.models.split(","), args.weights.split(",")):
        for name in ("o", "down"):
            n, k = linear_shapes(model)[name]
            if n > 2048:
                continue  # (wide layers are not split: tma_config.split_config)
            print(f"{model} {name} N={n} K={k} {kind}", flush=True)
            table[(kind != "bf16", n, k)] = sweep_layer(n, k, kind, ms, args.refine)
    print_table("SPLIT_TILES", table)


if __name__ == "__main__":
    main()
