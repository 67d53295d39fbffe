#!/usr/bin/env bash
# One device call for issue 27 on a GPU: SmolLM2-135M-Instruct (real weights, from its GGUF)
# against HF transformers, fp8 KV accuracy, the throughput bench, and the GPU tests.
#   GGUF=/tmp/smollm2.gguf STEPS="acc fp8 bench tests" bash tools/real_model_check.sh
# The GGUF travels in two halves (a call carries at most 64 MiB): the first call copies
# .dev/smol.gguf.part00 to /tmp, this one joins it with part01. The `gguf` package comes as a
# wheel in .whl/. Logs and JSON land in $OUT.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-acc fp8 bench tests}
GGUF=${GGUF:-/tmp/smollm2.gguf}
has() { [[ " $STEPS " == *" $1 "* ]]; }
if [ ! -f "$GGUF" ] && [ -f /tmp/smol.gguf.part00 ] && [ -f .dev/smol.gguf.part01 ]; then
  cat /tmp/smol.gguf.part00 .dev/smol.gguf.part01 > "$GGUF"
fi
md5sum "$GGUF" || exit 1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export XDG_CACHE_HOME=/tmp/cache
nvidia-smi --query-gpu=name --format=csv,noheader
if has acc; then  # ours fp32 / bf16 / bf16+fp8 vs HF fp32, HF bf16, greedy reply, bs=1 tok/s
  timeout ${ACC_TIMEOUT:-240} python3 tools/smollm2_accuracy.py --gguf "$GGUF" --out "$OUT" \
    > "$OUT/acc.log" 2>&1; tail -12 "$OUT/acc.log"
fi
if has fp8; then  # fp32/bf16 caches and fp8 vs ours fp32, prefill and decode positions
  timeout ${FP8_TIMEOUT:-180} python3 tools/fp8_accuracy.py --gguf "$GGUF" \
    --json "$OUT/fp8_smollm2.json" > "$OUT/fp8.log" 2>&1; grep " vs \|Error" "$OUT/fp8.log"
fi
if has bench; then
  timeout 100 python3 bench.py > "$OUT/bench_bf16.log" 2>&1
  timeout 100 python3 bench.py --kv-cache-dtype fp8_e4m3 > "$OUT/bench_fp8.log" 2>&1
  grep -H -E "Total|KV cache:|Error" "$OUT/bench_bf16.log" "$OUT/bench_fp8.log"
fi
if has tests; then
  SMOLLM2_GGUF=$GGUF timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:logging -m gpu \
    ${TESTS:-tests/models/test_smollm2.py tests/kernels/test_fp8_kv.py tests/engine/test_gpu_engine.py} \
    > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
fi
