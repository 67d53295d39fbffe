#!/usr/bin/env bash
# `OUT=$OUT bash tools/profile_now.sh` (~5 min): the Qwen2.5-0.5B shape's decode-step kernel
# profile and host split with the forty-third session's defaults (FUSE_ROPE, two-level
# sampler), bench.py with an fp8 cache off / defaults alternating, and bf16 / fp8 weights.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/profile_now.txt
timeout 150 python3 tools/profile_bench.py --model-shape qwen2.5-0.5b --bandwidth 4.3e12 \
  > "$o/profile_qwen25.txt" 2>&1
tail -n 45 "$o/profile_qwen25.txt"
timeout 100 python3 tools/host_split.py --model-shape qwen2.5-0.5b 2>&1 | tail -8 | tee -a "$f"
OFF="decode.FUSE_ROPE=0 sample.TWO_LEVEL_FROM=1073741824"
for run in 1 2; do
  for ov in "$OFF" ""; do
    r=$(timeout 90 python3 tools/bench_with.py $ov -- --kv-cache-dtype fp8_e4m3 2>&1 \
      | grep -E 'Throughput|Error' | tail -1)
    echo "[fp8 cache, ${ov:-defaults}] $r" | tee -a "$f"
  done
done
for args in "" "--quantization fp8"; do
  echo "[bench $args] $(timeout 60 python3 bench.py $args 2>&1 | grep -E 'Throughput|Error')" \
    | tee -a "$f"
done
