#!/usr/bin/env bash
# One device call (~6 min; `OUT=$OUT bash tools/lk_prekv_check.sh`): the layer kernel's GPU
# tests, then CONFIG["PRE_KV"] 0 / 1 (each program's first key split, one tile, requested
# before the A -> B barrier: into registers up to 64-dim heads, else into L2), alternating,
# us a layer (tools/bench_layer_kernel.py), and bench.py --single --num-seqs 16 both ways.
# Lines go to $OUT/prekv.txt as they come, so a cut call keeps what it measured.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
f=$OUT/prekv.txt
timeout 200 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py 2>&1 | tail -4 \
  | tee -a $f
time_pre() {  # shape, context, then PRE_KV values
  local shape=$1 ctx=$2; shift 2
  for p in "$@"; do
    echo "$shape ctx$ctx PRE_KV=$p: $(timeout 40 python3 tools/bench_layer_kernel.py \
      --only config --shapes $shape --context $ctx --config PRE_KV=$p 2>&1 \
      | grep -E 'us a layer|Error' | tr -s ' ')" | tee -a $f
  done
}
time_pre smollm2-135m 300 0 1 0 1
time_pre smollm2-135m 512 0 1
time_pre qwen2.5-0.5b 300 0 1
time_pre qwen3-0.6b 300 0 1 0 1
for run in "smollm2-135m 0" "smollm2-135m 1" "qwen2.5-0.5b 0" "qwen2.5-0.5b 1" "qwen3-0.6b 1"; do
  set -- $run
  echo "[$1 PRE_KV=$2] $(timeout 90 python3 tools/lk_single.py $1 PRE_KV=$2 2>&1 \
    | grep -E 'Single|Error')" | tee -a $f
done
