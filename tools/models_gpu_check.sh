#!/usr/bin/env bash
# One device call for the model zoo (issue 15): the new GPU tests (fused-MoE kernel sweep, the
# new architectures against HF) and the Qwen3 engine tests, the fused-MoE tile sweep, then the
# benchmark on the dense shapes. Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout ${TEST_TIMEOUT:-220} python3 -m pytest -q -p no:logging -m gpu --durations=10 \
  tests/kernels/test_triton_moe.py tests/models/test_architectures.py \
  tests/engine/test_gpu_engine.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -2 "$OUT/tests.log"
timeout ${SWEEP_TIMEOUT:-90} python3 tools/bench_moe.py 2>&1 | tee "$OUT/bench_moe.txt"
for shape in ${SHAPES:-llama-3.2-1b qwen2.5-0.5b}; do
  timeout ${BENCH_TIMEOUT:-120} python3 bench.py --model-shape "$shape" --single \
    --json "$OUT/bench_$shape.json" ${BENCH_ARGS:-} > "$OUT/bench_$shape.log" 2>&1
  grep -E "KV cache|Total|Single|Startup" "$OUT/bench_$shape.log"
done
