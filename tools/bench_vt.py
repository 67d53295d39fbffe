"""GPU timing of the decode kernel with V's pages transposed ([kv head, dim, slot]: the
V_T experiment of kernels/decode_tiles.attend_tiles) against the engine's layout.

    python tools/bench_vt.py [--models qwen3-fp8 qwen3 qwen2.5] [--batches 64 128 256]

bench_splits.py's setting (contexts uniform in [100, 2048], each layer its own cache, rows
longest first, a CUDA graph over the layers replayed 15 times) at the default split count.
First it checks that both layouts give the same output on every layer. A line per model
and batch: us a layer and GB/s of K/V,
as is / transposed. Needs a CUDA GPU.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from bench_splits import MODELS, make_layers, us_per_layer  # noqa: E402

from nanovllm.kernels import triton_decode  # noqa: E402


def transposed(layers):
    """The same layers with each V cache [blocks, slot, kv head, dim] as [blocks, kv head,
    dim, slot]."""
    return [(q, k, v.permute(0, 2, 3, 1).contiguous(), sc) for q, k, v, sc in layers]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS),
                    default=["qwen3-fp8", "qwen3", "qwen2.5"])
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_vt.py needs a CUDA GPU")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for model in args.models:
        _, hkv, d, _, _ = MODELS[model]
        for batch in args.batches:
            ctx, order, tables, layers = make_layers(model, batch)
            vt = transposed(layers)
            splits = triton_decode.choose_num_splits(batch, hkv, ctx.device)
            scale = d ** -0.5
            worst = 0.0
            for (q, k, v, sc), (_, _, v_t, _) in zip(layers, vt):
                a = triton_decode.decode_attention(q, k, v, ctx, tables, scale, splits,
                                                   order=order, **sc)
                b = triton_decode.decode_attention(q, k, v_t, ctx, tables, scale, splits,
                                                   order=order, v_transposed=True, **sc)
                worst = max(worst, (a.float() - b.float()).abs().max().item())
            nbytes = int(ctx.sum()) * hkv * d * 2 * layers[0][1].element_size()
            us = us_per_layer(ctx, order, tables, layers, splits)
            us_t = us_per_layer(ctx, order, tables, vt, splits, v_transposed=True)
            print(f"{model:<9} b{batch:<4} splits {splits}: {us:7.2f} ({nbytes / us / 1e3:4.0f}) / "
                  f"{us_t:7.2f} ({nbytes / us_t / 1e3:4.0f}) us (GB/s); max |diff| {worst:.2e}",
                  flush=True)
            del layers, vt
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
