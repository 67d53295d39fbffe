"""Where bench.py's decode steps spend the GPU's time, by how many rows a step runs.

    python tools/step_buckets.py --model-shape qwen2.5-0.5b      # (bench.py's arguments)

One timed generate of the workload under the torch profiler (CUDA activity only). Kernels
are cut into steps at each step's sampler (`_slice_stats_kernel`), and a step's rows and
cached keys follow from the workload: with all prompts prefilled first (bench.py's default
schedule), decode step j runs the sequences asking for more than j + 1 tokens. Prints µs a
step by kind of kernel per bucket of rows, and decode attention's rate over the K/V bytes
it must read. Kernel times are their own: programmatic dependent launch is off here
(NANOVLLM_PDL=0, set unless --pdl), since under it a kernel's time counts from its early
launch while it waits.
"""
import argparse
import collections
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BUCKETS = [(256, 10**9), (193, 255), (129, 192), (65, 128), (33, 64), (17, 32), (1, 16)]
KINDS = ("attn", "gemm", "norm", "sample", "other")


def kind(name: str) -> str:
    """The kind of a kernel, by name."""
    if "decode_partial" in name:
        return "attn"
    if any(s in name for s in ("gemm", "gemv", "nvjet", "splitK", "cutlass", "sm90_xmma")):
        return "gemm"
    if "rms_norm" in name:
        return "norm"
    if "slice" in name or "sample" in name:
        return "sample"
    return "other"


def steps_of(events) -> list[dict]:
    """Kernel µs by kind for each step, a step ending with its sampler's stats kernel."""
    steps, cur = [], collections.Counter()
    for start, end, name in events:
        cur[kind(name)] += end - start
        cur["attn_calls"] += "decode_partial" in name
        if "_slice_stats" in name:
            steps.append(cur)
            cur = collections.Counter()
    return steps


def main():
    """Profile one timed generate and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--pdl", action="store_true", help="leave programmatic launch on")
    from nanovllm.bench import add_bench_args
    add_bench_args(ap)
    args = ap.parse_args()
    if not args.pdl:
        os.environ["NANOVLLM_PDL"] = "0"  # (read when the kernels are imported)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nanovllm import LLM, SamplingParams
    from nanovllm.bench import _bench_model, check_bench_args, engine_kwargs, workload

    check_bench_args(args)
    llm = LLM(_bench_model(args), **engine_kwargs(args))
    hf = llm.config.hf_config
    prompts, params = workload(args, hf.vocab_size)
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=8), use_tqdm=False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    llm.shutdown()
    events = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    decode = [s for s in steps_of(events) if s["attn_calls"]]
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    kv_bytes = 2 * hf.num_key_value_heads * head_dim * 2  # a token a layer, 16-bit K and V
    if args.kv_cache_dtype not in ("auto", "bfloat16", "float16"):
        kv_bytes //= 2
    lens, outs = [len(p) for p in prompts], [p.max_tokens for p in params]
    table = {b: collections.Counter() for b in BUCKETS}
    for j, step in enumerate(decode):
        live = [i for i, o in enumerate(outs) if o > j + 1]
        if not live:
            continue
        row = table[next(b for b in BUCKETS if b[0] <= len(live) <= b[1])]
        row["steps"] += 1
        row["bytes"] += sum(lens[i] + j + 1 for i in live) * kv_bytes * step["attn_calls"]
        row.update({k: step[k] for k in KINDS})
    print(f"timed generate {wall * 1e3:.0f} ms; {len(decode)} decode steps; µs a step:")
    print(f"{'rows':>8} {'steps':>5} {'kernels':>7} " + " ".join(f"{k:>6}" for k in KINDS)
          + "  attention TB/s")
    total = collections.Counter()
    for (lo, hi), row in table.items():
        total.update(row)
        n = max(row["steps"], 1)
        label = f"{lo}" if hi > 10**8 else f"{lo}-{hi}"
        print(f"{label:>8} {row['steps']:5d} {sum(row[k] for k in KINDS) / n:7.0f} "
              + " ".join(f"{row[k] / n:6.0f}" for k in KINDS)
              + f"  {row['bytes'] / max(row['attn'], 1) / 1e6:6.2f}")
    print("decode, ms: " + ", ".join(f"{k} {total[k] / 1e3:.0f}" for k in KINDS)
          + f"; attention {total['bytes'] / max(total['attn'], 1) / 1e6:.2f} TB/s")


if __name__ == "__main__":
    main()
