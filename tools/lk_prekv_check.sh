#!/usr/bin/env bash
# One device call (~6 min; `OUT=$OUT bash tools/lk_prekv_check.sh`): the layer kernel's GPU
# tests, then CONFIG["PRE_KV"] 0 / 1 (each program's first key split, one tile, requested
# before the A -> B barrier: into registers up to 64-dim heads, else into L2), alternating,
# us a layer (tools/bench_layer_kernel.py), and bench.py --single --num-seqs 16 both ways.
# Lines go to $OUT/prekv.txt as they come, so a cut call keeps what it measured.
f=${OUT:-/tmp/out}/prekv.txt
source tools/lk_common.sh
lk_gpu_tests
time_cfg smollm2-135m auto 300 PRE_KV=0 PRE_KV=1 PRE_KV=0 PRE_KV=1
time_cfg smollm2-135m auto 512 PRE_KV=0 PRE_KV=1
time_cfg qwen2.5-0.5b auto 300 PRE_KV=0 PRE_KV=1
time_cfg qwen3-0.6b auto 300 PRE_KV=0 PRE_KV=1 PRE_KV=0 PRE_KV=1
for run in "smollm2-135m 0" "smollm2-135m 1" "qwen2.5-0.5b 0" "qwen2.5-0.5b 1" "qwen3-0.6b 1"; do
  set -- $run
  echo "[$1 PRE_KV=$2] $(timeout 90 python3 tools/lk_single.py $1 PRE_KV=$2 2>&1 \
    | grep -E 'Single|Error')" | tee -a $f
done
