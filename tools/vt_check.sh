#!/usr/bin/env bash
# One device call (~7-8 min): the V_T experiment (8-bit caches with V's pages transposed).
# The kernel alone (tools/bench_vt.py), its GPU tests, then bench.py with an fp8 and an int8
# cache, NANOVLLM_KV_V_T off and on, alternating. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 150 python3 tools/bench_vt.py --models qwen3-fp8 --batches 64 128 256 | tee "$OUT/vt.txt"
timeout 240 python3 -m pytest -q -p no:logging -m gpu -k "transposed" tests/kernels/test_fp8_kv.py \
  tests/worker/test_kv_cache.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
for kv in fp8_e4m3 int8; do
  for vt in 0 1 0 1; do
    NANOVLLM_KV_V_T=$vt timeout 90 python3 bench.py --kv-cache-dtype $kv > "$OUT/bench.log" 2>&1
    echo "[$kv V_T=$vt] $(grep -E "Throughput" "$OUT/bench.log" | tr '\n' ' ')"
  done
done
