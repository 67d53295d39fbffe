# Sourced by the tools/lk_*_check.sh device scripts (after setting f, their output file):
# the environment, the layer kernel's GPU tests, and time_cfg, which times the layer kernel
# (tools/bench_layer_kernel.py, us a layer) under CONFIG overrides.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"

lk_gpu_tests() {  # the layer kernel's GPU tests, their summary appended to $f
  timeout 200 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py 2>&1 | tail -4 \
    | tee -a "$f"
}

time_cfg() {  # shape, cache, context, then configs ("KEY=V KEY=V" each)
  local shape=$1 kv=$2 ctx=$3 cfg args c; shift 3
  for cfg in "$@"; do
    args=""; for c in $cfg; do args="$args --config $c"; done
    echo "$shape $kv ctx$ctx $cfg: $(timeout 40 python3 tools/bench_layer_kernel.py --only \
      config --shapes $shape --kv-cache-dtype $kv --context $ctx $args 2>&1 \
      | grep -E 'us a layer|Error' | tr -s ' ')" | tee -a "$f"
  done
}
