"""What data parallelism would give, measured on one GPU: bench.py's workload whole, then each
replica's share of it as `LLM(data_parallel_size=N)` would split it, one after another.

    python tools/dp_projection.py --num-seqs 512 --dp 2 [--json out.json]

DP=N runs its replicas side by side, so its time is about the slowest share's time; the
projection is total tokens / that time. The replicas' process hops (a pickle per request and
per output) are measured too: the whole workload once more through a single replica process
(LLM(engine_process=True)), and the projection scaled by that run's time over the in-process
one. Left out: N GPUs sharing one host's CPUs. The real run is `bench.py --dp N`
on N GPUs (tools/dp_check.sh).
"""
import argparse
import json
import sys
import time

sys.path.insert(0, ".")
from nanovllm import LLM, SamplingParams
from nanovllm.bench import add_bench_args, check_bench_args, engine_kwargs, workload
from nanovllm.engine.load_balance import balance, request_cost
from nanovllm.utils.model_shapes import dummy_model_dir


def timed(llm, prompts, params) -> float:
    """Seconds to generate the whole list."""
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t


def main():
    """Time the workload and each DP share on one engine; print the projection."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    add_bench_args(ap)
    args = ap.parse_args()
    check_bench_args(args)
    n = args.dp
    # Prefix caching off: the shares repeat the whole run's prompts, and cached blocks from it
    # would flatter them.
    kw = {**engine_kwargs(args), "enable_prefix_caching": False}
    model = dummy_model_dir(args.model_shape or "qwen3-0.6b")
    # The replica process first: it gives all its GPU memory back when it exits.
    with LLM(model, engine_process=True, **kw) as llm:
        prompts, params = workload(args, llm.config.hf_config.vocab_size)
        llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)
        via_replica = timed(llm, prompts, params)
    llm = LLM(model, **kw)
    owner = balance([request_cost(len(p), sp) for p, sp in zip(prompts, params)], [0] * n)
    llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)
    total = sum(sp.max_tokens for sp in params)
    whole = timed(llm, prompts, params)
    shares = []
    for r in range(n):
        mine = [i for i, o in enumerate(owner) if o == r]
        ps, sps = [prompts[i] for i in mine], [params[i] for i in mine]
        shares.append({"seqs": len(mine), "output_tokens": sum(sp.max_tokens for sp in sps),
                       "seconds": round(timed(llm, ps, sps), 3)})
    slowest = max(s["seconds"] for s in shares)
    result = {"num_seqs": args.num_seqs, "dp": n, "output_tokens": total,
              "kv_blocks": llm.stats()[0]["num_blocks"],
              "tp1_seconds": round(whole, 3), "tp1_tok_s": round(total / whole, 1),
              "replica_seconds": round(via_replica, 3),
              "replica_tok_s": round(total / via_replica, 1),
              "shares": shares, "projected_dp_tok_s": round(total / slowest, 1),
              "projected_ratio": round(whole / slowest, 3),
              "with_hops_ratio": round(whole / (slowest * via_replica / whole), 3)}
    llm.shutdown()
    print(f"TP=1: {total} tokens in {whole:.2f}s = {total / whole:,.0f} tok/s "
          f"({result['kv_blocks']} KV blocks)")
    print(f"through one replica process: {via_replica:.2f}s = {total / via_replica:,.0f} tok/s")
    for r, s in enumerate(shares):
        print(f"  share {r}: {s['seqs']} seqs, {s['output_tokens']} tokens in {s['seconds']:.2f}s")
    print(f"DP={n} projected: {result['projected_dp_tok_s']:,.0f} tok/s = "
          f"{result['projected_ratio']:.2f}x TP=1; with the process hops "
          f"{result['with_hops_ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
