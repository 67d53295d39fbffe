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
                   help="a Hugging Face model directory, a .gguf file or a hub id (default: "
                        "on a GPU, random weights in the --model-shape shape, nothing to "
                        "download; on a CPU, the demo model)")
    add_bench_args(p)
    p.set_defaults(func=run, log_level_default="INFO")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the workload (its options are checked first: a ValueError names the bad one)."""
    run_bench(args)
    return 0
