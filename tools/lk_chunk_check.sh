#!/usr/bin/env bash
# One device call (~5 min; `OUT=$OUT bash tools/lk_chunk_check.sh`): the layer kernel's
# weight chunk (CONFIG["CHUNK"], elements a program loads at once) at Qwen3-0.6B's shape.
# Compiled for sm_90 on the CPU machine, its bf16 kernel spills 312 bytes at CHUNK 16384
# (the default) and 16 at 8192, with 7,144 instructions against 8,976; over an e4m3 cache
# (V_WORDS) 40 and 104. CHUNK 8192 was timed before only at SmolLM2's shape (slower, before
# TAIL and PRE_KV). us a layer alternating, then bench.py --single --num-seqs 16.
f=${OUT:-/tmp/out}/chunk.txt
source tools/lk_common.sh
time_cfg qwen3-0.6b auto 300 CHUNK=16384 CHUNK=8192 CHUNK=16384 CHUNK=8192
time_cfg qwen3-0.6b fp8_e4m3 300 CHUNK=16384 CHUNK=8192
time_cfg smollm2-135m auto 300 CHUNK=16384 CHUNK=8192
time_cfg qwen2.5-0.5b auto 300 CHUNK=16384 CHUNK=8192
for run in "CHUNK=16384" "CHUNK=8192" "CHUNK=16384" "CHUNK=8192"; do
  echo "[qwen3-0.6b $run] $(timeout 90 python3 tools/lk_single.py qwen3-0.6b $run 2>&1 \
    | grep -E 'Single|Error')" | tee -a $f
done
