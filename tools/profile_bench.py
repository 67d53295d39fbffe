"""Where does bench.py's time go? Per-phase step timing plus a kernel profile of decode steps.

    python tools/profile_bench.py [--num-seqs 256] [--kv-cache-dtype fp8_e4m3] [--small 128]
        [--prefill]
    python tools/profile_bench.py --single --model-shape qwen3-8b --quantization fp8

Each kernel table is followed by what each kernel adds to the GPU's busy time after the one
before it ends (critical_path): under PDL a kernel's own time includes its wait.
"""
import argparse
import time
from collections import defaultdict
from random import randint, seed

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.utils.model_shapes import dummy_model_dir


BUCKETS = (1, 4, 8, 16, 32, 64, 128, 192, 256, 512)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--bandwidth", type=float, default=3.0e12, help="bytes/s for 'ideal'")
    ap.add_argument("--single", action="store_true",
                    help="instead: kernel profile of bs=1 decode (GPU time vs wall per step)")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--model-shape", default="qwen3-0.6b", help="a shape from "
                    "nanovllm/utils/model_shapes.py (random weights), e.g. qwen3-8b")
    ap.add_argument("--quantization", default=None, help="e.g. fp8 (weights quantized at load)")
    ap.add_argument("--small", type=int, default=8,
                    help="also profile one decode step once this few sequences are left")
    ap.add_argument("--prefill", action="store_true", help="also profile the second prefill step")
    args = ap.parse_args()
    llm = LLM(dummy_model_dir(args.model_shape), load_format="dummy",
              kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization)
    if args.single:
        return profile_single(llm)
    seed(0)
    prompts = [[randint(0, 10000) for _ in range(randint(100, 1024))] for _ in range(args.num_seqs)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, 1024))
              for _ in range(args.num_seqs)]
    llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)
    for p, sp in zip(prompts, params):
        llm.add_request(p, sp)

    core = llm.clients[0].core
    sched, executor = core.scheduler, core.executor
    totals = defaultdict(float)
    counts = defaultdict(int)
    prof_done = small_done = False
    prefills = 0
    buckets = {b: [0, 0.0, 0] for b in BUCKETS}
    t_all = time.perf_counter()
    while not sched.is_finished():
        t0 = time.perf_counter()
        seqs, is_prefill = sched.schedule()
        t1 = time.perf_counter()
        kind = "prefill" if is_prefill else "decode"
        if not is_prefill and not prof_done and len(seqs) == args.num_seqs and \
                sched.running[0].num_completion_tokens > 50:
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(args.profile_steps):
                    ids = executor.launch(seqs, is_prefill).result()
                    sched.on_result(sched.on_launch(seqs), ids)
                    seqs, is_prefill = sched.schedule()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
            print_added(prof, args.profile_steps, "step")
            prof_done = True
        prefills += is_prefill
        small = not is_prefill and not small_done and len(seqs) <= args.small
        if small or (args.prefill and is_prefill and prefills == 2):
            ids = profile_step(executor, seqs, is_prefill)
            small_done = small_done or small
            sched.on_result(sched.on_launch(seqs), ids)
            continue
        ctx = sum(len(s) for s in seqs)
        ids = executor.launch(seqs, is_prefill).result()
        t2 = time.perf_counter()
        sched.on_result(sched.on_launch(seqs), ids)
        t3 = time.perf_counter()
        totals[kind + "_schedule"] += t1 - t0
        totals[kind + "_run"] += t2 - t1
        totals[kind + "_post"] += t3 - t2
        counts[kind] += 1
        if not is_prefill:
            b = next(b for b in BUCKETS if len(seqs) <= b)
            buckets[b][0] += 1
            buckets[b][1] += t3 - t0
            buckets[b][2] += ctx
    wall = time.perf_counter() - t_all
    print(f"wall {wall:.2f}s steps {dict(counts)}")
    for k, v in sorted(totals.items()):
        print(f"{k:20s} {v:8.3f}s")
    # Decode by batch size: where the time goes against what reading the KV cache and the
    # weights at copy bandwidth would take.
    hf = llm.config.hf_config
    # K and V of one token, all layers, at the cache's element size (1 byte for fp8).
    kv_bytes = (2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim
                * executor.runner.kv_cache.element_size())
    weights = sum(p.numel() * p.element_size() for p in executor.runner.model.parameters())
    print(f"{'batch<=':>8} {'steps':>6} {'seconds':>8} {'ms/step':>8} {'ideal s':>8} "
          f"{'KV TB/s':>8}")
    for b in BUCKETS:
        n, sec, ctx = buckets[b]
        if n:
            ideal = (ctx * kv_bytes + n * weights) / args.bandwidth
            print(f"{b:>8} {n:>6} {sec:>8.3f} {1e3 * sec / n:>8.2f} {ideal:>8.3f} "
                  f"{ctx * kv_bytes / sec / 1e12:>8.2f}")
    llm.shutdown()


def critical_path(kernels) -> tuple[dict, float]:
    """µs each kernel name adds to the busy timeline, and the idle gaps, from (name, start,
    end) device intervals. Under PDL a kernel's start is its launch (it may then wait for the
    one before), so its own time overstates it; what it adds is end - max(start, the
    previous end), which also holds without PDL."""
    added: dict = defaultdict(float)
    gaps, last = 0.0, None
    for name, start, end in sorted(kernels, key=lambda k: k[2]):
        if last is not None:
            gaps += max(0.0, start - last)
            start = max(start, last)
        added[name] += max(0.0, end - start)
        last = end if last is None else max(last, end)
    return dict(added), gaps


def profile_step(executor, seqs, is_prefill: bool):
    """Run one step under the profiler; print its kernel table and what each kernel adds.
    Returns the step's sampled ids."""
    tokens = sum(s.num_scheduled_tokens for s in seqs)  # (read before the launch)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        ids = executor.launch(seqs, is_prefill).result()
        torch.cuda.synchronize()
    print(f"one {'prefill' if is_prefill else 'decode'} step, {len(seqs)} sequences, "
          f"{tokens} tokens:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=16))
    print_added(prof, 1, "step")
    return ids


def print_added(prof, steps: int, unit: str) -> None:
    """The profile's kernels by what each adds to the busy timeline (critical_path), per
    step, with the idle gaps."""
    added, gaps = critical_path([(e.name, e.time_range.start, e.time_range.end)
                                 for e in prof.events()
                                 if e.device_type == torch.autograd.DeviceType.CUDA])
    print(f"what each kernel adds after the one before ends (meaningful under PDL, where a "
          f"kernel's own time counts its wait); busy {sum(added.values()) / steps:.1f}, "
          f"idle {gaps / steps:.1f} us/{unit}")
    for name, us in sorted(added.items(), key=lambda kv: -kv[1])[:20]:
        print(f"{name[:70]:70s} {us / steps:8.1f}")


def profile_single(llm, steps: int = 64):
    """bs=1 decode: per-kernel GPU time per step (decode steps only) next to the wall time
    per token (a whole generate)."""
    one = [list(range(100, 132))]
    llm.generate(one, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    sp = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=steps)
    t = time.perf_counter()
    llm.generate(one, sp, use_tqdm=False)
    wall = (time.perf_counter() - t) / steps
    # The profile holds decode steps only: the prefill and the first steps run before it
    # (an eager prefill's launch gaps and cuBLAS calls would count as the token's otherwise).
    llm.add_request(one[0], SamplingParams(temperature=0.6, ignore_eos=True,
                                           max_tokens=steps + 8))
    for _ in range(4):
        llm.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            llm.step()
        torch.cuda.synchronize()
    while not llm.is_finished():
        llm.step()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = sum(e.self_device_time_total for e in events) / steps / 1e3
    print(f"bs=1: wall {1e3 * wall:.3f} ms/token, GPU kernels {gpu:.3f} ms/token")
    print(f"{'kernel':70s} {'calls/tok':>9} {'us/tok':>8}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:30]:
        print(f"{e.key[:70]:70s} {e.count / steps:9.1f} {e.self_device_time_total / steps:8.1f}")
    print_added(prof, steps, "tok")
    llm.shutdown()


if __name__ == "__main__":
    main()
