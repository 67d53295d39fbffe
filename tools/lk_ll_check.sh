#!/usr/bin/env bash
# One device call (~6 min; `OUT=$OUT bash tools/lk_ll_check.sh`): the batch-1 layer kernel's
# flagged hand-overs (CONFIG["LL"]: 1 after phases C, D and E; 2 also B -> C; off by
# default, built without a device). First the default path's layer-kernel GPU tests, then
# the LL GPU tests (tests/models/test_layer_kernel_ll.py) and the usual ones with LL 2
# forced on; then us a layer, LL 0, 2, 1, 0, 2 (tools/bench_layer_kernel.py, context
# 512, three shapes bf16 and the Qwen3 shape over fp8); then bench.py --single --num-seqs 16
# each way. Every step has its own timeout: a poll that never ends costs its step only.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -x -p no:logging -m gpu tests/models/test_layer_kernel.py \
  -k gpu_one_launch > "$OUT/default.log" 2>&1
echo "default GPU tests rc=$?"; grep -E "passed|failed" "$OUT/default.log" | tail -1
timeout 150 python3 -m pytest -q -x -p no:logging -m gpu tests/models/test_layer_kernel_ll.py \
  > "$OUT/ll_tests.log" 2>&1
echo "LL GPU tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/ll_tests.log" | tail -6
timeout 120 python3 -c "
import sys, pytest
from nanovllm.kernels import layer_launch
layer_launch.CONFIG['LL'] = 2
sys.exit(pytest.main(['-q', '-x', '-p', 'no:logging', '-m', 'gpu',
                      'tests/models/test_layer_kernel.py', '-k', 'gpu_one_launch']))
" > "$OUT/ll_all.log" 2>&1
echo "layer kernel GPU tests with LL 2 rc=$?"; grep -E "passed|failed" "$OUT/ll_all.log" | tail -1
for run in "smollm2-135m auto" "qwen3-0.6b auto" "qwen2.5-0.5b auto" "qwen3-0.6b fp8_e4m3"; do
  set -- $run
  for ll in 0 2 1 0 2; do
    echo "$1 $2 LL=$ll: $(timeout 45 python3 tools/bench_layer_kernel.py --only config \
      --shapes $1 --kv-cache-dtype $2 --config LL=$ll 2>&1 | grep -E 'us a layer|Error')"
  done
done
for shape in smollm2-135m qwen3-0.6b; do
  for ll in 0 2; do
    timeout 90 python3 -c "
import runpy, sys
from nanovllm.kernels import layer_launch
layer_launch.CONFIG['LL'] = $ll
sys.argv = ['bench.py', '--single', '--num-seqs', '16', '--model-shape', '$shape']
runpy.run_path('bench.py', run_name='__main__')
" > "$OUT/bench.log" 2>&1
    echo "[$shape LL=$ll] $(grep -E 'Single' "$OUT/bench.log")"
  done
done
