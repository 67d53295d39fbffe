#!/usr/bin/env bash
# `OUT=$OUT bash tools/fp8_gemv_ab.sh`: the one-row fp8 GEMV (kernels/fp8_gemv.py) on the
# device: its GPU tests, then the Qwen3-8B shape at batch 1 (`bench.py --single`) with fp8
# weights, GEMV on (fp8_gemv.MAX_M = 1) and off (0: the skinny kernel), and bf16, alternating;
# then the kernel on bf16 weights against cuBLAS (~3 min in all).
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/fp8_gemv_ab.txt
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemv.py \
  2>&1 | tail -n 1 | tee -a "$f"
args="--model-shape qwen3-8b --single --num-seqs 4 --min-output-len 100 --max-output-len 128"
run() {  # label, python prelude, bench.py arguments
  r=$(timeout 60 python3 -c "$2
import runpy, sys
sys.argv = ['bench.py'] + sys.argv[1:]
runpy.run_path('bench.py', run_name='__main__')" $3 2>&1 | grep -E 'Single|Error' | tail -1)
  echo "[$1] $r" | tee -a "$f"
}

on='from nanovllm.kernels import fp8_gemv; fp8_gemv.MAX_M = 1'
off='from nanovllm.kernels import fp8_gemv; fp8_gemv.MAX_M = 0'
run "fp8, GEMV" "$on" "$args --quantization fp8"
run "fp8, skinny" "$off" "$args --quantization fp8"
run "bf16" "" "$args"
run "fp8, GEMV" "$on" "$args --quantization fp8"
run "fp8, skinny" "$off" "$args --quantization fp8"
# The same FMA kernel on bf16 weights against cuBLAS at one row (a GEMV for bf16 models too?)
timeout 90 python3 tools/fp8_gemv_sweep.py --weights bf16 2>&1 | grep -v skip | tee -a "$f"
