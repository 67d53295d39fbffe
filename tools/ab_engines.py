"""A/B of engines built differently (bf16 against fp8 weights, one KV cache dtype against
another) inside one process: each variant's engine is built once, then bench.py's workload
runs on each in turn, again and again, so drift and the machine's state hit all alike (as
tools/ab_inproc.py, whose run and summary it shares, does for tunables read at run time).

    python tools/ab_engines.py 3 "" "--quantization fp8" -- --model-shape qwen3-0.6b

A variant is a string of bench.py options added to the shared ones after `--` ("": none,
printed as base). Engine i of n takes gpu_memory_utilization x (i + 1) / n: the engines
before it hold their share, so each gets about the same KV cache. Each run shifts the
prompts' token ids, so no run reuses another's prefix cache.
"""
import argparse
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.ab_inproc import summary, timed_run  # noqa: E402


def variant_args(shared: list[str], variant: str, index: int, count: int):
    """bench.py's parsed options for one variant: the shared options, then its own, with
    gpu_memory_utilization scaled to its share (engine `index` of `count`)."""
    from nanovllm.bench import add_bench_args, check_bench_args

    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    add_bench_args(ap)
    args = ap.parse_args(shared + shlex.split(variant))
    check_bench_args(args)
    args.gpu_memory_utilization *= (index + 1) / count
    return args


def main():
    """Build one engine a variant, then time the workload on each in turn, ROUNDS times."""
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") < 3:
        sys.exit(__doc__)
    cut = argv.index("--")
    rounds, names, shared = int(argv[0]), argv[1:cut], argv[cut + 1:]
    from nanovllm import LLM, SamplingParams
    from nanovllm.bench import _bench_model, engine_kwargs, workload

    engines, work = [], []
    for i, name in enumerate(names):
        args = variant_args(shared, name, i, len(names))
        llm = LLM(_bench_model(args), **engine_kwargs(args))
        llm.generate(["Benchmark: "], SamplingParams(max_tokens=8), use_tqdm=False)
        engines.append(llm)
        work.append(workload(args, llm.config.hf_config.vocab_size))
    results = {name or "base": [] for name in names}
    for run in range(rounds * len(names)):
        i = run % len(names)
        (prompts, params), vocab = work[i], engines[i].config.hf_config.vocab_size
        rate = timed_run(engines[i], prompts, params, vocab, run)
        results[names[i] or "base"].append(rate)
        print(f"run {run}: {names[i] or 'base'}: {rate:,.0f} tok/s", flush=True)
    summary(results)
    for llm in engines:
        llm.shutdown()


if __name__ == "__main__":
    main()
