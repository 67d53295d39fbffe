"""The decode kernel's (triton_decode.py) tunables and the measurements behind them. Module
level dicts, so tools/bench_kernels.py and tests can override them (triton_decode uses these
very objects)."""
from nanovllm.kernels._common import INTERPRET

MAX_SPLITS = 64

# Tunables (module level so tools/bench_kernels.py and tests can override them).
# BLOCK_N: keys per tile; USE_DOT: tl.dot with the GQA group padded to 16 rows, else
# broadcast-multiply-sum (no padding waste, but measured 2.5x slower on H100: 1200 vs 2900 GB/s).
# WAVES: target programs per SM when splitting (see choose_num_splits). HEAD_FAST:
# launch a sequence's kv heads one after another (grid axis 0 = kv head): a token's K (and V)
# for all kv heads is one contiguous run in the cache, so its programs, running together,
# read whole DRAM rows instead of one head's slice of each at a time (1/8 of 1-2 KB here).
# LPT: start rows in the `order` the engine gives (longest context first), when it gives one.
# HEAD_FAST + LPT are on: H100, `bench_kernels.py --order`, 256 rows of 100-2048 tokens: bf16
# 401 -> 383 us, fp8 241 -> 221 us (128 rows: 224 -> 204, 149 -> 121); uniform lengths
# unchanged; bench.py 19,229 -> 19,933 tok/s bf16, 24,371 -> 25,528 fp8 (same call).
# (Transposed dots, the cache tiles as wgmma's register operand, were tried and measured no
# faster: fp8 b=256 ctx=2048 406-412 vs 403 us; see docs/PERF_NOTES.md.)
# The interpreter uses 16-key tiles so tiny test contexts still span several tiles.
CONFIG = dict(BLOCK_N=16 if INTERPRET else 64, num_warps=4, num_stages=2 if INTERPRET else 3,
              USE_DOT=True, WAVES=2, HEAD_FAST=True, LPT=True,
              SHORT_ROW_STAGES=2 if INTERPRET else 5, TWO_SPLITS_BELOW=4, FUSE_ROPE=True)
# FUSE_ROPE: a pure decode step over a 16-bit cache norms and rotates q/k and stores this
# step's K/V inside the decode kernel (kernels/decode_rope.py), not in a triton_rope launch
# before it. H200 bench.py, off / on alternating: Qwen2.5-0.5B shape 65,385 / 71,277 and
# 62,241 / 69,014 tok/s; Qwen3-0.6B 27,025 / 27,025 and 27,014 / 26,910 (within noise).
# TWO_SPLITS_BELOW: from one to this many programs (rows x kv heads) per SM, each row's keys
# are split in two. A context's programs then end at about the same time, instead of the
# last wave's long rows running on a GPU left half idle. H200, tools/bench_splits.py (a graph
# over the layers, contexts 100-2048, longest first), us a layer, 1 / 2 / 4 splits: Qwen2.5
# batch 128 (256 programs) 31.96 / 26.87 / 26.93, 256 (512) 44.13 / 40.52 / 44.39; SmolLM2
# 64 (192) 30.51 / 22.72 / 22.68, 128 (384) 36.99 / 32.24 / 35.35, 256 (768) 59.69 / 62.59;
# Qwen3-0.6B 64 (512) 80.90 / 74.38 / 79.38, 128 (1024) 126.28 / 134.99; its fp8 cache 64
# 64.10 / 58.15 / 67.31, 128 92.59 / 104.26. bench.py, alternating: SmolLM2 shape 62,587 /
# 63,050 -> 66,683 / 66,066 tok/s, Qwen3-0.6B 26,898 -> 27,135, fp8 KV 30,882 -> 30,660,
# Qwen2.5 68,952 / 67,662 -> 66,244 / 69,558 (these two within their run-to-run spread).
# SHORT_ROW_STAGES: stages for a 16-bit cache whose key rows are at most 128 bytes (head_dim
# <= 64: Qwen2.5-0.5B, SmolLM2), whose 64-key tiles are half a head_dim-128 tile's bytes, as
# fp8's are. H100, .dev/decode_bw25.py (Qwen2.5-0.5B's 14/2/64, bench-like contexts, graph
# over 24 layers), us a layer, 3 vs 5 stages: batch 256 37.7 vs 35.4, 128 29.4 vs 22.6,
# 64 15.3 vs 15.3 (128-key tiles: 36.3 / 24.2 / 14.8).
# An fp8 cache has its own tiles: a 64-key tile is half the bytes of a bf16 one, so it takes
# more stages in flight to keep HBM busy (H100, `bench_kernels.py --fp8`, b=256 ctx=2048:
# 5 stages 405 us = 2.65 TB/s, 3 stages 472 us, 128-key tiles 428-449 us; H200, 32-key
# tiles at 8-10 stages ~30% slower though 5 programs fit an SM, not 4). FP16_DOT: with
# bf16 q, run the dots in fp16 (q cast to fp16): fp8 values are exact in fp16 as in bf16, and
# Hopper converts fp8 to fp16 in one instruction (same shape: 468 us vs 557 with bf16 dots).
# V_WORDS (e4m3, fp16 dots; not in the interpreter, which runs no PTX): V's tile read as
# 32-bit words and widened to fp16 where loaded (_common.e4m3_words_to_f16), so it reaches the
# PV dot through 16-bit transposed shared-memory loads (ldmatrix) instead of a byte a load:
# the tile loop's SASS 669 -> 428 instructions (sm_90, bench.py's shape), 16 KB more shared
# memory a program. Slower here all the same (H200, tools/bench_splits.py, Qwen3-0.6B's fp8
# cache, us a layer, off / on: batch 64 63.71 / 71.98, 128 91.38 / 98.45, 256 172.21 / 192.73;
# at 3 or 4 stages or 8 warps slower still; bench.py fp8 30,539 / 28,595 tok/s): this kernel
# waits on latency, not issue slots, and the staging adds a barrier a tile. Off; the layer
# kernel, one program a kv head split at batch 1, gains from it (kernels/layer_config.py).
# V_TILE: when not 0, an fp8 cache on these kernels keeps each page's V as [kv head][V_TILE-key
# tile][dim][key] (kv_cache.tile_v_pages, at block sizes it divides). The PV dot contracts
# over the keys, so its V operand wants a dim's keys side by side: in the usual layout an
# 8-bit tile reaches it a byte a load (64 LDS.U8 and ~70 moves a tile: there is no 8-bit
# ldmatrix.trans); tiled it is a plain load (the tile loop's SASS 669 -> 465-484
# instructions, sm_90). Pages stored [kv head][dim][slot] (thirty-second session) cut as many
# instructions but ran 11% slower; a tile's V^T as one 8 KB run instead of 128 runs of 64
# bytes runs faster. H200, tools/v_tile_check.py (bench_splits' Qwen3-0.6B fp8 cache, one
# split, us a layer, usual / tiled, same output): a first form reading every tile whole
# (NaN-unsafe) 63.65 / 50.64 at batch 64, 92.39 / 69.95 at 128, 169.21 / 137.84 at 256; with
# the last tile's V read masked (byte loads) 62.94 / 52.17, 91.36 / 87.29, 169.73 / 166.10,
# bench.py fp8 30,771 / 30,792 tok/s, batch 1 (--single --num-seqs 16) 944 / 908. Now the
# last tile is read whole too (from its aligned start) and its keys outside the range zeroed
# after the load: 63.29 / 49.18, 91.91 / 82.62, 170.95 / 156.73; bench.py fp8 30,864 and
# 30,878 / 31,632 and 31,693; --shared-prefix 20,283 / 22,569; batch 1 948 / 899 (the layer
# kernel without V_WORDS, which the tiles replace; not profiled). On.
# V_LAST (decode_tiles.attend_tiles): how the last partial tile's V, read whole, meets the
# slots past a context. H200, tools/v_tile_check.py, us a layer at batch 64 / 128 / 256:
# 0, zeroed in a step after the loop, 49.3 / 82.6 / 158.0; 1, zeroed in the loop under a
# run-time test, 61.6 / 84.1 / 165.2; zeroed in the loop always 74.7 / 116.0 / 203.5 (the
# select moves V off its shared-memory path to the dot; dropped); 2, read as is, the cache
# holding no NaN codes there (V zeroed when tiled, NaN stored as 0), 50.8 / 70.7 / 140.2.
# bench.py fp8, alternating: 0 32,436, 32,239; 2 34,009, 34,016 tok/s.
CONFIG_FP8 = dict(CONFIG, FP16_DOT=True, num_stages=CONFIG["num_stages"] if INTERPRET else 5,
                  V_WORDS=False, V_TILE=64, V_LAST=2)
# An int8 cache reads fp8's bytes per tile (plus a 4-byte scale per row): fp8's stages. Without
# FP16_DOT its dots run in q's dtype (bf16: int8 -> bf16 is an int-to-float conversion per
# element; an fp16 q gets an fp32 (tf32) PV dot, since p times V's row scales could underflow
# fp16).
# FP16_DOT=True (bf16 or fp16 q): both dots in fp16, the codes widened with integer ops
# (_common.int8_to_fp16) and V's scales normalized by their running max (decode_tiles).
# H100, tools/bench_kernels.py --int8-mixed (the bench's spread of lengths): fp16 dots ran as
# fast as bf16 dots, not faster (also with the widening in PTX, tried and dropped): bf16 kept.
CONFIG_INT8 = dict(CONFIG_FP8, FP16_DOT=False)
