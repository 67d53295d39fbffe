"""GPU timing of decode_config's FUSE_ROPE at the kernel level: per layer, triton_rope's store
then the decode kernel (today's pure decode step) against the decode kernel with
decode_rope's prologue, at bench-like mixed contexts (tools/bench_splits.make_layers).

    python tools/fuse_rope_time.py [--models qwen2.5 qwen3] [--batches 64 128 256]

One CUDA graph holds every layer's calls (each layer its own caches and qkv rows), replayed
15 times; us a layer, the two forms alternating twice. Also checks that both leave the
same caches and outputs. Needs a CUDA GPU.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from nanovllm.kernels import triton_decode  # noqa: E402
from nanovllm.kernels.decode_rope import new_token_of  # noqa: E402
from nanovllm.kernels.triton_rope import norm_rope_store  # noqa: E402
from nanovllm.layers.layernorm import RMSNorm  # noqa: E402
from nanovllm.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from tools.bench_gemm import time_graph  # noqa: E402
from tools.bench_splits import BLOCK, MODELS, make_layers  # noqa: E402

QK_NORM = {"qwen3": True}


def step_inputs(model, batch, ctx, tables, layers):
    """Per layer (q, k, v views of one qkv buffer, k_cache, v_cache), and the shared positions,
    slots, rope and norms (Qwen3's q/k norms)."""
    h, hkv, d, _, _ = MODELS[model]
    pos = (ctx - 1).long()
    slots = (tables.gather(1, (pos // BLOCK).view(-1, 1)).view(-1).long() * BLOCK
             + pos % BLOCK).int()
    rope = RotaryEmbedding(d, 4096, 1e6).cuda()
    norms = (None, None)
    if QK_NORM.get(model):
        norms = tuple(RMSNorm(d, 1e-6).to("cuda", torch.bfloat16) for _ in range(2))
    out = []
    for _, kc, vc, _ in layers:
        qkv = torch.randn(batch, (h + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
        q = qkv[:, :h * d].view(batch, h, d)
        k = qkv[:, h * d:(h + hkv) * d].view(batch, hkv, d)
        v = qkv[:, (h + hkv) * d:].view(batch, hkv, d)
        out.append((q, k, v, kc, vc))
    return pos, slots, rope, norms, out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5", "qwen3"])
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256])
    args = ap.parse_args()
    for model in args.models:
        for batch in args.batches:
            ctx, order, tables, layers = make_layers(model, batch)
            pos, slots, rope, (qn, kn), rows = step_inputs(model, batch, ctx, tables, layers)
            w = (qn.weight, kn.weight, qn.eps) if qn is not None else (None, None, 0.0)
            scale = rows[0][0].shape[-1] ** -0.5
            outs = {}

            def unfused():
                outs[0] = [triton_decode.decode_attention(
                    norm_rope_store(q, k, v, pos, rope.cos_sin_cache, *w, kc, vc, slots), kc,
                    vc, ctx, tables, scale, order=order) for q, k, v, kc, vc in rows]

            def fused():
                outs[1] = [triton_decode.decode_attention(
                    q, kc, vc, ctx, tables, scale, order=order,
                    new=new_token_of(q, k, v, pos, rope.cos_sin_cache, qn, kn, slots))
                    for q, k, v, kc, vc in rows]

            unfused()
            fused()
            torch.cuda.synchronize()
            diff = max((a.float() - b.float()).abs().max().item()
                       for a, b in zip(outs[0], outs[1]))
            times = {0: [], 1: []}
            for _ in range(2):
                for key, fn in ((0, unfused), (1, fused)):
                    times[key].append(time_graph(fn, len(rows), replays=15, inner=1) * 1e3)
            print(f"{model} batch {batch}: rope store + decode "
                  f"{', '.join(f'{t:.2f}' for t in times[0])} us a layer; fused "
                  f"{', '.join(f'{t:.2f}' for t in times[1])}; max |diff| {diff:.2e}",
                  flush=True)
            layers = rows = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
