"""The fp8 decode over V pages tiled (kv_cache.tile_v_pages, CONFIG_FP8["V_TILE"]) against
the usual layout: the same output, then us a layer for each, alternating, as
tools/bench_splits.py times them (Qwen3-0.6B's fp8 cache, bench-like contexts, one split).

    python tools/v_tile_check.py [--batches 64 128 256] [--rounds 2] [--v-last 0 1 2]

--v-last times the tiled form once for each way of zeroing the last tile's keys past a
context (CONFIG_FP8["V_LAST"], decode_tiles.attend_tiles).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from nanovllm.kernels import decode_config, triton_decode  # noqa: E402
from tools.bench_splits import make_layers, us_per_layer  # noqa: E402


def tiled(v: torch.Tensor, tile: int) -> torch.Tensor:
    """A [pages, BLOCK, kv heads, dim] cache's values in tiled pages ([pages, kv heads,
    BLOCK / tile, dim, tile], a new tensor)."""
    p, b, h, d = v.shape
    return v.view(p, b // tile, tile, h, d).permute(0, 3, 1, 4, 2).contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tile", type=int, default=64, help="keys a V tile (V_TILE)")
    ap.add_argument("--v-last", type=int, nargs="+", default=[None], help="V_LAST values")
    args = ap.parse_args()
    tile = args.tile
    for batch in args.batches:
        ctx, order, tables, layers = make_layers("qwen3-fp8", batch)
        moved = [(q, k, tiled(v, tile), sc) for q, k, v, sc in layers]
        q, k, v, sc = layers[0]
        scale = q.shape[-1] ** -0.5
        ref, out = (triton_decode.decode_attention(q, k, vc, ctx, tables, scale, num_splits=1,
                                                   order=order, **sc)
                    for vc in (v, moved[0][2]))
        err = (out.float() - ref.float()).abs().max().item()
        row = []
        cfg = decode_config.CONFIG_FP8
        keep = cfg["V_LAST"]
        runs = [("usual", layers, keep)] + [(f"tiled{'' if vl is None else vl}", moved,
                                             keep if vl is None else vl) for vl in args.v_last]
        for _ in range(args.rounds):
            for name, ls, vl in runs:
                cfg["V_LAST"] = vl
                if vl != keep:  # each form's output checked too
                    o = triton_decode.decode_attention(q, k, moved[0][2], ctx, tables, scale,
                                                       num_splits=1, order=order, **sc)
                    err = max(err, (o.float() - ref.float()).abs().max().item())
                row.append(f"{name} {us_per_layer(ctx, order, tables, ls, 1):7.2f}")
        cfg["V_LAST"] = keep
        print(f"b{batch} max|diff| {err:.3g}: " + ", ".join(row), flush=True)
        del layers, moved
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
