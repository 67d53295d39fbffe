#!/usr/bin/env bash
# Forty-second session, first call: tall bf16 GEMMs against op + cuBLAS at batched-decode M,
# then last session's planned layer-kernel V_LAST check.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"
timeout 250 python3 tools/mid_gemm_sweep.py --model qwen2.5-0.5b --json $o/mid_q25.json > $o/mid_q25.txt 2>&1
timeout 200 python3 tools/mid_gemm_sweep.py --model qwen3-0.6b --json $o/mid_q3.json > $o/mid_q3.txt 2>&1
OUT=$o timeout 130 bash tools/v_last_lk.sh > /dev/null 2>&1
tail -n 5 $o/mid_q25.txt $o/mid_q3.txt; cat $o/v_last_lk.txt
