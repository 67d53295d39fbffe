"""Real weights through the one-row decode kernels, on the CPU (Triton interpreter): the
teacher-forced logprobs of SmolLM2-135M-Instruct (bf16, fp8 weights at load) when each decode
step's row goes through kernels/gemv.py, or through the skinny GEMM (the GPU's path before it),
or the torch reference matmul, each against the unquantized bf16 model.

    PYTHONPATH=. python tools/gemv_real_weights.py [TOKENS]   # 64: ~35 min on 2 cores

The kernels run with wide interpreter tiles (64-row programs, the GEMV summing 16 products a
group as on the GPU) to keep it to minutes.
"""
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from fp8_accuracy import context_logits, logprob_errors, text_ids  # noqa: E402

from nanovllm import LLM  # noqa: E402
from nanovllm.kernels import gemv  # noqa: E402
from nanovllm.kernels.skinny_gemm import gemm  # noqa: E402
from nanovllm.layers.quant import fp8  # noqa: E402
from nanovllm.utils.toy import smollm2_gguf  # noqa: E402


def logits(model: str, ids: list[int], quantization: str | None, path: str) -> torch.Tensor:
    """context_logits with one-row fp8 matmuls on `path`: "gemv", "skinny" or "torch"."""
    llm = LLM(model, dtype="bfloat16", device="cpu", quantization=quantization,
              kvcache_block_size=16, max_model_len=len(ids) + 64,
              num_kvcache_blocks=-(-len(ids) // 16) + 8, enforce_eager=True)
    orig = fp8.Fp8LinearMethod.apply

    def apply(self, layer, x, bias):
        scale = getattr(layer, self.scale_name)
        if x.shape[0] == 1 and path == "gemv":
            return gemv.gemv(x, layer.weight, scale, self.block, bias)
        if x.shape[0] == 1 and path == "skinny":
            cfg = dict(BLOCK_N=64, BLOCK_K=64, SPLIT_K=1, num_warps=1, num_stages=1)
            return gemm(x, layer.weight, bias, scale, self.block, config=cfg)
        return orig(self, layer, x, bias)

    fp8.Fp8LinearMethod.apply = apply
    try:
        return context_logits(llm, ids, len(ids) // 2).cpu()
    finally:
        fp8.Fp8LinearMethod.apply = orig
        llm.shutdown()


def main():
    start = time.time()
    gemv.choose_config = lambda n, k, itemsize=1, rows=1: dict(
        BLOCK_N=64, BLOCK_K=128, GROUP=16, W_EVICT="", num_warps=1, num_stages=1)
    model = smollm2_gguf()
    ids = text_ids(model)[:int(sys.argv[1]) if len(sys.argv) > 1 else 64]
    p = len(ids) // 2
    ref = logits(model, ids, None, "torch")
    runs = {path: logits(model, ids, "fp8", path) for path in ("torch", "skinny", "gemv")}
    for path, got in runs.items():
        e = logprob_errors(ref, got, ids, p)
        print(f"fp8, {path:6s} vs bf16: decode mean |dlogprob| {e['decode_mean']:.4f} max "
              f"{e['decode_max']:.4f} ({e['positions']})")
    for a, b in (("skinny", "gemv"), ("torch", "skinny")):
        e = logprob_errors(runs[a], runs[b], ids, p)
        agree = (runs[a][p:].argmax(-1) == runs[b][p:].argmax(-1)).float().mean().item()
        print(f"{b} vs {a}: decode mean {e['decode_mean']:.5f} max {e['decode_max']:.5f}, "
              f"top-1 agreement {agree:.3f}")
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
