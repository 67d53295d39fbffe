"""bench.py --single --num-seqs 16 (512 tokens at batch 1) with the layer kernel's CONFIG
overridden first (kernels/layer_config.py), for the tools/lk_*_check.sh device calls.

    python tools/lk_single.py smollm2-135m [KEY=INT ...] [-- more bench.py options]
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanovllm.kernels.layer_config import CONFIG  # noqa: E402


def main():
    """Apply the KEY=INT overrides, then run bench.py in this process."""
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    shape, overrides = args[0], args[1:]
    for item in overrides:
        key, _, value = item.partition("=")
        CONFIG[key] = type(CONFIG[key])(int(value))
    sys.argv = ["bench.py", "--single", "--num-seqs", "16", "--model-shape", shape, *extra]
    runpy.run_path(os.path.join(ROOT, "bench.py"), run_name="__main__")


if __name__ == "__main__":
    main()
