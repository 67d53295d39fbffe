#!/usr/bin/env bash
# Two device calls (~5 min each; `bash tools/lk_fp8_check.sh 1`, then `... 2`): the layer
# kernel over an fp8 KV cache (on by default for e4m3). Logs in $OUT.
# Part 1: the e5m2 GPU test (until it passes, an e5m2 cache takes the kernel only with
#   NANOVLLM_LAYER_KERNEL=1); us a layer, K's feedback chains a thread each (FB_CHAINS_MAX_HD
#   128) or on the register tile (0), each with and without the feedback rows asked into L1
#   (FB_PREFETCH_L1), at both shapes.
# Part 2: each phase alone at the Qwen3-0.6B shape, chains against the tile (is the chains'
#   loss there in phase B at all?); batch-1 decode, e4m3 by default, e5m2 kernel on / off.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
lk() { timeout 90 python3 tools/bench_layer_kernel.py --kv-cache-dtype fp8_e4m3 --only config "$@" \
  2>&1 | grep -E "us a layer|Error"; }
if [ "${1:-1}" = 1 ]; then
  timeout 150 python3 -m pytest -q -p no:logging -m gpu tests/models/test_layer_kernel.py \
    -k "gpu_one_launch and e5m2" > "$OUT/lk_tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/lk_tests.log" | tail -8
  for shape in qwen3-0.6b smollm2-135m; do
    for hd in 128 0; do
      for l1 in 0 1; do
        echo "$shape FB_CHAINS_MAX_HD=$hd FB_PREFETCH_L1=$l1: $(lk --shapes $shape \
          --config FB_CHAINS_MAX_HD=$hd --config FB_PREFETCH_L1=$l1)"
      done
    done
  done
else
  for hd in 128 0; do
    echo "qwen3-0.6b FB_CHAINS_MAX_HD=$hd, phases:"
    timeout 150 python3 tools/bench_layer_kernel.py --shapes qwen3-0.6b --kv-cache-dtype fp8_e4m3 \
      --only config --phases --config FB_CHAINS_MAX_HD=$hd 2>&1 | grep -E "us a layer|Error"
  done
  for run in "qwen3-0.6b fp8_e4m3 1" "smollm2-135m fp8_e4m3 1" "qwen3-0.6b fp8_e5m2 1" \
             "qwen3-0.6b fp8_e5m2 0"; do
    set -- $run
    NANOVLLM_LAYER_KERNEL=$3 timeout 60 python3 bench.py --single --num-seqs 16 \
      --model-shape $1 --kv-cache-dtype $2 > "$OUT/bench.log" 2>&1
    echo "[$1 $2 layer_kernel=$3] $(grep -E 'Single' "$OUT/bench.log")"
  done
fi
