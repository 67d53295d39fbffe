#!/usr/bin/env bash
# `OUT=$OUT bash tools/defaults_check.sh` (~8 min): the session's new defaults (FUSE_ROPE on,
# the two-level sampler from 256 programs) under the GPU tests they touch, then bench.py with
# both off / the defaults, alternating (Qwen2.5-0.5B shape, Qwen3-0.6B), and batch 1
# (Qwen3-0.6B --single) with FUSE_ROPE off / on.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/defaults.txt
timeout ${LIMIT:-300} python3 -m pytest -v -rfE -m gpu -p no:cacheprovider \
  tests/kernels/test_decode_rope.py tests/kernels/test_triton_sample.py \
  tests/layers/test_mixed_attention.py tests/test_speculative.py tests/models/test_smollm2.py \
  tests/models/test_architectures.py tests/engine > "$o/defaults_tests.txt" 2>&1
grep -E "(FAILED|ERROR)" "$o/defaults_tests.txt" | head
echo "$(grep -c PASSED "$o/defaults_tests.txt") passed; $(tail -n 1 "$o/defaults_tests.txt")" \
  | tee -a "$f"
OFF="decode.FUSE_ROPE=0 sample.TWO_LEVEL_FROM=1073741824"
bench() {  # label, overrides..., -- bench args
  local label=$1; shift
  echo "[$label] $(timeout 90 python3 tools/bench_with.py "$@" 2>&1 | grep -E 'Total|Error|Single' \
    | tail -2 | tr '\n' ' ')" | tee -a "$f"
}
for shape in qwen2.5-0.5b qwen3-0.6b; do
  for run in 1 2; do
    bench "$shape off" $OFF -- --model-shape $shape
    bench "$shape defaults" -- --model-shape $shape
  done
done
for run in 1 2; do
  bench "single FUSE_ROPE=0" decode.FUSE_ROPE=0 -- --single
  bench "single defaults" -- --single
done
