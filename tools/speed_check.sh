#!/usr/bin/env bash
# One device call: all GPU tests, then bench.py with async scheduling on (default) and off
# (--sync) for the plain, eager and shared-prefix workloads. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:logging -m gpu tests > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR|E  )" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
fi
for args in "--single" "--single --sync" "--enforce-eager" "--enforce-eager --sync" \
            "--shared-prefix" "--shared-prefix --sync"; do
  timeout ${BENCH_TIMEOUT:-100} python3 bench.py $args > "$OUT/bench.log" 2>&1
  echo "[$args] $(grep -E "Total|Single|Startup" "$OUT/bench.log" | tr '\n' ' ')"
done
