"""Where a layer of the one-launch decode kernel (kernels/layer_kernel.py) spends its time, by
phase: each program records its SM clock and the GPU timer as it starts and stops waiting at
every grid barrier (CONFIG["TRACE"]), so a phase's work is the time from one wait's end to the
next wait's start, and a barrier's cost is how long the programs wait in it. GPU only.

    python tools/lk_trace.py [--shapes smollm2-135m] [--context 512] [--config KEY=INT ...]
                             [--programs N]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench_layer_kernel import PHASE_NAMES, build, forward, time_graph  # noqa: E402
from nanovllm.kernels import layer_launch as lk  # noqa: E402


def trace(shape: str, context: int, fp8: bool, show: int) -> None:
    """Run a graph of every layer of the shape, then print the last replay's waits by phase."""
    layers, step, x = build(shape, context, fp8=fp8)
    n = len(layers)
    stacks = [lk.stack_layers(layers)]
    us = time_graph(lambda: forward(stacks, step, x))
    programs = lk._programs(x.device)
    words = lk.trace_words(n, programs)
    raw = lk._BARRIERS[(x.device, words)].cpu().numpy()[64:].astype(np.int64) & 0xFFFFFFFF
    t = raw.reshape(5 * n, programs, 4)  # [barrier, program, (clock, ns) at start, at end]
    clk0, _, clk1, ns1 = (t[:, :, i] for i in range(4))
    last = 5 * n - 2  # the last layer's fifth barrier is skipped: nothing comes after it
    ghz = ((clk1[last, 0] - clk1[0, 0]) % 2**32) / ((ns1[last, 0] - ns1[0, 0]) % 2**32)
    wait = ((clk1 - clk0) % 2**32) / ghz / 1e3  # us
    work = np.zeros_like(wait)
    work[1:] = ((clk0[1:] - clk1[:-1]) % 2**32) / ghz / 1e3
    print(f"{shape}: {us / n:.2f} us a layer (a graph of {n} layers, {programs} programs), "
          f"SM clock {ghz:.2f} GHz; means over layers 1..{n - 2}, us")
    # (Only each program's own clock: the GPU timer ticks too coarsely to order programs,
    # so it only calibrates the clock, over program 0's whole run.)
    print(f"  {'phase':16s} {'work mean':>9s} {'work max':>9s} {'wait mean':>9s} "
          f"{'wait min':>9s}")
    for k in range(5):
        rows = [5 * layer + k for layer in range(1, n - 1)]
        print(f"  {PHASE_NAMES[k]:16s} {work[rows].mean():9.2f} "
              f"{work[rows].max(axis=1).mean():9.2f} "
              f"{wait[rows].mean():9.2f} {wait[rows].min(axis=1).mean():9.2f}")
    rows = [b for b in range(5, 5 * n - 5)]
    print(f"  per layer: work {5 * work[rows].mean():.2f} + waits {5 * wait[rows].mean():.2f}")
    if show:  # phase B's work by program: item p is (kv head p % HKV, split p // HKV)
        b = work[[5 * layer + 1 for layer in range(1, n - 1)], :show].mean(axis=0)
        print("  B work by program, us: " + " ".join(f"{v:.2f}" for v in b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,qwen3-0.6b")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"])
    ap.add_argument("--config", action="append", default=[], metavar="KEY=INT")
    ap.add_argument("--programs", type=int, default=0, help="print phase B's work of the first N")
    args = ap.parse_args()
    lk.CONFIG["TRACE"] = True
    for item in args.config:
        key, _, value = item.partition("=")
        lk.CONFIG[key] = type(lk.CONFIG[key])(int(value))
    for shape in args.shapes.split(","):
        trace(shape, args.context, args.kv_cache_dtype == "fp8_e4m3", args.programs)


if __name__ == "__main__":
    main()
