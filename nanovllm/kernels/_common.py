"""What the Triton attention kernels share: the interpreter flag, the exp2 constant, the dot
precision choice and one online-softmax step."""
import functools
import os

import numpy as np
import torch
import triton
import triton.language as tl

# TRITON_INTERPRET=1 (set by tests/conftest.py without a GPU) runs kernels on the CPU; tile
# configs then shrink so that tiny test shapes still span several tiles.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Kernels exponentiate with exp2 (one hardware instruction): exp(x) == exp2(x * LOG2E), so the
# softmax scale is premultiplied by LOG2E on the host.
LOG2E = 1.4426950408889634


def _check_multiple(x, n: int) -> None:
    """The interpreter's check of an alignment promise (aligned)."""
    values = np.asarray(x.handle.data if hasattr(x, "handle") else getattr(x, "value", x))
    n = getattr(n, "value", n)
    assert (values % n == 0).all(), f"promised a multiple of {n}: {values}"


if INTERPRET:
    @triton.jit
    def aligned(x, N: tl.constexpr):
        """x, promised a multiple of N (tl.multiple_of); the interpreter, which ignores the
        hint, checks it: a false one makes a GPU's vector loads fault (misaligned address)."""
        _check_multiple(x, N)
        return x
else:
    # tl.multiple_of itself: the promise is an attribute on the value's defining op, which
    # a jit function's argument does not carry back to its caller (the loads became bytes).
    aligned = tl.multiple_of


@functools.lru_cache(maxsize=None)
def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input_precision for q's dtype: fp32 inputs get exact (ieee) dots so fp32 runs match
    the reference; tf32 would not. Other dtypes are unaffected by the choice."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def online_softmax_step(m_i, l_i, qk):
    """Fold one tile of exp2-domain scores qk [M, N] (masked keys at -inf) into the running row
    max m_i [M] and row sum l_i [M].

    Returns (m_i, l_i, p, alpha): the caller updates its accumulator as acc * alpha[:, None] + p @ V
    (written there, after V's load, so the compiled kernels keep their instruction order).
    """
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, p, alpha



def bits_to_bf16(w_dtype: torch.dtype, x_dtype: torch.dtype) -> bool:
    """Whether a GEMM widens its e4m3 weights for bf16 dots with e4m3_to_bf16 (a GPU only:
    the interpreter cannot run PTX)."""
    return not INTERPRET and w_dtype == torch.float8_e4m3fn and x_dtype == torch.bfloat16


@triton.jit
def e4m3_to_bf16(w):
    """e4m3 values as bf16, exactly, with integer ops. Triton's own cast goes through fp16
    (cvt e4m3x2 -> f16x2, then one cvt per element to bf16): three conversions per two
    values, and Hopper converts at a quarter of its integer rate, which caps a weight-streaming
    GEMM below copy speed. Here, four values a time: each byte goes to the top of a 16-bit
    half (prmt), its exponent and mantissa move down 4 bits to bf16's places (bf16 keeps the
    sign bit where it is), and one bf16x2 multiply by 2^120 turns e4m3's exponent bias (7)
    into bf16's (127). e4m3's subnormals land on bf16 subnormals of the same pattern, which
    the multiply scales exactly; e4m3 has no infinities and its NaN (S.1111.111) is never a
    stored weight."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 a, b, s, c;
        mov.b32 c, 0x7B807B80;
        prmt.b32 a, $2, 0, 0x1404;
        prmt.b32 b, $2, 0, 0x3424;
        and.b32 s, a, 0x80008000;
        and.b32 a, a, 0x7F007F00;
        shr.b32 a, a, 4;
        or.b32 a, a, s;
        and.b32 s, b, 0x80008000;
        and.b32 b, b, 0x7F007F00;
        shr.b32 b, b, 4;
        or.b32 b, b, s;
        mul.rn.bf16x2 $0, a, c;
        mul.rn.bf16x2 $1, b, c;
        }""", "=r,=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def e4m3_words_to_f16(w):
    """int32 words of four e4m3 codes each [R, W] -> fp16 [R, 4 W] (exact; byte 0 first).
    The words are widened where they were loaded (a join and a reshape follow, which the
    compiler does not move a layout change across), so a V tile reaches its dot's operand
    layout as 16-bit values (transposed shared-memory loads) rather than a byte a load."""
    a, b, c, d = tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        .reg .b32 t;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 t, lo;
        mov.b32 {$0, $1}, t;
        cvt.rn.f16x2.e4m3x2 t, hi;
        mov.b32 {$2, $3}, t;
        }""", "=h,=h,=h,=h,r", [w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True, pack=1)
    x = tl.join(tl.join(a, c), tl.join(b, d))
    return tl.reshape(x, (w.shape[0], 4 * w.shape[1]))


# fp8 cache formats: (largest finite value, mantissa bits, exponent bias).
FP8_FORMATS = {torch.float8_e4m3fn: (448.0, 3, 7), torch.float8_e5m2: (57344.0, 2, 15)}


def fp8_meta(cache_dtype: torch.dtype) -> dict:
    """The store kernels' quantization constants of a cache dtype: quantize_fp8's (KV_FP8=False
    for any other cache) and KV_INT8 (an int8 cache with row scales: int8_row_scale and
    int8_codes)."""
    fmax, mant, bias = FP8_FORMATS.get(cache_dtype, (0.0, 0, 0))
    return dict(KV_FP8=cache_dtype in FP8_FORMATS, FMAX=fmax, MANT=mant, BIAS=bias,
                SOFT=INTERPRET, KV_INT8=cache_dtype == torch.int8)


@triton.jit
def int8_row_scale(amax):
    """The scale of rows whose largest |x| is amax: amax times fp32(1 / 127) (1 for an
    all-zero row), as torch_ref.quantize_rows computes it (see INT8_INV_MAX there)."""
    return tl.where(amax > 0, amax * (1.0 / 127.0), 1.0)


@triton.jit
def int8_to_fp16(x):
    """int8 codes as fp16, exactly, with integer ops instead of an int -> float conversion:
    the bits 0x6400 | (c + 128) are the fp16 number 1024 + c + 128, so subtracting 1152 leaves
    c (every step exact: fp16 holds integers up to 2048)."""
    u = x.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x80
    return ((u | 0x6400).to(tl.float16, bitcast=True) - 1152.0).to(tl.float16)


@triton.jit
def int8_codes(x, scale):
    """round(x / scale) (ties to even, by the 1.5 * 2^23 trick of torch_ref.ROUND_MAGIC),
    clamped to +-127, as int8; scale broadcasts over x's rows."""
    y = (tl.div_rn(x, scale) + 12582912.0) - 12582912.0
    return tl.clamp(y, -127.0, 127.0).to(tl.int8)


@triton.jit
def quantize_fp8(x, scale, cache_ty: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr,
                 BIAS: tl.constexpr, SOFT: tl.constexpr):
    """x (fp32) / scale, clamped to +-FMAX, in the cache's fp8 type; torch rounds the same way
    (exact division, round to nearest even), so both paths store the same bytes. NaN is
    stored as 0: the decode reads a tiled V's last tile whole (decode_tiles, V_LAST 2), and
    its p of 0 must meet finite codes there.

    SOFT (the interpreter only) returns the fp8 bit pattern as uint8, built with integer ops:
    the interpreter's fp32 -> fp8 cast drops the carry of a round-up into the exponent.
    """
    y = tl.div_rn(x, scale)
    # (NaN first: the interpreter's clamp made it -FMAX, torch's keeps it NaN)
    y = tl.clamp(tl.where(y == y, y, 0.0), -FMAX, FMAX)
    if SOFT:
        a = tl.abs(y)
        bits = a.to(tl.int32, bitcast=True)
        # Normal range: round fp32's mantissa to MANT bits (nearest even; a carry moves into the
        # exponent), then rebias the exponent from fp32's 127 to BIAS.
        drop = 23 - MANT
        rounded = (bits + ((1 << (drop - 1)) - 1) + ((bits >> drop) & 1)) >> drop
        normal = rounded - ((127 - BIAS) << MANT)
        # Subnormal range: multiples of 2^(1 - BIAS - MANT); adding 1.5 * 2^23 rounds to integer.
        t = tl.minimum(a, 2.0 ** (1 - BIAS)) * (2.0 ** (BIAS + MANT - 1))
        sub = ((t + 12582912.0) - 12582912.0).to(tl.int32)
        code = tl.where(a < 2.0 ** (1 - BIAS), sub, normal)
        sign = (y.to(tl.int32, bitcast=True) >> 24) & 128
        q = (code | sign).to(tl.uint8)
    else:
        q = y.to(cache_ty)
    return q


@triton.jit
def v_tile_offsets(slot, stride_slot, kv_head_off, offs_d, BLOCK_SIZE: tl.constexpr,
                   HEAD_DIM: tl.constexpr, V_TILE: tl.constexpr):
    """Offset of V's element (slot, kv head, dim) when each page holds V as [kv head][V_TILE-key
    tile][dim][key] (triton_kv.v_tile_of): slot counts from the cache's first page, whose
    slots are stride_slot elements apart in the usual [slot][kv head][dim] layout, and
    kv_head_off is the head's offset there (head * HEAD_DIM)."""
    in_page = slot % BLOCK_SIZE
    return ((slot // BLOCK_SIZE) * (BLOCK_SIZE * stride_slot) + kv_head_off * BLOCK_SIZE
            + (in_page // V_TILE) * (HEAD_DIM * V_TILE) + offs_d * V_TILE + in_page % V_TILE)


@triton.jit
def v_tile_tile(v_cache_ptr, bt_row, kv_head_off, n, stride_kblk, HEAD_DIM: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, V_TILE: tl.constexpr):
    """V [BLOCK_N, HEAD_DIM] of keys n .. n + BLOCK_N from tiled pages, whole, unmasked (n a
    multiple of BLOCK_N, which divides BLOCK_SIZE, and BLOCK_N and V_TILE one a multiple of
    the other: the tile lies in one page, in runs of min(BLOCK_N, V_TILE) keys a dim)."""
    page = tl.load(bt_row + n // BLOCK_SIZE).to(tl.int64)
    slot0 = aligned(n % BLOCK_SIZE, BLOCK_N)
    base = (page * stride_kblk + kv_head_off * BLOCK_SIZE + (slot0 // V_TILE) * (HEAD_DIM * V_TILE)
            + slot0 % V_TILE)
    # (Triton 3.6 loses the alignment through // and %: without the hint each byte is a load.)
    base = aligned(base, 16)
    j = tl.arange(0, BLOCK_N)
    keys = (j // V_TILE) * (HEAD_DIM * V_TILE) + j % V_TILE
    return tl.load(v_cache_ptr + base + keys[:, None] + tl.arange(0, HEAD_DIM)[None, :] * V_TILE)
