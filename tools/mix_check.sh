#!/usr/bin/env bash
# `OUT=$OUT bash tools/mix_check.sh [kernels|cache|real]` on the device: the Hadamard mix by
# butterflies (NANOVLLM_FWHT=1, the default) against the dots (0). (Written when SmolLM2's
# int8-cache decode drifted on an H200: the stager's fault, fixed 2026-11-30.)
#   kernels (~4 min): the mixing kernels' GPU tests under each (test_mix_store names the
#     faulty piece: the mixed q / k, or the int8 codes and scales made from them).
#   cache (~6 min): the rest of the 8-bit caches' GPU tests under FW (default 1), then what
#     the dots cost: bench.py fp8 KV and batch 1, alternating.
#   real (~4 min): with SMOLLM2_GGUF (tools/real_model_check.sh carries the GGUF), SmolLM2's
#     int8-cache teacher-forced test and tools/fp8_accuracy.py's fp8-cache errors under each.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/mix_check.txt
tests() {  # label, pytest args...
  local label=$1; shift
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 \
    | grep -E "^(FAILED|ERROR)|^E  .*assert|passed|failed" | tail -n 25 | sed "s/^/[$label] /" \
    | tee -a "$f"
}
case "${1:-kernels}" in
  kernels)
    for fw in 1 0; do
      NANOVLLM_FWHT=$fw tests "FWHT=$fw" tests/kernels/test_mix_store.py \
        tests/kernels/test_hadamard.py tests/kernels/test_triton_rope.py
    done ;;
  cache)
    NANOVLLM_FWHT=${FW:-1} tests "FWHT=${FW:-1}" tests/models/test_layer_kernel.py \
      tests/kernels/test_kv_feedback.py \
      tests/kernels/test_fp8_kv.py tests/kernels/test_int8_kv.py
    for round in 1 2; do
      for fw in 1 0; do
        r=$(NANOVLLM_FWHT=$fw timeout 100 python3 bench.py --kv-cache-dtype fp8_e4m3 \
          --single 2>&1 | grep -E 'Total|Single|Error' | tr '\n' ' ')
        echo "[bench fp8 KV FWHT=$fw] $r" | tee -a "$f"
      done
    done ;;
  real)
    [ -n "$SMOLLM2_GGUF" ] || { echo "SMOLLM2_GGUF not set"; exit 1; }
    for fw in 1 0; do
      NANOVLLM_FWHT=$fw tests "FWHT=$fw" tests/worker/test_kv_cache.py -k smollm2_gpu
      NANOVLLM_FWHT=$fw timeout 150 python3 tools/fp8_accuracy.py --gguf "$SMOLLM2_GGUF" \
        --json "$o/fp8_fwht$fw.json" 2>&1 | grep " vs \|Error" | sed "s/^/[FWHT=$fw] /" \
        | tee -a "$f"
    done ;;
esac
