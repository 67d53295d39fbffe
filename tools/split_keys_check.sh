#!/usr/bin/env bash
# `PART=kernel OUT=$OUT bash tools/split_keys_check.sh`, then PART=bench (~11 min in two
# calls): decode_config's SPLIT_KEYS (each row's splits by its length past one program an SM,
# kernels/decode_splits.py): its GPU tests and the decode tests it touches, the kernel over
# bench_splits' mixed contexts (default rule against SPLIT_KEYS 128-512 at 4 and 8 splits a
# row; bf16 caches and Qwen3's fp8 one), then bench.py off / on.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/split_keys.txt
# PART=kernel: the tests and bench_splits (~5 min); PART=bench: bench.py (~6 min).
if [ "${PART:-}" != bench ]; then
timeout 150 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider \
  tests/kernels/test_decode_splits.py tests/kernels/test_decode_rope.py \
  tests/kernels/test_triton_attention.py tests/kernels/test_fp8_kv.py \
  > "$o/split_keys_tests.txt" 2>&1
tail -n 1 "$o/split_keys_tests.txt" | tee -a "$f"
for c in "100 2048" "100 1100"; do
  m="--models qwen2.5 smollm2 qwen3 qwen3-fp8 --batches 128 256 --contexts $c"
  echo "[contexts $c, default rule] $(timeout 60 python3 tools/bench_splits.py $m --splits 1 2 \
    2>&1 | grep -E '^(qwen|smol)|Error' | tr '\n' ' ')" | tee -a "$f"
  for keys in 128 256 512; do
    r=$(timeout 60 python3 tools/bench_splits.py $m --splits 4 8 --config SPLIT_KEYS=$keys \
      2>&1 | grep -E '^(qwen|smol)|Error' | tr '\n' ' ')
    echo "[contexts $c, SPLIT_KEYS=$keys] $r" | tee -a "$f"
  done
done
fi
[ "${PART:-}" = kernel ] && exit 0
for run in "decode qwen2.5-0.5b" "decode smollm2-135m" "decode qwen3-0.6b" \
    "fp8 qwen3-0.6b --kv-cache-dtype fp8_e4m3"; do
  set -- $run
  table=$1 shape=$2; shift 2
  for keys in 0 256 0 256; do
    r=$(timeout 90 python3 tools/bench_with.py $table.SPLIT_KEYS=$keys -- --model-shape $shape \
      "$@" 2>&1 | grep -E 'Total|Error' | tail -1)
    echo "[$shape $* SPLIT_KEYS=$keys] $r" | tee -a "$f"
  done
done
