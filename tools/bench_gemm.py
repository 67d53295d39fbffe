"""Time the skinny GEMM (kernels/skinny_gemm.py) against torch.matmul (cuBLAS) on the linear
shapes of real models at M = 1, 2, 4, 8, 16; prints the weight-stream bandwidth of each.

    python tools/bench_gemm.py                        # Qwen3-0.6B and Qwen3-8B, bf16 + fp8
    python tools/bench_gemm.py --models qwen3-0.6b --weights bf16 --m 1,16
    python tools/bench_gemm.py --sweep                # also try candidate tile configs (M=1,
                                                      # 16) and print the best per shape
    python tools/bench_gemm.py --large-m 128,1024,8192   # fp8 weights at larger M: tall
                                                         # tiles, dequantize + cuBLAS, W8A8
    python tools/bench_gemm.py --fused --m 1,4,16     # the prologue-fused kernel
                                                      # (gemm_prologue.py) against its
                                                      # unfused sequence, below

Timing: each call reads a different copy of the weight (enough copies to pass 256 MB, so
the weights come from HBM as in a model's forward, not from the 50 MB L2); the calls are one
CUDA graph (no launch gaps); median of 5 replays. GB/s counts the weight and its scales, x
and y; "% copy" compares with a device-to-device copy's (read + written) bandwidth.
fp8 rows compare with cuBLAS on the same shape in bf16 (what fp8 weights replace).

--fused: on each layer a prologue feeds (qkv and gate_up: residual add + RMSNorm; down:
SiluAndMul), the fused skinny GEMM against the unfused sequence (triton_norm's kernel, then
the plain skinny GEMM; bf16 weights also with cuBLAS as the second launch); "diff" is the
largest |fused - unfused| over the largest |y| (roundings of the activation: see
gemm_prologue.py).
"""
import argparse
import itertools
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm.kernels import skinny_config, skinny_gemm  # noqa: E402
from nanovllm.layers.quant.fp8 import FP8  # noqa: E402
from nanovllm.utils.model_shapes import SHAPES, linear_shapes  # noqa: E402

KINDS = ("bf16", "fp8_row", "fp8_block")


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy."""
    a = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    ms = time_graph(lambda: b.copy_(a), calls=1)
    return 2 * a.numel() * 2 / (ms * 1e-3)


def time_graph(fn, calls: int, replays: int = 5, inner: int = 5) -> float:
    """Median ms per call of fn (which makes `calls` calls), captured in one CUDA graph."""
    fn()  # warm-up: compile, allocate workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (inner * calls))
    del graph
    return statistics.median(times)


def layer_sweep_args(doc: str, model: str, m: str, weights: tuple = ()):
    """(args, the M values, {layer: (N, K)} but the LM head) of a per-layer sweep script's
    command line: --model, --m (comma-separated), --json and, given choices, --weights."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=model)
    ap.add_argument("--m", default=m)
    ap.add_argument("--json", default="")
    if weights:
        ap.add_argument("--weights", choices=weights, default=weights[0])
    args = ap.parse_args()
    layers = {name: nk for name, nk in linear_shapes(args.model).items() if name != "lm_head"}
    return args, [int(v) for v in args.m.split(",")], layers


def make_weights(n: int, k: int, kind: str):
    """Enough (weight, scale, block) copies to pass 256 MB."""
    wbytes = n * k * (2 if kind == "bf16" else 1)
    copies = max(2, -(-(256 << 20) // wbytes))
    out = []
    for _ in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        if kind == "bf16":
            out.append((w, None, None))
        elif kind == "fp8_row":
            out.append((w.to(FP8), torch.rand(n, device="cuda") + 0.5, None))
        else:
            s = torch.rand(-(-n // 128), -(-k // 128), device="cuda") + 0.5
            out.append((w.to(FP8), s, (128, 128)))
    return out


def bytes_moved(m: int, n: int, k: int, weights) -> int:
    w, s, _ = weights[0]
    return w.numel() * w.element_size() + (s.numel() * 4 if s is not None else 0) + 2 * m * (n + k)


def time_skinny(x, weights, config=None, block_m=skinny_gemm.MAX_M) -> float:
    return time_graph(lambda: [skinny_gemm.gemm(x, w, None, s, b, config=config,
                                                block_m=block_m) for w, s, b in weights],
                      calls=len(weights))


_CUBLAS: dict = {}


def candidate_us(fn, calls: int, label) -> float | None:
    """µs a call of fn (time_graph), or None, said, where the candidate `label` does not
    compile (out of shared memory or registers)."""
    try:
        return time_graph(fn, calls=calls) * 1e3
    except Exception as e:
        print(f"    skip {label}: {type(e).__name__}", flush=True)
        return None


def tally(totals: dict, key, t: float) -> None:
    """Adds t to totals[key] = (sum, count)."""
    t0, seen = totals.get(key, (0.0, 0))
    totals[key] = (t0 + t, seen + 1)


def best_complete(tallies: dict, count: int):
    """(key, summed µs) of the candidate tallied `count` times (on every layer) with the least
    sum."""
    done = {key: t for key, (t, seen) in tallies.items() if seen == count}
    return min(done.items(), key=lambda kv: kv[1])


def time_cublas(m: int, n: int, k: int) -> float:
    """ms of F.linear (cuBLAS) on bf16 weights of this shape (once per shape and M)."""
    if (m, n, k) not in _CUBLAS:
        ws = make_weights(n, k, "bf16")
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        _CUBLAS[m, n, k] = time_graph(lambda: [F.linear(x, w) for w, _, _ in ws],
                                      calls=len(ws))
    return _CUBLAS[m, n, k]


def time_large(m: int, n: int, k: int, weights) -> None:
    """fp8 weights at M rows: the tall-tile kernel, dequantize + cuBLAS and W8A8, beside cuBLAS
    bf16 (fp8_gemm.DEQUANT_FROM_M: where the long-prefill paths start winning)."""
    from nanovllm.kernels import fp8_gemm
    from nanovllm.kernels.fp8_w8a8 import quantize_tokens, rowwise_gemm, w8a8_gemm

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    cfg = fp8_gemm.tall_config(m, x.dtype)
    t_tall = time_graph(lambda: [skinny_gemm.gemm(x, w, None, s, b, config=cfg,
                                                  block_m=cfg["BLOCK_M"])
                                 for w, s, b in weights], calls=len(weights))
    t_deq = time_graph(lambda: [F.linear(x, fp8_gemm.dequantize(w, s, b, x.dtype))
                                for w, s, b in weights], calls=len(weights))
    t_w8a8 = time_graph(lambda: [w8a8_gemm(x, w, s, b) for w, s, b in weights],
                        calls=len(weights))
    tc = time_cublas(m, n, k)
    tflops = 2 * m * n * k / 1e12
    times = [t_tall, t_deq, t_w8a8]
    line = ""
    if weights[0][2] is None:  # row scales: per-token x scales + torch._scaled_mm
        t_row = time_graph(lambda: [rowwise_gemm(x, w, s) for w, s, _ in weights],
                           calls=len(weights))
        xq, xs = quantize_tokens(x)
        t_mm = time_graph(lambda: [torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=s.view(1, -1),
                                                    out_dtype=x.dtype) for w, s, _ in weights],
                          calls=len(weights))
        times.append(t_row)
        line = f"   rowwise {t_row * 1e3:8.1f} us (its _scaled_mm alone {t_mm * 1e3:8.1f})"
    print(f"  M={m:5d}  tall {t_tall * 1e3:8.1f} us   dequant+cuBLAS {t_deq * 1e3:8.1f} us   "
          f"w8a8 {t_w8a8 * 1e3:8.1f} us {tflops / (t_w8a8 * 1e-3):6.1f} TFLOP/s   cuBLAS bf16 "
          f"{tc * 1e3:8.1f} us {tflops / (tc * 1e-3):6.1f} TFLOP/s   "
          f"best/bf16 {tc / min(times):4.2f}x" + line)


# The prologue fused into each layer's GEMM (kernels/gemm_prologue.py).
FUSED_LAYERS = {"qkv": "add_rms_norm", "gate_up": "add_rms_norm", "down": "silu_mul"}


def time_fused(model: str, kinds, ms) -> None:
    """Fused prologue + skinny GEMM against norm / SiluAndMul kernel + GEMM, per layer and M."""
    from nanovllm.kernels.triton_norm import rms_norm, silu_and_mul

    gemm = skinny_gemm.gemm
    for (name, (n, k)), kind in itertools.product(linear_shapes(model).items(), kinds):
        if name not in FUSED_LAYERS:
            continue
        weights = make_weights(n, k, kind)
        norm_w = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
        print(f"\n{model} {name} N={n} K={k} {kind}  prologue {FUSED_LAYERS[name]}")
        for m in ms:
            if FUSED_LAYERS[name] == "silu_mul":
                x = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)

                def fused(w, s, b):
                    return gemm(x, w, None, s, b, act="silu_mul")

                def first():
                    return silu_and_mul(x)
            else:
                x, r = torch.randn(2, m, k, device="cuda", dtype=torch.bfloat16)

                def fused(w, s, b):
                    return gemm(x, w, None, s, b, norm_weight=norm_w, residual=r, eps=1e-6)[0]

                def first():
                    return rms_norm(x, norm_w, 1e-6, r)[0]
            t_f = time_graph(lambda: [fused(*wsb) for wsb in weights], calls=len(weights))
            t_u = time_graph(lambda: [gemm(first(), *wsb[:1], None, *wsb[1:])
                                      for wsb in weights], calls=len(weights))
            line = (f"  M={m:2d}  fused {t_f * 1e3:7.1f} us   unfused (kernel + skinny) "
                    f"{t_u * 1e3:7.1f} us  speed-up {t_u / t_f:4.2f}x")
            if kind == "bf16":
                t_c = time_graph(lambda: [F.linear(first(), w) for w, _, _ in weights],
                                 calls=len(weights))
                line += f"   kernel + cuBLAS {t_c * 1e3:7.1f} us ({t_c / t_f:4.2f}x)"
            w, s, b = weights[0]
            y, ref = fused(w, s, b).float(), gemm(first(), w, None, s, b).float()
            print(line + f"   diff {(y - ref).abs().max() / ref.abs().max():.1e}")


def sweep_configs(kind: str, n: int, k: int):
    """Candidate configs: tile shapes x splits, pruned to sensible program counts."""
    tiles = [(16, 256, 4, 4), (16, 512, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3),
             (32, 256, 4, 4), (32, 256, 4, 6), (32, 512, 4, 3), (32, 512, 8, 4),
             (64, 128, 4, 4), (64, 256, 4, 4), (64, 256, 8, 4), (64, 512, 8, 3),
             (128, 128, 4, 4), (128, 256, 8, 3)]
    seen = set()
    for bn, bk, warps, stages in tiles:
        if kind == "fp8_row":
            bk = min(bk * 2, 512)  # same bytes per tile, within the registers that widen it
        elif kind == "fp8_block":
            bk = min(bk, 128)  # a tile must not straddle scale blocks
        if (bn, bk, warps, stages) in seen:
            continue
        seen.add((bn, bk, warps, stages))
        for split in (1, 2, 4, 8, 16):
            programs = -(-n // bn) * split
            if k // split < bk or not 32 <= programs <= 8192:
                continue
            yield dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps,
                       num_stages=stages)


def fmt_cfg(c: dict) -> str:
    return (f"BN={c['BLOCK_N']} BK={c['BLOCK_K']} split={c['SPLIT_K']} w={c['num_warps']} "
            f"s={c['num_stages']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="qwen3-0.6b,qwen3-8b",
                    help=f"comma-separated, from: {', '.join(SHAPES)}")
    ap.add_argument("--weights", default=",".join(KINDS), help=f"from: {', '.join(KINDS)}")
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--sweep", action="store_true", help="try candidate configs (slow)")
    ap.add_argument("--compare-widen", action="store_true",
                    help="fp8: also time the table config with Triton's cast to bf16 instead "
                         "of the integer widening (_common.e4m3_to_bf16)")
    ap.add_argument("--sweep-m", default="1,16")
    ap.add_argument("--large-m", default="", help="fp8: also time these M with tall tiles")
    ap.add_argument("--fused", action="store_true",
                    help="only time the prologue-fused kernel against its unfused sequence")
    args = ap.parse_args()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy_bw / 1e9:.0f} GB/s (read + write)")
    kinds = args.weights.split(",")
    ms = [int(m) for m in args.m.split(",")]
    if args.fused:
        for model in args.models.split(","):
            time_fused(model, kinds, ms)
        return
    best_rows = []
    for model in args.models.split(","):
        for (name, (n, k)), kind in itertools.product(linear_shapes(model).items(), kinds):
            if name == "lm_head" and kind != "bf16":
                continue  # LM heads stay in the model's dtype
            weights = make_weights(n, k, kind)
            cfg = skinny_config.choose_config(n, k, weights[0][0].dtype, torch.bfloat16)
            print(f"\n{model} {name} N={n} K={k} {kind}  table: {fmt_cfg(cfg)}")
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                t = time_skinny(x, weights)
                tc = time_cublas(m, n, k)
                gbs = bytes_moved(m, n, k, weights) / (t * 1e-3) / 1e9
                gbc = (2 * n * k + 2 * m * (n + k)) / (tc * 1e-3) / 1e9
                print(f"  M={m:2d}  skinny {t * 1e3:8.1f} us {gbs:6.0f} GB/s "
                      f"({gbs * 1e9 / copy_bw:4.0%} copy)   cuBLAS bf16 {tc * 1e3:8.1f} us "
                      f"{gbc:6.0f} GB/s   speed-up {tc / t:4.2f}x")
                if args.compare_widen and kind != "bf16":
                    tcast = time_skinny(x, weights, dict(cfg, BITS_TO_BF16=False))
                    w, s, b = weights[0]
                    same = torch.equal(skinny_gemm.gemm(x, w, None, s, b),
                                       skinny_gemm.gemm(x, w, None, s, b, config=dict(
                                           cfg, BITS_TO_BF16=False)))
                    print(f"        cast to bf16 {tcast * 1e3:8.1f} us: widening "
                          f"{tcast / t:4.2f}x faster, same result: {same}")
            if args.sweep:
                for m in (int(v) for v in args.sweep_m.split(",")):
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    results = []
                    for c in sweep_configs(kind, n, k):
                        try:
                            results.append((time_skinny(x, weights, c), c))
                        except Exception as e:  # e.g. out of shared memory: skip the config
                            print(f"    skip {fmt_cfg(c)}: {type(e).__name__}")
                    results.sort(key=lambda r: r[0])
                    for t, c in results[:3]:
                        gbs = bytes_moved(m, n, k, weights) / (t * 1e-3) / 1e9
                        print(f"  sweep M={m:2d}  {t * 1e3:7.1f} us {gbs:6.0f} GB/s  {fmt_cfg(c)}")
                    if results:
                        best_rows.append((model, name, n, k, kind, m, results[0]))
            if args.large_m and kind != "bf16":
                for m in (int(v) for v in args.large_m.split(",")):
                    time_large(m, n, k, weights[:2])
            del weights
            torch.cuda.empty_cache()
    if best_rows:
        print("\nbest per (shape, weights, M):")
        for model, name, n, k, kind, m, (t, c) in best_rows:
            print(f"  {model:11s} {name:8s} N={n:6d} K={k:5d} {kind:9s} M={m:2d} "
                  f"{t * 1e3:7.1f} us  {fmt_cfg(c)}")


if __name__ == "__main__":
    main()
