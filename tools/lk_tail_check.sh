#!/usr/bin/env bash
# One device call (~9 min; `OUT=$OUT bash tools/lk_tail_check.sh`): the layer kernel's GPU
# tests at the defaults (C_SPLITS 8 since 2026-11-29: phase C combines up to 8 key splits;
# TAIL and A_CHUNK forced on in their own tests), then CONFIG["TAIL"] (a narrow last K chunk
# loaded with the first, before the barrier: SmolLM2's 576 = 512 + 64) and ["A_CHUNK"]
# (phase A's K chunks sized for its own rows) off / on, alternating, us a layer
# (tools/bench_layer_kernel.py, context 512), with NEW_APART 1 (SmolLM2) and 8 warps over
# 32K chunks (Qwen2.5) beside them; the SmolLM2 trace with both (tools/lk_trace.py); and
# bench.py --single --num-seqs 16 both ways. Lines go to $OUT/tail.txt as they come, so a
# cut call keeps what it measured.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
f=$OUT/tail.txt
timeout 170 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py 2>&1 | tail -4 | tee -a $f
time_configs() {  # shape, cache, then configs ("KEY=V KEY=V" each)
  local shape=$1 kv=$2; shift 2
  for cfg in "$@"; do
    args=""; for c in $cfg; do args="$args --config $c"; done
    echo "$shape $kv $cfg: $(timeout 40 python3 tools/bench_layer_kernel.py --only config \
      --shapes $shape --kv-cache-dtype $kv $args 2>&1 | grep -E 'us a layer|Error' \
      | tr -s ' ')" | tee -a $f
  done
}
time_configs smollm2-135m auto "TAIL=0 A_CHUNK=0" "TAIL=64 A_CHUNK=0" "TAIL=0 A_CHUNK=1" \
  "TAIL=64 A_CHUNK=1" "TAIL=64 A_CHUNK=1 NEW_APART=1" "TAIL=0 A_CHUNK=0" "TAIL=64 A_CHUNK=1"
time_configs qwen2.5-0.5b auto "A_CHUNK=0" "A_CHUNK=1" "A_CHUNK=1 num_warps=8 CHUNK=32768" \
  "num_warps=8 CHUNK=32768" "A_CHUNK=0" "A_CHUNK=1"
time_configs qwen3-0.6b auto "A_CHUNK=0" "A_CHUNK=1" "A_CHUNK=0" "A_CHUNK=1"
time_configs smollm2-135m fp8_e4m3 "TAIL=0 A_CHUNK=0" "TAIL=64 A_CHUNK=1" "TAIL=0 A_CHUNK=0" \
  "TAIL=64 A_CHUNK=1"
timeout 60 python3 tools/lk_trace.py --shapes smollm2-135m --config TAIL=64 --config A_CHUNK=1 \
  2>&1 | tee -a $f
for run in "smollm2-135m 0 0" "smollm2-135m 64 1" "qwen2.5-0.5b 0 0" "qwen2.5-0.5b 64 1"; do
  set -- $run
  echo "[$1 TAIL=$2 A_CHUNK=$3] $(timeout 90 python3 tools/lk_single.py $1 TAIL=$2 \
    A_CHUNK=$3 2>&1 | grep -E 'Single|Error')" | tee -a $f
done
