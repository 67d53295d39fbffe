"""Time the one-launch decode layers (kernels/layer_kernel.py) at batch 1 on a GPU: a CUDA
graph of every layer of a model shape (random weights, each layer its own, so L2 holds none
of them between replays), as one persistent launch of all layers or one a layer, as their
barriers alone, and as each phase alone (a launch a layer and phase).

    python tools/bench_layer_kernel.py [--shapes qwen3-0.6b,smollm2-135m] [--context 512]
        [--kv-cache-dtype fp8_e4m3] [--phases] [--config KEY=INT ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from nanovllm.kernels import layer_launch as lk  # noqa: E402
from nanovllm.kernels.kv_feedback import feedback_factor, group_size  # noqa: E402
from nanovllm.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from nanovllm.utils.model_shapes import shape_config  # noqa: E402

PHASE_NAMES = ["A norm+qkv", "B attention", "C o_proj", "D norm+gate_up", "E down"]


def build(shape: str, context: int, block_size: int = 256, fp8: bool = False):
    """Per-layer weights, caches and the step's inputs of a model shape, bf16 on cuda; with
    fp8, an e4m3 cache with its per-kv-head scales and K's feedback matrices (mixing on)."""
    c = shape_config(shape)
    d, inter, n_layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hq, hkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or d // hq
    qwen3 = c["architectures"][0].startswith("Qwen3")
    dev, bf = "cuda", torch.bfloat16

    def rand(*shape, std=0.02):
        return (torch.randn(*shape, device=dev) * std).to(bf)

    blocks = -(-context // block_size) + 1
    layers = []
    for _ in range(n_layers):
        layers.append(dict(
            w_in=1 + rand(d), w_qkv=rand((hq + 2 * hkv) * hd, d), b_qkv=None,
            q_norm=1 + rand(hd) if qwen3 else None, k_norm=1 + rand(hd) if qwen3 else None,
            w_o=rand(d, hq * hd), b_o=None, w_post=1 + rand(d), w_gu=rand(2 * inter, d),
            w_down=rand(d, inter),
            s_qkv=None, s_o=None, s_gu=None, s_down=None, k_scale=None, v_scale=None, k_fb=None,
            k_cache=rand(blocks, block_size, hkv, hd, std=1.0),
            v_cache=rand(blocks, block_size, hkv, hd, std=1.0)))
        if fp8:
            w = layers[-1]
            w["k_cache"] = w["k_cache"].to(torch.float8_e4m3fn)
            w["v_cache"] = w["v_cache"].to(torch.float8_e4m3fn)
            w["k_scale"] = torch.full((hkv,), 0.02, device=dev)
            w["v_scale"] = torch.full((hkv,), 0.02, device=dev)
            w["k_fb"] = feedback_factor(torch.randn(256, hq, hd), hkv,
                                        group=group_size(hd)).to(dev)
    theta = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 1e6)
    rope = RotaryEmbedding(hd, context + 16, theta).to(dev)
    step = dict(
        mix=fp8, eps=1e-6, num_heads=hq, num_kv_heads=hkv, head_dim=hd, scale=hd ** -0.5,
        cos_sin=rope.cos_sin_cache.view(-1, hd),
        positions=torch.tensor([context - 1], device=dev),
        slot_mapping=torch.tensor([context - 1], dtype=torch.int32, device=dev),
        context_lens=torch.tensor([context], dtype=torch.int32, device=dev),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=dev)[None])
    x = rand(1, d, std=1.0)
    return layers, step, x


def time_graph(fn, iters: int = 50) -> float:
    """Mean microseconds of one replay of a graph of fn."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def forward(stacks, step, x, **kw):
    """Every layer's step: one launch per stack (stack_layers), chained."""
    residual = None
    for stack in stacks:
        x, residual = lk.decode_layers(x, residual, stack, **step, **kw)
    return x


# (label, CONFIG changes) timed one after another against the module's CONFIG.
# per_layer: a launch a layer instead of one for all layers.
VARIANTS = [
    ("config", {}),
    ("a launch a layer", dict(per_layer=True)),
    ("barriers alone", dict(WORK=False)),
    ("barriers alone, a launch a layer", dict(WORK=False, per_layer=True)),
    ("group 1", dict(GROUP=1)),
    ("chunk 32K", dict(CHUNK=32768)),
    # An fp8 cache (--kv-cache-dtype fp8_e4m3): K's feedback chains a thread each / on the
    # register tile at every head size.
    ("fp8: feedback chains", dict(FB_CHAINS_MAX_HD=1 << 10)),
    ("fp8: feedback on the tile", dict(FB_CHAINS_MAX_HD=0)),
    ("fp8: feedback on the tile, no prefetch", dict(FB_CHAINS_MAX_HD=0, FB_PREFETCH=False)),
    ("fp8: no feedback prefetch", dict(FB_PREFETCH=False)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3-0.6b,smollm2-135m")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--phases", action="store_true", help="also time each phase alone")
    ap.add_argument("--only", default="", help="time only the variants whose label has one "
                    "of these comma-separated texts")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"])
    ap.add_argument("--config", action="append", default=[], metavar="KEY=INT",
                    help="set layer_launch.CONFIG[KEY] first (repeatable), e.g. "
                    "FB_CHAINS_MAX_HD=0 to time the phases with K's feedback on the tile")
    args = ap.parse_args()
    for item in args.config:
        key, _, value = item.partition("=")
        if key not in lk.CONFIG or not value.lstrip("-").isdigit():
            raise ValueError(f"--config {item!r}: use KEY=INT with KEY one of {list(lk.CONFIG)}")
        lk.CONFIG[key] = type(lk.CONFIG[key])(int(value))
    fp8 = args.kv_cache_dtype == "fp8_e4m3"
    for shape in args.shapes.split(","):
        layers, step, x = build(shape, args.context, fp8=fp8)
        n = len(layers)
        whole, each = [lk.stack_layers(layers)], [lk.stack_layers([w]) for w in layers]
        nbytes = sum(w[k].numel() * 2 for w in layers for k in ("w_qkv", "w_o", "w_gu", "w_down"))
        print(f"{shape}: {n} layers, {nbytes / n / 1e6:.1f} MB of weights a layer "
              f"({nbytes / n / 3.0e12 * 1e6:.1f} us at 3.0 TB/s), context {args.context}; "
              f"CONFIG {lk.CONFIG}")
        base = dict(lk.CONFIG)
        for label, change in VARIANTS:
            if (not any(text in label for text in args.only.split(","))
                    or (label.startswith("fp8") and not fp8)):
                continue
            change = dict(change)
            stacks = each if change.pop("per_layer", False) else whole
            lk.CONFIG.update(base, **change)
            us = time_graph(lambda: forward(stacks, step, x))
            print(f"  {label:34s} {us / n:6.2f} us a layer")
        lk.CONFIG.update(base)
        if args.phases:
            for p, name in enumerate(PHASE_NAMES):
                us = time_graph(lambda: forward(whole, step, x, phased=True, phases=(p,)))
                print(f"  phase {name:16s} alone: {us / n:6.2f} us a layer")


if __name__ == "__main__":
    main()
