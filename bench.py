"""Throughput benchmark: nano-vLLM's workload (256 random sequences, Qwen3-0.6B shape).

    python bench.py                      # random-weight Qwen3-0.6B (no download needed)
    python bench.py --model ~/huggingface/Qwen3-0.6B/
    python bench.py --single             # also time one sequence decoding 512 tokens
    python bench.py --shared-prefix      # 512 requests sharing a 2,000-token prefix
"""
import argparse
import json
import logging
import os
import tempfile
import time
from random import randint, seed

from nanovllm import LLM, SamplingParams


def dummy_model_dir() -> str:
    """config.json (Qwen3-0.6B shape, bf16) + a small tokenizer; weights come from 'dummy'."""
    from nanovllm.utils.toy import QWEN3_0_6B, save_config_only

    path = os.path.join(tempfile.gettempdir(), "nanovllm-qwen3-0.6b-dummy")
    if not os.path.isfile(os.path.join(path, "config.json")):
        save_config_only(path, **QWEN3_0_6B, torch_dtype="bfloat16", eos_token_id=151645)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="Hugging Face Qwen3 directory (default: dummy Qwen3-0.6B)")
    ap.add_argument("--dummy", action="store_true", help="random weights even with --model")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--max-input-len", type=int, default=1024)
    ap.add_argument("--max-output-len", type=int, default=1024)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--sync", action="store_true",
                    help="async_scheduling=False: the host waits for every step")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--single", action="store_true", help="also time bs=1 decode of 512 tokens")
    ap.add_argument("--shared-prefix", action="store_true",
                    help="instead: 512 requests sharing a 2,000-token prefix (prefix caching)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    path = args.model or dummy_model_dir()
    load_format = "dummy" if args.dummy or not args.model else "auto"
    # Import the device side (torch, Triton, the model) outside the start-up timing, as the
    # figures before the engine stopped importing torch at module level were taken.
    t = time.perf_counter()
    import nanovllm.engine.model_runner  # noqa: F401
    imports = time.perf_counter() - t
    t = time.perf_counter()
    llm = LLM(path, load_format=load_format, enforce_eager=args.enforce_eager,
              max_model_len=args.max_model_len, tensor_parallel_size=args.tp,
              kvcache_block_size=args.block_size, attention_backend=args.attention_backend,
              async_scheduling=False if args.sync else None)
    startup = time.perf_counter() - t

    seed(0)
    if args.shared_prefix:
        prefix = [randint(0, 10000) for _ in range(2000)]
        prompts = [prefix + [randint(0, 10000) for _ in range(randint(1, 100))]
                   for _ in range(512)]
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, 300))
                  for _ in range(512)]
    else:
        prompts = [[randint(0, 10000) for _ in range(randint(100, args.max_input_len))]
                   for _ in range(args.num_seqs)]
        params = [SamplingParams(temperature=0.6, ignore_eos=True,
                                 max_tokens=randint(100, args.max_output_len))
                  for _ in range(args.num_seqs)]

    llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)  # warm-up
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t
    total = sum(p.max_tokens for p in params)
    result = {"startup_s": round(startup, 2), "import_s": round(imports, 2), "prompt_tokens": sum(map(len, prompts)),
              "output_tokens": total, "seconds": round(elapsed, 3),
              "throughput_tok_s": round(total / elapsed, 1)}
    print(f"Total: {total}tok, Time: {elapsed:.2f}s, Throughput: {total / elapsed:.2f}tok/s")

    if args.single:
        sp = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=512)
        one = [[randint(0, 10000) for _ in range(32)]]
        llm.generate(one, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
        t = time.perf_counter()
        llm.generate(one, sp, use_tqdm=False)
        single = time.perf_counter() - t
        result["single_seq_decode_tok_s"] = round(512 / single, 1)
        print(f"Single sequence: 512tok, Time: {single:.2f}s, Throughput: {512 / single:.2f}tok/s")
    print(f"Startup: {startup:.1f}s (imports before it: {imports:.1f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
