"""Time the fused temperature sampler at decode batch sizes (bf16 logits, Qwen3's and
SmolLM2's vocabularies), one-level against two-level (triton_sample.TWO_LEVEL_FROM).

    python tools/bench_sampler.py [module.py]   # default: nanovllm/kernels/triton_sample.py

Each call is captured in a CUDA graph and replayed (tools/bench_gemm.time_graph), so the
figures are the kernels' device time, as in the engine's sampling graphs.
"""
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bench_gemm import time_graph  # noqa: E402


def load(path):
    spec = importlib.util.spec_from_file_location("sampler_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "nanovllm/kernels/triton_sample.py"
    mod = load(path)
    levels = (False, True) if hasattr(mod, "TWO_LEVEL_FROM") else (None,)
    for vocab in (151936, 49152):
        for batch in (1, 8, 64, 256):
            logits = torch.randn(batch, vocab, device="cuda", dtype=torch.bfloat16)
            temps = torch.full((batch,), 0.6, device="cuda")
            row = []
            for two in levels:
                if two is not None:
                    mod.TWO_LEVEL_FROM = 0 if two else 1 << 62
                us = time_graph(lambda: mod.sample_temperature(logits, temps, 1), calls=1,
                                replays=7, inner=20) * 1e3
                row.append(f"{'two-level' if two else 'one-level'} {us:.1f}")
            print(f"vocab {vocab} batch {batch}: " + ", ".join(row) + " us a call", flush=True)


if __name__ == "__main__":
    main()
