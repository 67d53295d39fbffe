"""How much an 8-bit KV cache (fp8 or int8) changes the model's outputs, against the cache in
the model's dtype.

Two measurements per checkpoint, each run once with kv_cache_dtype="auto" and once per fp8 kind:
1. Logits over one long context, teacher-forced: the first half of a random-token context is
   prefilled (logits at every position), the rest is fed one token per decode step, so both the
   prefill and the decode kernels read the quantized cache. Per position: ||l - l_ref|| / ||l_ref||;
   mean and max are printed for the prefill and the decode positions, and how often the top-1
   token agrees (each position a separate trial, unlike free-running greedy decoding, where
   everything after the first differing token differs too).
2. Greedy agreement: LLM.generate at temperature 0 over random-token prompts, token by token
   against the reference; also how many completions are identical and the mean position of the
   first differing token.

Usage (CPU, tiny random checkpoints built on the fly):
    PYTHONPATH=. python tools/fp8_accuracy.py --toy
GPU, the Qwen3-0.6B shape with random weights (load_format="dummy"):
    PYTHONPATH=. python tools/fp8_accuracy.py --dummy-qwen3
Random weights make flat, odd logits, so greedy agreement there is a lower bound for real models.

Real weights (--hf-dir DIR, a checkpoint directory, or --gguf FILE, loaded natively):
teacher-forced logprobs of the actual next token over real English text (tools/fp8_text.txt;
first half prefilled, the rest one decode step per token), for each model dtype / KV cache
dtype pair of --runs against the first (fp32, fp32 cache): mean and max |delta logprob| over
the prefill and the decode positions, and the mean KL divergence of the whole distribution.
    PYTHONPATH=. python tools/fp8_accuracy.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --json fp8_smollm2.json
--calibrate "Hi": a short first prompt calibrates the cache instead (a server's first request).
"""
import argparse
import json
import os
import random
import tempfile
import time

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import decode_inputs, prefill_inputs
from nanovllm.utils.context import reset_context

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp8_text.txt")
# --hf-dir runs: (model dtype, kv_cache_dtype); the first is the reference.
LOGPROB_RUNS = ["float32:auto", "bfloat16:auto", "bfloat16:fp8_e4m3", "float32:fp8_e4m3",
                "bfloat16:int8", "float32:int8"]

TOY_SHAPES = {
    "toy_gqa4_d64": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                         hidden_size=128, num_hidden_layers=3, vocab_size=512),
    "toy_mha_d32": dict(num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                        hidden_size=128, num_hidden_layers=2, vocab_size=512),
}


@torch.inference_mode()
def context_logits(llm: LLM, tokens: list[int], prefill_len: int,
                   copies: int = 1) -> torch.Tensor:
    """fp32 logits [len(tokens), vocab]: prefill tokens[:prefill_len], then one decode step
    per remaining token (eager, straight through the ModelRunner; blocks 0.. are ours).
    copies > 1 runs that many copies of the sequence side by side, so each decode step is a
    batch of that many rows (the batched GEMM paths); the last copy's logits are returned."""
    runner = llm.clients[0].core.executor.runner
    bs, width = runner.block_size, runner.max_blocks_per_seq
    blocks = -(-len(tokens) // bs)
    seqs = [Sequence(tokens[:prefill_len], SamplingParams(), bs) for _ in range(copies)]
    for i, seq in enumerate(seqs):
        seq.block_table = list(range(i * blocks, (i + 1) * blocks))
        seq.num_scheduled_tokens = prefill_len
    hidden = runner.forward(prefill_inputs(seqs, bs, width))
    out = [runner.model.compute_all_logits(hidden[-prefill_len:]).float()]
    reset_context()
    for t in tokens[prefill_len:-1]:
        for seq in seqs:
            seq.append_token(t)
        hidden = runner.forward(decode_inputs(seqs, bs, width, rows=max(4, copies)))
        out.append(runner.model.compute_logits(hidden)[copies - 1:copies].float())
        reset_context()
    return torch.cat(out)


def timed_logits(llm: LLM, tokens: list[int], prefill_len: int) -> tuple[torch.Tensor, float]:
    """context_logits on the CPU and the seconds they took; llm is shut down after."""
    try:
        start = time.time()
        return context_logits(llm, tokens, prefill_len).cpu(), time.time() - start
    finally:
        llm.shutdown()


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy completions of every prompt (ignore_eos: always max_tokens)."""
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]


def run_one(model: str, kv_dtype: str, load_format: str, args, context, prompts) -> dict:
    """Both measurements' raw outputs for one kv_cache_dtype."""
    llm = LLM(model, kv_cache_dtype=kv_dtype, load_format=load_format, device=args.device,
              num_kvcache_blocks=args.blocks, kvcache_block_size=args.block_size,
              max_model_len=args.context + 8, enforce_eager=True)
    try:
        # Greedy first: its first prefill calibrates the fp8 scales, as in real use.
        completions = greedy(llm, prompts, args.tokens)
        logits = context_logits(llm, context, args.context // 2)
    finally:
        llm.shutdown()
    return dict(logits=logits, completions=completions)


def compare(ref: dict, got: dict, prefill_len: int) -> dict:
    """The figures the tool prints for one fp8 kind against the reference."""
    rel = (got["logits"] - ref["logits"]).norm(dim=-1) / ref["logits"].norm(dim=-1)
    pre, dec = rel[:prefill_len], rel[prefill_len:]
    agree = total = identical = 0
    first_diff = []
    for a, b in zip(ref["completions"], got["completions"]):
        agree += sum(x == y for x, y in zip(a, b))
        total += len(a)
        identical += a == b
        first_diff.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)))
    return {"logit_rel_err_prefill_mean": pre.mean().item(),
            "logit_rel_err_prefill_max": pre.max().item(),
            "logit_rel_err_decode_mean": dec.mean().item(),
            "logit_rel_err_decode_max": dec.max().item(),
            # Teacher-forced: the same context, so every position is an independent trial.
            "context_top1_agreement": (got["logits"].argmax(-1) == ref["logits"].argmax(-1))
            .float().mean().item(),
            "greedy_token_agreement": agree / total,
            "identical_completions": f"{identical}/{len(first_diff)}",
            "mean_first_divergence": sum(first_diff) / len(first_diff)}


def text_ids(tokenizer, text_path: str = TEXT) -> list[int]:
    """The English text as `tokenizer` (or the tokenizer of a checkpoint dir or GGUF file)
    encodes it."""
    if isinstance(tokenizer, str):
        from nanovllm.utils.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    with open(text_path) as f:
        return tokenizer(f.read())["input_ids"]


def logprob_errors(ref: torch.Tensor, got: torch.Tensor, ids: list[int],
                   prefill_len: int) -> dict:
    """|delta logprob| of each actual next token between two context_logits results (rows
    < prefill_len came from the prefill, the rest from decode steps) and the mean KL(ref||got)."""
    ref_lp, got_lp = torch.log_softmax(ref.float(), -1), torch.log_softmax(got.float(), -1)
    rows, nxt = torch.arange(len(ids) - 1), torch.tensor(ids[1:])
    d = (got_lp[rows, nxt] - ref_lp[rows, nxt]).abs()
    kl = (ref_lp.exp() * (ref_lp - got_lp)).sum(-1)
    pre, dec = d[:prefill_len], d[prefill_len:]
    return {"prefill_mean": pre.mean().item(), "prefill_max": pre.max().item(),
            "decode_mean": dec.mean().item(), "decode_max": dec.max().item(),
            "kl_mean": kl.mean().item(), "positions": f"{len(pre)} prefill, {len(dec)} decode"}


def run_logprobs(model_dir: str, args) -> dict:
    """context_logits of the English text for every --runs pair, compared with the first."""
    ids = text_ids(model_dir)
    prefill_len = len(ids) // 2
    ref, results = None, {}
    for run in args.runs:
        dtype, kv = run.split(":")
        # The first prefill is the text's first half: it calibrates the fp8 scales.
        llm = LLM(model_dir, dtype=dtype, kv_cache_dtype=kv, device=args.device,
                  kvcache_block_size=args.block_size, max_model_len=len(ids) + 8,
                  num_kvcache_blocks=-(-len(ids) // args.block_size) + 1, enforce_eager=True)
        try:
            if args.calibrate:  # a first prompt of its own sets the scales (and feedback)
                first = llm.tokenizer.encode(args.calibrate)
                llm.generate([first], SamplingParams(max_tokens=1), use_tqdm=False)
            logits = context_logits(llm, ids, prefill_len).cpu()
        finally:
            llm.shutdown()
        if ref is None:
            ref = logits
            continue
        results[run] = logprob_errors(ref, logits, ids, prefill_len)
        print(f"{run} vs {args.runs[0]}: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in results[run].items()), flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], help="checkpoint dir (repeatable)")
    ap.add_argument("--toy", action="store_true", help="tiny random checkpoints (CPU-sized)")
    ap.add_argument("--dummy-qwen3", action="store_true",
                    help="the Qwen3-0.6B shape with load_format='dummy'")
    ap.add_argument("--hf-dir", help="real checkpoint: teacher-forced logprobs on English text")
    ap.add_argument("--gguf", help="real checkpoint as a GGUF file (instead of --hf-dir)")
    ap.add_argument("--runs", nargs="+", default=LOGPROB_RUNS,
                    help="--hf-dir: dtype:kv_cache_dtype pairs, the first is the reference")
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["fp8_e4m3", "fp8_e5m2"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=256, help="KV blocks (same for every kind)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--calibrate", help="real weights: a first prompt (text) run before the "
                    "measured one, so it, not the text, calibrates the fp8 cache")
    args = ap.parse_args()

    if args.hf_dir or args.gguf:
        results = run_logprobs(args.gguf or args.hf_dir, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    models = [(m, "auto") for m in args.model]
    if args.toy:
        from nanovllm.utils.toy import save_random_qwen3

        root = tempfile.mkdtemp(prefix="fp8acc-")
        models += [(save_random_qwen3(f"{root}/{name}", seed=i, max_position_embeddings=4096,
                                      **shape), "auto")
                   for i, (name, shape) in enumerate(TOY_SHAPES.items())]
    if args.dummy_qwen3:
        from nanovllm.utils.model_shapes import dummy_model_dir

        models.append((dummy_model_dir(), "dummy"))
    if not models:
        ap.error("give --model, --toy, --dummy-qwen3 or --hf-dir")

    results = {}
    for model, load_format in models:
        rng = random.Random(0)
        vocab = 512 if "fp8acc-" in model else 10000
        context = [rng.randrange(vocab) for _ in range(args.context)]
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(16, 512))]
                   for _ in range(args.prompts)]
        ref = run_one(model, "auto", load_format, args, context, prompts)
        for kind in args.kv_cache_dtype:
            figs = compare(ref, run_one(model, kind, load_format, args, context, prompts),
                           args.context // 2)
            name = model.rstrip("/").rsplit("/", 1)[-1]
            results[f"{name} {kind}"] = figs
            print(f"{name} {kind}: " + ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figs.items()),
                flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
