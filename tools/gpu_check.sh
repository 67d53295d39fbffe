#!/usr/bin/env bash
# One device call: GPU tests, then the benchmark. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:logging -m gpu ${TESTS:-tests} > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR|E  )" "$OUT/tests.log" | head -30; tail -3 "$OUT/tests.log"
fi
timeout ${BENCH_TIMEOUT:-400} python3 bench.py --single --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tail -25 | tee "$OUT/bench.log"
