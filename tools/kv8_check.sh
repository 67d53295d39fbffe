#!/usr/bin/env bash
# One device call for the int8 KV cache (kv_cache_dtype="int8"): the throughput bench, the int8
# GPU tests, SmolLM2 accuracy (fp32 / bf16 models, fp8_e4m3 and int8 caches against fp32 with
# an fp32 cache).
#   GGUF=/tmp/smol.gguf STEPS="bench tests acc" bash tools/kv8_check.sh
# STEPS, run in this order:
#   bench  python bench.py (through tools/bench_tuned.py) for each run in BENCH (default
#          "int8 fp8 int8_fp16dots"; also "bf16", "int8_again"): int8_fp16dots sets
#          CONFIG_INT8's FP16_DOT (decode's dots in fp16, see nanovllm/kernels/triton_decode.py);
#          int8_s1 / int8_s2 set its num_stages to 1 / 2 (fewer loads in flight; see
#          tools/kernel_ir.py)
#   tests  the int8 GPU tests (tests/kernels/test_int8_kv.py: stores, decode, prefill, one
#          engine start), verbose so failing names show even if the call is cut short
#   acc    tools/fp8_accuracy.py --gguf (needs GGUF)
#   kern   tools/bench_kernels.py --int8: bf16 / fp8 / int8 decode kernel alone, int8 variants
#   mixed  tools/bench_kernels.py --int8-mixed: fp8 vs int8 at the bench's spread of lengths
# Logs land in $OUT.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-bench tests acc}
BENCH=${BENCH:-int8 fp8 int8_fp16dots}
GGUF=${GGUF:-/tmp/smol.gguf}
has() { [[ " $STEPS " == *" $1 "* ]]; }
if ! python3 -c "import gguf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  # The `gguf` package as a wheel in .whl/ (as tools/real_model_check.sh takes it).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/cache}
nvidia-smi --query-gpu=name --format=csv,noheader
if has mixed; then
  timeout 180 python3 tools/bench_kernels.py --int8-mixed 2>&1 | tee "$OUT/mixed.log" | tail -6
fi
if has bench; then
  for name in $BENCH; do
    case $name in
      bf16) args=(-- --kv-cache-dtype auto) ;;
      fp8) args=(-- --kv-cache-dtype fp8_e4m3) ;;
      int8 | int8_again) args=(-- --kv-cache-dtype int8) ;;
      int8_fp16dots) args=(--decode-int8 '{"FP16_DOT": true}' -- --kv-cache-dtype int8) ;;
      int8_s1) args=(--decode-int8 '{"num_stages": 1}' -- --kv-cache-dtype int8) ;;
      int8_s2) args=(--decode-int8 '{"num_stages": 2}' -- --kv-cache-dtype int8) ;;
      *) echo "unknown BENCH run $name"; continue ;;
    esac
    timeout ${BENCH_TIMEOUT:-150} python3 tools/bench_tuned.py "${args[@]}" \
      > "$OUT/bench_$name.log" 2>&1
    echo "[$name] $(grep -E "Total|KV cache:|Error" "$OUT/bench_$name.log" | tr '\n' ' ')"
  done
fi
if has tests; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -v -p no:logging -m gpu \
    tests/kernels/test_int8_kv.py > "$OUT/tests.log" 2>&1
  grep -E "PASSED|FAILED|ERROR" "$OUT/tests.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -30
  grep -E "^E " "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
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
  timeout 180 python3 tools/bench_kernels.py --int8 2>&1 | tee "$OUT/kern.log" | tail -12
fi
