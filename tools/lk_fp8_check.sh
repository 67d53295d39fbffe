#!/usr/bin/env bash
# One device call (at most 9.5 min, ~7 typical): the layer kernel over an fp8 KV cache
# (NANOVLLM_LAYER_KERNEL=1).
# Its GPU tests against the launch-per-op path, then batch-1 decode with the kernel on / off,
# and at the SmolLM2 shape with K's error feedback off, then the mixing too (is the new key's
# feedback chain what costs? NANOVLLM_KV_FEEDBACK=0, NANOVLLM_KV_MIX=0). Logs land in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 300 python3 -m pytest -q -p no:logging -m gpu tests/models/test_layer_kernel.py \
  -k "gpu_one_launch" > "$OUT/lk_tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/lk_tests.log" | tail -8
# (shape, layer kernel, K feedback, Hadamard mixing)
for run in "qwen3-0.6b 1 1 1" "qwen3-0.6b 0 1 1" "smollm2-135m 1 1 1" "smollm2-135m 0 1 1" \
           "smollm2-135m 1 0 1" "smollm2-135m 1 0 0"; do
  set -- $run
  NANOVLLM_LAYER_KERNEL=$2 NANOVLLM_KV_FEEDBACK=$3 NANOVLLM_KV_MIX=$4 timeout 45 python3 \
    bench.py --single --num-seqs 16 --model-shape $1 --kv-cache-dtype fp8_e4m3 \
    > "$OUT/bench.log" 2>&1
  echo "[$1 layer_kernel=$2 feedback=$3 mix=$4] $(grep -E 'Single' "$OUT/bench.log")"
done
