#!/usr/bin/env bash
# One device call for the fp8 KV cache: its GPU tests, bench.py bf16 vs fp8 (same call), the
# decode kernel bf16 vs fp8 bandwidth, accuracy on dummy Qwen3-0.6B. Logs land in $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:logging tests/kernels/test_fp8_gpu.py > $OUT/fp8tests.log 2>&1; grep -E "^(FAILED|ERROR)" $OUT/fp8tests.log | head; tail -1 $OUT/fp8tests.log
timeout 90 python3 bench.py --single > $OUT/bench_bf16.log 2>&1; grep -E "Total|Single|KV|Startup" $OUT/bench_bf16.log
timeout 90 python3 bench.py --single --kv-cache-dtype fp8_e4m3 > $OUT/bench_fp8.log 2>&1; grep -E "Total|Single|KV|Startup|Error" $OUT/bench_fp8.log
timeout 150 python3 tools/bench_kernels.py --fp8 2>&1 | tee $OUT/kern.log | tail -16
timeout 150 python3 tools/fp8_accuracy.py --dummy-qwen3 --json $OUT/acc.json 2>&1 | grep -v Writing | tail -4
