"""Throughput benchmark: nano-vLLM's workload (256 random sequences, Qwen3-0.6B shape).

    python bench.py                      # random-weight Qwen3-0.6B (no download needed)
    python bench.py --model ~/huggingface/Qwen3-0.6B/
    python bench.py --single             # also time one sequence decoding 512 tokens
    python bench.py --shared-prefix      # 512 requests sharing a 2,000-token prefix
    python bench.py --model-shape llama-3.2-1b   # or qwen2.5-0.5b, qwen3-30b-a3b (random weights)

The workload lives in nanovllm/bench.py, which `nanovllm bench` runs too.
"""
import argparse
import logging

from nanovllm.bench import add_bench_args, check_bench_args, run_bench


def main():
    """Parse bench.py's options and run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="Hugging Face model directory (default: random weights of\n"
                    "--model-shape, Qwen3-0.6B unless given)")
    add_bench_args(ap)
    args = ap.parse_args()
    try:
        check_bench_args(args)
    except ValueError as e:
        ap.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_bench(args)


if __name__ == "__main__":
    main()
