"""Device functions of the fp8 K store with error feedback (kernels/kv_feedback.py is the
plain-torch reference): the fused norm + RoPE + store kernel (triton_rope) calls
feedback_round on a decode step's rotated keys; a prefill's go through
feedback_chains.feedback_chains, a thread a chain."""
import triton
import triton.language as tl

from nanovllm.kernels._common import quantize_fp8


@triton.jit
def _round_fp8(y, FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr):
    """y (fp32) rounded to the nearest fp8 value (ties to even, clamped to +-FMAX), as fp32:
    the step is 2^(exponent - MANT), the exponent floored at the smallest normal's."""
    y = tl.clamp(y, -FMAX, FMAX)
    e = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, 1 - BIAS)
    step = ((e - MANT + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((MANT - e + 127) << 23).to(tl.float32, bitcast=True)  # exact: a power of two
    # 1.5 * 2^23 rounds |x| < 2^22 to an integer, ties to even (torch_ref.ROUND_MAGIC).
    return ((y * inv_step + 12582912.0) - 12582912.0) * step


@triton.jit
def _col(t, j, i):
    """Column i of t [rows, groups, G] (j: arange(G) as [1, 1, G]), as [rows, groups, 1]."""
    return tl.sum(tl.where(j == i, t, 0.0), axis=2, keep_dims=True)


@triton.jit
def top_rows(t, R: tl.constexpr):
    """The first R rows of t [P, C] (P a multiple of R): the mixing's dots pad the kv heads
    to 16 rows, which the feedback loop would otherwise carry through every step."""
    P: tl.constexpr = t.shape[0]
    C: tl.constexpr = t.shape[1]
    first = tl.arange(0, P // R)[:, None, None] == 0
    return tl.sum(tl.where(first, tl.reshape(t, [P // R, R, C]), 0.0), axis=0)


@triton.jit
def store_tile(k1, k2, ks, fb_ptr, dst_ptr, stride_ch, HKV: tl.constexpr, R: tl.constexpr,
               G: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
               SOFT: tl.constexpr, ROWS_AHEAD: tl.constexpr = 0):
    """A decode token's rotated K halves ([rows, HALF], kv heads padded; scales ks
    [rows, 1]) rounded with error feedback on the register tile (feedback_round) and stored
    at dst_ptr, its cache slot (kv heads stride_ch apart)."""
    HALF: tl.constexpr = k1.shape[1]
    hr = tl.arange(0, R)[:, None]
    mr = hr < HKV
    y1 = top_rows(tl.div_rn(k1.to(tl.float32), ks), R)
    y2 = top_rows(tl.div_rn(k2.to(tl.float32), ks), R)
    y1, y2 = feedback_round(y1, y2, fb_ptr, hr, mr, G, min(G, 4), FMAX, MANT, BIAS,
                            ROWS_AHEAD if G % 4 == 0 else 0)
    dst = dst_ptr + hr * stride_ch + tl.arange(0, HALF)[None, :]
    cache_ty: tl.constexpr = dst_ptr.dtype.element_ty
    tl.store(dst, quantize_fp8(y1, 1.0, cache_ty, FMAX, MANT, BIAS, SOFT), mask=mr)
    tl.store(dst + HALF, quantize_fp8(y2, 1.0, cache_ty, FMAX, MANT, BIAS, SOFT), mask=mr)


@triton.jit
def prefetch_rows(ptr, n: tl.constexpr, N_POW2: tl.constexpr):
    """Ask for the n fp32 values at ptr (a multiple of 32: whole 128-byte lines; N_POW2 a
    power of two >= n) to be brought into L2, not waiting for them."""
    lines = tl.arange(0, N_POW2 // 32)
    addr = (ptr + tl.minimum(lines, n // 32 - 1) * 32).to(tl.int64)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [addr],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def feedback_round(y1, y2, fb_ptr, hk, mk, G: tl.constexpr, UNROLL: tl.constexpr,
                   FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                   ROWS_AHEAD: tl.constexpr = 0):
    """K's halves in units of its scale ([R, HALF] fp32; kv heads hk [R, 1], mask mk), their
    groups of G channels rounded to fp8 side by side, channel by channel, each channel's
    error times its row of the feedback matrix fb [Hkv, D, G] taken off the rest of its
    group (kernels/kv_feedback.py, whose reference takes the same steps)."""
    R: tl.constexpr = y1.shape[0]
    HALF: tl.constexpr = y1.shape[1]
    NG: tl.constexpr = 2 * HALF // G
    # One [R, groups, G] tile over both halves: a step rounds one [R, groups] column, not
    # one per half (each thread's share of the chain halves).
    y = tl.reshape(tl.permute(tl.join(y1, y2), (0, 2, 1)), [R, NG, G])
    j = tl.arange(0, G)[None, None, :]
    m3 = mk[:, :, None]
    base = fb_ptr + (hk[:, :, None] * NG + tl.arange(0, NG)[None, :, None]) * (G * G)
    # The chain a step waits on is channel i's rounding and one multiply-add: channels i+1
    # (c) and i+2 (d) are carried ahead, each brought up to date as an error comes, while
    # the tile's update and the next extraction (a cross-lane sum) run beside the chain.
    # Unrolled by UNROLL steps inside a loop: the loads need not wait on the chain, and the
    # compiler's coalescing pass, quadratic in a body's loads, stays fast (fully unrolled,
    # 32 steps took it 90 s).
    c = _col(y, j, 0)
    d = _col(y, j, 1)
    zero = hk[:, :, None] * 0  # the masks past a group's end: tensors, as the interpreter's are
    if ROWS_AHEAD == 1:
        # The next UNROLL (4) steps' rows loaded while this block's steps run: loaded in
        # their own block, each waited a round trip to L2 on the chain (8 a 32-step group).
        tl.static_assert(UNROLL == 4)
        w0, a0, b0 = _step_rows(base, 0, j, m3, zero, G)
        w1, a1, b1 = _step_rows(base, 1, j, m3, zero, G)
        w2, a2, b2 = _step_rows(base, 2, j, m3, zero, G)
        w3, a3, b3 = _step_rows(base, 3, j, m3, zero, G)
        for start in range(0, G, 4):
            v0, p0, q0 = _step_rows(base, start + 4, j, m3, zero, G)
            v1, p1, q1 = _step_rows(base, start + 5, j, m3, zero, G)
            v2, p2, q2 = _step_rows(base, start + 6, j, m3, zero, G)
            v3, p3, q3 = _step_rows(base, start + 7, j, m3, zero, G)
            y, c, d = _step(y, c, d, j, start, w0, a0, b0, FMAX, MANT, BIAS)
            y, c, d = _step(y, c, d, j, start + 1, w1, a1, b1, FMAX, MANT, BIAS)
            y, c, d = _step(y, c, d, j, start + 2, w2, a2, b2, FMAX, MANT, BIAS)
            y, c, d = _step(y, c, d, j, start + 3, w3, a3, b3, FMAX, MANT, BIAS)
            w0, a0, b0, w1, a1, b1 = v0, p0, q0, v1, p1, q1
            w2, a2, b2, w3, a3, b3 = v2, p2, q2, v3, p3, q3
    else:
        for start in range(0, G, UNROLL):
            if ROWS_AHEAD == 2:  # the next block's rows asked into L1, holding no registers
                for k in tl.static_range(UNROLL):
                    _prefetch_l1(base + tl.minimum(start + UNROLL + k, G - 1) * G + j)
            for k in tl.static_range(UNROLL):
                w, a, b = _step_rows(base, start + k, j, m3, zero, G)
                y, c, d = _step(y, c, d, j, start + k, w, a, b, FMAX, MANT, BIAS)
    return tl.split(tl.permute(tl.reshape(y, [R, 2, HALF]), (0, 2, 1)))


@triton.jit
def _prefetch_l1(ptrs):
    """Ask for the lines of ptrs to be brought into L1, not waiting for them."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1];\nmov.u32 $0, 0;", "=r,l",
                              [ptrs.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _step_rows(base, i, j, m3, zero, G: tl.constexpr):
    """What step i of feedback_round reads of the matrix: row i (zeros past the group's
    end), and its entries at channels i + 1 and i + 2 (zero past the end)."""
    row = base + i * G
    return (tl.load(row + j, mask=m3 & (zero + i < G), other=0.0),
            tl.load(row + (i + 1), mask=m3 & (zero + (i + 1) < G), other=0.0),
            tl.load(row + (i + 2), mask=m3 & (zero + (i + 2) < G), other=0.0))


@triton.jit
def _step(y, c, d, j, i, w, a, b, FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr):
    """Step i of feedback_round: channel i (c) rounded, its error taken off the tile y with
    row w, and off the channels carried ahead (d, c) with its entries a and b."""
    x = _col(y, j, i + 2)  # zero past the group's end
    e = c - _round_fp8(c, FMAX, MANT, BIAS)
    # Row i is 1 at channel i: it becomes its rounded value, exactly (Sterbenz).
    return y - e * w, d - e * a, x - e * b
