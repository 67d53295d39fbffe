"""Device functions of the fp8 K store with error feedback (kernels/kv_feedback.py is the
plain-torch reference): the fused norm + RoPE + store kernel (triton_rope) calls
feedback_round on a token's rotated keys when NANOVLLM_KV_FEEDBACK=1."""
import triton
import triton.language as tl


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
def feedback_round(y1, y2, fb_ptr, hk, mk, G: tl.constexpr, UNROLL: tl.constexpr,
                   FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr):
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
    for start in range(0, G, UNROLL):
        for k in tl.static_range(UNROLL):
            i = start + k
            row = base + i * G
            x = _col(y, j, i + 2)  # zero past the group's end
            e = c - _round_fp8(c, FMAX, MANT, BIAS)
            # Row i is 1 at channel i: it becomes its rounded value, exactly (Sterbenz).
            y = y - e * tl.load(row + j, mask=m3, other=0.0)
            c = d - e * tl.load(row + (i + 1), mask=m3 & (zero + (i + 1) < G), other=0.0)
            d = x - e * tl.load(row + (i + 2), mask=m3 & (zero + (i + 2) < G), other=0.0)
    return tl.split(tl.permute(tl.reshape(y, [R, 2, HALF]), (0, 2, 1)))
