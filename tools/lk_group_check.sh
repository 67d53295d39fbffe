#!/usr/bin/env bash
# One device call (~6 min; `OUT=$OUT bash tools/lk_group_check.sh`): the batch-1 layer
# kernel's GROUP (products each thread sums at once in a matvec; 16 by default since
# 2026-11-29, from 8) on more shapes and past 16, alone and with 8 warps over 32K-weight
# chunks: us a layer, alternating (tools/bench_layer_kernel.py, context 512, three shapes
# bf16 and the Qwen3 shape over an fp8 cache), then bench.py --single --num-seqs 16 at the
# default. Lines go to $OUT/group.txt as they come, so a cut call keeps what it measured.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for run in "smollm2-135m auto" "qwen3-0.6b auto" "qwen2.5-0.5b auto" "qwen3-0.6b fp8_e4m3"; do
  set -- $run
  for cfg in "GROUP=8" "GROUP=16" "GROUP=32" "GROUP=64" "GROUP=16 num_warps=8 CHUNK=32768" \
             "GROUP=32 num_warps=8 CHUNK=32768" "GROUP=16" "GROUP=8"; do
    args=""; for c in $cfg; do args="$args --config $c"; done
    echo "$1 $2 $cfg: $(timeout 40 python3 tools/bench_layer_kernel.py --only config \
      --shapes $1 --kv-cache-dtype $2 $args 2>&1 | grep -E 'us a layer|Error' \
      | tr -s ' ')" | tee -a "$OUT/group.txt"
  done
done
for shape in smollm2-135m qwen3-0.6b; do
  echo "[$shape] $(timeout 90 python3 bench.py --single --num-seqs 16 --model-shape $shape \
    2>&1 | grep -E 'Single|Error')" | tee -a "$OUT/group.txt"
done
