#!/usr/bin/env bash
# `OUT=$OUT bash tools/sweep43.sh` (~5 min): the two-level sampler's slice width
# (tools/slice_sweep.py), then the 64-dim bf16 decode kernel's tile configs at the Qwen2.5
# shape, 128 and 256 rows, one and two splits (tools/bench_splits.py --config).
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/sweep43.txt
timeout 120 python3 tools/slice_sweep.py 2>&1 | tail -n 6 | tee -a "$f"
for cfg in "" "SHORT_ROW_STAGES=4" "SHORT_ROW_STAGES=6" "num_warps=2" "num_warps=8" \
    "BLOCK_N=32 SHORT_ROW_STAGES=8" "BLOCK_N=128 SHORT_ROW_STAGES=3" \
    "BLOCK_N=128 SHORT_ROW_STAGES=4 num_warps=8" "BLOCK_N=32 SHORT_ROW_STAGES=6 num_warps=2"; do
  r=$(timeout 60 python3 tools/bench_splits.py --models qwen2.5 --batches 128 256 --splits 1 2 \
    --config $cfg 2>&1 | grep -E "^qwen|Error" | tr '\n' ' ')
  echo "[${cfg:-defaults}] $r" | tee -a "$f"
done
