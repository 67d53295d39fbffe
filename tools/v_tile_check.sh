#!/usr/bin/env bash
# An fp8 cache's V pages tiled (CONFIG_FP8["V_TILE"], on by default since the fortieth
# session; kv_cache.tile_v_pages),
# two device calls: `OUT=$OUT bash tools/v_tile_check.sh tests` (~5 min: the GPU tests that
# read or write the tiles, and the bf16 decode's, whose tile loop moved into a helper), then
# `OUT=$OUT bash tools/v_tile_check.sh bench` (~5 min: the kernel alone against the usual
# layout; bench.py over an fp8 cache without / with the tiles, alternating; batch 1, the
# layer kernel; --shared-prefix, whose prefills read V from the cache).
f=${OUT:-/tmp/out}/v_tile_$1.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
if [ "$1" = tests ]; then
  timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_v_tiles.py \
    tests/kernels/test_fp8_kv.py tests/kernels/test_triton_attention.py 2>&1 | tail -4 | tee -a $f
  timeout 130 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py -k "fp8 or tile" \
    2>&1 | tail -4 | tee -a $f
  exit
fi
timeout 60 python3 tools/v_tile_check.py 2>&1 | tee -a $f
for run in "fp8.V_TILE=0" "" "fp8.V_TILE=0" ""; do
  echo "[bench fp8 $run] $(timeout 90 python3 tools/bench_with.py $run -- --kv-cache-dtype \
    fp8_e4m3 2>&1 | grep -E 'Throughput|Error')" | tee -a $f
done
for run in "fp8.V_TILE=0" ""; do
  echo "[single fp8 $run] $(timeout 90 python3 tools/bench_with.py $run -- --kv-cache-dtype \
    fp8_e4m3 --single --num-seqs 16 2>&1 | grep -E 'Single|Error')" | tee -a $f
  echo "[shared-prefix fp8 $run] $(timeout 90 python3 tools/bench_with.py $run -- \
    --kv-cache-dtype fp8_e4m3 --shared-prefix 2>&1 | grep -E 'Throughput|Error' | tail -2 \
    | tr '\n' ' ')" | tee -a $f
done
