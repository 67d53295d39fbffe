#!/usr/bin/env bash
# `OUT=$OUT bash tools/fuse_rope_check.sh` (~8 min): decode_config's FUSE_ROPE (the decode
# kernel norms, rotates and stores the new token itself; kernels/decode_rope.py): the kernels
# timed alone (tools/fuse_rope_time.py), its GPU tests and the attention tests it touches,
# then bench.py off / on alternating, Qwen2.5-0.5B shape and Qwen3-0.6B (bf16 caches; an fp8
# cache keeps triton_rope either way).
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/fuse_rope.txt
timeout 150 python3 tools/fuse_rope_time.py 2>&1 | tail -n 6 | tee -a "$f"
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_decode_rope.py \
  tests/layers/test_mixed_attention.py > "$o/fuse_rope_tests.txt" 2>&1
tail -n 2 "$o/fuse_rope_tests.txt" | tee -a "$f"
for shape in qwen2.5-0.5b qwen3-0.6b; do
  for on in 0 1 0 1; do
    echo "[$shape FUSE_ROPE=$on] $(timeout 90 python3 tools/bench_with.py decode.FUSE_ROPE=$on \
      -- --model-shape $shape 2>&1 | grep -E 'Total|Error' | tail -1)" | tee -a "$f"
  done
done
