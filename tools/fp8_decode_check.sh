#!/usr/bin/env bash
# The fp8 decode kernel's tiles, once more (`OUT=$OUT bash tools/fp8_decode_check.sh`, ~2
# min): 32-key tiles take 86 registers instead of 116 (sm_90, compiled on the CPU machine),
# so 5 programs an SM instead of 4; the kernel waits on latency, so more warps may pay.
# tools/bench_splits.py, Qwen3-0.6B's fp8 cache, one split, us a layer.
f=${OUT:-/tmp/out}/fp8_decode.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
for cfg in "BLOCK_N=64" "BLOCK_N=32 num_stages=8" "BLOCK_N=32 num_stages=10" \
    "BLOCK_N=32 num_stages=8 V_WORDS=1" "BLOCK_N=32 num_stages=6 V_WORDS=1" "BLOCK_N=64"; do
  echo "[$cfg]" | tee -a $f
  timeout 60 python3 tools/bench_splits.py --models qwen3-fp8 --splits 1 --config $cfg \
    2>&1 | grep -E "b[0-9]|Error" | tee -a $f
done
