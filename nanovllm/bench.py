"""The throughput benchmark's workload, shared by `python bench.py` and `nanovllm bench`.

nano-vLLM's workload: random token-id prompts (random.seed(0)) with random output lengths and
ignore_eos, so every run asks for the same tokens; the options only shrink or reshape it.
"""
import argparse
import json
import time
from random import randint, seed

from nanovllm.config import DTYPES, KV_CACHE_DTYPES
from nanovllm.quant_config import QUANTIZATIONS
from nanovllm.utils.json_arg import json_object
from nanovllm.utils.model_shapes import SHAPES, dummy_model_dir

# The workload's default sizes: nano-vLLM's on a GPU; on a CPU, one a 2-core machine
# finishes in under a minute.
WORKLOADS = {
    "gpu": dict(num_seqs=256, min_input_len=100, max_input_len=1024, min_output_len=100,
                max_output_len=1024),
    "cpu": dict(num_seqs=8, min_input_len=16, max_input_len=64, min_output_len=16,
                max_output_len=64),
}


def add_bench_args(ap: argparse.ArgumentParser) -> None:
    """The benchmark's options (all but the model), for bench.py and `nanovllm bench`."""
    ap.add_argument("--dummy", action="store_true", help="random weights even with a model")
    ap.add_argument("--model-shape", choices=list(SHAPES), default=None,
                    help="without a model: the shape of the random-weight model (default: "
                         "qwen3-0.6b; on a CPU the demo model, SmolLM2 when installed)")
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    for name in WORKLOADS["gpu"]:
        gpu, cpu = WORKLOADS["gpu"][name], WORKLOADS["cpu"][name]
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                        help=f"default: {gpu} on a GPU, {cpu} on a CPU")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--sync", action="store_true",
                    help="async_scheduling=False: the host waits for every step")
    ap.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                    help="tensor_parallel_size")
    ap.add_argument("--dp", "--data-parallel-size", dest="dp", type=int, default=1,
                    help="data_parallel_size: engine replicas, each on its own --tp GPUs")
    ap.add_argument("--ray", action="store_true",
                    help="replicas as Ray actors (distributed_executor_backend='ray')")
    ap.add_argument("--block-size", "--kvcache-block-size", dest="block_size", type=int,
                    default=256)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--device", help="cpu or cuda (default: cuda when there is one)")
    ap.add_argument("--dtype", choices=DTYPES, default="auto")
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                    help="KV cache storage (fp8, int8: 8-bit K/V, ~2x the blocks)")
    ap.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                    help="fp8 linear weights, quantized at load (default: the checkpoint's)")
    ap.add_argument("--lm-head-quantization", choices=("int8",), default=None,
                    help="int8: the LM head also read as int8 by steps of up to 16 rows")
    # The engine options bench.py has no name of its own for (every subcommand takes them).
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="most tokens in one step (default: the engine's)")
    ap.add_argument("--num-kvcache-blocks", type=int, default=None,
                    help="KV-cache blocks (default: as many as the memory budget allows)")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer directory or hub id (default: the model's)")
    ap.add_argument("--generation-config", default=None,
                    help="auto, none or a directory (the workload sets its own sampling)")
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                    default=None, help="reuse the KV cache of shared prefixes (default: on)")
    ap.add_argument("--speculative-config", type=json_object, default=None,
                    help="speculative decoding as JSON (default: off)")
    ap.add_argument("--enable-mixed-steps", action=argparse.BooleanOptionalAction,
                    default=None, help="decode and compute prompt chunks in one step "
                                       "(default: off)")
    ap.add_argument("--max-mixed-prefill-tokens", type=int, default=None,
                    help="most prompt tokens in a step that also decodes (default: "
                         "--max-num-batched-tokens)")
    ap.add_argument("--prefill-graph-tokens", type=int, default=None,
                    help="piecewise CUDA graphs for prefill and mixed steps up to this many "
                         "tokens; 0: eager (default: 2560 with mixed steps, else 0)")
    ap.add_argument("--single", action="store_true", help="also time bs=1 decode of 512 tokens")
    ap.add_argument("--shared-prefix", action="store_true",
                    help="instead: 512 requests sharing a 2,000-token prefix (prefix caching)")
    ap.add_argument("--structured-output", action="store_true",
                    help="constrain every output to a JSON schema (one string field), then "
                         "time the same prompts unconstrained at the lengths it produced")
    ap.add_argument("--json", help="write the results to this file")


def check_bench_args(args: argparse.Namespace) -> None:
    """A ValueError naming the first workload option out of range (randint would fail later):
    the options given are checked at once, the rest once the device's defaults fill them in
    (finding the device imports torch: an argument error answers without it)."""
    _check_workload(args)
    _device_defaults(args)
    _check_workload(args)


def _check_workload(args: argparse.Namespace) -> None:
    """The workload options that are set (None: the device's default, not known yet)."""
    if args.dp < 1:
        raise ValueError(f"--dp={args.dp} must be >= 1")
    if args.num_seqs is not None and args.num_seqs < 1:
        raise ValueError(f"--num-seqs={args.num_seqs} must be >= 1")
    for kind in ("input", "output"):
        lo, hi = getattr(args, f"min_{kind}_len"), getattr(args, f"max_{kind}_len")
        if None not in (lo, hi) and not 1 <= lo <= hi:
            raise ValueError(f"--min-{kind}-len={lo} and --max-{kind}-len={hi} must satisfy "
                             f"1 <= min <= max")


def _on_cpu(args: argparse.Namespace) -> bool:
    import torch

    return args.device == "cpu" or (args.device is None and not torch.cuda.is_available())


def _device_defaults(args: argparse.Namespace) -> None:
    """The workload sizes left unset: the device's defaults."""
    for name, value in WORKLOADS["cpu" if _on_cpu(args) else "gpu"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def _bench_model(args: argparse.Namespace) -> str:
    """--model; else on a CPU without --model-shape the demo model (real SmolLM2 when
    installed: the random 0.6B would take hours there); else random weights of the shape."""
    if args.model:
        return args.model
    if _on_cpu(args) and args.model_shape is None:
        import contextlib
        import sys

        from nanovllm.utils.toy import model_or_demo

        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the figures
            args.model = model_or_demo(None)
        return args.model
    args.model_shape = args.model_shape or "qwen3-0.6b"
    return dummy_model_dir(args.model_shape)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The LLM(...) arguments the benchmark options set, parallelism apart."""
    model = getattr(args, "model", None)
    return dict(load_format="dummy" if args.dummy or not model else "auto",
                enforce_eager=args.enforce_eager, max_model_len=args.max_model_len,
                kvcache_block_size=args.block_size, attention_backend=args.attention_backend,
                async_scheduling=False if args.sync else None, device=args.device,
                dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                max_num_seqs=args.max_num_seqs,
                gpu_memory_utilization=args.gpu_memory_utilization,
                **{key: getattr(args, key) for key in _ENGINE_DEFAULTS_OPTIONAL
                   if getattr(args, key, None) is not None})


# Options left unset (None) keep the engine's default.
_ENGINE_DEFAULTS_OPTIONAL = ("max_num_batched_tokens", "num_kvcache_blocks",
                             "enable_prefix_caching", "tokenizer", "generation_config",
                             "speculative_config", "quantization", "lm_head_quantization",
                             "enable_mixed_steps",
                             "max_mixed_prefill_tokens", "prefill_graph_tokens")


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list]:
    """The benchmark's prompts (token ids) and SamplingParams, the same on every call."""
    from nanovllm import SamplingParams, StructuredOutputsParams
    from nanovllm.bench_structured import BENCH_SCHEMA

    # Token ids are drawn from [0, 10000] as in nano-vLLM; a smaller vocabulary (the tiny test
    # models) takes them modulo its size, which leaves a real model's workload unchanged.
    def tok() -> int:
        return randint(0, 10000) % vocab

    seed(0)
    if args.shared_prefix:
        prefix = [tok() for _ in range(2000)]
        prompts = [prefix + [tok() for _ in range(randint(1, 100))] for _ in range(512)]
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, 300))
                  for _ in range(512)]
    else:
        prompts = [[tok() for _ in range(randint(args.min_input_len, args.max_input_len))]
                   for _ in range(args.num_seqs)]
        params = [SamplingParams(temperature=0.6, ignore_eos=True,
                                 max_tokens=randint(args.min_output_len, args.max_output_len))
                  for _ in range(args.num_seqs)]
    if getattr(args, "structured_output", None):
        so = StructuredOutputsParams(json=BENCH_SCHEMA, disable_any_whitespace=True)
        for p in params:
            p.structured_outputs = so
    return prompts, params


def run_bench(args: argparse.Namespace) -> dict:
    """Build the engine, run the workload, print the figures; returns them as a dict."""
    from nanovllm import LLM, SamplingParams

    check_bench_args(args)
    path = _bench_model(args)
    # Import the device side (torch, Triton, the model) outside the start-up timing, as the
    # figures before the engine stopped importing torch at module level were taken.
    t = time.perf_counter()
    import nanovllm.worker.model_runner  # noqa: F401
    imports = time.perf_counter() - t
    t = time.perf_counter()
    llm = LLM(path, tensor_parallel_size=args.tp, data_parallel_size=args.dp,
              distributed_executor_backend="ray" if args.ray else "mp", **engine_kwargs(args))
    startup = time.perf_counter() - t

    vocab = llm.config.hf_config.vocab_size
    prompts, params = workload(args, vocab)

    # Warm-up: one prompt per replica (balancing sends each to a different one).
    # (a few tokens: max_tokens past max_model_len is a ValueError, and tests use tiny ones)
    # With --structured-output it carries the schema, so its grammar compiles before timing.
    warm = SamplingParams(max_tokens=8, structured_outputs=params[0].structured_outputs)
    llm.generate(["Benchmark: "] * args.dp, warm, use_tqdm=False)
    t = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t
    # What was generated: max_tokens each (ignore_eos), unless a grammar ended an output.
    total = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {"model": args.model or args.model_shape, "startup_s": round(startup, 2),
              "import_s": round(imports, 2),
              "prompt_tokens": sum(map(len, prompts)), "output_tokens": total,
              "seconds": round(elapsed, 3), "throughput_tok_s": round(total / elapsed, 1),
              "kv_cache_dtype": args.kv_cache_dtype,
              "structured_output": bool(getattr(args, "structured_output", False)),
              "tensor_parallel_size": args.tp, "data_parallel_size": args.dp,
              "num_kvcache_blocks": _kv_blocks(llm)}
    print(f"Total: {total}tok, Time: {elapsed:.2f}s, Throughput: {total / elapsed:.2f}tok/s")
    print(f"KV cache: {args.kv_cache_dtype}, {result['num_kvcache_blocks']} blocks of "
          f"{args.block_size} tokens")
    if result["structured_output"]:
        from nanovllm.bench_structured import same_lengths_unconstrained

        same_lengths_unconstrained(llm, prompts, params, outputs, result)

    if args.single:
        sp = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=512)
        one = [[randint(0, 10000) % vocab for _ in range(32)]]  # the workload's draws go on
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
    return result


def _kv_blocks(llm) -> int:
    """KV blocks of the engine (of each replica, with data parallelism)."""
    return llm.stats()[0]["num_blocks"]
