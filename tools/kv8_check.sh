#!/usr/bin/env bash
# One device call for the int8 KV cache (kv_cache_dtype="int8"): GPU tests, SmolLM2 accuracy
# (fp32 / bf16 models, fp8_e4m3 and int8 caches against fp32 with an fp32 cache), and the
# throughput bench with the bf16, fp8_e4m3 and int8 caches.
#   GGUF=/tmp/smol.gguf STEPS="tests acc bench" bash tools/kv8_check.sh
# STEPS: tests (the int8/fp8 kernel and engine GPU tests), acc (tools/fp8_accuracy.py --gguf),
# bench (python bench.py: auto, fp8_e4m3, int8, then int8 with CONFIG_INT8's FP16_DOT through
# tools/bench_tuned.py, then int8 again), kern (decode kernel alone: bf16 / fp8 / int8 at the
# bench's shape, int8 variants). Logs land in $OUT.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-tests acc bench}
GGUF=${GGUF:-/tmp/smol.gguf}
has() { [[ " $STEPS " == *" $1 "* ]]; }
if ! python3 -c "import gguf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  # The `gguf` package as a wheel in .whl/ (as tools/real_model_check.sh takes it).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/cache}
nvidia-smi --query-gpu=name --format=csv,noheader
if has tests; then
  # The SmolLM2 GPU test (int8 logprobs vs fp32) skips without the GGUF.
  if [ -f "$GGUF" ]; then export SMOLLM2_GGUF=$GGUF; fi
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:logging -m gpu \
    tests/kernels/test_int8_kv.py tests/kernels/test_fp8_kv.py tests/kernels/test_triton_rope.py \
    tests/kernels/test_triton_attention.py tests/worker/test_kv_cache.py > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
fi
if has acc; then
  if [ -f "$GGUF" ]; then
    timeout ${ACC_TIMEOUT:-240} python3 tools/fp8_accuracy.py --gguf "$GGUF" --device cuda \
      --runs float32:auto bfloat16:auto bfloat16:fp8_e4m3 float32:fp8_e4m3 bfloat16:int8 \
      float32:int8 --json "$OUT/kv8_smollm2.json" > "$OUT/acc.log" 2>&1
    grep " vs \|Error" "$OUT/acc.log"
  else
    echo "acc: no GGUF at $GGUF (set GGUF=)"
  fi
fi
if has kern; then
  timeout 120 python3 tools/bench_kernels.py --int8 2>&1 | tee "$OUT/kern.log" | tail -12
fi
if has bench; then
  run() {  # name, then bench_tuned.py arguments
    local name=$1; shift
    timeout 120 python3 tools/bench_tuned.py "$@" > "$OUT/bench_$name.log" 2>&1
    echo "[$name] $(grep -E "Total|KV cache:|Error" "$OUT/bench_$name.log" | tr '\n' ' ')"
  }
  run bf16 -- --kv-cache-dtype auto
  run fp8 -- --kv-cache-dtype fp8_e4m3
  run int8 -- --kv-cache-dtype int8
  run int8_fp16dots --decode-int8 '{"FP16_DOT": true}' -- --kv-cache-dtype int8
  run int8_again -- --kv-cache-dtype int8
fi
