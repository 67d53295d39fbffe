#!/usr/bin/env bash
# Second V_WORDS call (~6 min; `OUT=$OUT bash tools/vwords_check2.sh`): the layer kernel over
# an fp8 cache, us a layer (tools/bench_layer_kernel.py) and batch 1 (bench.py --single)
# with V_WORDS off / on, alternating; the decode kernel's V_WORDS at fewer stages or 8 warps
# (does the shared memory it adds, or the registers, cost the occupancy?).
f=${OUT:-/tmp/out}/vwords2.txt
source tools/lk_common.sh
time_cfg qwen3-0.6b fp8_e4m3 300 V_WORDS=0 V_WORDS=1 V_WORDS=0 V_WORDS=1
time_cfg smollm2-135m fp8_e4m3 300 V_WORDS=0 V_WORDS=1
for vw in 0 1 0 1; do
  echo "[single qwen3-0.6b fp8 V_WORDS=$vw] $(timeout 120 python3 tools/bench_with.py \
    layer.V_WORDS=$vw -- --single --num-seqs 16 --kv-cache-dtype fp8_e4m3 2>&1 \
    | grep -E 'Throughput|Error' | tail -1)" | tee -a $f
done
for cfg in "V_WORDS=0" "V_WORDS=1 num_stages=3" "V_WORDS=1 num_stages=4" \
    "V_WORDS=1 num_warps=8" "V_WORDS=0 num_warps=8"; do
  echo "[bench_splits $cfg]" | tee -a $f
  timeout 60 python3 tools/bench_splits.py --models qwen3-fp8 --splits 1 --config $cfg \
    2>&1 | grep -E "b[0-9]|Error" | tee -a $f
done
