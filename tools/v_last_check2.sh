#!/usr/bin/env bash
# `OUT=$OUT bash tools/v_last_check2.sh` (~4 min): the decode kernel with every V tile read
# whole in the loop (V_LAST 3: slots past a context must hold no NaN codes) against
# today's V_LAST 0; bench.py over an fp8 cache with each, alternating.
f=${OUT:-/tmp/out}/v_last2.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
timeout 150 python3 tools/v_tile_check.py --v-last 0 3 2>&1 | tee -a "$f"
for run in 0 3 0 3; do
  echo "[bench fp8 V_LAST=$run] $(timeout 60 python3 tools/bench_with.py fp8.V_LAST=$run \
    -- --kv-cache-dtype fp8_e4m3 2>&1 | grep -E 'Throughput|Error')" | tee -a "$f"
done
