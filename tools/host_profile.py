"""Where does the host's time go per decode step? cProfile of the engine loop.

    python tools/host_profile.py [--eager] [--sync] [--batch 1] [--tokens 256]
                                 [--model-shape smollm2-135m]
"""
import argparse
import cProfile
import io
import pstats
import time

from nanovllm import LLM, SamplingParams
from nanovllm.utils.model_shapes import dummy_model_dir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--model-shape", default="qwen3-0.6b",
                    help="a shape from nanovllm/utils/model_shapes.py (random weights)")
    args = ap.parse_args()
    llm = LLM(dummy_model_dir(args.model_shape), load_format="dummy", enforce_eager=args.eager,
              async_scheduling=False if args.sync else None)
    prompts = [list(range(100 + i, 132 + i)) for i in range(args.batch)]
    sp = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=args.tokens)
    llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    t = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(prompts, sp, use_tqdm=False)
    prof.disable()
    print(f"eager={args.eager} sync={args.sync} batch={args.batch}: "
          f"{1e3 * wall / args.tokens:.3f} ms/step without the profiler")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.rows)
    print(out.getvalue())
    llm.shutdown()


if __name__ == "__main__":
    main()
