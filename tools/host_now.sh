#!/usr/bin/env bash
# `OUT=$OUT bash tools/host_now.sh` (~5 min): where a step's host time goes today at the
# Qwen2.5-0.5B shape (tools/host_split.py), its bench.py, and bench.py bf16 / fp8 weights
# (issue 32's ratio), in one call.
f=${OUT:-/tmp/out}/host_now.txt
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$(dirname "$f")"
timeout 100 python3 tools/host_split.py --model-shape qwen2.5-0.5b 2>&1 | tail -8 | tee -a "$f"
for args in "--model-shape qwen2.5-0.5b" "" "--quantization fp8"; do
  echo "[bench $args] $(timeout 55 python3 bench.py $args 2>&1 | grep -E 'Throughput|Error')" \
    | tee -a "$f"
done
