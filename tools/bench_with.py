"""bench.py in this process with kernel tunables overridden first, for A/B runs in one call.

    python tools/bench_with.py fp8.V_WORDS=1 layer.V_WORDS=1 -- --kv-cache-dtype fp8_e4m3

Each override is TABLE.KEY=INT: `decode`, `fp8` or `int8` (kernels/decode_config.py's CONFIG,
CONFIG_FP8, CONFIG_INT8), `layer` (kernels/layer_config.py), `rope` (kernels/triton_rope.py's
module-level knobs, e.g. rope.FEEDBACK_ROWS_AHEAD=2), `sample` (kernels/triton_sample.py's,
e.g. sample.TWO_LEVEL_FROM=0), `gemv` (kernels/gemv.py's, e.g. gemv.MAX_M=1), `gated`
(kernels/gemv_gated.py's, gated.GATED=1), `tma` (kernels/tma_gemm.py's, tma.ON=0), `tma_cfg`
(kernels/tma_config.py's) or `rows` (layers/fp8_rows.py's, rows.LARGE=0); the value takes the
type of the one it replaces. What follows `--` goes to bench.py as is.
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanovllm.kernels import (decode_config, gemv, gemv_gated, layer_config,  # noqa: E402
                              tma_config, tma_gemm, triton_rope,
                              triton_sample)
from nanovllm.layers import fp8_rows  # noqa: E402

TABLES = {"decode": decode_config.CONFIG, "fp8": decode_config.CONFIG_FP8,
          "int8": decode_config.CONFIG_INT8, "layer": layer_config.CONFIG,
          "rope": vars(triton_rope), "sample": vars(triton_sample), "gemv": vars(gemv),
          "gated": vars(gemv_gated), "tma": vars(tma_gemm), "tma_cfg": vars(tma_config),
          "rows": vars(fp8_rows)}


def main():
    """Apply the overrides, then run bench.py with the rest of the arguments."""
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    for item in args[:cut]:
        name, _, value = item.partition("=")
        table, _, key = name.partition(".")
        if table not in TABLES or key not in TABLES[table] or key.startswith("_"):
            sys.exit(f"bench_with.py: unknown tunable {name!r} (TABLE.KEY, TABLE one of "
                     f"{', '.join(TABLES)})")
        TABLES[table][key] = type(TABLES[table][key])(int(value))
    sys.argv = ["bench.py", *args[cut + 1:]]
    runpy.run_path(os.path.join(ROOT, "bench.py"), run_name="__main__")


if __name__ == "__main__":
    main()
