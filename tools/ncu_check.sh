#!/usr/bin/env bash
# Why does the fp8 decode kernel read at ~3.2 TB/s where bf16's reads at ~4.4 (H200, batch
# 256, Qwen3-0.6B's shapes)? Not its instruction count (V_WORDS: 36% fewer, slower), not
# its warps (32-key tiles: 5 programs an SM, slower), not its pages' layout (head by head:
# the same). Nsight Compute's stall reasons for fp8 (V_WORDS off / on) and bf16, and for
# the fp8 store at 8 tokens (7-9 us a layer against bf16's 2). `OUT=$OUT bash
# tools/ncu_check.sh` (~4 min); one report a run under $OUT/ncu/.
d=${OUT:-/tmp/out}/ncu
mkdir -p "$d"
export PYTHONPATH=. PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
stalls=""
for r in long_scoreboard short_scoreboard mio_throttle lg_throttle barrier wait math_pipe_throttle \
    not_selected selected dispatch_stall no_instruction branch_resolving drain misc; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
what="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats \
  --metrics ${stalls#,}"
for run in "qwen3-fp8 V_WORDS=0" "qwen3-fp8 V_WORDS=1" "qwen3 V_WORDS=0"; do
  set -- $run
  out="$d/decode_$1_${2/=/_}.txt"  # (a name with '=' does not come back from the device)
  timeout 120 $NCU --clock-control none -k regex:_decode_partial --launch-skip 2 \
    --launch-count 1 $what python3 tools/ncu_decode.py $1 --config $2 > "$out" 2>&1
  echo "$run: rc $? $(grep -E 'DRAM Throughput|Issued Ipc|No Eligible' "$out" \
    | tr -s ' ' | head -3 | tr '\n' ';')"
done
timeout 120 $NCU --clock-control none -k regex:_norm_rope_store --launch-skip 20 \
  --launch-count 1 $what python3 tools/bench_kv_feedback.py --variants engine --tokens 8 \
  --warps 8 > "$d/store_fp8_8.txt" 2>&1
echo "store: rc $?"
