"""`nanovllm bench`: bench.py's throughput benchmark (nanovllm/bench.py's workload)."""
import argparse

from nanovllm.bench import add_bench_args, run_bench


def register(subparsers) -> argparse.ArgumentParser:
    """Add the bench subcommand."""
    p = subparsers.add_parser(
        "bench", help="throughput benchmark (bench.py's workload)",
        description="nano-vLLM's throughput workload: --num-seqs random token-id prompts of "
                    "--min/--max-input-len tokens, each generating --min/--max-output-len "
                    "tokens (ignore_eos). Prints the throughput and start-up time.")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="Hugging Face Qwen3 directory (default: random weights in the "
                        "Qwen3-0.6B shape, nothing to download)")
    add_bench_args(p)
    p.set_defaults(func=run, log_level_default="INFO")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the workload (its options are checked first: a ValueError names the bad one)."""
    run_bench(args)
    return 0
