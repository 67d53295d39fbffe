"""GPU micro-benchmark of the fused norm + RoPE + fp8 store kernel with and without K error
feedback (kernels/kv_feedback.py), Qwen3-0.6B shapes (16 q / 8 kv heads, d=128, q/k norm,
Hadamard mix), as a decode step (graph-replayed) and a prefill chunk would run it.

    PYTHONPATH=. python tools/bench_kv_feedback.py [--groups 16 32] [--warps 1 2 4]
"""
import argparse

import torch
from triton.testing import do_bench, do_bench_cudagraph

from nanovllm.kernels.kv_feedback import feedback_factor
from nanovllm.kernels import triton_rope
from nanovllm.kernels.triton_rope import norm_rope_store
from nanovllm.layers.rotary_embedding import RotaryEmbedding

H, HKV, D, BS = 16, 8, 128, 256


def case(tokens: int):
    """Kernel inputs for `tokens` new rows, each at its own slot of an fp8 cache."""
    dev, dt = "cuda", torch.bfloat16
    qkv = torch.randn(tokens, (H + 2 * HKV) * D, dtype=dt, device=dev)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q.view(tokens, H, D), k.view(tokens, HKV, D), v.view(tokens, HKV, D)
    blocks = tokens // BS + 2
    caches = [torch.zeros(blocks, BS, HKV, D, dtype=torch.float8_e4m3fn, device=dev)
              for _ in range(2)]
    rope = RotaryEmbedding(D, 40960, 1e6).to(dev)
    pos = torch.randint(0, 4096, (tokens,), device=dev)
    slots = torch.randperm(blocks * BS, device=dev)[:tokens].int()
    norm = torch.ones(D, dtype=dt, device=dev)
    scales = torch.full((HKV,), 0.02, device=dev), torch.full((HKV,), 0.02, device=dev)
    return q, k, v, pos, rope.cos_sin_cache, norm, norm, 1e-6, *caches, slots, scales


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, nargs="*", default=[32])
    ap.add_argument("--warps", type=int, nargs="*", default=[4],
                    help="num_warps of the store with feedback (triton_rope.FEEDBACK_WARPS)")
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 64, 256, 2048, 16384])
    args = ap.parse_args()
    queries = torch.randn(4096, H, 8, device="cuda") @ torch.randn(8, D, device="cuda")
    variants = [(g, w) for g in args.groups for w in args.warps]
    print(f"{'tokens':>7} " + " ".join(f"{n:>12}" for n in ["plain us"] + [
        f"G={g} w={w} us" for g, w in variants]))
    for tokens in args.tokens:
        *inputs, slots, (ks, vs) = case(tokens)
        times = []
        for g, w in [(None, None)] + variants:
            fb = None if g is None else feedback_factor(queries, HKV, group=g)
            triton_rope.FEEDBACK_WARPS = w

            def step():
                norm_rope_store(*inputs, slots, k_scale=ks, v_scale=vs, mix=True,
                                k_feedback=fb)
            step()
            torch.cuda.synchronize()
            # Decode-sized steps run inside CUDA graphs in the engine.
            ms = do_bench_cudagraph(step) if tokens <= 512 else do_bench(step)
            times.append(ms * 1e3)
        print(f"{tokens:>7} " + " ".join(f"{t:>12.1f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
