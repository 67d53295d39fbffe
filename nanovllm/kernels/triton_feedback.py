"""Device functions of the fp8 K store with error feedback (kernels/kv_feedback.py is the
plain-torch reference): the fused norm + RoPE + store kernel (triton_rope) calls
feedback_round on a decode step's rotated keys; a prefill's go through feedback_chains."""
import functools

import torch
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
               SOFT: tl.constexpr):
    """A decode token's rotated K halves ([rows, HALF], kv heads padded; scales ks
    [rows, 1]) rounded with error feedback on the register tile (feedback_round) and stored
    at dst_ptr, its cache slot (kv heads stride_ch apart)."""
    HALF: tl.constexpr = k1.shape[1]
    hr = tl.arange(0, R)[:, None]
    mr = hr < HKV
    y1 = top_rows(tl.div_rn(k1.to(tl.float32), ks), R)
    y2 = top_rows(tl.div_rn(k2.to(tl.float32), ks), R)
    y1, y2 = feedback_round(y1, y2, fb_ptr, hr, mr, G, min(G, 4), FMAX, MANT, BIAS)
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


# Codes a chain returns: four 64-bit words (eight codes each), so groups of 8-32 channels.
CHAIN_WORDS = 4
# Feedback rows a chain has in flight ahead of its step (chain_asm).
CHAIN_PREFETCH = 4


@functools.lru_cache(maxsize=None)
def chain_asm(group: int, src: str, depth: int | None = None) -> str:
    """PTX for one thread's whole chain: a (kv head, group)'s `group` keys loaded from the
    scratch row at $4 (`src`: "bf16", "fp16" or "fp32"), divided by the scale $6, rounded to
    e4m3 channel by channel with each error times its row of the feedback matrix (at $5)
    taken off the channels after it, and returned as codes in $0-$3 (8 a word, channel 0 in
    the low byte). Every step is the reference's (kv_feedback.quantize_feedback): _round_fp8's
    integer rounding, then a separate multiply and subtract per channel (.rn: no contraction),
    so the codes equal the torch path's bit for bit. One thread carries the chain in its
    registers: a step waits on no other lane, only on its own rounding and one update."""
    assert group % 8 == 0 and 8 <= group <= 8 * CHAIN_WORDS, group
    w = CHAIN_WORDS
    row, fb, scale = f"${w}", f"${w + 1}", f"${w + 2}"
    out = ["{", f".reg .f32 x<{group}>, u<{group}>, y, t, e, st, iv, p;",
           ".reg .b32 b, bs, bi, lo, hi;", ".reg .b32 v<4>;", ".reg .b16 h<2>;"]
    # The keys, widened to fp32 (a bf16 is the top half of its fp32) and divided by the scale.
    for q in range(group // 4 if src == "fp32" else group // 8):
        if src == "fp32":
            regs = ", ".join(f"x{q * 4 + k}" for k in range(4))
            out.append(f"ld.global.v4.f32 {{{regs}}}, [{row}+{16 * q}];")
            continue
        out.append(f"ld.global.v4.b32 {{v0, v1, v2, v3}}, [{row}+{16 * q}];")
        for k in range(4):
            a, b = f"x{q * 8 + 2 * k}", f"x{q * 8 + 2 * k + 1}"
            if src == "fp16":
                out += [f"mov.b32 {{h0, h1}}, v{k};", f"cvt.f32.f16 {a}, h0;",
                        f"cvt.f32.f16 {b}, h1;"]
            else:
                out += [f"shl.b32 lo, v{k}, 16;", f"and.b32 hi, v{k}, 0xFFFF0000;",
                        f"mov.b32 {a}, lo;", f"mov.b32 {b}, hi;"]
    for i in range(group):
        out.append(f"div.rn.f32 x{i}, x{i}, {scale};")

    def load_row(r):  # row r of the matrix, from its first 16-byte chunk past channel r
        slot = (r % depth) * group
        for q in range((r + 1) // 4 * 4, group, 4):
            regs = ", ".join(f"u{slot + q + k}" for k in range(4))
            out.append(f"ld.global.v4.f32 {{{regs}}}, [{fb}+{4 * (r * group + q)}];")

    # Rows are loaded `depth` steps before their step, so no step need wait for its own
    # (on the H100 depths 2, 4 and 6 measured alike: ptxas hoists the loads anyway).
    depth = min(depth or CHAIN_PREFETCH, group)
    out[1] = f".reg .f32 x<{group}>, u<{group * depth}>, y, t, e, st, iv, p;"
    for r in range(depth):
        load_row(r)
    # e4m3 (3 mantissa bits, bias 7, largest 448): _round_fp8's steps.
    fmax, nmax, mant, bias = "0f43E00000", "0fC3E00000", 3, 7
    for i in range(group):
        out += [
            f"min.f32 y, x{i}, {fmax};", f"max.f32 y, y, {nmax};",
            "mov.b32 b, y;", "bfe.u32 b, b, 23, 8;", f"max.s32 b, b, {128 - bias};",
            f"sub.s32 bs, b, {mant};", "shl.b32 bs, bs, 23;", "mov.b32 st, bs;",
            f"sub.s32 bi, {254 + mant}, b;", "shl.b32 bi, bi, 23;", "mov.b32 iv, bi;",
            "mul.rn.f32 t, y, iv;", "add.rn.f32 t, t, 0f4B400000;",
            "sub.rn.f32 t, t, 0f4B400000;", "mul.rn.f32 t, t, st;",
            f"sub.rn.f32 e, x{i}, t;",
            # The row is 1 at i: the channel lands on its rounded value (the reference's
            # subtraction, so a -0 rounding leaves +0 as there).
            f"sub.rn.f32 x{i}, x{i}, e;"]
        slot = (i % depth) * group
        for j in range(i + 1, group):
            out += [f"mul.rn.f32 p, e, u{slot + j};", f"sub.rn.f32 x{j}, x{j}, p;"]
        if i + depth < group:
            load_row(i + depth)
    # Pack: cvt puts its first operand in the upper byte.
    for word in range(w):
        for pair in range(4):
            c = word * 8 + pair * 2
            if c < group:
                out.append(f"cvt.rn.satfinite.e4m3x2.f32 h{pair % 2}, x{c + 1}, x{c};")
            else:
                out.append(f"mov.b16 h{pair % 2}, 0;")
            if pair % 2:
                out.append(f"mov.b32 {'lo' if pair == 1 else 'hi'}, {{h0, h1}};")
        out.append(f"mov.b64 ${word}, {{lo, hi}};")
    out.append("}")
    return "\n".join(out)


# num_tokens varies per prefill: not specialized on (== 1, % 16), so the warm-up's compile
# serves every step (the first bench.py run on a machine compiled a second variant inside
# its timed prefill: 5.39 s against 5.03-5.06 s after).
@triton.jit(do_not_specialize=["num_tokens"])
def feedback_chains_kernel(k_ptr, fb_ptr, s_ptr, cache_ptr, slot_ptr, num_tokens,
                           stride_cslot, stride_ch, HKV: tl.constexpr, NG: tl.constexpr,
                           G: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    """Many tokens' K (k_ptr [T, HKV, NG * G], rotated, in the activation dtype) rounded with
    error feedback, a chain per thread (chain_asm), and stored at the tokens' slots (-1:
    none). Program p takes BLOCK tokens of one (kv head, group): a warp's threads then read
    the same feedback rows (one broadcast load each), where a token's own (head, group)s
    side by side would read 32 different rows a load."""
    hg = tl.program_id(1)
    h, g = hg // NG, hg % NG
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = t < num_tokens
    t = tl.minimum(t, num_tokens - 1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    src = (k_ptr + t.to(tl.int64) * (HKV * NG * G) + hg * G).to(tl.int64)
    fb = (fb_ptr + hg * (G * G) + t * 0).to(tl.int64)
    w0, w1, w2, w3 = tl.inline_asm_elementwise(
        ASM, "=l,=l,=l,=l,l,l,f", [src, fb, tl.load(s_ptr + h + t * 0)],
        dtype=(tl.int64, tl.int64, tl.int64, tl.int64), is_pure=True, pack=1)
    m = live & (slot >= 0)
    dst = (cache_ptr.to(tl.pointer_type(tl.int64))
           + (slot * stride_cslot + h * stride_ch + g * G) // 8)
    tl.store(dst, w0, mask=m)
    if G > 8:
        tl.store(dst + 1, w1, mask=m)
    if G > 16:
        tl.store(dst + 2, w2, mask=m)
        tl.store(dst + 3, w3, mask=m)


# Tokens a program of feedback_chains_kernel takes (a thread each).
CHAINS_BLOCK = 128
SOURCE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def feedback_chains(k, feedback, scale, cache, slot_mapping) -> None:
    """Store k [T, Hkv, D] (rotated) into the fp8 `cache` at slot_mapping, each (kv head,
    group) rounded with error feedback through `feedback` [Hkv, D, G], in units of `scale`
    [Hkv] (kernels/kv_feedback.quantize_feedback's codes, bit for bit)."""
    t, hkv, d = k.shape
    g = feedback.shape[-1]
    assert k.is_contiguous() and feedback.is_contiguous() and cache.stride(3) == 1
    feedback_chains_kernel[(triton.cdiv(t, CHAINS_BLOCK), hkv * (d // g))](
        k, feedback, scale, cache, slot_mapping, t, cache.stride(1), cache.stride(2),
        HKV=hkv, NG=d // g, G=g, ASM=chain_asm(g, SOURCE_DTYPES[k.dtype]),
        BLOCK=CHAINS_BLOCK, num_warps=CHAINS_BLOCK // 32)
