"""A/B of kernel tunables inside one process: one engine, bench.py's workload timed again and
again, the decode graphs recaptured before each run so the variant's launches are the ones
replayed. Runs alternate variant by variant, so drift and the machine's state hit all alike:
on an H200 the same tree repeats within ~0.3% this way, where separate bench.py processes
spread by several percent.

    python tools/ab_inproc.py 3 base tma_cfg.PLAIN=2048 decode.TWO_SPLITS_BELOW=3 \\
        -- --model-shape qwen2.5-0.5b

A variant is `base` (every tunable as shipped) or comma-joined TABLE.KEY=INT overrides, the
tables of tools/bench_with.py. Each run shifts the prompts' token ids, so no run reuses
another's prefix cache. Tunables read when a model is built (weights, cache layout) do not
change this way: use tools/bench_with.py for those.
"""
import argparse
import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.bench import (_bench_model, add_bench_args, check_bench_args,  # noqa: E402
                            engine_kwargs, workload)
from nanovllm.worker import model_runner  # noqa: E402


def _tables() -> dict:
    """bench_with.py's tunable tables (its TABLES), loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "bench_with", os.path.join(ROOT, "tools", "bench_with.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TABLES


def parse_variant(text: str, tables: dict) -> list[tuple[str, str, object]]:
    """[(table, key, value)] of a variant ('base': none); ValueError names an unknown one."""
    out = []
    for item in ([] if text == "base" else text.split(",")):
        name, _, value = item.partition("=")
        table, _, key = name.partition(".")
        if table not in tables or key not in tables[table] or key.startswith("_"):
            raise ValueError(f"unknown tunable {name!r}: TABLE.KEY=INT, TABLE one of "
                             f"{', '.join(tables)}")
        out.append((table, key, type(tables[table][key])(int(value))))
    return out


def main():
    """Build the engine once, then time the variants' runs in turn, ROUNDS times."""
    argv = sys.argv[1:]
    if "--" not in argv or len(argv) < 3:
        sys.exit(__doc__)
    cut = argv.index("--")
    rounds, names = int(argv[0]), argv[1:cut]
    tables = _tables()
    variants = {name: parse_variant(name, tables) for name in names}
    shipped = {(t, k): tables[t][k] for v in variants.values() for t, k, _ in v}
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    add_bench_args(ap)
    args = ap.parse_args(argv[cut + 1:])
    check_bench_args(args)

    runners = []  # the engine's ModelRunner (tensor parallel size 1: in this process)
    init = model_runner.ModelRunner.__init__

    def recording(self, *a, **k):
        runners.append(self)
        init(self, *a, **k)

    model_runner.ModelRunner.__init__ = recording
    llm = LLM(_bench_model(args), **engine_kwargs(args))
    if not runners:
        sys.exit("ab_inproc.py: the model runs in another process (use --tp 1, --dp 1)")
    vocab = llm.config.hf_config.vocab_size
    prompts, params = workload(args, vocab)
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=8), use_tqdm=False)
    results = {name: [] for name in names}
    for run in range(rounds * len(names)):
        name = names[run % len(names)]
        for (table, key), value in shipped.items():
            tables[table][key] = value
        for table, key, value in variants[name]:
            tables[table][key] = value
        if runners[0].graphs is not None:
            runners[0].graphs.capture()
        rate = timed_run(llm, prompts, params, vocab, run)
        results[name].append(rate)
        print(f"run {run}: {name}: {rate:,.0f} tok/s", flush=True)
    summary(results)
    llm.shutdown()


def timed_run(llm, prompts: list, params: list, vocab: int, run: int) -> float:
    """Output tok/s of one generate of the workload, its token ids shifted by 7 x run (so
    no run reuses another's prefix cache)."""
    shifted = [[(t + 7 * run) % vocab for t in p] for p in prompts]
    start = time.perf_counter()
    outputs = llm.generate(shifted, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def summary(results: dict) -> None:
    """Prints each variant's mean rate against the first's (a ratio and a change) and its runs."""
    first = next(iter(results))
    base = sum(results[first]) / len(results[first])
    for name, rates in results.items():
        mean = sum(rates) / len(rates)
        print(f"{name}: mean {mean:,.0f} tok/s ({mean / base:.3f}x, {mean / base - 1:+.1%} of "
              f"{first}); " + " / ".join(f"{r:,.0f}" for r in rates))


if __name__ == "__main__":
    main()
