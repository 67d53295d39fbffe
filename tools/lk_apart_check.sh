#!/usr/bin/env bash
# One device call (~8 min; `OUT=$OUT bash tools/lk_apart_check.sh`): the layer kernel's GPU
# tests (bf16 and fp8 caches) at the defaults (TAIL 64, A_CHUNK on since 2026-11-29); where
# phase B's time goes at bench.py --single's contexts (a 32-token prompt + 512 tokens: mostly
# <= 8 one-tile splits) by program (tools/lk_trace.py --programs), with and without the new
# key a split of its own (NEW_APART 1); the same off / on in us a layer and bench.py --single.
# Lines go to $OUT/apart.txt as they come.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
f=$OUT/apart.txt
timeout 250 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py \
  tests/models/test_layer_kernel_fp8.py 2>&1 | tail -4 | tee -a $f
for a in 0 1; do
  timeout 60 python3 tools/lk_trace.py --shapes smollm2-135m --context 300 --programs 24 \
    --config NEW_APART=$a 2>&1 | sed "s/^/[NEW_APART=$a] /" | tee -a $f
done
for shape in smollm2-135m qwen2.5-0.5b; do
  for a in 0 1 0 1; do
    echo "$shape ctx300 NEW_APART=$a: $(timeout 40 python3 tools/bench_layer_kernel.py \
      --only config --shapes $shape --context 300 --config NEW_APART=$a 2>&1 \
      | grep -E 'us a layer|Error' | tr -s ' ')" | tee -a $f
  done
done
for run in "smollm2-135m 0" "smollm2-135m 1" "qwen3-0.6b 2" "qwen2.5-0.5b 2"; do
  set -- $run
  echo "[$1 NEW_APART=$2] $(timeout 90 python3 tools/lk_single.py $1 NEW_APART=$2 2>&1 \
    | grep -E 'Single|Error')" | tee -a $f
done
