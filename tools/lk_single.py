"""bench.py --single --num-seqs 16 (512 tokens at batch 1) with the layer kernel's CONFIG
overridden first (kernels/layer_config.py), for the tools/lk_*_check.sh device calls.

    python tools/lk_single.py smollm2-135m [KEY=INT ...] [-- more bench.py options]

Shorthand for tools/bench_with.py layer.KEY=INT ... -- --single --num-seqs 16 --model-shape.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_with  # noqa: E402


def main():
    """Turn the arguments into bench_with.py's and run it."""
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    shape, overrides = args[0], args[1:]
    sys.argv = ["bench_with.py", *(f"layer.{item}" for item in overrides), "--", "--single",
                "--num-seqs", "16", "--model-shape", shape, *extra]
    bench_with.main()


if __name__ == "__main__":
    main()
