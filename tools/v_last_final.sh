#!/usr/bin/env bash
# `OUT=$OUT bash tools/v_last_final.sh` (~9 min): the GPU tests of the fp8 cache with the
# decode reading a tiled V's last tile as is (CONFIG_FP8["V_LAST"] 2, the defaults of the
# forty-first session), then bench.py's figures for the README.
f=${OUT:-/tmp/out}/v_last_final.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
timeout 220 python3 -m pytest -q -m gpu tests/kernels/test_v_tiles.py tests/kernels/test_fp8_kv.py \
  tests/worker/test_kv_cache.py > "$f.1" 2>&1
timeout 110 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py \
  -k "split_of_its_own or widened_as_loaded or rows_asked" > "$f.2" 2>&1
tail -n 3 "$f.1" "$f.2" | tee -a "$f"
grep -E "^(FAILED|ERROR)" "$f.1" "$f.2" | head | tee -a "$f"
for args in "--kv-cache-dtype fp8_e4m3" "" "--kv-cache-dtype fp8_e4m3" \
    "--kv-cache-dtype fp8_e4m3 --shared-prefix" "--kv-cache-dtype fp8_e4m3 --single --num-seqs 16"; do
  echo "[bench $args] $(timeout 60 python3 bench.py $args 2>&1 | grep -E 'Throughput|Error')" \
    | tee -a "$f"
done
