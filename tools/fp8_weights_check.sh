#!/usr/bin/env bash
# One device call for fp8 linear weights (issue 32), on the torch reference matmul (no fp8
# kernels yet): correctness, accuracy on real weights, and the baseline speed and KV blocks
# the kernels will be measured against. Steps, chosen with STEPS (default "tests acc bench"):
#   tests  the fp8 tests on the GPU (CPU-written checkpoints; the KV-block test is gpu-only)
#   acc    tools/fp8_weights_accuracy.py on SmolLM2 in bf16 (needs GGUF=path/to/
#          SmolLM2-135M-Instruct.Q4_1.gguf, or HF_DIR=an HF checkpoint, e.g. Qwen3-0.6B)
#   bench  bench.py --single, Qwen3-0.6B and Qwen3-8B shapes (random weights), bf16 vs
#          --quantization fp8: the reference path's cost and the KV blocks fp8 weights free
# Logs land in $OUT.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-tests acc bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name --format=csv,noheader
if has tests; then
  timeout 240 python3 -m pytest -q -p no:logging tests/models/test_fp8_weights.py \
    tests/models/test_fp8_config.py > "$OUT/fp8w_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/fp8w_tests.log" | head -20; tail -1 "$OUT/fp8w_tests.log"
fi
if has acc; then
  src=${HF_DIR:+--hf-dir $HF_DIR}; src=${src:-${GGUF:+--gguf $GGUF}}
  timeout 300 python3 tools/fp8_weights_accuracy.py $src --dtype bfloat16 --device cuda \
    --json "$OUT/fp8w_acc.json" > "$OUT/fp8w_acc.log" 2>&1
  head -4 "$OUT/fp8w_acc.log"
fi
if has bench; then
  for shape in qwen3-0.6b qwen3-8b; do
    for q in "" "--quantization fp8"; do
      name="${shape}${q:+_fp8}"
      timeout 150 python3 bench.py --model-shape $shape --single $q > "$OUT/bench_$name.log" 2>&1
      echo "[$name] $(grep -E "Total|Single|KV cache:|Error" "$OUT/bench_$name.log" | tr '\n' ' ')"
    done
  done
fi
