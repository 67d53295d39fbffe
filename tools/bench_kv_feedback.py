"""GPU micro-benchmark of the fused norm + RoPE + fp8 store kernel with and without K error
feedback (kernels/kv_feedback.py), Qwen3-0.6B shapes (16 q / 8 kv heads, d=128, q/k norm,
Hadamard mix), as a decode step (graph-replayed) and a prefill chunk would run it.

    PYTHONPATH=. python tools/bench_kv_feedback.py [--variants plain tile engine ...]

Variants: bf16 (a bf16 cache: no scales, mixing or rounding), nomix (plain without the
Hadamard mix), plain (no feedback), tile (the fused kernel's register tile at every size), chains
(a thread per chain at every size, feedback_chains.feedback_chains), engine (as the engine
runs: the tile up to FUSED_FEEDBACK_MAX_TOKENS, then chains), ahead1 / ahead2 (engine with
triton_rope.FEEDBACK_ROWS_AHEAD 1 / 2); each with q and k/v in one
program per token ("-one"), in two ("-two") or as the engine picks (no suffix,
triton_rope.SPLIT_QK_MAX_TOKENS).
"""
import argparse

import torch
from triton.testing import do_bench, do_bench_cudagraph

from nanovllm.kernels import triton_rope
from nanovllm.kernels.decode_config import CONFIG_FP8
from nanovllm.kernels.kv_feedback import feedback_factor
from nanovllm.kernels.triton_rope import norm_rope_store
from nanovllm.layers.rotary_embedding import RotaryEmbedding

H, HKV, D, BS = 16, 8, 128, 256
ENGINE_MAX = triton_rope.FUSED_FEEDBACK_MAX_TOKENS
# variant -> (feedback on, FEEDBACK_CHAINS, FUSED_FEEDBACK_MAX_TOKENS)
KINDS = {"bf16": (False, True, ENGINE_MAX), "nomix": (False, True, ENGINE_MAX),
         "plain": (False, True, ENGINE_MAX), "ahead1": (True, True, ENGINE_MAX),
         "ahead2": (True, True, ENGINE_MAX), "tile": (True, False, ENGINE_MAX),
         "chains": (True, True, 0), "engine": (True, True, ENGINE_MAX)}


def case(tokens: int, cache_dtype=torch.float8_e4m3fn):
    """Kernel inputs for `tokens` new rows, each at its own slot of a cache."""
    dev, dt = "cuda", torch.bfloat16
    qkv = torch.randn(tokens, (H + 2 * HKV) * D, dtype=dt, device=dev)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q.view(tokens, H, D), k.view(tokens, HKV, D), v.view(tokens, HKV, D)
    blocks = tokens // BS + 2
    caches = [torch.zeros(blocks, BS, HKV, D, dtype=cache_dtype, device=dev)
              for _ in range(2)]
    tile = CONFIG_FP8["V_TILE"]
    if cache_dtype.itemsize == 1 and tile:  # V's pages as the engine keeps them
        caches[1] = caches[1].view(blocks, HKV, BS // tile, D, tile)
    rope = RotaryEmbedding(D, 40960, 1e6).to(dev)
    pos = torch.randint(0, 4096, (tokens,), device=dev)
    slots = torch.randperm(blocks * BS, device=dev)[:tokens].int()
    norm = torch.ones(D, dtype=dt, device=dev)
    scales = torch.full((HKV,), 0.02, device=dev), torch.full((HKV,), 0.02, device=dev)
    return q, k, v, pos, rope.cos_sin_cache, norm, norm, 1e-6, *caches, slots, scales


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="*",
                    default=["plain", "tile", "chains", "engine"])
    ap.add_argument("--warps", type=int, default=triton_rope.FEEDBACK_WARPS,
                    help="num_warps of the store with feedback (triton_rope.FEEDBACK_WARPS)")
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 64, 256, 2048, 16384])
    args = ap.parse_args()
    queries = torch.randn(4096, H, 8, device="cuda") @ torch.randn(8, D, device="cuda")
    factor = feedback_factor(queries, HKV)
    triton_rope.FEEDBACK_WARPS = args.warps
    split_max = triton_rope.SPLIT_QK_MAX_TOKENS
    print(f"{'tokens':>7} " + " ".join(f"{n:>11}" for n in args.variants) + "  (us)")
    for tokens in args.tokens:
        times = []
        for name in args.variants:
            kind, _, one = name.partition("-")
            *inputs, slots, (ks, vs) = case(tokens, torch.bfloat16 if kind == "bf16"
                                            else torch.float8_e4m3fn)
            if kind == "bf16":
                ks = vs = None
            on, triton_rope.FEEDBACK_CHAINS, triton_rope.FUSED_FEEDBACK_MAX_TOKENS = KINDS[kind]
            triton_rope.SPLIT_QK_MAX_TOKENS = {"one": 0, "two": 1 << 30}.get(one, split_max)
            triton_rope.FEEDBACK_ROWS_AHEAD = int(kind[-1]) if kind.startswith("ahead") else 0
            fb = factor if on else None

            def step():
                norm_rope_store(*inputs, slots, k_scale=ks, v_scale=vs,
                                mix=kind not in ("bf16", "nomix"),
                                k_feedback=fb)
            step()
            torch.cuda.synchronize()
            # Decode-sized steps run inside CUDA graphs in the engine.
            ms = do_bench_cudagraph(step) if tokens <= 512 else do_bench(step)
            times.append(ms * 1e3)
        print(f"{tokens:>7} " + " ".join(f"{t:>11.1f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
