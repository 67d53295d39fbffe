"""A real model on the GPU: SmolLM2-135M-Instruct from its GGUF against HF transformers.

    python tools/smollm2_accuracy.py --gguf /tmp/SmolLM2-135M-Instruct.Q4_1.gguf --out OUT

Teacher-forced logprobs of a fixed text (each token's log p under the model, given the tokens
before it): ours in fp32, bf16 and bf16 + fp8 KV cache against HF fp32, next to HF bf16
against HF fp32 (mean and max |delta| in nats); then the greedy reply to one chat question and
bs=1 decode tok/s of our bf16 engine (CUDA graphs). Writes OUT/smollm2_gpu.json.
Needs the `gguf` package (pure Python) for both engines.
"""
import argparse
import gc
import json
import os
import time

import torch

TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the "
    "tower from 1887 to 1889. Locally nicknamed the Iron Lady, it was constructed as the "
    "centrepiece of the 1889 World's Fair, and to crown the centennial anniversary of the "
    "French Revolution. Although initially criticised by some of France's leading artists and "
    "intellectuals for its design, it has since become a global cultural icon of France and "
    "one of the most recognisable structures in the world. def fibonacci(n):\n    return n if "
    "n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\nThe quick brown fox jumps over the lazy "
    "dog. Photosynthesis converts light energy into chemical energy stored in glucose.")


DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def hf_logprobs(file: str, ids: list[int], dtype: torch.dtype) -> torch.Tensor:
    """HF's log p(ids[i] | ids[:i]) for i >= 1, computed in `dtype`, returned as fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(file), gguf_file=os.path.basename(file), dtype=dtype).to(DEVICE).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=DEVICE)).logits[0, :-1].float()
    out = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    del model
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out.cpu()


def ours(file: str, **kw):
    from nanovllm import LLM

    return LLM(file, gpu_memory_utilization=0.3, max_model_len=2048, device=DEVICE, **kw)


def our_logprobs(llm, ids: list[int]) -> torch.Tensor:
    from nanovllm import SamplingParams

    out = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])


def delta(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {"mean_abs_nats": round(d.mean().item(), 6), "max_abs_nats": round(d.max().item(), 6)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", required=True, help="directory for smollm2_gpu.json")
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only checks the script (fp32)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    from nanovllm import SamplingParams

    result = {"gguf": os.path.basename(args.gguf),
              "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"}
    llm = ours(args.gguf, dtype="float32")
    ids = llm.tokenizer.encode(TEXT)
    result["teacher_forced_tokens"] = len(ids) - 1
    mine = {"fp32": our_logprobs(llm, ids)}
    llm.shutdown()
    del llm
    ref = hf_logprobs(args.gguf, ids, torch.float32)
    hf_bf16 = hf_logprobs(args.gguf, ids, torch.bfloat16)
    llm = ours(args.gguf, dtype="bfloat16")
    mine["bf16"] = our_logprobs(llm, ids)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = llm.chat(question, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    result["greedy_reply_bf16"] = reply["text"]
    # bs=1 decode: one warm-up, then the timed run (CUDA graphs replay every step).
    one = [ids[:32]]
    sp = SamplingParams(temperature=0, ignore_eos=True, max_tokens=args.decode_tokens)
    llm.generate(one, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    sync()
    t = time.perf_counter()
    llm.generate(one, sp, use_tqdm=False)
    sync()
    result["bs1_decode_tok_s_bf16"] = round(args.decode_tokens / (time.perf_counter() - t), 1)
    llm.shutdown()
    del llm
    llm = ours(args.gguf, dtype="bfloat16", kv_cache_dtype="fp8")
    mine["bf16_fp8_kv"] = our_logprobs(llm, ids)
    llm.shutdown()
    result["vs_hf_fp32"] = {"hf_bf16": delta(hf_bf16, ref),
                            **{f"ours_{k}": delta(v, ref) for k, v in mine.items()}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "smollm2_gpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
