#!/usr/bin/env bash
# One device call (H100) for the GEMM kernels (issues 31 and 32): kernels/skinny_gemm.py for
# M <= 16 and kernels/fp8_gemm.py for fp8 prefill. Steps, chosen with STEPS (default
# "tests bench e2e"; each fits one 10-minute call, "sweep" alone takes ~5 minutes):
#   tests  the gpu-marked GEMM tests: every model's linear shapes at M = 1..16 (bf16, fp32 x;
#          bf16 / fp8 row / fp8 block weights), graph replay, fp8 prefill sizes, the dispatch,
#          greedy parity with NANOVLLM_SKINNY_GEMM on and off and fp8 kernels vs reference on
#          SmolLM2 (set SMOLLM2_GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf, else they skip),
#          the fp8 KV-block test
#   bench  tools/bench_gemm.py: skinny vs cuBLAS, M = 1..16, Qwen3-0.6B and Qwen3-8B shapes,
#          plus fp8 weights at M = 128, 1024, 8192: tall tiles, dequantize + cuBLAS and W8A8
#          (vs bf16 cuBLAS)
#   sweep  tools/bench_gemm.py --sweep: the best tile configs per shape (the table's source)
#   e2e    bench.py --single: Qwen3-0.6B with NANOVLLM_SKINNY_GEMM=0 and 1, and with
#          --quantization fp8 (long prefills: dequantize + cuBLAS, then NANOVLLM_FP8_PREFILL=w8a8)
#   e2e8b  the same for the Qwen3-8B shape: bf16 (switch 0 and 1) vs --quantization fp8
# Logs land in $OUT.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-tests bench e2e}
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name --format=csv,noheader
if has tests; then
  timeout 420 python3 -m pytest -v -rf -m gpu -p no:logging tests/kernels/test_skinny_gemm.py \
    tests/kernels/test_fp8_gemm.py tests/kernels/test_fp8_w8a8.py \
    tests/layers/test_linear_dispatch.py \
    tests/models/test_fp8_weights.py > "$OUT/gemm_tests.log" 2>&1
  grep -E "(FAILED|ERROR)" "$OUT/gemm_tests.log" | head -30; tail -1 "$OUT/gemm_tests.log"
fi
if has bench; then
  timeout 400 python3 tools/bench_gemm.py --large-m 128,1024,8192 > "$OUT/bench_gemm.log" 2>&1
  cat "$OUT/bench_gemm.log"
fi
if has sweep; then
  timeout 580 python3 tools/bench_gemm.py --sweep --m 1,16 > "$OUT/bench_gemm_sweep.log" 2>&1
  sed -n '/^best per/,$p' "$OUT/bench_gemm_sweep.log"
fi
if has e2e; then
  run() {  # name, env, args
    env $2 timeout 170 python3 bench.py --single $3 > "$OUT/e2e_$1.log" 2>&1
    echo "[$1] $(grep -E "Total|Single|KV cache:|Error" "$OUT/e2e_$1.log" | tr '\n' ' ')"
  }
  run qwen3-0.6b_skinny0 NANOVLLM_SKINNY_GEMM=0 ""
  run qwen3-0.6b_skinny1 NANOVLLM_SKINNY_GEMM=1 ""
  run qwen3-0.6b_fp8 NANOVLLM_SKINNY_GEMM=1 "--quantization fp8"
  run qwen3-0.6b_fp8_w8a8 NANOVLLM_FP8_PREFILL=w8a8 "--quantization fp8"
fi
if has e2e8b; then
  run() {  # name, env, args
    env $2 timeout 190 python3 bench.py --single $3 > "$OUT/e2e_$1.log" 2>&1
    echo "[$1] $(grep -E "Total|Single|KV cache:|Error" "$OUT/e2e_$1.log" | tr '\n' ' ')"
  }
  run qwen3-8b_skinny0 NANOVLLM_SKINNY_GEMM=0 "--model-shape qwen3-8b"
  run qwen3-8b_skinny1 NANOVLLM_SKINNY_GEMM=1 "--model-shape qwen3-8b"
  run qwen3-8b_fp8 NANOVLLM_SKINNY_GEMM=1 "--model-shape qwen3-8b --quantization fp8"
fi
