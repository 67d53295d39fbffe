#!/usr/bin/env bash
# One 2-GPU device call (kind nvidia-h200-x2) for data parallelism: the GPU replica and TP
# tests, then bench.py's workload doubled to 512 sequences at TP=1, TP=2 and DP=2, each run
# on a fresh engine. Logs and JSON land in $OUT; a summary table is printed last.
set -u
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 240 python3 -m pytest -v --durations=0 -p no:logging -o faulthandler_timeout=120 -m gpu \
  tests/engine/test_data_parallel.py tests/worker/test_multiproc.py > "$OUT/dp_tests.log" 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|SKIPPED|ERROR|^E  " "$OUT/dp_tests.log" | head -20
tail -1 "$OUT/dp_tests.log"
for run in "--tp 1" "--tp 2" "--dp 2"; do
  name=$(echo "$run" | tr -d ' -')
  timeout 200 python3 bench.py --num-seqs 512 $run --json "$OUT/bench_$name.json" \
    > "$OUT/bench_$name.log" 2>&1
  echo "bench $run rc=$?"; grep -E "Total|KV cache|Startup|Error|error" "$OUT/bench_$name.log" | tail -4
done
ls /dev/shm | grep -c psm_ | sed 's/^/shm segments left: /'
pgrep -fa "nanovllm|multiprocessing" | head -5
python3 - "$OUT" <<'PY'
import json, os, sys
rows = {}
for name in ("tp1", "tp2", "dp2"):
    path = os.path.join(sys.argv[1], f"bench_{name}.json")
    if os.path.exists(path):
        rows[name] = json.load(open(path))
base = rows.get("tp1", {}).get("throughput_tok_s")
print(f"{'run':>4} {'tok/s':>9} {'x TP=1':>7} {'seconds':>8} {'startup s':>9}")
for name, r in rows.items():
    ratio = f"{r['throughput_tok_s'] / base:.2f}" if base else "-"
    print(f"{name:>4} {r['throughput_tok_s']:>9.0f} {ratio:>7} {r['seconds']:>8.2f} {r['startup_s']:>9.1f}")
PY
