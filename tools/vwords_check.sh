#!/usr/bin/env bash
# One device call (~8 min; `OUT=$OUT bash tools/vwords_check.sh`): V_WORDS (an e4m3 cache's V
# tiles read as 32-bit words and widened to fp16 where loaded) in the decode kernel and the
# layer kernel. The GPU tests; then the decode kernel alone (tools/bench_splits.py,
# Qwen3-0.6B's fp8 cache, bench-like contexts) off / on; bench.py over an fp8 cache off / on,
# alternating; batch 1 (the layer kernel) off / on. Lines go to $OUT/vwords.txt as they come.
f=${OUT:-/tmp/out}/vwords.txt
source tools/lk_common.sh
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_fp8_kv.py -k "v_words or decode_fp8" \
  2>&1 | tail -3 | tee -a $f
timeout 150 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py \
  -k "v_tiles or one_launch" 2>&1 | tail -3 | tee -a $f
for vw in 0 1 0 1; do
  echo "[bench_splits V_WORDS=$vw]" | tee -a $f
  timeout 60 python3 tools/bench_splits.py --models qwen3-fp8 --splits 1 2 --config \
    V_WORDS=$vw 2>&1 | grep -E "b[0-9]|Error" | tee -a $f
done
bench() {  # label, then bench_with.py's arguments
  local label=$1; shift
  echo "[$label] $(timeout 120 python3 tools/bench_with.py "$@" 2>&1 \
    | grep -E 'Throughput|Error' | tail -1)" | tee -a $f
}
for vw in 0 1 0 1; do
  bench "bench fp8 V_WORDS=$vw" fp8.V_WORDS=$vw -- --kv-cache-dtype fp8_e4m3
done
for shape in qwen3-0.6b smollm2-135m; do
  for vw in 0 1; do
    bench "single $shape fp8 V_WORDS=$vw" fp8.V_WORDS=$vw layer.V_WORDS=$vw -- --single \
      --num-seqs 16 --model-shape $shape --kv-cache-dtype fp8_e4m3
  done
done
