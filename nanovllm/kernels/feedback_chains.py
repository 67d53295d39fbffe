"""K's error feedback a GPU thread a chain: chain_asm's PTX runs one (kv head, group)'s steps in
registers with the reference's roundings (kernels/kv_feedback.py), for a prefill's keys
(feedback_chains, after the fused RoPE store) and the layer kernel's new key (FB_ASM)."""
import functools

import torch
import triton
import triton.language as tl

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
    the low byte). Every step is the reference's (kv_feedback.quantize_feedback):
    triton_feedback._round_fp8's integer rounding, then a separate multiply and subtract per
    channel (.rn: no contraction), so the codes equal the torch path's bit for bit. One thread
    carries the chain in its registers: a step waits on no other lane, only on its own
    rounding and one update."""
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
    # e4m3 (3 mantissa bits, bias 7, largest 448): triton_feedback._round_fp8's steps.
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
