"""One step's cost on the device: a batch of decodes alone (a CUDA graph), a prompt chunk
alone (a prefill step: what stalls running streams without mixed steps) and the two in one
mixed step (eager varlen path), for a few chunk sizes. Sizes max_mixed_prefill_tokens.

    python tools/bench_mixed_step.py                  # dummy Qwen3-0.6B, 256 decodes, ctx 600
    python tools/bench_mixed_step.py --decodes 64 --context 300 --chunks 256 1024 4096
    python tools/bench_mixed_step.py --prefill-graph-tokens 4352   # prefill/mixed steps
                                                                   # replay piecewise graphs

Prints host ms (until launch returns: the Python that builds and queues the step) and wall ms
(launch to sampled ids on the host), medians of --repeats. A step whose host ms is near its
wall ms is host-bound: its GPU waits for the launches, and async scheduling cannot hide that.
"""
import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-shape", default="qwen3-0.6b")
    ap.add_argument("--decodes", type=int, default=256)
    ap.add_argument("--context", type=int, default=600, help="each decode's context tokens")
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--prefill-graph-tokens", type=int, default=0,
                    help="piecewise graphs for prefill and mixed steps up to this many "
                         "tokens (0: eager, as before)")
    args = ap.parse_args()

    import torch

    from nanovllm import LLM, SamplingParams
    from nanovllm.engine.sequence import Sequence
    from nanovllm.utils.model_shapes import dummy_model_dir

    llm = LLM(dummy_model_dir(args.model_shape), load_format="dummy", max_model_len=8192,
              max_num_seqs=max(args.decodes + 1, 8), async_scheduling=False,
              max_num_batched_tokens=max(16384, max(args.chunks) + args.decodes),
              prefill_graph_tokens=args.prefill_graph_tokens)
    core = llm.clients[0].core
    runner, bm = core.executor.runner, core.scheduler.block_manager
    rng = random.Random(0)
    sp = SamplingParams(temperature=0.6, max_tokens=64)

    def sequence(computed: int, new: int) -> Sequence:
        """Blocks for `computed` cached tokens (their K/V: whatever the cache holds) and
        `new` tokens to compute."""
        s = Sequence([rng.randrange(10000) for _ in range(computed + new)], sp,
                     bm.block_size)
        bm.allocate(s)
        s.num_cached_tokens, s.num_scheduled_tokens = computed, new
        return s

    decodes = [sequence(args.context - 1, 1) for _ in range(args.decodes)]

    def timed(seqs, is_prefill) -> tuple[float, float]:
        host, wall = [], []
        for i in range(args.repeats + 3):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            handle = runner.launch(seqs, is_prefill)
            t1 = time.perf_counter()
            handle.result()
            t2 = time.perf_counter()
            if i >= 3:  # warm-up: kernels compiled, allocator grown
                host.append(1e3 * (t1 - t0))
                wall.append(1e3 * (t2 - t0))
        return statistics.median(host), statistics.median(wall)

    print(f"{args.decodes} decodes of {args.context} tokens' context; {args.model_shape}; "
          f"piecewise graphs up to {args.prefill_graph_tokens} tokens")
    print(f"{'step':<34}{'host ms':>9}{'wall ms':>9}")
    h, w = timed(decodes, False)
    print(f"{'decodes (graph)':<34}{h:9.2f}{w:9.2f}")
    h, w = timed(decodes, True)
    print(f"{'decodes (eager, mixed path)':<34}{h:9.2f}{w:9.2f}")
    for c in args.chunks:
        chunk = sequence(0, c)
        h1, w1 = timed([chunk], True)
        h2, w2 = timed(decodes + [chunk], True)
        print(f"{f'chunk {c} alone (prefill step)':<34}{h1:9.2f}{w1:9.2f}")
        print(f"{f'decodes + chunk {c} (mixed)':<34}{h2:9.2f}{w2:9.2f}")
        bm.deallocate(chunk)
    llm.shutdown()


if __name__ == "__main__":
    main()
