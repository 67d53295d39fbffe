#!/usr/bin/env bash
# One device call (~8 min; `OUT=$OUT bash tools/lk_qfirst_check.sh`): the layer kernel's GPU
# tests (PRE_KV_FP8 and Q_FIRST among them), then, us a layer alternating
# (tools/bench_layer_kernel.py): Q_FIRST 0 / 1 (phase B's queries before the new key's store)
# for three shapes, and PRE_KV_FP8 0 / 1 (PRE_KV over an fp8 cache) for SmolLM2's; the
# trace with Q_FIRST; bench.py --single --num-seqs 16 both ways (tools/lk_single.py). Lines
# go to $OUT/qfirst.txt as they come, so a cut call keeps what it measured. Last:
# tools/host_split.py --single (who sets batch 1's pace: the host or the GPU).
f=${OUT:-/tmp/out}/qfirst.txt
source tools/lk_common.sh
lk_gpu_tests
time_cfg smollm2-135m auto 300 Q_FIRST=0 Q_FIRST=1 Q_FIRST=0 Q_FIRST=1
time_cfg smollm2-135m auto 512 Q_FIRST=0 Q_FIRST=1
time_cfg qwen2.5-0.5b auto 300 Q_FIRST=0 Q_FIRST=1
time_cfg qwen3-0.6b auto 300 Q_FIRST=0 Q_FIRST=1
time_cfg smollm2-135m fp8_e4m3 300 PRE_KV_FP8=0 PRE_KV_FP8=1 PRE_KV_FP8=0 PRE_KV_FP8=1 \
  "PRE_KV_FP8=1 Q_FIRST=1"
time_cfg smollm2-135m fp8_e4m3 512 PRE_KV_FP8=0 PRE_KV_FP8=1
timeout 60 python3 tools/lk_trace.py --shapes smollm2-135m --context 300 --programs 18 \
  --config Q_FIRST=1 2>&1 | tee -a $f
# Qwen3-0.6B's phases (not traced since PRE_KV; 8 kv heads, 5 splits: 40 programs in B)
timeout 60 python3 tools/lk_trace.py --shapes qwen3-0.6b --context 300 --programs 40 2>&1 \
  | tee -a $f
for run in "Q_FIRST=0" "Q_FIRST=1"; do
  echo "[smollm2-135m $run] $(timeout 90 python3 tools/lk_single.py smollm2-135m $run 2>&1 \
    | grep -E 'Single|Error')" | tee -a $f
done
for run in "PRE_KV_FP8=0" "PRE_KV_FP8=1"; do
  echo "[smollm2-135m fp8 $run] $(timeout 90 python3 tools/lk_single.py smollm2-135m $run \
    -- --kv-cache-dtype fp8_e4m3 2>&1 | grep -E 'Single|Error')" | tee -a $f
done
# Who sets batch 1's pace now (the GPU's layer kernel is ~13.3 us a layer): "wait" near zero
# means the host does.
timeout 90 python3 tools/host_split.py --single --model-shape smollm2-135m 2>&1 | tail -6 \
  | tee -a $f
