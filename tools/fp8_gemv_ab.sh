#!/usr/bin/env bash
# `OUT=$OUT bash tools/fp8_gemv_ab.sh`: the one-row fp8 GEMV (kernels/gemv.py) on the
# device: its GPU tests, then the Qwen3-8B shape at batch 1 (`bench.py --single`) with fp8
# weights, GEMV on (gemv.MAX_M = 1) and off (0: the skinny kernel), and bf16, alternating;
# then the kernel on bf16 weights against cuBLAS (~3 min in all).
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/fp8_gemv_ab.txt
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py \
  2>&1 | tail -n 1 | tee -a "$f"
args="--model-shape qwen3-8b --single --num-seqs 4 --min-output-len 100 --max-output-len 128"
for round in 1 2; do
  for v in "fp8, GEMV|gemv.MAX_M=1|--quantization fp8" "fp8, skinny|gemv.MAX_M=0|--quantization fp8" \
      "bf16|gemv.MAX_M=0|"; do
    IFS='|' read -r label knob extra <<< "$v"
    r=$(timeout 60 python3 tools/bench_with.py $knob -- $args $extra 2>&1 \
      | grep -E 'Single|Error' | tail -1)
    echo "[$label] $r" | tee -a "$f"
  done
done
# The same FMA kernel on bf16 weights against cuBLAS at one row (a GEMV for bf16 models too?)
timeout 90 python3 tools/fp8_gemv_sweep.py --weights bf16 2>&1 | grep -v skip | tee -a "$f"
