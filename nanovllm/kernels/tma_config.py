"""Tiles and K splits for kernels/tma_gemm.py, by call: measured tables where they exist (the
H200 sweeps in PERF_NOTES, fifty-fifth and fifty-sixth sessions), rules elsewhere, and None
where another path (cuBLAS, dequantize + cuBLAS) was faster. Module level so tools/bench_with.py
and tests can override them."""
import functools
import os

from nanovllm.kernels._common import INTERPRET

# (outputs, K) of a gated gate_up -> {most rows: (BLOCK_M, BLOCK_N, BLOCK_K, STAGES)}, the
# best TMA tiles of sweeps against cuBLAS + the SiLU-and-mul launch (H200, PERF_NOTES
# fifty-fifth session; tools/tile_sweep.py refined Qwen2.5-0.5B's in the sixty-second); past
# the last bound, and other shapes, cuBLAS. Qwen2.5-0.5B, us at 64 / 128 / 192 rows: 8.00 /
# 9.15 / 9.94 against 9.02 / 9.58 / 10.57; Qwen3-0.6B at 64 / 128 6.32 / 7.09 against 7.25 /
# 7.34. At some rows cuBLAS wins alone (Qwen2.5 at 96: 9.41 against 10.16); handing it those
# rows did not pay in the engine (Qwen2.5 shape 70,459 / 71,751 tok/s against 72,237 /
# 71,217), where the TMA GEMM overlaps the kernel before it (PDL) and cuBLAS does not.
GATED_TILES = {(4864, 896): {32: (64, 64, 128, 4), 64: (64, 32, 128, 3), 96: (64, 128, 64, 4),
                             128: (64, 32, 64, 4), 160: (64, 128, 64, 5), 192: (64, 64, 64, 4),
                             256: (64, 64, 64, 3)},
               (3072, 1024): {64: (64, 32, 128, 4), 128: (64, 64, 128, 4)}}
# Split K, whose partials the next RMSNorm adds. H200, the fifty-sixth session's probe (GEMM +
# the norm, us; cuBLAS + the norm in brackets), Qwen3-0.6B o / down at 64 rows 5.86 (7.01) /
# 6.44 (8.04), at 256 7.26 (7.88) / 8.58 (9.29); Qwen2.5-0.5B down at 192 rows 10.68 (10.01).
# Ungated unsplit 16-bit calls only tie cuBLAS: PLAIN (the widest such layer taken, by
# outputs) 0 leaves them there. Under PDL they still lose, H200 bench.py --model-shape
# qwen2.5-0.5b alternating (fifty-ninth session): all (the LM heads too) 68,555 / 67,862 /
# 67,817 against 73,978 / 71,842 / 76,636 tok/s; up to 8,192 outputs (qkv) 68,867 / 66,503 /
# 73,757 against 71,588 / 76,032 / 71,770 (bench.py 27,946 against 28,143).
SPLIT_ROWS, MIN_SPLIT_K, MAX_SPLIT_K = 512, 128, 1536
PLAIN = 0
# Split-K tiles by layer, measured: {(fp8 weights?, N, K): {most rows: (BLOCK_M, BLOCK_N,
# SPLIT[, BLOCK_K, STAGES], 128 and 4 if not given) or None (cuBLAS, or dequantize + cuBLAS)}},
# each call timed with the norm that adds its partials at the decode graphs' sizes (H200,
# tools/split_sweep.py, then --refine; PERF_NOTES sixty-first session: Qwen3-0.6B,
# Qwen2.5-0.5B, SmolLM2-135M, Llama-3.2-1B; SmolLM2's bf16 o_proj is left to the rule, which
# was within 0.3 us of every winner). Other layers take the rule (split_config); SPLIT_TABLE 0
# sends every layer there.
SPLIT_TILES = {
    (False, 1024, 2048): {64: (64, 32, 4), 128: (64, 64, 4), 256: (64, 64, 2, 128, 6)},
    (False, 1024, 3072): {24: (64, 64, 8, 256, 3), 32: (64, 64, 8), 64: (64, 32, 8),
        96: (128, 64, 8), 128: (64, 64, 4, 128, 6), 256: (64, 64, 2, 128, 6)},
    (True, 1024, 2048): {32: (64, 32, 4, 256, 4), 64: (64, 32, 4, 256, 3), 128: (128, 32, 4),
        256: (128, 64, 4)},
    (True, 1024, 3072): {32: (64, 32, 4, 256, 4), 64: (64, 32, 4, 256, 3), 128: (128, 32, 4),
        256: (128, 64, 4)},
    (False, 896, 896): {64: (64, 32, 4), 128: (64, 32, 2, 256, 3), 256: (64, 64, 2, 128, 6)},
    (False, 896, 4864): {48: (64, 64, 8), 64: (64, 32, 8), 128: (128, 64, 8),
        160: (64, 64, 2, 128, 6), 192: None, 256: (128, 64, 4)},
    (True, 896, 896): {64: (64, 32, 4), 96: (64, 32, 2, 256, 4), 128: (64, 32, 2, 256, 3),
        192: (64, 64, 2, 256, 3), 256: (128, 32, 2)},
    (True, 896, 4864): {64: (64, 64, 8, 256, 3), 128: (128, 64, 8), 256: (128, 64, 4)},
    (False, 576, 1536): {64: (64, 32, 8), 128: (64, 64, 8), 192: (64, 64, 4, 256, 3),
        256: (64, 64, 2, 128, 6)},
    (True, 576, 576): {128: (64, 32, 4), 192: (64, 32, 2), 256: (128, 32, 4)},
    (True, 576, 1536): {64: (64, 32, 8), 128: (128, 32, 8), 160: (64, 64, 4, 256, 3),
        192: (64, 32, 2, 256, 4), 256: (128, 64, 8)},
    (False, 2048, 2048): {64: (64, 64, 4), 96: (64, 64, 2, 256, 3), 128: (64, 64, 2, 128, 6),
        256: None},
    (False, 2048, 8192): {24: None, 32: (64, 64, 4, 128, 6), 64: (64, 64, 4),
        96: None, 128: (128, 64, 4), 256: None},
    (True, 2048, 2048): {48: (64, 64, 4), 64: (64, 32, 4), 128: (128, 64, 4), 256: (128, 64, 2)},
    (True, 2048, 8192): {64: (64, 64, 8), 128: (128, 64, 4), 160: None, 256: (128, 64, 2)},
}
SPLIT_TABLE = 1
# Switches for A/B runs: split calls (0: cuBLAS or dequantize + cuBLAS), fp8 weights.
SPLIT, FP8 = 1, 1
# qkv and gate_up of fp8 weights with their input quantized by the norm before them (W8A8,
# layers/fp8_rows.py); NANOVLLM_FP8_W8A8=0 keeps bf16 activations (the reference's numerics).
_W8A8 = os.environ.get("NANOVLLM_FP8_W8A8", "1")
if _W8A8 not in ("0", "1"):
    raise ValueError(f"NANOVLLM_FP8_W8A8={_W8A8!r}: use 1 (fp8 weights' qkv and gate_up take "
                     "e4m3 activations at 17-256 rows) or 0 (bf16 activations)")
W8A8 = int(_W8A8)
# Block-scaled weights (Qwen's *-FP8 checkpoints) in W8A8 too. H200, the fifty-eighth
# session (.dev/w8a8_block.py, the kernel alone): at or under bf16 cuBLAS on the 0.6B's and
# the 8B's qkv / gate_up at 32-256 rows but the 8B's gate_up at 256 (98.8 against 78.0 us),
# 1.2-3.2x faster than their weight-only TMA path everywhere.
W8A8_BLOCKS = 1
# fp8 weights: {gated: {most rows: (BLOCK_M, BLOCK_N, STAGES)}}, the fifty-sixth session's
# best on the H200 (Qwen3-0.6B qkv, gate_up); gated past 128 rows and narrow ungated layers
# unsplit (N <= 2048) lose to dequantize + cuBLAS (+ SiLU-and-mul): not taken.
FP8_TILES = {False: {32: (32, 16, 4), 64: (64, 32, 4), 256: (64, 64, 4)},
             True: {64: (64, 32, 3), 128: (64, 16, 3)}}


# W8A8 tiles by layer, measured: {(N, K, gated): {most rows: (BLOCK_M, BLOCK_N, BLOCK_K,
# STAGES)}} (8 warps with 128-row tiles, else 4), the fastest of tools/tile_sweep.py's 36
# candidates at the decode graphs' sizes (H200, PERF_NOTES sixty-second session). 256-column
# K steps pay nearly everywhere: us at 64 / 128 / 256 rows against the rule's, Qwen3-0.6B qkv
# 3.63 / 3.96 / 4.87 (4.71 / 4.75 / 5.59), gate_up 4.94 / 5.60 / 6.85 (6.48 / 6.56 / 8.47);
# Llama-3.2-1B gate_up 11.37 / 13.58 / 21.09 (12.52 / 19.88 / 25.73); Qwen3-8B (sixty-third,
# 24 / 64 / 128 / 256 rows only) qkv 9.36 at 64 (13.40). Other layers take the rule;
# W8A8_TABLE 0 sends every layer there.
W8A8_TILES = {
    (4096, 1024, False): {64: (64, 32, 256, 5), 128: (64, 64, 256, 5), 160: (64, 64, 128, 5),
        192: (64, 32, 128, 5), 256: (64, 128, 256, 4)},
    (3072, 1024, True): {64: (64, 32, 256, 4), 128: (64, 64, 256, 4), 192: (64, 32, 128, 4),
        224: (64, 64, 128, 4), 256: (64, 32, 128, 4)},
    (1152, 896, False): {192: (64, 32, 256, 5), 256: (64, 64, 256, 5)},
    (4864, 896, True): {32: (64, 64, 128, 5), 64: (64, 32, 256, 3), 96: (64, 64, 128, 4),
        128: (64, 32, 128, 4), 192: (64, 64, 128, 4), 256: (64, 64, 128, 3)},
    (960, 576, False): {256: (64, 32, 256, 5)},
    (1536, 576, True): {128: (64, 32, 256, 4), 256: (64, 64, 256, 3)},
    (3072, 2048, False): {32: (64, 64, 256, 5), 64: (64, 32, 256, 5), 128: (64, 64, 256, 5),
        256: (64, 128, 256, 4)},
    (8192, 2048, True): {32: (64, 64, 256, 4), 64: (64, 32, 256, 3), 128: (128, 64, 256, 3),
        192: (64, 64, 128, 3), 256: (128, 128, 128, 4)},
    (6144, 4096, False): {24: (64, 128, 256, 4), 64: (64, 64, 256, 5), 128: (64, 128, 256, 4),
        256: (64, 64, 128, 4)},
    (12288, 4096, True): {24: (64, 128, 128, 4), 64: (64, 32, 128, 4), 128: (64, 64, 128, 3),
        256: (64, 64, 128, 3)},
}
W8A8_TABLE = 1


def w8a8_config(m: int, n: int, k: int, gated: bool = False, scale_bk: int = 0) -> dict | None:
    """Tiles for e4m3 activations against e4m3 weights (W8A8; layers/fp8_rows.py), or None
    with W8A8 off: W8A8_TILES' where it has the layer (K steps of 128 where block scales' K,
    scale_bk, is not a multiple of its step), else a rule: 64-row tiles; 64 columns and
    256-column K steps (K >= 256) for ungated layers up to 128 rows (5 stages: within ~0.3
    us of the best on every listed layer there) and gated ones of up to 8,192 outputs up to
    64 rows (4 stages: 4-17% faster than the old rule where the sweeps show it; it lost on
    the 8B's 12,288); else the fifty-seventh session's probe: 4 stages, 32 columns up to 128
    rows, 64 past (3 stages gated)."""
    if INTERPRET:
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, SPLIT=1, STAGES=1, num_warps=4)
    if not W8A8:
        return None
    table = W8A8_TILES.get((n, k, gated)) if W8A8_TABLE else None
    if table:
        bm, bn, bk, stages = table[min((r for r in table if r >= m), default=max(table))]
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128 if scale_bk % bk else bk, SPLIT=1,
                    STAGES=stages, num_warps=8 if bm == 128 else 4)
    wide = m > 128
    if (not gated and not wide) or (gated and m <= 64 and n <= 8192):
        bk = 128 if scale_bk % 256 or k < 256 else 256
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=bk, SPLIT=1, STAGES=4 if gated else 5,
                    num_warps=4)
    return dict(BLOCK_M=64, BLOCK_N=64 if wide else 32, BLOCK_K=128, SPLIT=1,
                STAGES=3 if gated and wide else 4, num_warps=4)


def choose_config(m: int, n: int, k: int, gated: bool = False, fp8: bool = False,
                  split: bool = False, scale_bk: int = 0) -> dict | None:
    """Tiles and K splits for an [m, k] @ [n, k]^T call (n: outputs; gated: a tile's n
    columns are read twice, gate and up; fp8: e4m3 weights; split: the caller adds the
    partials, a SplitSum), or None where this path is not the faster one."""
    if INTERPRET:
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=2 if split and k >= 32 else 1,
                    STAGES=1, num_warps=4)
    if split:
        return split_config(m, n, k, fp8, scale_bk) if SPLIT else None
    if fp8:
        if not FP8:
            return None
        rows = [r for r in sorted(FP8_TILES[gated]) if m <= r]
        if not rows or not gated and n <= 2048:
            return None
        bm, bn, stages = FP8_TILES[gated][rows[0]]
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, SPLIT=1, STAGES=stages, num_warps=4)
    if gated:
        rows = [r for r in sorted(GATED_TILES.get((n, k), {})) if m <= r]
        if not rows:
            return None
        bm, bn, bk, stages = GATED_TILES[(n, k)][rows[0]]
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=1, STAGES=stages, num_warps=4)
    return default_config(m, n, k) if n <= PLAIN else None


def split_config(m: int, n: int, k: int, fp8: bool = False, scale_bk: int = 0) -> dict | None:
    """Split-K tiles for a narrow layer (n <= 2048): SPLIT_TILES' where it has the layer, else
    a rule: 64 rows, 32 columns (64 past 128 rows), K split in up to 8 while the partials stay
    small (splits x rows <= SPLIT_ROWS: the norm reads them all back) and each split keeps
    MIN_SPLIT_K columns; None where no split fits, or (16-bit weights) where a split's K loop
    stays longer than MAX_SPLIT_K (cuBLAS's own split-K is faster there). scale_bk: block
    scales' K (0: none), which a K step must divide."""
    if n > 2048:  # (wide layers fill the GPU unsplit; not measured split)
        return None
    table = SPLIT_TILES.get((fp8, n, k)) if SPLIT_TABLE else None
    if table:
        tiles = table[min((r for r in table if r >= m), default=max(table))]
        if tiles is None:
            return None
        bk, stages = tiles[3:] or (128, 4)
        if scale_bk % bk:  # a K step inside one block of scales (their K, scale_bk)
            bk = 128
        return dict(BLOCK_M=tiles[0], BLOCK_N=tiles[1], BLOCK_K=bk, SPLIT=tiles[2],
                    STAGES=stages, num_warps=4)
    split = 1
    while split < 8 and (split * 2) * m <= SPLIT_ROWS and k >= split * 2 * MIN_SPLIT_K:
        split *= 2
    if split == 1 or (not fp8 and k > split * MAX_SPLIT_K):
        return None
    return dict(BLOCK_M=64, BLOCK_N=32 if m <= 128 else 64, BLOCK_K=128, SPLIT=split,
                STAGES=4, num_warps=4)


def default_config(m: int, n: int, k: int, gated: bool = False) -> dict:
    """A rule for any shape without a split: 64-row tiles, 128-wide K steps, 4 stages; 32
    columns on narrow layers (and gated ones)."""
    block_n = 32 if n <= 2048 or gated else 128
    return dict(BLOCK_M=64, BLOCK_N=block_n, BLOCK_K=128, SPLIT=1, STAGES=4, num_warps=4)


# The tables' tiles (up to ~190 KB of stages) assume the 227 KB (232,448 bytes) of shared memory
# a block may opt into on H100 / H200 / B200; a Hopper-or-later GPU with less (compute
# capability 12: ~100 KB) would stop with OutOfResources at the warm-up.
MIN_SHARED_MEM = 200 * 1024


def gpu_fits(index: int) -> bool:
    """Whether GPU `index` runs the TMA GEMM: compute capability >= 9 (TMA) and room for the
    tables' tiles (Triton's own limit, the opt-in shared memory a block; if Triton cannot say,
    capability alone decides)."""
    import torch

    return torch.cuda.get_device_capability(index)[0] >= 9 and _shared_room(index)


@functools.cache
def _shared_room(index: int) -> bool:
    try:
        from triton.runtime import driver

        shared = driver.active.utils.get_device_properties(index)["max_shared_mem"]
    except Exception:  # noqa: BLE001 - an older or different Triton: keep the capability test
        return True
    return shared >= MIN_SHARED_MEM
