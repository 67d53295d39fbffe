#!/usr/bin/env bash
# `OUT=$OUT bash tools/mix_check.sh` on the device (~5 min): the Hadamard mix by butterflies
# (NANOVLLM_FWHT=1) against the dots (0, the default since SmolLM2's int8-cache decode drifted
# with the butterflies on an H200): the mixing kernels' GPU tests under each, then with
# SMOLLM2_GGUF (tools/real_model_check.sh carries it) SmolLM2's int8-cache teacher-forced test
# and tools/fp8_accuracy.py's fp8-cache errors under each.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/mix_check.txt
for fw in 1 0; do
  NANOVLLM_FWHT=$fw timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/kernels/test_mix_store.py tests/kernels/test_hadamard.py \
    tests/kernels/test_triton_rope.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" \
    | tail -n 25 | sed "s/^/[FWHT=$fw] /" | tee -a "$f"
done
if [ -n "$SMOLLM2_GGUF" ]; then
  for fw in 1 0; do
    NANOVLLM_FWHT=$fw timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/worker/test_kv_cache.py -k int8_logprobs_on_smollm2_gpu 2>&1 \
      | grep -E "^E  .*assert|passed|failed" | sed "s/^/[FWHT=$fw] /" | tee -a "$f"
    NANOVLLM_FWHT=$fw timeout 150 python3 tools/fp8_accuracy.py --gguf "$SMOLLM2_GGUF" \
      --json "$o/fp8_fwht$fw.json" 2>&1 | grep " vs \|Error" | sed "s/^/[FWHT=$fw] /" \
      | tee -a "$f"
  done
fi
