"""The one-launch decode layers' (layer_kernel.py) tunables and the measurements behind them.
A module-level dict, so tools/bench_layer_kernel.py and tests can override it (layer_launch
uses this very object)."""

# CHUNK: weights per K chunk of a matvec. SPLITS: most key splits of a kv head (at most
# programs / kv heads). PER_SM: programs per SM. GROUP: products each thread sums at once in
# a matvec (1: a partial sum per product). WORK=False: the barriers alone (timing only).
# H100, tools/bench_layer_kernel.py, Qwen3-0.6B shape, context 512, us a layer, a launch a
# layer: 33.9 with 8192-weight chunks -> 32.2 with 16384 (4096: 39.8; 32768 no better);
# 30.6 -> 30.3 with the next layer's qkv rows prefetched into L2 at the end; 30.3 -> 27.0
# with each matrix phase's first chunk requested before the wait it follows and GROUP=8
# (SmolLM2 shape 18.8 -> 18.0; either alone 27.8 / 29.8; a release-only arrival that skips
# the count: 27.0 vs 26.8; 8 warps or 8K / 32K chunks with them: 29.6 / 30.4 / 28.1).
# Tried and dropped (docs/PERF_NOTES.md): the later phases' weights prefetched into L2 at
# the start (30.3 -> 33.8: their 22 MB compete with phase A's reads), the cached K/V of each
# split prefetched (no gain), barriers polling with atomics (the barriers alone 8.8 vs 8.3
# with acquire loads), each K chunk summed to [rows] at once (32.1), 8 warps (31.1), 2
# programs per SM (31.2), tensor-core dots over a pipelined K loop instead of unrolled fp32
# products (36.8; Qwen3-8B shape 224 us a layer), C-E's weights asked into L2
# (prefetch.global.L2) at the A->B barrier or by the programs idle in B (SmolLM2 16.70 /
# 17.00 vs 16.96, Qwen3-0.6B 26.9 / 28.2 vs 25.8: the matrix phases wait on latency, not HBM).
# A flag per program in place of the shared counter (a release store each, every flag polled
# with relaxed loads, then an acquire fence or acquire loads): H200, barriers alone 7.3-7.5
# vs 4.3-4.6 us a layer, SmolLM2 18.2-18.5 vs 16.2 (the counter's arrivals are not what a
# barrier waits on; one more acquire poll after each wait costs ~1.0 us a layer, 0.2 a trip).
# FB_PREFETCH (an fp8 cache with K's error feedback): the program that will store a kv
# head's new key asks for its feedback rows into L2 as the layer starts, as the fused RoPE
# store does (triton_rope.FEEDBACK_PREFETCH). H200, tools/bench_layer_kernel.py
# --kv-cache-dtype fp8_e4m3, us a layer with / without: Qwen3-0.6B shape (tile) 37.2 / 38.9;
# SmolLM2 (inlined chains) 22.1 / 21.8, (tile) 27.8 / 27.7: kept for the larger head.
# FB_CHAINS_MAX_HD: up to this head size that program rounds the key a thread per feedback
# group (layer_attn._chains), past it on its register tile. Same run, chains / tile: SmolLM2
# shape (head 64, 2 groups) 22.5 / 27.8; Qwen3-0.6B (head 128, 4 groups) 41.5 / 37.2, a
# gap not yet explained (an inlined chain: 42.8; the kernel there spills 448 bytes).
# The rows also asked into that SM's L1 as its store begins (prefetch.global.L1; the
# compiled chain loads each row 60-100 instructions ahead of its use): H200, chains / tile,
# Qwen3-0.6B shape 43.7 / 37.5 against 41.4 / 36.8 without, SmolLM2 22.4 / 27.8 against
# 22.1 / 27.7. Dropped.
# NEW_APART: the new key a split of its own (layer_kernel.py, phase B): 0 never, 1 always,
# 2 where K's feedback runs on the register tile. H200, context 512 / 2048, us a layer,
# without / with, two rounds alternating: fp8 Qwen3-0.6B shape (tile) 36.8, 37.4 / 36.2,
# 36.7 and 37.6, 38.3 / 37.1, 36.9; fp8 SmolLM2 (chains) 22.05 / 22.27, 23.1 / 23.2; bf16
# caches 23.7 / 24.0 (Qwen3), 16.2 / 16.3 (SmolLM2), 25.0-25.1 / 25.1-25.2 (Qwen2.5-0.5B).
# Flagged hand-overs (NCCL's "LL" idea; tried and dropped, docs/PERF_NOTES.md): phases C, D
# and E (and B's combined output) handed their outputs over as 8-byte words {fp32 value,
# epoch}, polled by the readers, in place of four of a layer's five barriers (whose release
# fence alone costs ~0.33 us). GPU tests passed, but H200, us a layer, barriers / words:
# SmolLM2 shape 16.2 / 16.9, Qwen3-0.6B 23.8 / 30.2, Qwen2.5-0.5B 25.7 / 29.5, Qwen3 fp8
# 36.0 / 43.0 (a poll per K chunk); polling all chunks at once, then reading: 18.0 / 29.4,
# and each producer's last word first: 18.9 / 30.8. A wait on the words costs what the
# barrier did, and reading 8-byte words costs more than 2-byte ones.
# GROUP 16 (each thread sums 16 products at once; 8 before): H200, 2026-11-29, us a layer,
# alternating 16 / 8: SmolLM2 shape 15.82, 15.82 / 16.11, 16.13; Qwen3-0.6B 23.79, 23.78 /
# 24.01 (GPU tests passed). Same sweep, no gain: CHUNK 8192 / 32768 (SmolLM2 16.25 / 16.14;
# Qwen3 25.57 at 32768), 8 warps (17.09; with 32768-weight chunks 15.94, Qwen3 23.79),
# GROUP 4 (16.22), SPLITS 16 / 32 (16.04 / 16.24).
# TRACE: each program records its clocks around every barrier's wait (tools/lk_trace.py).
# C_SPLITS: up to this many key splits, every program of phase C combines the splits' partial
# outputs itself (one load) instead of the last split of each kv head (a count, then a load;
# phase B's slowest program: tools/lk_trace.py, SmolLM2 shape, its work 5.4 -> 3.2 us). H200,
# 2026-11-29, us a layer, off / 8, alternating: SmolLM2 shape context 512 15.97, 15.92 /
# 14.90, 14.91; 1024 (16 splits: B combines) 16.19, 15.97 / 16.12, 16.07; 2048 16.48, 16.50
# / 16.95, 16.59; bf16 Qwen2.5-0.5B and fp8 SmolLM2 at 512: 25.6 / 24.0, 22.2 / 20.9 (an
# earlier form). Qwen3-0.6B's 16 heads of 128 fit 4 splits, which cost more (23.7 / 24.3 at
# 256): off there. Also tried: at most 8 longer splits up to 4096 keys (1024: 15.9 vs 15.7,
# 2048: 19.1 vs 16.4); a phase C that picks its input (combined or read) before one matvec,
# or that reads split 0 holding B's combine: 0.3-1.3 us slower past 8 splits.
# TAIL: a matvec whose K ends in a narrow remainder of at most TAIL columns (SmolLM2's 576 =
# 512 + 64 in phase D) loads that remainder with its first chunk, before the barrier,
# instead of a whole masked chunk after it (a round trip to HBM after the wait).
# A_CHUNK: phase A's K chunks sized for its own qkv rows (CHUNK / rows), not for D's gate_up
# rows, which are more, where that makes K one chunk: Qwen2.5-0.5B's 16 qkv rows a program
# in one 1024-column chunk instead of seven of 128, SmolLM2's 8 in one of 1024 instead of two
# of 512 (Qwen3-0.6B's 32 would take two of 512 instead of four of 256: slower, so not).
# H200, 2026-11-29, context 512, us a layer, alternating (tools/lk_tail_check.sh): SmolLM2
# shape neither 14.93, 14.88 / TAIL 13.87 / A_CHUNK 14.49 / both 13.80, 13.79; Qwen2.5-0.5B
# 24.33, 24.35 / A_CHUNK 21.44, 21.13 (with 8 warps and 32K chunks 21.09: not taken);
# Qwen3-0.6B 24.19, 23.85 / two chunks of 512: 24.66, 24.67; fp8 SmolLM2 20.86, 20.82 /
# both 19.31, 19.32. bench.py --single --num-seqs 16: SmolLM2 1,967 -> 2,097 tok/s,
# Qwen2.5-0.5B 1,425 -> 1,593.
# PRE_KV: each program's first key split, when it is one 64-key tile (contexts up to 4096),
# requested between the A -> B barrier's arrival and its wait: 1 into registers, K and V,
# the new key put into them after phase B stores it (no read-back, no block barrier), where
# heads are at most 64 wide (Qwen3-0.6B's 128-dim tiles spill: into L2 there, 2); 0 off.
# tools/lk_trace.py, SmolLM2 shape, context 300: the splits' phase B work 3.1 -> 2.7 us, the
# new key's split 3.6 -> 3.3. H200, 2026-11-29, us a layer, off / on, alternating
# (tools/lk_prekv_check.sh): SmolLM2 context 300 13.66, 13.70 / 13.48, 13.24, 512 13.79 /
# 13.25; Qwen2.5-0.5B 21.39 / 20.88; Qwen3-0.6B (L2) 23.80, 23.70 / 23.37, 23.36. bench.py
# --single --num-seqs 16: SmolLM2 2,013 / 2,155 (2,099 / 2,158 in a later call), Qwen2.5
# 1,587 / 1,572, Qwen3 1,271 (on). Also timed: K alone in registers, V read after the wait
# (SmolLM2 13.74, 13.75: no gain), and into L2 at 64-dim heads (13.90, 13.81: slower).
# Timed and dropped (H200, 2026-11-29, 38th session; docs/PERF_NOTES.md): PRE_KV over an
# fp8 cache, the new key's codes read back into the tile (SmolLM2 shape 26.9 vs 19.9 us a
# layer); phase B's queries before the new key's store (13.38-13.83 vs 13.22-13.59).
# FB_AHEAD: the register tile's feedback rows asked for a block of steps early, as the fused
# store's triton_rope.FEEDBACK_ROWS_AHEAD (0 no, 1 into registers, 2 into L1). H200, one
# call, bench.py --single --num-seqs 16 --kv-cache-dtype fp8_e4m3: 991 / 966 / 1,035 tok/s.
# V_WORDS: an e4m3 cache's V tiles read as 32-bit words and widened to fp16 where loaded
# (kernels/decode_config.py says why). H200, 2026-11-29, off / on, alternating
# (tools/vwords_check2.sh): Qwen3-0.6B shape, context 300, 34.67, 34.67 / 31.26, 31.34 us a
# layer; bench.py --single --num-seqs 16 --kv-cache-dtype fp8_e4m3 874, 868 / 951, 947 tok/s;
# SmolLM2 shape 19.77 / 19.69 us.
# V_LAST: a tiled V's last tile (decode_tiles.attend_tiles; 2 cannot serve the new key's split,
# which starts anywhere). H200, bench.py --single --num-seqs 16 --kv-cache-dtype fp8_e4m3,
# alternating: 0 1,041, 1,036; 1 1,073, 1,073 tok/s (8,832 vs 9,280 instructions, sm_90).
# 2 (read as is) where the new key is not apart (layer_launch lowers it to 1 elsewhere):
# tools/v_last_lk.sh, SmolLM2 shape (64-dim heads, one split from key 0) over an fp8 cache,
# alternating 1 / 2: 1,455.7, 1,452.7 / 1,495.8, 1,496.8 tok/s.
CONFIG = dict(num_warps=4, CHUNK=16384, SPLITS=64, PER_SM=1, GROUP=16, WORK=True,
              FB_PREFETCH=True, FB_CHAINS_MAX_HD=64, NEW_APART=2, TRACE=False, FB_AHEAD=1,
              C_SPLITS=8, TAIL=64, A_CHUNK=True, PRE_KV=1, V_WORDS=True,
              V_LAST=2)
