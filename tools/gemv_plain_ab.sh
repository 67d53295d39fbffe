#!/usr/bin/env bash
# `OUT=$OUT bash tools/gemv_plain_ab.sh` (~6 min): the one-row GEMV (kernels/gemv.py) on plain
# bf16 weights (gemv.PLAIN, off by default) and the GEMV's next tiles, on the device:
#   1. its GPU tests (fp8 and plain weights, every supported shape);
#   2. tools/fp8_gemv_sweep.py --variants (GROUP-summed accumulators, evict-first W loads);
#   3. the Qwen3-8B shape at batch 1: bf16 and fp8 weights, PLAIN 0 / 1 (the bf16 layers, and
#      for both the LM head), alternating over two rounds;
#   4. bench.py (Qwen3-0.6B, 256 sequences) bf16 and --quantization fp8, alternating, twice.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/gemv_plain_ab.txt
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed" | tail -n 5 | tee -a "$f"
timeout 150 python3 tools/fp8_gemv_sweep.py --variants 2>&1 | grep -v skip | tee -a "$f"
args="--model-shape qwen3-8b --single --num-seqs 4 --min-output-len 100 --max-output-len 128"
for round in 1 2; do
  for v in "0|" "1|" "0|--quantization fp8" "1|--quantization fp8"; do
    IFS='|' read -r plain extra <<< "$v"
    r=$(timeout 60 python3 tools/bench_with.py gemv.PLAIN=$plain -- $args $extra 2>&1 \
      | grep -E 'Single|Error' | tail -1)
    echo "[8B PLAIN=$plain ${extra:-bf16}] $r" | tee -a "$f"
  done
done
for round in 1 2; do
  for extra in "" "--quantization fp8"; do
    r=$(timeout 90 python3 bench.py $extra 2>&1 | grep -E 'Total|Error' | tail -1)
    echo "[bench.py ${extra:-bf16}] $r" | tee -a "$f"
  done
done
