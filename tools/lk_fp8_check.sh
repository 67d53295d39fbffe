#!/usr/bin/env bash
# One device call (~5 min): the layer kernel over an fp8 KV cache (on by default for e4m3).
# 1. Its e5m2 GPU test (until it passes, an e5m2 cache takes the kernel only with
#    NANOVLLM_LAYER_KERNEL=1). 2. Phase by phase at the Qwen3-0.6B shape, K's feedback chains
#    a thread each against the register tile (why do the chains lose at head 128 and win at
#    64?). 3. Batch-1 decode, fp8 e4m3 by default, e5m2 with the kernel on / off. Logs in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:logging -m gpu tests/models/test_layer_kernel.py \
  -k "gpu_one_launch and e5m2" > "$OUT/lk_tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/lk_tests.log" | tail -8
for hd in 128 0; do
  timeout 100 python3 tools/bench_layer_kernel.py --shapes qwen3-0.6b --kv-cache-dtype fp8_e4m3 \
    --only config --phases --config FB_CHAINS_MAX_HD=$hd 2>&1 | grep -vE "^qwen3"
done
for run in "qwen3-0.6b fp8_e4m3 1" "smollm2-135m fp8_e4m3 1" "qwen3-0.6b fp8_e5m2 1" \
           "qwen3-0.6b fp8_e5m2 0"; do
  set -- $run
  NANOVLLM_LAYER_KERNEL=$3 timeout 60 python3 bench.py --single --num-seqs 16 --model-shape $1 \
    --kv-cache-dtype $2 > "$OUT/bench.log" 2>&1
  echo "[$1 $2 layer_kernel=$3] $(grep -E 'Single' "$OUT/bench.log")"
done
