#!/usr/bin/env bash
# `OUT=$OUT bash tools/fp8_table_ab.sh`: Qwen3-8B shape at batch 1 (`bench.py --single`),
# bf16 weights against fp8 (`--quantization fp8`) with skinny_config.FP8_TABLE's widest row as
# it is and as it was (32 x 512, 3 stages), alternating in one call.
export PYTHONPATH=. PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/fp8_table_ab.txt
old='from nanovllm.kernels import skinny_config as s; s.FP8_TABLE[-1] = (1 << 30, 1 << 30,
dict(BLOCK_N=32, BLOCK_K=512, SPLIT_K=None, num_warps=4, num_stages=3))'
args="--model-shape qwen3-8b --single --num-seqs 4 --min-output-len 100 --max-output-len 128"
run() {  # label, python prelude, bench.py arguments
  r=$(timeout 120 python3 -c "$2
import runpy, sys
sys.argv = ['bench.py'] + sys.argv[1:]
runpy.run_path('bench.py', run_name='__main__')" $3 2>&1 | grep -E 'Single|Error' | tail -1)
  echo "[$1] $r" | tee -a "$f"
}
for round in 1 2; do
  run "bf16" "" "$args"
  run "fp8, table now" "" "$args --quantization fp8"
  run "fp8, table before" "$old" "$args --quantization fp8"
done
