"""GPU timing of the two-level sampler's slice width (triton_sample.SLICE) at batched sizes.

    python tools/slice_sweep.py        # Qwen's 151,936 and SmolLM2's 49,152 logits, bf16

A line per vocabulary and batch: µs a call (CUDA graph replays) for each SLICE, the two-level
path forced (TWO_LEVEL_FROM 0).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from nanovllm.kernels import triton_sample  # noqa: E402
from tools.bench_gemm import time_graph  # noqa: E402


def main():
    """Time sample_temperature at each slice width."""
    triton_sample.TWO_LEVEL_FROM = 0
    for vocab in (151936, 49152):
        for batch in (16, 64, 256):
            logits = torch.randn(batch, vocab, device="cuda", dtype=torch.bfloat16)
            temps = torch.full((batch,), 0.6, device="cuda")
            row = []
            for width in (2048, 4096, 8192, 16384):
                triton_sample.SLICE = width
                us = time_graph(lambda: triton_sample.sample_temperature(logits, temps, 1),
                                calls=1, replays=7, inner=20) * 1e3
                row.append(f"{width} {us:.1f}")
            print(f"vocab {vocab} batch {batch}: " + ", ".join(row) + " us", flush=True)


if __name__ == "__main__":
    main()
