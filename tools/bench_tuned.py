"""bench.py with the decode kernel's tunables overridden, for A/B runs in one device call.

    python tools/bench_tuned.py [--decode JSON] [--decode-fp8 JSON] [--decode-int8 JSON]
        [--best FILE] -- BENCH ARGS

--best loads CONFIG_FP8 from a file `bench_kernels.py --fp8 FILE` wrote (ignored when it is
missing); then --decode updates triton_decode.CONFIG (model-dtype caches), --decode-fp8
CONFIG_FP8 and --decode-int8 CONFIG_INT8.
Example: python tools/bench_tuned.py --decode '{"HEAD_FAST": true, "LPT": true}' -- --single
"""
import argparse
import json
import os
import runpy
import sys


def main():
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decode", type=json.loads, default={})
    ap.add_argument("--decode-fp8", type=json.loads, default={})
    ap.add_argument("--decode-int8", type=json.loads, default={})
    ap.add_argument("--best")
    args = ap.parse_args(argv[:split])
    from nanovllm.kernels import triton_decode

    # The file first: the explicit overrides then apply on top of the sweep's winner.
    if args.best and os.path.exists(args.best):
        with open(args.best) as f:
            triton_decode.CONFIG_FP8.update(json.load(f))
    for name, cfg, update in (("CONFIG", triton_decode.CONFIG, args.decode),
                              ("CONFIG_FP8", triton_decode.CONFIG_FP8, args.decode_fp8),
                              ("CONFIG_INT8", triton_decode.CONFIG_INT8, args.decode_int8)):
        unknown = set(update) - set(cfg)
        if unknown:
            raise SystemExit(f"unknown {name} keys {sorted(unknown)}; known: {sorted(cfg)}")
        cfg.update(update)
    print("decode CONFIG", triton_decode.CONFIG)
    print("decode CONFIG_FP8", triton_decode.CONFIG_FP8)
    print("decode CONFIG_INT8", triton_decode.CONFIG_INT8, flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.argv = ["bench.py", *argv[split + 1:]]
    runpy.run_path(os.path.join(here, "..", "bench.py"), run_name="__main__")


if __name__ == "__main__":
    main()
