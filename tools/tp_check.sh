#!/usr/bin/env bash
# One 2-GPU device call: NCCL TP tests, then bench.py at TP=2 and TP=1. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 240 python3 -m pytest -v -x -p no:logging -m gpu tests/engine/test_tp.py > "$OUT/tp_tests.log" 2>&1
grep -E "^(FAILED|ERROR|E  )" "$OUT/tp_tests.log" | head -20; tail -2 "$OUT/tp_tests.log"
for tp in 2 1; do
  timeout 140 python3 bench.py --tp $tp --json "$OUT/bench_tp$tp.json" > "$OUT/bench_tp$tp.log" 2>&1
  grep -E "Total|Startup|Error|error" "$OUT/bench_tp$tp.log" | tail -4
done
