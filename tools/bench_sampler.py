"""Time the fused temperature sampler at decode batch sizes (Qwen3 vocabulary, bf16 logits).

    python tools/bench_sampler.py [module.py]   # default: nanovllm/kernels/triton_sample.py
"""
import importlib.util
import sys

import torch


def load(path):
    spec = importlib.util.spec_from_file_location("sampler_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "nanovllm/kernels/triton_sample.py"
    sample = load(path).sample_temperature
    for batch in (1, 64, 256):
        logits = torch.randn(batch, 151936, device="cuda", dtype=torch.bfloat16)
        temps = torch.full((batch,), 0.6, device="cuda")
        for _ in range(3):
            sample(logits, temps, 1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(50):
            sample(logits, temps, i)
        end.record()
        torch.cuda.synchronize()
        print(f"{path}: batch {batch}: {1e3 * start.elapsed_time(end) / 50:.1f} us per call")


if __name__ == "__main__":
    main()
