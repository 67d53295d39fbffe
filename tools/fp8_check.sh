#!/usr/bin/env bash
# One device call for the fp8 KV cache (and the decode kernel's launch orders). Steps, chosen
# with STEPS (default "kern order bench"; also "tests", "acc", "real", "fp8bench", "profile"):
#   tests   the GPU tests (server tests aside)
#   kern    decode kernel bf16 vs fp8 with a tile sweep; its fastest fp8 config -> best_fp8.json
#   order   decode kernel launch orders (HEAD_FAST, LPT) on mixed context lengths
#   bench   bench.py --single: bf16, bf16 + launch orders, fp8 (best_fp8.json), fp8 + orders
#   acc     fp8 accuracy on dummy Qwen3-0.6B; profile: profile_bench of an fp8 run
#   real    teacher-forced logprobs on SmolLM2 (real weights): fp32 / bf16 / fp8 caches vs fp32;
#           needs GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf (or HF_DIR=an HF checkpoint)
#   fp8bench  python bench.py, then --kv-cache-dtype fp8_e4m3 (the plain bench, no tuning)
# Logs land in $OUT.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-kern order bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name --format=csv,noheader
if has tests; then
  timeout ${TEST_TIMEOUT:-270} python3 -m pytest -q -p no:logging -m gpu tests --ignore=tests/server > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
fi
if has kern; then
  timeout 180 python3 tools/bench_kernels.py --fp8 "$OUT/best_fp8.json" 2>&1 | tee "$OUT/kern.log" | tail -9
fi
if has order; then
  timeout 120 python3 tools/bench_kernels.py --order 2>&1 | tee "$OUT/order.log" | tail -9
fi
if has bench; then
  ORDERS='{"HEAD_FAST": true, "LPT": true}'
  run() {  # name, then bench_tuned.py arguments
    local name=$1; shift
    timeout 80 python3 tools/bench_tuned.py "$@" > "$OUT/bench_$name.log" 2>&1
    echo "[$name] $(grep -E "Total|Single|KV cache:|Error" "$OUT/bench_$name.log" | tr '\n' ' ')"
  }
  run bf16 -- --single
  run bf16_orders --decode "$ORDERS" -- --single
  run fp8 --best "$OUT/best_fp8.json" -- --single --kv-cache-dtype fp8_e4m3
  run fp8_orders --best "$OUT/best_fp8.json" --decode-fp8 "$ORDERS" -- --single --kv-cache-dtype fp8_e4m3
fi
if has acc; then
  timeout ${ACC_TIMEOUT:-100} python3 tools/fp8_accuracy.py --dummy-qwen3 --kv-cache-dtype ${ACC_KINDS:-fp8_e5m2} \
    --json "$OUT/acc.json" 2>&1 | grep -v Writing | tail -3
fi
if has real; then
  timeout ${REAL_TIMEOUT:-300} python3 tools/fp8_accuracy.py ${GGUF:+--gguf "$GGUF"} \
    ${HF_DIR:+--hf-dir "$HF_DIR"} --json "$OUT/fp8_smollm2.json" > "$OUT/real.log" 2>&1
  grep " vs " "$OUT/real.log"; tail -2 "$OUT/real.log" | grep -i error
fi
if has fp8bench; then
  timeout 100 python3 bench.py > "$OUT/bench_bf16.log" 2>&1
  timeout 100 python3 bench.py --kv-cache-dtype fp8_e4m3 > "$OUT/bench_fp8.log" 2>&1
  grep -H -E "Total|KV cache:" "$OUT/bench_bf16.log" "$OUT/bench_fp8.log"
fi
if has profile; then  # where an fp8 run's decode steps spend their time
  timeout 120 python3 tools/profile_bench.py --kv-cache-dtype fp8_e4m3 > "$OUT/profile_fp8.log" 2>&1
  grep -A12 "^wall" "$OUT/profile_fp8.log"
fi
