#!/usr/bin/env bash
# One device call for the fp8 KV cache: the GPU tests (server tests aside), the decode kernel
# bf16 vs fp8 with a tile sweep (its fastest fp8 config is then used by the fp8 bench run),
# bench.py bf16 vs fp8 in the same call, accuracy on dummy Qwen3-0.6B. Logs land in $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-270} python3 -m pytest -q -p no:logging -m gpu tests --ignore=tests/server > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
fi
timeout 180 python3 tools/bench_kernels.py --fp8 "$OUT/best_fp8.json" 2>&1 | tee "$OUT/kern.log" | tail -9
timeout 70 python3 bench.py --single > "$OUT/bench_bf16.log" 2>&1
echo "[bf16] $(grep -E "Total|Single|KV cache:" "$OUT/bench_bf16.log" | tr '\n' ' ')"
# The fp8 run with the sweep's fastest decode config (the shipped default when it is absent).
timeout 70 python3 -c "
import json, os, runpy, sys
from nanovllm.kernels import triton_decode
best = sys.argv[1]
if os.path.exists(best):
    triton_decode.CONFIG_FP8.update(json.load(open(best)))
print('decode CONFIG_FP8', triton_decode.CONFIG_FP8)
sys.argv = ['bench.py', '--single', '--kv-cache-dtype', 'fp8_e4m3']
runpy.run_path('bench.py', run_name='__main__')" "$OUT/best_fp8.json" > "$OUT/bench_fp8.log" 2>&1
echo "[fp8] $(grep -E "CONFIG|Total|Single|KV cache:|Error" "$OUT/bench_fp8.log" | tr '\n' ' ')"
timeout ${ACC_TIMEOUT:-100} python3 tools/fp8_accuracy.py --dummy-qwen3 --kv-cache-dtype ${ACC_KINDS:-fp8_e5m2} \
  --json "$OUT/acc.json" 2>&1 | grep -v Writing | tail -3
if [ "${PROFILE:-0}" = 1 ]; then  # where an fp8 run's decode steps spend their time
  timeout 120 python3 tools/profile_bench.py --kv-cache-dtype fp8_e4m3 > "$OUT/profile_fp8.log" 2>&1
  grep -A12 "^wall" "$OUT/profile_fp8.log"
fi
