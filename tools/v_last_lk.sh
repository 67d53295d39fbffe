#!/usr/bin/env bash
# `OUT=$OUT bash tools/v_last_lk.sh` (~3 min): the layer kernel reading a tiled V's last tile
# as is (layer_config V_LAST 2; where the new key is not apart: 64-dim heads), its GPU test,
# then batch 1 of the SmolLM2 shape over an fp8 cache with V_LAST 1 / 2 alternating.
f=${OUT:-/tmp/out}/v_last_lk.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
for run in 1 2 1 2; do
  echo "[smollm2 single fp8 V_LAST=$run] $(timeout 40 python3 tools/bench_with.py \
    layer.V_LAST=$run -- --model-shape smollm2-135m --kv-cache-dtype fp8_e4m3 --single \
    --num-seqs 16 2>&1 | grep -E 'Single|Error')" | tee -a "$f"
done
timeout 45 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py \
  -k "widened_as_loaded and 64-2" > "$f.1" 2>&1
tail -n 2 "$f.1" | tee -a "$f"
