#!/usr/bin/env bash
# `OUT=$OUT bash tools/fp8_swap_ab.sh MODE` on the device: the fp8 tall tiles in y^T's form
# (kernels/skinny_gemm.py SWAP, fp8_gemm.TALL_SWAP) for issue 32's bench.py with fp8 weights
# at batched-decode sizes (17-256 rows), where every fp8 path so far lost to bf16 cuBLAS.
#   sweep (~6 min, not yet run): the fp8 GEMM / skinny kernel GPU tests (SWAP checked on
#     real shapes), then tools/fp8_tall_sweep.py on Qwen3-0.6B's layers, both tile forms,
#     M 32 / 64 / 128 / 256, against dequantize + cuBLAS and bf16 cuBLAS.
#   engine (~4 min, not yet run): bench.py --quantization fp8 with today's path against the
#     swapped tall tiles up to 64 rows (or ROWS), alternating twice, and bf16 once.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/fp8_swap_ab.txt
if [ "${1:-sweep}" = sweep ]; then
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=line \
    tests/kernels/test_fp8_gemm.py tests/kernels/test_skinny_gemm.py 2>&1 \
    | grep -E "^(FAILED|ERROR)|^/.*(Error|assert)|passed|failed" | tail -n 12 | tee -a "$f"
  timeout 330 python3 tools/fp8_tall_sweep.py --m 32,64,128,256 --json "$o/swap_sweep.json" \
    2>&1 | tee -a "$f"
else
  rows=$(( ${ROWS:-64} + 1 ))
  for round in 1 2; do
    for arm in "" "fp8gemm.TALL_SWAP=1 fp8gemm.DEQUANT_FROM_M=$rows"; do
      r=$(timeout 100 python3 tools/bench_with.py $arm -- --quantization fp8 2>&1 \
        | grep -E 'Total|Error' | tail -1)
      echo "[fp8 ${arm:-today}] $r" | tee -a "$f"
    done
  done
  r=$(timeout 100 python3 bench.py 2>&1 | grep -E 'Total|Error' | tail -1)
  echo "[bf16] $r" | tee -a "$f"
fi
