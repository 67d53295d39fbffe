#!/usr/bin/env bash
# One device call (~5 min; `OUT=$OUT bash tools/lk_ll_check.sh`): the batch-1 layer kernel's
# flagged hand-overs (CONFIG["LL"], off by default; built without a device). First its GPU
# tests (LL forced on: two new parameters, then the usual ones), then us a layer with LL
# off / on alternating (tools/bench_layer_kernel.py, context 512, three shapes, bf16 and the
# Qwen3 shape over fp8), then bench.py --single --num-seqs 16 both ways. Logs in $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -x -p no:logging -m gpu tests/models/test_layer_kernel.py \
  -k flagged > "$OUT/ll_tests.log" 2>&1
echo "flagged tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/ll_tests.log" | tail -6
timeout 150 python3 -c "
import sys, pytest
from nanovllm.kernels import layer_launch
layer_launch.CONFIG['LL'] = True
sys.exit(pytest.main(['-q', '-x', '-p', 'no:logging', '-m', 'gpu',
                      'tests/models/test_layer_kernel.py', '-k', 'gpu_one_launch']))
" > "$OUT/ll_all.log" 2>&1
echo "layer kernel GPU tests with LL on rc=$?"; grep -E "passed|failed" "$OUT/ll_all.log" | tail -2
for run in "smollm2-135m auto" "qwen3-0.6b auto" "qwen2.5-0.5b auto" "qwen3-0.6b fp8_e4m3"; do
  set -- $run
  for ll in 0 1 0 1; do
    echo "$1 $2 LL=$ll: $(timeout 60 python3 tools/bench_layer_kernel.py --only config \
      --shapes $1 --kv-cache-dtype $2 --config LL=$ll 2>&1 | grep -E 'us a layer|Error')"
  done
done
for shape in smollm2-135m qwen3-0.6b; do
  for ll in 0 1; do
    timeout 90 python3 -c "
import runpy, sys
from nanovllm.kernels import layer_launch
layer_launch.CONFIG['LL'] = bool($ll)
sys.argv = ['bench.py', '--single', '--num-seqs', '16', '--model-shape', '$shape']
runpy.run_path('bench.py', run_name='__main__')
" > "$OUT/bench.log" 2>&1
    echo "[$shape LL=$ll] $(grep -E 'Single' "$OUT/bench.log")"
  done
done
