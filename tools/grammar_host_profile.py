"""The host's share of a structured-output step: bench.py's schema on every request against
the same prompts unconstrained to the same lengths, both with async scheduling (late masks).

    python tools/grammar_host_profile.py [--seqs 8] [--tokens 200] [--rows 25] [--vocab 640]
    python tools/grammar_host_profile.py --gpu [--seqs 8]   # bench.py's model, CUDA graphs

On CPU the model is tiny and its attention returns zeros (the reference attention would take
most of the time), so what is timed is the host. Prints ms per step of both runs and, for
the structured one, cProfile's heaviest functions and the grammar's own ones per step.
NANOVLLM_PARALLEL_FILL_WORDS=0 sends every mask fill to xgrammar's threads (structured/grammars.py).
"""
import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanovllm import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from nanovllm.bench_structured import BENCH_SCHEMA  # noqa: E402
from nanovllm.utils.toy import save_random_qwen3  # noqa: E402

GRAMMAR_FUNCS = ("grammar_bitmask", "fill", "accept", "terminated", "sample", "constrain",
                 "upload", "finish_reason", "on_result", "_results", "launch", "schedule",
                 "step", "generate")


def no_attention() -> None:
    """Attention returns zeros: the step's device work shrinks to a few tiny matmuls."""
    import torch

    from nanovllm.layers.attention_backend import TorchBackend

    TorchBackend.prefill = lambda self, q, *a, **kw: torch.zeros_like(q)
    TorchBackend.decode = lambda self, q, *a, **kw: torch.zeros_like(q)


def model(vocab: int) -> str:
    path = os.path.join(tempfile.gettempdir(), f"nanovllm-grammar-profile-{vocab}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        save_random_qwen3(path, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                          hidden_size=96, num_hidden_layers=4, vocab_size=vocab)
    return path


def timed(llm, prompts, params, profile: cProfile.Profile | None = None):
    """(outputs, seconds, engine steps) of one generate call."""
    steps = llm.clients[0].core
    n0 = _step_count(steps)
    if profile:
        profile.enable()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t
    if profile:
        profile.disable()
    return outs, elapsed, _step_count(steps) - n0


def _step_count(core) -> int:
    return getattr(core, "_profile_steps", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--vocab", type=int, default=640)
    ap.add_argument("--gpu", action="store_true",
                    help="bench.py's model (qwen3-0.6b shape, random weights) on the GPU")
    args = ap.parse_args()
    if args.gpu:
        from nanovllm.utils.model_shapes import dummy_model_dir

        llm = LLM(dummy_model_dir(), load_format="dummy", max_model_len=2048)
    else:
        no_attention()
        llm = LLM(model(args.vocab), kvcache_block_size=16, max_model_len=512,
                  async_scheduling=True, enforce_eager=True)
    core = llm.clients[0].core
    step = core.step

    def counting_step():
        core._profile_steps = getattr(core, "_profile_steps", 0) + 1
        return step()

    core.step = counting_step
    prompts = [[(17 * i + j) % 300 + 3 for j in range(24)] for i in range(args.seqs)]
    so = StructuredOutputsParams(json=BENCH_SCHEMA, disable_any_whitespace=True)
    params = [SamplingParams(temperature=0.6, max_tokens=args.tokens,
                             structured_outputs=so) for i in range(args.seqs)]
    timed(llm, prompts, params)  # warm-up: compiles the grammar
    outs, constrained, steps = timed(llm, prompts, params)
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    free = [replace(p, structured_outputs=None, max_tokens=n, ignore_eos=True)
            for p, n in zip(params, lengths)]
    timed(llm, prompts, free)
    _, plain, plain_steps = timed(llm, prompts, free)
    prof = cProfile.Profile()
    timed(llm, prompts, params, prof)
    print(f"{args.seqs} seqs, {sum(lengths)} tokens (lengths {min(lengths)}..{max(lengths)}), "
          "NANOVLLM_PARALLEL_FILL_WORDS="
          f"{os.environ.get('NANOVLLM_PARALLEL_FILL_WORDS', 'default')}")
    print(f"structured: {constrained * 1e3 / steps:.3f} ms/step ({steps} steps); "
          f"unconstrained, same lengths: {plain * 1e3 / plain_steps:.3f} ms/step "
          f"({plain_steps} steps); ratio of tok/s {plain / constrained:.1%}")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(args.rows)
    print(out.getvalue())
    print("cumulative ms per step (profiled) of:")
    for (file, _, name), (_, calls, _, cum, _) in sorted(stats.stats.items(),
                                                         key=lambda kv: -kv[1][3]):
        if name in GRAMMAR_FUNCS and "nanovllm" in file:
            short = file.split("nanovllm/")[-1]
            print(f"  {cum * 1e3 / steps:8.3f}  {calls:6d} calls  {short}:{name}")
    llm.shutdown()


if __name__ == "__main__":
    main()
