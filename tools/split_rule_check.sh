#!/usr/bin/env bash
# One device call (~4 min): the decode kernel by split count at mixed lengths
# (tools/bench_splits.py), the decode GPU tests, then bench.py with the split rule's
# TWO_SPLITS_BELOW at its default (4) and at 1 (the rule before it), alternating, for the
# default shape, the SmolLM2 and Qwen2.5 shapes and an fp8 cache. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 90 python3 tools/bench_splits.py | tee "$OUT/splits.txt"
timeout 120 python3 -m pytest -q -p no:logging -m gpu tests/kernels/test_triton_attention.py \
  tests/kernels/test_fp8_kv.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
run() {  # $1: TWO_SPLITS_BELOW, the rest: bench.py's options
  local below=$1; shift
  timeout ${BENCH_TIMEOUT:-60} python3 -c "
import sys
from nanovllm.kernels import decode_config
decode_config.CONFIG['TWO_SPLITS_BELOW'] = $below
sys.argv = ['bench.py'] + sys.argv[1:]
import bench
bench.main()" "$@" > "$OUT/bench.log" 2>&1
  echo "[TWO_SPLITS_BELOW=$below $*] $(grep -E "Throughput" "$OUT/bench.log" | tr '\n' ' ')"
}
for args in "" "--model-shape smollm2-135m" "--model-shape qwen2.5-0.5b" \
            "--kv-cache-dtype fp8_e4m3"; do
  for below in 4 1 4 1; do run $below $args; done
done
