#!/usr/bin/env bash
# `OUT=$OUT bash tools/gemv_rows_ab.sh MODE` on the device, MODE one of sweep, engine, small,
# plain, tests, next, head, narrow, pdl, pdlpos, files, trees, gated, ratio, wvec,
# narrow8: the GEMV (kernels/gemv.py) at one to four rows and on plain weights, and the
# batch-1 decode chain around it (PDL, the decode kernel's splits, the gated epilogue).
#   sweep (~6 min): its GPU tests; tools/gemv_sweep.py, fp8 and bf16 weights, rows 1 / 2 / 4;
#     the small models at batch 1 with gemv.PLAIN 0 / 1 (their LM heads), alternating.
#   small (~5 min): the small models' fp8 layers at one / two rows, the 8B bf16 LM head, and
#     two sequences of Qwen3-0.6B / Qwen2.5-0.5B with fp8 weights, gemv.MAX_M 1 / 2.
#   plain (~3 min): small models' bf16 layers and LM heads on the GEMV or not (gemv.PLAIN
#     1 / 0) at two sequences then one. (Timed with knobs since folded into PLAIN: layers
#     under 2^24 values, heads of K < 4,096; each won.)
#   tests (PART 1 / 2 / 3, each <= 9.5 min; FILES overrides the part's list; logs in
#     $OUT/tests_PART.log): every GPU test outside tests/kernels (toy engines in bf16 decode
#     through the GEMV) plus the GEMV's, fp8 GEMM's and skinny GEMM's; the real-weight ones
#     (test_linear_dispatch, test_smollm2, test_kv_cache) skip unless SMOLLM2_GGUF names the
#     GGUF (carried in two calls; PYTHONPATH must keep the gguf wheel's folder). H200,
#     2026-11-30, with the GGUF, fiftieth session on fresh machines (Triton compiles all):
#     part 1 402 s (35 passed, 10 skipped), part 2 324 s (48 passed), part 3 312 s (255
#     passed, 4 skipped); run one part a call.
#     No fastapi there: server / structured are left to the CPU suite.
#   next (~4 min; run 2026-11-30, PERF_NOTES forty-seventh session): the int8 LM head copy
#     through the GEMV (tests, sweep, the 8B shape with gemv.INT8_HEAD_MAX_M 0 / 2), bf16
#     small layers at 3-4 rows, and batch 1 of small models with the layer kernel on / off
#     now that a launch per op uses the GEMV.
#   head (~3 min; run 2026-11-30, PERF_NOTES forty-ninth session: INT8_HEAD_MAX_M 1 since):
#     the int8 head copy at one row on its own tiles (gemv.GROUPED_ONE_ROW): the sweep's
#     default against the best, then the 8B fp8 + int8 head and Qwen3-0.6B bf16 + int8 head
#     shapes with gemv.INT8_HEAD_MAX_M 0 / 1, alternating.
#   narrow (~3 min; run 2026-11-30, forty-ninth session: PLAIN_NARROW_MAX_M 4 since): bf16
#     o / down projections (N < K) at three and four rows, then four sequences decoding
#     together with gemv.PLAIN_NARROW_MAX_M 0 / 4, alternating.
#   pdl (~8 min): programmatic dependent launch (kernels/pdl.py, NANOVLLM_PDL) for the
#     batch-1 chain of norm / GEMV / SiLU·mul: its GPU tests, then the 8B shape's batch 1
#     (fp8 and bf16) with NANOVLLM_PDL 0 / 1 alternating twice, bench.py (Qwen3-0.6B and the
#     Qwen2.5-0.5B shape) once each, and
#     the 8B fp8 token's kernel profile with it off and on.
#   wvec (~5 min): fp8 W in 8-byte vectors at one row (gemv.ONE_ROW_W_VEC: x's tile then
#     needs no shared-memory trip or barriers): the GEMV's GPU tests, the sweep, the 8B
#     batch 1 A/B.
#   narrow8 (~2 min): the narrow fp8 layers' one-row tile (4, 1024) / (4, 2048): the sweep,
#     then the 8B fp8 shape's batch 1, alternating twice.
#   pdlpos (~6 min): where the GEMV releases the next launch under PDL (gemv.
#     PDL_EARLY_RELEASE 1: at its start, 0: after its K loop) against PDL off, the 8B shape's
#     batch 1 in fp8 and bf16, alternating twice; bench.py both ways; the narrow fp8 tile
#     (4, 1024) / (4, 2048) on the small models' batch 1.
#   ratio (~3 min): issue 32's batch-1 ratio as shipped (PDL on): the 8B shape in bf16,
#     fp8, and fp8 + the int8 LM head copy, alternating twice.
#   files (~7 min): the tree's kernel files against OLD, a folder of earlier versions of
#     some of them (nanovllm/kernels/NAME for each OLD/NAME), swapped in and out: TESTS' GPU
#     tests (default: test_pdl and the norm / RoPE / decode files), then the 8B shape's batch
#     1 in fp8 and bf16 alternating twice, and bench.py once each. First use (as `preload`,
#     2026-11-30, fifty-second session): the norm, RoPE store and decode kernels loading the
#     host's inputs before their PDL wait.
#   trees (~4 min a round of four variants): files with several variants, TREES/NAME/ each;
#     first use 2026-11-30 (fifty-third session): the decode early exit, batch 1 on the fused
#     RoPE step, both, neither.
#   gated (~5 min): a one-row gate_up with its SiLU-and-mul in the GEMV's epilogue
#     (kernels/gemv_gated.py, gated.GATED): its GPU tests, then the 8B shape's batch 1 in fp8
#     and bf16 with gated.GATED 0 / 1 alternating twice.
#   (skinny and peel2, run 2026-11-30, PERF_NOTES fifty-second session: PDL in the skinny
#     GEMM and two W tiles before the GEMV's wait both lost, and were removed; so did
#     minsplit, fifty-third session: decode splits of at least 256 keys, 405 -> 391 tok/s;
#     and ahead, fifty-fourth: W's later tiles asked into L2 before the wait, 405.7 -> 359.7;
#     late, same session: the norm releasing the next launch before its store 401 -> 394,
#     decode attention after its key loop 401.4 -> 402.2, within the spread.)
#   engine (~9 min): the Qwen3-8B shape, 2 sequences then one (bench.py --single), bf16 and
#     fp8 weights, the GEMV up to one row or two (gemv.PLAIN_MAX_M / gemv.MAX_M) and bf16 on
#     cuBLAS, two rounds; bench.py bf16 and fp8; the GEMV's, fp8 and architectures' GPU tests.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1  # keep a caller's /tmp/site (gguf)
o=${OUT:-/tmp/out}; mkdir -p "$o"; f=$o/gemv_rows_ab.txt
run() {  # label, bench_with args...
  local label=$1; shift
  r=$(timeout 90 python3 tools/bench_with.py "$@" 2>&1 | grep -E 'Total|Single|Error' \
    | tr '\n' ' ')
  echo "[$label] $r" | tee -a "$f"
}
gpu_tests() {  # seconds, test files...: their GPU tests, the summary lines into $f
  local limit=$1; shift
  timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 \
    | grep -E "^(FAILED|ERROR)|passed|failed" | tail -n 8 | tee -a "$f"
}
narrow_tile() {  # label, model shape, BLOCK_K: fp8 batch 1 with the narrow tile (4, BLOCK_K)
  r=$(timeout 90 python3 -c "import runpy, sys
from nanovllm.kernels import gemv
gemv.ONE_ROW[(True, 'narrow')] = (4, $3)
sys.argv = ['bench.py', '--model-shape', '$2', '--quantization', 'fp8', '--single',
            '--num-seqs', '1', '--min-output-len', '16', '--max-output-len', '16']
runpy.run_path('bench.py', run_name='__main__')" 2>&1 | grep -E 'Single|Error' | tr '\n' ' ')
  echo "[$1] $r" | tee -a "$f"
}
if [ "${1:-sweep}" = tests ]; then
  # Every GPU test outside kernels/ (engines on toy models in bf16 now run their decode
  # through the GEMV), and the GEMM kernels' own; pass SMOLLM2_GGUF for the real-weight ones.
  # (--ignore=tests/kernels would drop the kernel files named too.)
  if [ "${PART:-1}" = 1 ]; then
    set -- tests/test_*.py tests/engine tests/layers
  elif [ "${PART:-1}" = 2 ]; then
    set -- tests/models tests/utils
  else
    set -- tests/worker tests/kernels/test_gemv.py tests/kernels/test_fp8_gemm.py \
      tests/kernels/test_skinny_gemm.py
  fi
  [ -n "${FILES:-}" ] && set -- $FILES
  timeout 570 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=line "$@" 2>&1 \
    | tee "$o/tests_${PART:-1}.log" | grep -E "^(FAILED|ERROR)|^/.*(Error|assert)|passed|failed" \
    | tail -n 24 | tee -a "$f"
elif [ "${1:-sweep}" = next ]; then
  gpu_tests 100 tests/kernels/test_gemv.py tests/layers/test_int8_head.py
  timeout 120 python3 tools/gemv_sweep.py --weights int8 --layers lm_head --rows 1,2 \
    --models qwen3-8b,qwen3-0.6b 2>&1 | grep -v skip | tee -a "$f"
  timeout 120 python3 tools/gemv_sweep.py --weights bf16 --rows 3,4 --models qwen3-0.6b \
    2>&1 | grep -v skip | tee -a "$f"
  a="--model-shape qwen3-8b --single --num-seqs 2 --min-input-len 16 --max-input-len 32"
  a="$a --min-output-len 256 --max-output-len 256 --quantization fp8 --lm-head-quantization int8"
  for round in 1 2; do
    for m in 0 2; do
      run "8B fp8 + int8 head INT8_HEAD_MAX_M=$m" gemv.INT8_HEAD_MAX_M=$m -- $a
    done
    for shape in qwen3-0.6b smollm2-135m; do
      for lk in 1 0; do
        NANOVLLM_LAYER_KERNEL=$lk run "$shape LAYER_KERNEL=$lk" -- --model-shape $shape \
          --single --num-seqs 1 --min-output-len 16 --max-output-len 16
      done
    done
  done
elif [ "${1:-sweep}" = head ]; then
  timeout 100 python3 tools/gemv_sweep.py --weights int8 --layers lm_head --rows 1 \
    --models qwen3-8b,qwen3-0.6b 2>&1 | grep -v skip | tee -a "$f"
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16 --lm-head-quantization int8"
  for round in 1 2; do
    for m in 0 1; do
      run "8B fp8 + int8 head INT8_HEAD_MAX_M=$m" gemv.INT8_HEAD_MAX_M=$m -- \
        --model-shape qwen3-8b --quantization fp8 $s
      run "0.6B bf16 + int8 head INT8_HEAD_MAX_M=$m" gemv.INT8_HEAD_MAX_M=$m -- \
        --model-shape qwen3-0.6b $s
    done
  done
elif [ "${1:-sweep}" = pdl ]; then
  gpu_tests 150 tests/kernels/test_pdl.py tests/kernels/test_triton_norm.py
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for round in 1 2; do
    for on in 0 1; do
      NANOVLLM_PDL=$on run "8B fp8 PDL=$on" -- --model-shape qwen3-8b --quantization fp8 $s
      NANOVLLM_PDL=$on run "8B bf16 PDL=$on" -- --model-shape qwen3-8b $s
    done
  done
  for on in 0 1; do  # large batches: the norm / RoPE / attention / SiLU launches after cuBLAS
    NANOVLLM_PDL=$on run "bench.py PDL=$on" --
    NANOVLLM_PDL=$on run "bench.py qwen2.5-0.5b PDL=$on" -- --model-shape qwen2.5-0.5b
  done
  for on in 0 1; do  # the token's kernels and wall, per op (logs in $OUT)
    NANOVLLM_PDL=$on timeout 120 python3 tools/profile_bench.py --single \
      --model-shape qwen3-8b --quantization fp8 > "$o/profile_8b_fp8_pdl$on.log" 2>&1
    tail -n 12 "$o/profile_8b_fp8_pdl$on.log" | tee -a "$f"
  done
elif [ "${1:-sweep}" = pdlpos ]; then
  gpu_tests 150 tests/kernels/test_pdl.py
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for round in 1 2; do
    for w in fp8 bf16; do
      q=$([ $w = fp8 ] && echo "--quantization fp8")
      NANOVLLM_PDL=0 run "8B $w PDL=0" -- --model-shape qwen3-8b $q $s
      for e in 1 0; do
        NANOVLLM_PDL=1 run "8B $w PDL=1 early=$e" gemv.PDL_EARLY_RELEASE=$e -- \
          --model-shape qwen3-8b $q $s
      done
    done
  done
  for on in 0 1; do
    NANOVLLM_PDL=$on run "bench.py PDL=$on late" --
    NANOVLLM_PDL=$on run "bench.py qwen2.5-0.5b PDL=$on late" -- --model-shape qwen2.5-0.5b
  done
  for m in qwen3-0.6b qwen2.5-0.5b; do
    for bk in 1024 2048; do
      narrow_tile "$m fp8 narrow tile 4 x $bk" $m $bk
    done
  done
elif [ "${1:-sweep}" = files ]; then
  gpu_tests 200 ${TESTS:-tests/kernels/test_pdl.py tests/kernels/test_triton_norm.py \
    tests/kernels/test_triton_rope.py tests/kernels/test_decode_rope.py \
    tests/kernels/test_triton_attention.py}
  k=nanovllm/kernels; new=/tmp/files_new; mkdir -p $new
  for p in "$OLD"/*.py; do cp $k/$(basename $p) $new/; done
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for round in 1 2; do
    for tree in old new; do
      if [ $tree = old ]; then cp "$OLD"/*.py $k/; else cp $new/*.py $k/; fi
      run "8B fp8 $tree" -- --model-shape qwen3-8b --quantization fp8 $s
      run "8B bf16 $tree" -- --model-shape qwen3-8b $s
    done
  done
  for tree in old new; do
    if [ $tree = old ]; then cp "$OLD"/*.py $k/; else cp $new/*.py $k/; fi
    run "bench.py $tree" --
  done
  cp $new/*.py $k/
elif [ "${1:-sweep}" = trees ]; then
  # Like files with several variants: each folder under TREES holds one version of the same
  # kernel files; ROUNDS (default 1 2; 2 runs the variants in reverse) of the 8B shape's batch
  # 1 in fp8 and bf16 per variant, TESTS' GPU tests first when set, bench.py per BENCH variant.
  k=nanovllm/kernels; new=/tmp/trees_new; mkdir -p $new
  [ -n "${TESTS:-}" ] && gpu_tests 200 $TESTS
  first=$(ls -d "$TREES"/*/ | head -n 1)
  for p in "$first"*.py; do cp -n $k/$(basename $p) $new/; done
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for round in ${ROUNDS:-1 2}; do
    vs=$(ls "$TREES"); [ $round = 2 ] && vs=$(ls "$TREES" | sort -r)
    for v in $vs; do
      cp "$TREES/$v"/*.py $k/
      run "8B fp8 $v" -- --model-shape qwen3-8b --quantization fp8 $s
      run "8B bf16 $v" -- --model-shape qwen3-8b $s
    done
  done
  for v in ${BENCH:-}; do cp "$TREES/$v"/*.py $k/; run "bench.py $v" --; done
  cp $new/*.py $k/
elif [ "${1:-sweep}" = gated ]; then
  gpu_tests 200 tests/kernels/test_gemv_gated.py
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for round in 1 2; do
    for g in 0 1; do
      run "8B fp8 GATED=$g" gated.GATED=$g -- --model-shape qwen3-8b --quantization fp8 $s
      run "8B bf16 GATED=$g" gated.GATED=$g -- --model-shape qwen3-8b $s
    done
  done
elif [ "${1:-sweep}" = ratio ]; then
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for round in 1 2; do
    run "8B bf16" -- --model-shape qwen3-8b $s
    run "8B fp8" -- --model-shape qwen3-8b --quantization fp8 $s
    run "8B fp8 + int8 head" -- --model-shape qwen3-8b --quantization fp8 \
      --lm-head-quantization int8 $s
  done
elif [ "${1:-sweep}" = wvec ]; then
  gpu_tests 240 tests/kernels/test_gemv.py
  timeout 100 python3 tools/gemv_sweep.py --weights fp8 --rows 1 --groups 16 \
    --evict evict_first --w-vec 0,8 --top 6 \
    --tiles 4x1024x4x3,8x1024x4x3,16x1024x4x3,4x2048x8x3,8x2048x8x3,16x256x4x3 2>&1 \
    | grep -v skip | tee -a "$f"
  s="--single --num-seqs 1 --min-output-len 16 --max-output-len 16"
  for v in 0 8 0 8; do
    run "8B fp8 ONE_ROW_W_VEC=$v" gemv.ONE_ROW_W_VEC=$v -- --model-shape qwen3-8b \
      --quantization fp8 $s
  done
elif [ "${1:-sweep}" = narrow8 ]; then
  # The narrow fp8 one-row tile, (4, 1024) as is or (4, 2048) (the fiftieth session's sweep:
  # o 6.8 -> 6.4, down 15.1 -> 14.4 µs on Qwen3-8B), in the engine, alternating twice.
  timeout 60 python3 tools/gemv_sweep.py --weights fp8 --rows 1 --layers o,down \
    --tiles 4x1024x4x3,4x2048x4x3 --groups 16 --evict evict_first 2>&1 | grep -v skip \
    | tee -a "$f"
  for bk in 1024 2048 1024 2048; do
    narrow_tile "8B fp8 narrow tile 4 x $bk" qwen3-8b $bk
  done
elif [ "${1:-sweep}" = narrow ]; then
  timeout 150 python3 tools/gemv_sweep.py --weights bf16 --rows 3,4 --layers o,down \
    --models qwen3-8b,qwen2.5-0.5b,smollm2-135m 2>&1 | grep -v skip | tee -a "$f"
  for round in 1 2; do
    for shape in qwen3-0.6b qwen2.5-0.5b qwen3-8b; do
      for m in 0 4; do
        run "$shape 4 seqs PLAIN_NARROW_MAX_M=$m" gemv.PLAIN_NARROW_MAX_M=$m -- \
          --model-shape $shape --num-seqs 4 --min-input-len 16 --max-input-len 32 \
          --min-output-len 256 --max-output-len 256
      done
    done
  done
elif [ "${1:-sweep}" = plain ]; then
  for round in 1 2; do
    for shape in qwen3-0.6b qwen2.5-0.5b smollm2-135m; do
      for p in 0 1; do
        run "$shape bf16 PLAIN=$p" gemv.PLAIN=$p -- --model-shape $shape --single \
          --num-seqs 2 --min-input-len 16 --max-input-len 32 --min-output-len 512 \
          --max-output-len 512
      done
    done
  done
elif [ "${1:-sweep}" = small ]; then
  # The small models' layers at one and two rows (fp8 takes the GEMV there whatever the
  # shape), the 8B bf16 LM head, and bench.py at two sequences with fp8 MAX_M 1 / 2.
  timeout 150 python3 tools/gemv_sweep.py --weights fp8 --rows 1,2 \
    --models qwen3-0.6b,qwen2.5-0.5b,smollm2-135m 2>&1 | grep -v skip | tee -a "$f"
  timeout 100 python3 tools/gemv_sweep.py --weights bf16 --rows 1,2 --layers lm_head 2>&1 \
    | grep -v skip | tee -a "$f"
  for round in 1 2; do
    for shape in qwen3-0.6b qwen2.5-0.5b; do
      for m in 1 2; do
        run "$shape fp8 MAX_M=$m" gemv.MAX_M=$m -- --model-shape $shape --num-seqs 2 \
          --min-input-len 16 --max-input-len 32 --min-output-len 512 --max-output-len 512 \
          --quantization fp8
      done
    done
  done
elif [ "${1:-sweep}" = sweep ]; then
  gpu_tests 120 tests/kernels/test_gemv.py
  for w in fp8 bf16; do
    timeout 200 python3 tools/gemv_sweep.py --weights $w --rows 1,2,4 2>&1 | grep -v skip \
      | tee -a "$f"
  done
  for round in 1 2; do
    for shape in qwen3-0.6b smollm2-135m qwen2.5-0.5b; do
      for p in 0 1; do
        run "$shape PLAIN=$p" gemv.PLAIN=$p -- --model-shape $shape --single --num-seqs 1 \
          --min-output-len 16 --max-output-len 16
      done
    done
  done
else
  # Defaults: fp8 MAX_M 2, PLAIN 1 with PLAIN_MAX_M 2; each against the GEMV at one row only
  # (and bf16 against cuBLAS), at two sequences then one.
  a="--model-shape qwen3-8b --single --num-seqs 2 --min-input-len 16 --max-input-len 32"
  a="$a --min-output-len 256 --max-output-len 256"
  for round in 1 2; do
    run "8B bf16 PLAIN=0" gemv.PLAIN=0 -- $a
    run "8B bf16 PLAIN_MAX_M=1" gemv.PLAIN_MAX_M=1 -- $a
    run "8B bf16 default" -- $a
    run "8B fp8 MAX_M=1" gemv.MAX_M=1 -- $a --quantization fp8
    run "8B fp8 default" -- $a --quantization fp8
  done
  run "8B fp8 + int8 head" -- $a --quantization fp8 --lm-head-quantization int8
  for extra in "" "--quantization fp8"; do
    r=$(timeout 90 python3 bench.py $extra 2>&1 | grep -E 'Total|Error' | tail -1)
    echo "[bench.py ${extra:-bf16}] $r" | tee -a "$f"
  done
  gpu_tests 170 tests/kernels/test_gemv.py tests/models/test_fp8_weights.py \
    tests/models/test_architectures.py
fi
