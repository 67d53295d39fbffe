#!/usr/bin/env bash
# One 2-GPU device call: NCCL TP tests, then bench.py at TP=2 and TP=1. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# faulthandler prints every thread's stack if a test runs past 120 s: a hang shows where.
timeout 240 python3 -m pytest -v --durations=0 -p no:logging -o faulthandler_timeout=120 -m gpu \
  tests/worker/test_multiproc.py > "$OUT/tp_tests.log" 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|ERROR|^E  " "$OUT/tp_tests.log" | head -20; tail -2 "$OUT/tp_tests.log"
ls /dev/shm | grep -c psm_ | sed 's/^/shm segments left after tests: /'
for tp in 2 1; do
  timeout 120 python3 bench.py --tp $tp --json "$OUT/bench_tp$tp.json" > "$OUT/bench_tp$tp.log" 2>&1
  echo "bench tp=$tp rc=$?"; grep -E "Total|Startup|Error|error" "$OUT/bench_tp$tp.log" | tail -4
done
ls /dev/shm | grep -c psm_ | sed 's/^/shm segments left after bench: /'
pgrep -fa "nanovllm|multiprocessing" | head -5
