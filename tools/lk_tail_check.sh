#!/usr/bin/env bash
# One device call (~6 min; `OUT=$OUT bash tools/lk_tail_check.sh`): the layer kernel's GPU
# tests at the defaults (C_SPLITS 8 since 2026-11-29: phase C combines up to 8 key splits),
# then CONFIG["TAIL"] (a narrow last K chunk loaded with the first, before the barrier;
# SmolLM2's 576 = 512 + 64) off / on alternating, us a layer (tools/bench_layer_kernel.py,
# SmolLM2 shape, bf16 and fp8 caches, contexts 512 and 2048), its per-phase trace
# (tools/lk_trace.py), and bench.py --single --num-seqs 16 both ways. Lines go to
# $OUT/tail.txt as they come, so a cut call keeps what it measured.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
f=$OUT/tail.txt
timeout 150 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py 2>&1 | tail -4 | tee -a $f
for run in "512 auto" "2048 auto" "512 fp8_e4m3"; do
  set -- $run
  for cfg in "TAIL=0" "TAIL=64" "TAIL=0" "TAIL=64"; do
    echo "smollm2 ctx $1 $2 $cfg: $(timeout 40 python3 tools/bench_layer_kernel.py --only config \
      --shapes smollm2-135m --context $1 --kv-cache-dtype $2 --config $cfg 2>&1 \
      | grep -E 'us a layer|Error' | tr -s ' ')" | tee -a $f
  done
done
timeout 60 python3 tools/lk_trace.py --shapes smollm2-135m --config TAIL=64 2>&1 | tee -a $f
for tail in 0 64; do
  echo "[smollm2 TAIL=$tail] $(timeout 90 python3 -c "
import runpy, sys
from nanovllm.kernels.layer_config import CONFIG
CONFIG['TAIL'] = $tail
sys.argv = ['bench.py', '--single', '--num-seqs', '16', '--model-shape', 'smollm2-135m']
runpy.run_path('bench.py', run_name='__main__')" 2>&1 | grep -E 'Single|Error')" | tee -a $f
done
