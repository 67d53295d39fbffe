#!/usr/bin/env bash
# One device call (~5 min; `OUT=$OUT bash tools/lk_fp8_check.sh`): the batch-1 layer kernel
# with the new key a split of its own (CONFIG["NEW_APART"]) or not, alternating, in us a
# layer (tools/bench_layer_kernel.py): an fp8 e4m3 cache at contexts 512 and 2048, a bf16
# cache at 512, at the Qwen3-0.6B, SmolLM2-135M (and for bf16 Qwen2.5-0.5B) shapes.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
run() {  # kv shape ctx
  for apart in 0 1 0 1; do
    echo "$1 $2 ctx $3 NEW_APART=$apart: $(timeout 90 python3 tools/bench_layer_kernel.py \
      --kv-cache-dtype $1 --only config --shapes $2 --context $3 --config NEW_APART=$apart \
      2>&1 | grep -E 'us a layer|Error')"
  done
}
for shape in qwen3-0.6b smollm2-135m; do
  for ctx in 512 2048; do run fp8_e4m3 $shape $ctx; done
done
for shape in qwen3-0.6b smollm2-135m qwen2.5-0.5b; do run auto $shape 512; done
