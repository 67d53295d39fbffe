"""GPU timing of the decode kernel by split count at bench-like mixed context lengths.

    python tools/bench_splits.py [--models qwen2.5 smollm2 qwen3 qwen3-fp8] [--batches 64 128 256]
        [--splits 1 2 4 8]

Per model and batch: context lengths uniform in [100, 2048] (seed 0), each layer its own
K/V cache (block 256, pages scattered), rows started longest first (the engine's order); one
CUDA graph holds every layer's decode_attention call at a forced split count and is replayed
15 times. A line per model and batch: the default split count (choose_num_splits), then us a
layer and GB/s (K/V bytes of the contexts / time) per split count. Mixed lengths are the
point: at uniform lengths (tools/bench_kernels.py --sweep) every program of a wave ends
together, and splitting past one program per SM only costs. Needs a CUDA GPU.

Programmatic dependent launch is off here unless NANOVLLM_PDL is set: a graph of decode calls
back to back, each letting the next launch at its start, is not the engine's chain (o_proj
follows each), and it slowed the kernel being timed (H200, Qwen2.5 at 256 rows, one split:
34.4 us a layer with it, 27.9 without; PERF_NOTES, sixty-fifth session). Tools that import
this module before the kernels get the same default.
"""
import argparse
import os
import statistics
import sys

os.environ.setdefault("NANOVLLM_PDL", "0")  # (read when kernels/pdl.py is imported)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from nanovllm.kernels import triton_decode  # noqa: E402
from nanovllm.kernels.torch_ref import quantize  # noqa: E402

# name: (q heads, kv heads, head_dim, cache dtype, layers)
MODELS = {"qwen2.5": (14, 2, 64, torch.bfloat16, 24), "smollm2": (9, 3, 64, torch.bfloat16, 30),
          "qwen3": (16, 8, 128, torch.bfloat16, 28),
          "qwen3-fp8": (16, 8, 128, torch.float8_e4m3fn, 28),
          "qwen3-8b": (32, 8, 128, torch.bfloat16, 36)}
BLOCK = 256


def make_layers(model, batch, seed=0, layout="nhd", contexts=(100, 2048)):
    """(ctx, order, block_tables, layers), each layer (q, k_cache, v_cache, scales). The
    caches are [pages, BLOCK, kv heads, dim] views; with layout "hnd" their memory holds each
    page kv head by kv head ([pages, kv heads, BLOCK, dim])."""
    h, hkv, d, dtype, num_layers = MODELS[model]
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(contexts[0], contexts[1] + 1, (batch,), generator=g)
    pages = (ctx + BLOCK - 1) // BLOCK
    perm = torch.randperm(int(pages.sum()), generator=g)
    tables = torch.zeros(batch, int(pages.max()), dtype=torch.int32)
    used = 0
    for i, n in enumerate(pages.tolist()):
        tables[i, :n] = perm[used:used + n].int()
        used += n
    layers = []
    for _ in range(num_layers):
        q = torch.randn(batch, h, d, dtype=torch.bfloat16, device="cuda")
        caches, scales = [], {}
        for name in ("k", "v"):
            x = torch.randn(used, BLOCK, hkv, d, dtype=torch.bfloat16, device="cuda")
            if dtype != torch.bfloat16:
                s = 0.5 + torch.rand(hkv, device="cuda")
                x = quantize(x.view(-1, hkv, d), s, dtype).view(x.shape)
                scales[f"{name}_scale"] = s
            if layout == "hnd":
                x = x.transpose(1, 2).contiguous().transpose(1, 2)
            caches.append(x)
        layers.append((q, *caches, scales))
    ctx = ctx.int().cuda()
    return ctx, torch.argsort(ctx, descending=True).int(), tables.cuda(), layers


def apply_config(items):
    """KEY=INT overrides of the decode kernel's tunables, set in each of CONFIG, CONFIG_FP8
    and CONFIG_INT8 that has the key."""
    for item in items:
        key, _, value = item.partition("=")
        for table in (triton_decode.CONFIG, triton_decode.CONFIG_FP8, triton_decode.CONFIG_INT8):
            if key in table:
                table[key] = type(table[key])(int(value))


def us_per_layer(ctx, order, tables, layers, splits, replays=15):
    """Median us a layer of a graph replay of every layer's call at `splits` splits."""
    scale = layers[0][0].shape[-1] ** -0.5

    def step():
        for q, kc, vc, sc in layers:
            triton_decode.decode_attention(q, kc, vc, ctx, tables, scale, num_splits=splits,
                                           order=order, **sc)

    step()  # compile, and make the split counters, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) * 1e3 / len(layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--splits", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--config", nargs="*", default=[], metavar="KEY=INT",
                    help="decode kernel tunables (kernels/decode_config.py; set in each of "
                         "CONFIG, CONFIG_FP8, CONFIG_INT8 that has the key), e.g. V_WORDS=1")
    ap.add_argument("--contexts", nargs=2, type=int, default=[100, 2048], metavar=("LO", "HI"),
                    help="context lengths uniform in [LO, HI] (bench.py's 256-row steps: "
                         "about 100-1,100)")
    ap.add_argument("--layout", choices=["nhd", "hnd"], default="nhd",
                    help="hnd: each page stored kv head by kv head (a head's keys side by "
                         "side), seen through the kernel's strides as the engine's layout")
    args = ap.parse_args()
    apply_config(args.config)
    if not torch.cuda.is_available():
        sys.exit("bench_splits.py needs a CUDA GPU")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for model in args.models:
        _, hkv, d, _, _ = MODELS[model]
        for batch in args.batches:
            ctx, order, tables, layers = make_layers(model, batch, layout=args.layout,
                                                contexts=args.contexts)
            nbytes = int(ctx.sum()) * hkv * d * 2 * layers[0][1].element_size()
            default = triton_decode.choose_num_splits(batch, hkv, ctx.device)
            row = []
            for s in args.splits:
                us = us_per_layer(ctx, order, tables, layers, s)
                row.append(f"s{s} {us:7.2f} ({nbytes / us / 1e3:4.0f})")
            print(f"{model:<9} b{batch:<4} default {default}: " + "  ".join(row), flush=True)
            del layers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
