#!/usr/bin/env bash
# Does the decode kernel read a page faster when each kv head's keys lie side by side?
# (`OUT=$OUT bash tools/kv_layout_check.sh`, ~2 min.) The 128-byte-row kernels (an fp8
# cache at head 128; bf16 at head 64) reach 65-70% of DRAM bandwidth where bf16 at head 128
# (256-byte rows) reaches 92% (ncu, thirty-second session). tools/bench_splits.py --layout
# hnd stores each page head by head and hands the kernel the same view through its strides.
f=${OUT:-/tmp/out}/kv_layout.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
for run in "--layout nhd" "--layout hnd" "--layout hnd --config HEAD_FAST=0" "--layout nhd"; do
  echo "[$run]" | tee -a $f
  timeout 60 python3 tools/bench_splits.py --models qwen3-fp8 qwen2.5 smollm2 qwen3 \
    --batches 128 256 --splits 1 $run 2>&1 | grep -E "b[0-9]|Error" | tee -a $f
done
