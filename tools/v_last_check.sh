#!/usr/bin/env bash
# The forty-first session's device checks, two calls:
# `OUT=$OUT bash tools/v_last_check.sh tests` (~4 min): GPU tests of the tiled V's last tile
# zeroed inside the tile loop (decode_tiles.attend_tiles' V_LAST), decode and layer kernels;
# `OUT=$OUT bash tools/v_last_check.sh bench` (~6 min): the decode kernel alone with V_LAST
# 0 / 1 / 2, bench.py over an fp8 cache and batch 1 with V_LAST 0 / 1 alternating.
f=${OUT:-/tmp/out}/v_last_$1.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
if [ "$1" = tests ]; then
  timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_v_tiles.py > "$f.1" 2>&1
  timeout 200 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py \
    -k "split_of_its_own or widened_as_loaded or rows_asked" > "$f.2" 2>&1
  tail -n 5 "$f.1" "$f.2" | tee -a "$f"
  exit
fi
timeout 150 python3 tools/v_tile_check.py --v-last 0 1 2 2>&1 | tee -a "$f"
for run in 0 1 0 1; do
  echo "[bench fp8 V_LAST=$run] $(timeout 60 python3 tools/bench_with.py fp8.V_LAST=$run \
    layer.V_LAST=$run -- --kv-cache-dtype fp8_e4m3 2>&1 | grep -E 'Throughput|Error')" \
    | tee -a "$f"
done
for run in 0 1 0 1; do
  echo "[single fp8 V_LAST=$run] $(timeout 60 python3 tools/bench_with.py fp8.V_LAST=$run \
    layer.V_LAST=$run -- --kv-cache-dtype fp8_e4m3 --single --num-seqs 16 2>&1 \
    | grep -E 'Single|Error')" | tee -a "$f"
done
