"""Hadamard mixing of q and k rows inside the Triton kernels (the torch path:
kv_mix.hadamard_mix): the fused RoPE store's and the layer kernel's."""
import os

import triton
import triton.language as tl

# Hadamard mixing by butterflies (_fwht: exact fp32 sums, no padding to 16 rows) rather than
# two tf32 tl.dot against a +-1 matrix built in registers, whose operand shuffles through
# shared memory made the mix the store's long pole. H200 (tools/bench_kv_feedback.py, us a
# call at 1 / 256 tokens, dots / butterflies): fp8 store with the mix 8.5 / 3.7 and 12.7 /
# 7.4 (no mix 3.2 and 6.2); with K's feedback 9.5 / 9.9 and 14.3 / 14.0 (the feedback tile is
# then the long pole); bench.py --single fp8 (the layer kernel) 876 / 975 tok/s; bench.py
# fp8 30,857 and 31,529 / 30,246 and 31,182 (within its spread); again 2026-11-30,
# alternating: bench.py fp8 33,485 and 33,402 / 34,120 and 34,200, batch 1 962, 966 / 1,098,
# 1,105.
# (Off for a day: SmolLM2's teacher-forced int8 decode drifted on an H200 under either
# path; the cause was the stager reusing a pinned buffer whose copy was still queued
# (worker/stager.py), not the mix.) NANOVLLM_FWHT=0: the dots.
FWHT = tl.constexpr(os.environ.get("NANOVLLM_FWHT", "1") == "1")


@triton.jit
def _fwht(x, R: tl.constexpr, N: tl.constexpr, LOG2_N: tl.constexpr):
    """x [R, N] times the (unnormalized) Sylvester Hadamard matrix, by LOG2_N rounds of the
    same butterfly: adjacent pairs (a, c) -> [a + c for all pairs, a - c for all pairs]."""
    for _ in tl.static_range(LOG2_N):
        a, c = tl.split(tl.reshape(x, [R, N // 2, 2]))
        x = tl.reshape(tl.permute(tl.join(a + c, a - c), (0, 2, 1)), [R, N])
    return x


@triton.jit
def mix_halves(x1, x2, OUT_DTYPE: tl.constexpr, HALF: tl.constexpr, LOG2_HALF: tl.constexpr,
               DOT_PREC: tl.constexpr, BUTTERFLIES: tl.constexpr = FWHT):
    """[x1 x2] (fp32 halves; for the dots, rows padded to >= 16) times the
    orthonormal Hadamard matrix of size 2 * HALF, after rounding to OUT_DTYPE as the torch
    path does. Sylvester's H = [[A, A], [A, -A]] gives [(x1 + x2) A, (x1 - x2) A]; A's
    entries (-1)^popcount(i & j) are built here, not loaded."""
    x1 = x1.to(OUT_DTYPE).to(tl.float32)
    x2 = x2.to(OUT_DTYPE).to(tl.float32)
    norm = 1.0 / tl.sqrt(2.0 * HALF)
    if BUTTERFLIES:
        R: tl.constexpr = x1.shape[0]
        y1 = _fwht(x1 + x2, R, HALF, LOG2_HALF)
        y2 = _fwht(x1 - x2, R, HALF, LOG2_HALF)
    else:
        both = tl.arange(0, HALF)[:, None] & tl.arange(0, HALF)[None, :]
        parity = tl.zeros([HALF, HALF], tl.int32)
        for b in tl.static_range(LOG2_HALF):
            parity ^= (both >> b) & 1
        a = (1 - 2 * parity).to(tl.float32)
        y1 = tl.dot(x1 + x2, a, input_precision=DOT_PREC)
        y2 = tl.dot(x1 - x2, a, input_precision=DOT_PREC)
    return y1 * norm, y2 * norm
