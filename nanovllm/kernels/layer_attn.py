"""Phase B's parts of the layer kernel (kernels/layer_kernel.py): the key splits, a split's
old keys read early (PRE_KV), this token's K and V into the cache and a kv head's query rows.
An fp8 cache gets them as the fused RoPE store makes them (triton_rope: Hadamard mixing, K's
error feedback, per-kv-head scales) and the queries as the decode kernel takes them. Same
steps, same roundings, so both paths store the same codes up to the rare tie that a
different summation order in the qkv rows tips. (layer_fp8.py before 2026-11-29.)"""
import triton
import triton.language as tl

from nanovllm.kernels._common import quantize_fp8, v_tile_offsets
from nanovllm.kernels.decode_tiles import prefetch_tile, tile_of
from nanovllm.kernels.hadamard import FWHT, mix_halves
from nanovllm.kernels.layer_parts import rope_rows
from nanovllm.kernels.triton_feedback import feedback_round, top_rows


@triton.jit
def split_halves(x):
    """[R, HD] -> its first and second halves, [R, HD / 2] each."""
    R: tl.constexpr = x.shape[0]
    HALF: tl.constexpr = x.shape[1] // 2
    return tl.split(tl.permute(tl.reshape(x, [R, 2, HALF]), (0, 2, 1)))


@triton.jit
def mix_rows(x, DTYPE: tl.constexpr, LOG2_HALF: tl.constexpr, DOT_PREC: tl.constexpr):
    """Rows x [R, HD] (fp32; R >= 16 without FWHT) times the orthonormal Hadamard matrix,
    rounded to DTYPE first as the torch path does (hadamard.mix_halves); fp32 out.
    HD = 2 ** (LOG2_HALF + 1)."""
    R: tl.constexpr = x.shape[0]
    HD: tl.constexpr = x.shape[1]
    HALF: tl.constexpr = HD // 2
    x1, x2 = split_halves(x)
    y1, y2 = mix_halves(x1, x2, DTYPE, HALF, LOG2_HALF, DOT_PREC)
    return tl.reshape(tl.permute(tl.join(y1, y2), (0, 2, 1)), [R, HD])


@triton.jit
def _store_fp8(qkv_ptr, kvh, pos, cos_sin_ptr, k_norm, eps, k_dst, v_dst, ks, vs, fb_ptr,
                 HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, QK_NORM: tl.constexpr,
                 DTYPE: tl.constexpr, MIX: tl.constexpr, LOG2_HALF: tl.constexpr,
                 FEEDBACK: tl.constexpr, FB_ASM: tl.constexpr, FB_G: tl.constexpr,
                 FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                 SOFT: tl.constexpr, DOT_PREC: tl.constexpr, V_STEP: tl.constexpr,
                 FB_AHEAD: tl.constexpr = 0):
    """kv head kvh's new K (normed, rotated, mixed) and V from the qkv row, as fp8 codes of
    k / ks (K's groups of FB_G channels rounded with error feedback through fb_ptr [Hkv, HD,
    FB_G] when FEEDBACK: by FB_ASM, feedback_chains.chain_asm's PTX, where it is set, else on
    the register tile, its rows asked for a block early by FB_AHEAD as feedback_round says)
    and v / vs, stored at k_dst / v_dst (this slot and head's row; V's dims V_STEP elements
    apart)."""
    HALF: tl.constexpr = HD // 2
    R: tl.constexpr = 16 if MIX and not FWHT else 1  # the mixing's dots take 16 rows
    rows = tl.arange(0, R)
    k = rope_rows(qkv_ptr + HQ * HD, rows * 0 + kvh, rows < 1, pos, cos_sin_ptr, k_norm, eps,
                  HD, QK_NORM, DTYPE)
    if MIX:
        k = mix_rows(k, DTYPE, LOG2_HALF, DOT_PREC)
    # The torch path holds the rotated key in the model dtype before it is quantized.
    k1, k2 = split_halves(k.to(DTYPE).to(tl.float32))
    k1, k2 = top_rows(k1, 1), top_rows(k2, 1)
    cache_ty: tl.constexpr = k_dst.dtype.element_ty
    if FEEDBACK and FB_ASM != "":
        _chains(k1, k2, qkv_ptr + (HQ + kvh) * HD, fb_ptr + kvh * (HD * FB_G), ks, k_dst,
                FB_ASM, FB_G)
    elif FEEDBACK:
        hk = tl.full([1, 1], 0, tl.int32) + kvh
        y1, y2 = feedback_round(tl.div_rn(k1, ks), tl.div_rn(k2, ks), fb_ptr, hk, hk < HKV,
                                FB_G, min(FB_G, 4), FMAX, MANT, BIAS,
                                FB_AHEAD if FB_G % 4 == 0 else 0)
        c1 = quantize_fp8(y1, 1.0, cache_ty, FMAX, MANT, BIAS, SOFT)
        c2 = quantize_fp8(y2, 1.0, cache_ty, FMAX, MANT, BIAS, SOFT)
    else:
        c1 = quantize_fp8(k1, ks, cache_ty, FMAX, MANT, BIAS, SOFT)
        c2 = quantize_fp8(k2, ks, cache_ty, FMAX, MANT, BIAS, SOFT)
    v = tl.load(qkv_ptr + (HQ + HKV) * HD + kvh * HD + tl.arange(0, HD),
                cache_modifier=".cg").to(tl.float32)
    c3 = quantize_fp8(v, vs, cache_ty, FMAX, MANT, BIAS, SOFT)
    if SOFT:  # the interpreter's codes are bit patterns (quantize_fp8)
        k_dst = k_dst.to(tl.pointer_type(tl.uint8))
        v_dst = v_dst.to(tl.pointer_type(tl.uint8))
    offs = tl.arange(0, HALF)[None, :]
    if not (FEEDBACK and FB_ASM != ""):
        tl.store(k_dst + offs, c1)
        tl.store(k_dst + HALF + offs, c2)
    tl.store(v_dst + tl.arange(0, HD) * V_STEP, c3)


@triton.jit
def store_new_kv(qkv_ptr, kvh, is_new, sync, slot_ptr, stride_kslot, pos, cos_sin_ptr, k_norm,
                 eps, k_cache, v_cache, k_scale, v_scale, fb_ptr, HQ: tl.constexpr,
                 HKV: tl.constexpr, HD: tl.constexpr, QK_NORM: tl.constexpr,
                 DTYPE: tl.constexpr, KV_FP8: tl.constexpr, MIX: tl.constexpr,
                 LOG2_HALF: tl.constexpr, FEEDBACK: tl.constexpr, FB_ASM: tl.constexpr,
                 FB_G: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr,
                 BIAS: tl.constexpr, SOFT: tl.constexpr, DOT_PREC: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, V_TILE: tl.constexpr, FB_AHEAD: tl.constexpr = 0):
    """Where is_new (the split that holds the new key): kv head kvh's new K (normed,
    rotated) and V from the qkv row, stored at this step's slot of the layer's caches, in
    the model dtype or with KV_FP8 as _store_fp8's codes (k_scale / v_scale: per-kv-head
    scales); then, with sync, a block barrier (the split reads the key back from the
    cache). Returns what was stored, as rows [1, HD] (zeros for an fp8 cache or elsewhere):
    the attention may take the new key from them. V_TILE: an fp8 cache's V pages tiled
    (triton_kv.v_tile_of)."""
    k_row = tl.zeros([1, HD], DTYPE)
    v_row = tl.zeros([1, HD], DTYPE)
    if is_new:
        slot = tl.load(slot_ptr).to(tl.int64)
        dst = slot * stride_kslot + kvh * HD
        offs = tl.arange(0, HD)[None, :]
        if KV_FP8:
            v_dst = dst
            if V_TILE:
                v_dst = v_tile_offsets(slot, stride_kslot, kvh * HD, 0, BLOCK_SIZE, HD, V_TILE)
            _store_fp8(qkv_ptr, kvh, pos, cos_sin_ptr, k_norm, eps, k_cache + dst,
                       v_cache + v_dst, tl.load(k_scale + kvh), tl.load(v_scale + kvh), fb_ptr,
                       HQ, HKV, HD, QK_NORM, DTYPE, MIX, LOG2_HALF, FEEDBACK, FB_ASM, FB_G,
                       FMAX, MANT, BIAS, SOFT, DOT_PREC, max(V_TILE, 1), FB_AHEAD)
        else:
            kv_head = tl.full([1], 0, tl.int32) + kvh
            k = rope_rows(qkv_ptr + HQ * HD, kv_head, kv_head < HKV, pos, cos_sin_ptr, k_norm,
                          eps, HD, QK_NORM, DTYPE)
            k_row = k.to(DTYPE)
            v_row = tl.load(qkv_ptr + (HQ + HKV) * HD + kvh * HD + offs, cache_modifier=".cg")
            tl.store(k_cache + dst + offs, k_row)
            tl.store(v_cache + dst + offs, v_row)
        if sync:
            tl.debug_barrier()
    return k_row, v_row


@triton.jit
def key_splits(ctx, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, NEW_APART: tl.constexpr):
    """(keys a split, splits that hold keys) for a context of ctx keys: whole BLOCK_N tiles,
    over SPLITS splits, or with NEW_APART the old keys over SPLITS - 1 and the new key alone
    in the split after them."""
    if NEW_APART:
        split_len = tl.cdiv(tl.cdiv(tl.maximum(ctx - 1, 1), SPLITS - 1), BLOCK_N) * BLOCK_N
        n_valid = tl.cdiv(ctx - 1, split_len) + 1
    else:
        split_len = tl.cdiv(tl.cdiv(ctx, SPLITS), BLOCK_N) * BLOCK_N
        n_valid = tl.cdiv(ctx, split_len)
    return split_len, n_valid


@triton.jit
def split_range(s, split_len, n_valid, ctx, NEW_APART: tl.constexpr):
    """(first key, end) of split s: key_splits' tiles, or with NEW_APART the new key alone
    in split n_valid - 1 and the old ones before it."""
    start = s * split_len
    end = tl.minimum(start + split_len, ctx)
    if NEW_APART:
        end = tl.where(s == n_valid - 1, ctx, tl.minimum(end, ctx - 1))
        start = tl.where(s == n_valid - 1, tl.maximum(ctx - 1, 0), start)
    return start, end


@triton.jit
def old_keys_tile(k_cache, v_cache, bt_row, pid, ctx, split_len, n_valid, stride_kblk,
                  stride_kslot, HKV: tl.constexpr, HD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  BLOCK_N: tl.constexpr, TO_L2: tl.constexpr):
    """Program pid's phase B item (kv head pid % HKV, split pid // HKV) when its split is one
    tile: that tile's K and V of the old keys (before ctx - 1), zeros elsewhere, or (TO_L2)
    asked into L2 with zeros returned. Nothing past n_valid splits or longer ones."""
    pre = (split_len == BLOCK_N) & (pid < HKV * n_valid)
    n0 = tl.where(pre, pid // HKV * BLOCK_N, 0)
    e0 = tl.where(pre, tl.minimum(n0 + BLOCK_N, ctx - 1), 0)
    off = pid % HKV * HD
    PAGE: tl.constexpr = BLOCK_SIZE % BLOCK_N == 0
    if TO_L2:
        prefetch_tile(k_cache, bt_row, off, n0, e0, stride_kblk, stride_kslot, HD, BLOCK_SIZE,
                      BLOCK_N, PAGE)
        prefetch_tile(v_cache, bt_row, off, n0, e0, stride_kblk, stride_kslot, HD, BLOCK_SIZE,
                      BLOCK_N, PAGE)
        k = tl.zeros([BLOCK_N, HD], k_cache.dtype.element_ty)
        v = tl.zeros([BLOCK_N, HD], k_cache.dtype.element_ty)
    else:
        k = tile_of(k_cache, bt_row, off, n0, e0, stride_kblk, stride_kslot, HD, BLOCK_SIZE,
                    BLOCK_N, PAGE)
        v = tile_of(v_cache, bt_row, off, n0, e0, stride_kblk, stride_kslot, HD, BLOCK_SIZE,
                    BLOCK_N, PAGE)
    return k, v


@triton.jit
def queries(qkv_ptr, heads, g_mask, pos, cos_sin_ptr, q_norm, eps, qk_scale, k_scale,
            kvh, HD: tl.constexpr, QK_NORM: tl.constexpr, DTYPE: tl.constexpr,
            KV_FP8: tl.constexpr, MIX: tl.constexpr, LOG2_HALF: tl.constexpr,
            FP16_QK: tl.constexpr, DOT_PREC: tl.constexpr):
    """A kv head's query rows (heads, masked by g_mask) normed, rotated and mixed (MIX), in
    the dtype of the attention's dots, and the scores' scale: as the decode kernel, an fp8
    cache's K scale joins the softmax scale, and a bf16 q meets its tiles in fp16 dots."""
    q = rope_rows(qkv_ptr, heads, g_mask, pos, cos_sin_ptr, q_norm, eps, HD, QK_NORM, DTYPE)
    if MIX:
        q = mix_rows(q, DTYPE, LOG2_HALF, DOT_PREC)
    q = q.to(DTYPE)
    if KV_FP8:
        qk_scale = qk_scale * tl.load(k_scale + kvh)
        if FP16_QK:
            q = q.to(tl.float16)
    return q, qk_scale


@triton.jit
def _chains(k1, k2, row_ptr, fb_ptr, ks, k_dst, FB_ASM: tl.constexpr, FB_G: tl.constexpr):
    """K's halves [1, HD / 2] (fp32, model-dtype values) rounded with error feedback by a
    thread per group of FB_G channels (FB_ASM: feedback_chains.chain_asm, which reads its keys
    from memory) and stored as codes at k_dst. The keys go through row_ptr, this kv head's K
    in the qkv row: only this program reads it, and it has read it already. On the register
    tile every step of the 32-step chain waits on a cross-lane sum; a thread's own chain
    waits on its rounding alone (H200 batch 1, SmolLM2 shape: 1,025 tok/s with the tile
    against 1,684 without the feedback)."""
    HALF: tl.constexpr = k1.shape[1]
    offs = tl.arange(0, HALF)[None, :]
    ty: tl.constexpr = row_ptr.dtype.element_ty
    tl.debug_barrier()  # every thread has read the row it is about to overwrite
    tl.store(row_ptr + offs, k1.to(ty))
    tl.store(row_ptr + HALF + offs, k2.to(ty))
    tl.debug_barrier()  # a block's global stores are seen by its threads after a bar.sync
    _run_chains(row_ptr, fb_ptr, ks, k_dst, FB_ASM, FB_G, 2 * HALF // FB_G)


@triton.jit(noinline=True)
def _run_chains(row_ptr, fb_ptr, ks, k_dst, FB_ASM: tl.constexpr, FB_G: tl.constexpr,
                NG: tl.constexpr):
    """_chains' PTX over the NG groups of the key at row_ptr. A call of its own: ptxas then
    allocates the chain's ~170 registers apart from the layer kernel's live state."""
    g = tl.arange(0, NG)
    src = (row_ptr + g * FB_G).to(tl.int64)
    fb = (fb_ptr + g * (FB_G * FB_G)).to(tl.int64)
    w0, w1, w2, w3 = tl.inline_asm_elementwise(
        FB_ASM, "=l,=l,=l,=l,l,l,f", [src, fb, tl.zeros([NG], tl.float32) + ks],
        dtype=(tl.int64, tl.int64, tl.int64, tl.int64), is_pure=True, pack=1)
    dst = k_dst.to(tl.pointer_type(tl.int64)) + g * (FB_G // 8)
    tl.store(dst, w0)
    if FB_G > 8:
        tl.store(dst + 1, w1)
    if FB_G > 16:
        tl.store(dst + 2, w2)
        tl.store(dst + 3, w3)
