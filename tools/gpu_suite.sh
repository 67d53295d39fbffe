#!/usr/bin/env bash
# `PART=1 OUT=$OUT bash tools/gpu_suite.sh` then PART=2: the whole `-m gpu` suite in two device
# calls (~10 min on one H200). Part 1 the kernels, engine, layers and models; part 2 the rest.
# The device has no fastapi: tests/server and tests/structured/test_generate.py do not collect.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"
if [ "${PART:-1}" = 1 ]; then
  set -- tests/kernels tests/engine tests/layers tests/models
elif [ "$PART" = 1b ]; then  # part 1 past the kernels a 550-s call reached (H200)
  set -- tests/models tests/kernels/test_v_tiles.py tests/engine tests/layers \
    tests/kernels/test_triton_rope.py tests/kernels/test_triton_sample.py
elif [ "$PART" = defaults ]; then  # what tools/defaults_check.sh left out, for new defaults
  set -- tests/models/test_hf_parity.py tests/models/test_layer_kernel.py \
    tests/models/test_layer_kernel_fp8.py tests/models/test_fused_prologues.py \
    tests/models/test_fp8_weights.py tests/models/test_gguf_weights.py tests/layers \
    tests/test_llm.py tests/test_async_llm.py tests/test_outputs.py tests/worker
else
  set -- tests/test_*.py tests/utils tests/worker tests/structured
fi
timeout ${LIMIT:-540} python3 -m pytest -v -rfE -m gpu -p no:cacheprovider --durations=12 \
  --continue-on-collection-errors "$@" > "$o/gpu_suite_$PART.txt" 2>&1
echo "rc $?" >> "$o/gpu_suite_$PART.txt"
grep -E "(FAILED|ERROR)" "$o/gpu_suite_$PART.txt" | head -30
echo "$(grep -c PASSED "$o/gpu_suite_$PART.txt") passed"
tail -n 20 "$o/gpu_suite_$PART.txt"
