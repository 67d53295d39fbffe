#!/usr/bin/env bash
# `OUT=$OUT bash tools/sampler_check.sh` (~5 min): triton_sample.TWO_LEVEL_FROM (a slice a
# row drawn from the slices' log-sum-exps, then a token within it): the kernels alone
# (tools/bench_sampler.py, one- against two-level), the sampler's GPU test, then bench.py off /
# on alternating, Qwen2.5-0.5B shape (256 rows of 151,936 logits) and Qwen3-0.6B.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/sampler.txt
timeout 120 python3 tools/bench_sampler.py 2>&1 | tail -n 8 | tee -a "$f"
timeout 60 python3 -m pytest -q -m gpu tests/kernels/test_triton_sample.py > "$o/sampler_tests.txt" 2>&1
tail -n 2 "$o/sampler_tests.txt" | tee -a "$f"
for shape in qwen2.5-0.5b qwen3-0.6b; do
  for from in 1073741824 256; do
    r=$(timeout 90 python3 tools/bench_with.py sample.TWO_LEVEL_FROM=$from \
      -- --model-shape $shape 2>&1 | grep -E 'Total|Error' | tail -1)
    echo "[$shape TWO_LEVEL_FROM=$from] $r" | tee -a "$f"
  done
done
