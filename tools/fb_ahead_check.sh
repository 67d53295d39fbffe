#!/usr/bin/env bash
# The fortieth session's open checks, two device calls:
# `OUT=$OUT bash tools/fb_ahead_check.sh tests` (~5 min): the GPU tests of the Hadamard mix by
# butterflies (kernels/hadamard.py) and of the decode store's feedback rows asked for early
# (triton_rope.FEEDBACK_ROWS_AHEAD 1: registers, 2: L1), not yet run on a GPU;
# `OUT=$OUT bash tools/fb_ahead_check.sh bench` (~7 min): the store alone at 1-256 tokens,
# bench.py over an fp8 cache with ROWS_AHEAD 0 / 2 / 1 alternating, batch 1 with the layer
# kernel's FB_AHEAD 0 / 2 / 1, then butterflies / dots (NANOVLLM_FWHT) alternating.
f=${OUT:-/tmp/out}/fb_ahead_$1.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
if [ "$1" = tests ]; then
  timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_kv_feedback.py \
    tests/kernels/test_hadamard.py tests/kernels/test_triton_rope.py > "$f.1" 2>&1
  timeout 150 python3 -m pytest -q -m gpu tests/models/test_layer_kernel.py \
    -k "feedback or fp8 or mix or rows_asked" > "$f.2" 2>&1
  tail -n 5 "$f.1" "$f.2" | tee -a "$f"
  exit
fi
timeout 60 python3 tools/bench_kv_feedback.py --variants nomix plain engine ahead1 ahead2 \
  --tokens 1 8 64 256 2>&1 | tee -a "$f"
for run in 0 2 1 0 2 1; do
  echo "[bench fp8 ROWS_AHEAD=$run] $(timeout 60 python3 tools/bench_with.py \
    rope.FEEDBACK_ROWS_AHEAD=$run -- --kv-cache-dtype fp8_e4m3 2>&1 \
    | grep -E 'Throughput|Error')" | tee -a "$f"
done
for run in 0 2 1; do  # the layer kernel's tile (Qwen3-0.6B: 128-dim heads), batch 1
  echo "[single fp8 FB_AHEAD=$run] $(timeout 60 python3 tools/bench_with.py \
    layer.FB_AHEAD=$run -- --kv-cache-dtype fp8_e4m3 --single --num-seqs 16 2>&1 \
    | grep -E 'Single|Error')" | tee -a "$f"
done
for fw in 1 0 1 0; do
  echo "[bench fp8 FWHT=$fw] $(NANOVLLM_FWHT=$fw timeout 60 python3 bench.py \
    --kv-cache-dtype fp8_e4m3 2>&1 | grep -E 'Throughput|Error')" | tee -a "$f"
done
