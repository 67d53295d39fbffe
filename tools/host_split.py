"""Where a step's host time goes under async scheduling: timers around the step's functions.

    python tools/host_split.py [--model-shape qwen2.5-0.5b] [--kv-cache-dtype fp8_e4m3]
    python tools/host_split.py --single [--model-shape smollm2-135m]   # one sequence

Runs bench.py's workload (after its warm-up) with each named function wrapped in a
perf_counter timer, then prints µs per step for each, by decode batch size. "wait" is the
host blocked on the device for the previous step's ids: near zero means the host, not the
GPU, sets the pace of those steps. --single: one sequence decoding 512 tokens (bench.py
--single's run). The timers cost ~1 µs a call.
"""
import argparse
import sys
import time
from collections import defaultdict

sys.path.insert(0, ".")

from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.bench import workload  # noqa: E402
from nanovllm.utils.model_shapes import dummy_model_dir  # noqa: E402

BUCKETS = (8, 64, 192, 256, 1 << 30)
TOTALS = defaultdict(float)  # (bucket, name) -> seconds
CURRENT = [None]  # the bucket of the step under way


def wrap(cls, name: str, label: str) -> None:
    """Replace cls.name by a timed version that adds to TOTALS[(current bucket, label)]."""
    inner = getattr(cls, name)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TOTALS[(CURRENT[0], label)] += time.perf_counter() - t

    setattr(cls, name, timed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-shape", default="qwen3-0.6b")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--single", action="store_true", help="one sequence, 512 tokens")
    args = ap.parse_args()
    llm = LLM(dummy_model_dir(args.model_shape), load_format="dummy",
              kv_cache_dtype=args.kv_cache_dtype)
    from nanovllm.engine.core import EngineCore
    from nanovllm.engine.reports import Reports
    from nanovllm.engine.scheduler import Scheduler
    from nanovllm.engine.step_inputs import StepBuilder
    from nanovllm.worker.cuda_graph import DecodeGraphs
    from nanovllm.worker.model_runner import ModelRunner
    from nanovllm.worker.stager import Stager
    from nanovllm.worker.step_output import StepResult

    ns = argparse.Namespace(shared_prefix=False, num_seqs=args.num_seqs, min_input_len=100,
                            max_input_len=1024, min_output_len=100, max_output_len=1024,
                            structured_output=False)
    prompts, params = workload(ns, llm.config.hf_config.vocab_size)
    if args.single:
        prompts = [prompts[0][:32]]
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=512)]
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=8), use_tqdm=False)

    core = llm.clients[0].core
    sched = core.scheduler
    steps = defaultdict(int)
    step = EngineCore.step

    def counted_step(self):
        n = len(sched.running)
        CURRENT[0] = next(b for b in BUCKETS if n <= b) if not sched.waiting else "prefill?"
        steps[CURRENT[0]] += 1
        t = time.perf_counter()
        try:
            return step(self)
        finally:
            TOTALS[(CURRENT[0], "step")] += time.perf_counter() - t

    EngineCore.step = counted_step
    for cls, name in ((StepResult, "result"), (ModelRunner, "launch"), (StepBuilder, "build"),
                      (Stager, "upload"), (DecodeGraphs, "run_sampled"),
                      (ModelRunner, "_send"), (Scheduler, "schedule"),
                      (Scheduler, "on_launch"), (Scheduler, "on_result"),
                      (Reports, "outputs"), (StepBuilder, "launched")):
        wrap(cls, name, "wait" if name == "result" else name)
    t = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    total = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"{args.model_shape} kv={args.kv_cache_dtype}: {total / wall:,.0f} tok/s "
          f"({wall:.2f} s, {sum(steps.values())} steps)")
    labels = ["step", "wait", "launch", "build", "upload", "run_sampled", "_send", "schedule",
              "on_launch", "on_result", "outputs", "launched"]
    print(f"{'running<=':>10} {'steps':>6} {'s':>6} " + " ".join(f"{x[:9]:>9}" for x in labels))
    for b in list(BUCKETS) + ["prefill?"]:
        n = steps.get(b, 0)
        if n:
            sec = TOTALS[(b, "step")]
            cells = " ".join(f"{1e6 * TOTALS[(b, x)] / n:9.0f}" for x in labels)
            print(f"{str(b):>10} {n:>6} {sec:6.2f} {cells}")
    llm.shutdown()


if __name__ == "__main__":
    main()
