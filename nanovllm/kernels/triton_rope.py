"""One Triton kernel for everything between the qkv projection and attention: per-head q/k
RMSNorm (optional), rotary embedding (rotate-half layout) and the K/V store into the paged cache.

Unfused this is six kernels per layer (two norms, the cos/sin gather, two rotations, the store),
which at small batches cost more than the layer's matmuls: each is a few microseconds of launch
and tail for a few kilobytes of work. The arithmetic follows the unfused torch path step by step,
rounding to the activation dtype where it does (normed value, times weight, rotated value), so
both paths give the same numbers to within float rounding. An fp8 cache gets the rounded k and
v divided by their per-kv-head scales (see torch_ref.quantize), an int8 cache each row's codes
and scale (torch_ref.quantize_rows), and with mix=True q and k are first multiplied by the
orthonormal Hadamard matrix (kv_mix.hadamard_mix).
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels import pdl
from nanovllm.kernels._common import (
    INTERPRET,
    dot_precision,
    fp8_meta,
    int8_codes,
    int8_row_scale,
    quantize_fp8,
    v_tile_offsets,
)
from nanovllm.kernels.feedback_chains import feedback_chains
from nanovllm.kernels.hadamard import FWHT, mix_halves
from nanovllm.kernels.triton_feedback import prefetch_rows, store_tile
from nanovllm.kernels.triton_kv import fp8_args, row_scale_strides, v_tile_of


@triton.jit
def _norm_rotate(x1, x2, w_ptr, cos, sin, offs, eps,
                 HALF: tl.constexpr, HAS_NORM: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Norm and rotate [H, HALF] halves (fp32); returns the two rotated halves (fp32)."""
    if HAS_NORM:
        var = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
        r = (1.0 / tl.sqrt(var + eps))[:, None]
        w1 = tl.load(w_ptr + offs).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)[None, :]
        # The torch path rounds the normed value, then its product with the weight.
        x1 = ((x1 * r).to(OUT_DTYPE).to(tl.float32) * w1).to(OUT_DTYPE).to(tl.float32)
        x2 = ((x2 * r).to(OUT_DTYPE).to(tl.float32) * w2).to(OUT_DTYPE).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _norm_rope_store_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_sin_ptr, qw_ptr, kw_ptr, slot_ptr,
    q_out_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, fb_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_pos,
    stride_cslot, stride_ch, stride_sblk, stride_sslot, stride_sh, SCALE_BS, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, HQ_PAD: tl.constexpr, HKV_PAD: tl.constexpr,
    HALF: tl.constexpr, HAS_NORM: tl.constexpr, WRITE_K: tl.constexpr,
    MIX: tl.constexpr, LOG2_HALF: tl.constexpr, DOT_PREC: tl.constexpr, KV_FP8: tl.constexpr,
    FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
    SOFT: tl.constexpr, KV_INT8: tl.constexpr, FEEDBACK: tl.constexpr, GROUP: tl.constexpr,
    KV_ROWS: tl.constexpr, CHAINS: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, V_TILE: tl.constexpr, ROWS_AHEAD: tl.constexpr, GDC: tl.constexpr,
):
    pdl.release_next(GDC)  # (kernels/pdl.py)
    # One program per token (two with SPLIT): all its heads at once (a few KB), so a decode
    # step is one wave.
    t = tl.program_id(0)
    out_dtype = q_out_ptr.dtype.element_ty
    offs = tl.arange(0, HALF)
    # Positions and the cos / sin table come from the host's copies, not from a kernel of the
    # PDL chain: their two dependent loads go out before the wait on q / k / v's writer.
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_pos + offs)[None, :]
    sin = tl.load(cos_sin_ptr + pos * stride_pos + HALF + offs)[None, :]
    pdl.wait_previous(GDC)

    # SPLIT: q in programs (t, 0), k and v in (t, 1), side by side: a small decode step's
    # kernel then lasts the longer half, not both.
    part = tl.program_id(1) if SPLIT else -1
    if FEEDBACK and not CHAINS and PREFETCH:
        # The feedback rows, on their way to L2 while q and k are rotated. Only the first
        # token's program asks: when every program asked, 256 tokens took 14.1 -> 15.1 us.
        if t == 0 and part != 0:
            prefetch_rows(fb_ptr, HKV * 2 * HALF * GROUP, KV_ROWS * 2 * HALF * GROUP)
    if part != 1:
        hq = tl.arange(0, HQ_PAD)[:, None]
        mq = hq < HQ
        src = q_ptr + t * stride_qt + hq * stride_qh + offs[None, :]
        o1, o2 = _norm_rotate(tl.load(src, mask=mq).to(tl.float32),
                              tl.load(src + HALF, mask=mq).to(tl.float32),
                              qw_ptr, cos, sin, offs, eps, HALF, HAS_NORM, out_dtype)
        if MIX:
            o1, o2 = mix_halves(o1, o2, out_dtype, HALF, LOG2_HALF, DOT_PREC)
        q_dst = q_out_ptr + t * (HQ * 2 * HALF) + hq * (2 * HALF) + offs[None, :]
        tl.store(q_dst, o1.to(out_dtype), mask=mq)
        tl.store(q_dst + HALF, o2.to(out_dtype), mask=mq)

    if part != 0:
        hk = tl.arange(0, HKV_PAD)[:, None]
        mk = hk < HKV
        k_src = k_ptr + t * stride_kt + hk * stride_kh + offs[None, :]
        k1, k2 = _norm_rotate(tl.load(k_src, mask=mk).to(tl.float32),
                              tl.load(k_src + HALF, mask=mk).to(tl.float32),
                              kw_ptr, cos, sin, offs, eps, HALF, HAS_NORM, out_dtype)
        if MIX:
            k1, k2 = mix_halves(k1, k2, out_dtype, HALF, LOG2_HALF, DOT_PREC)
        k1, k2 = k1.to(out_dtype), k2.to(out_dtype)
        k_row = k_out_ptr + t * (HKV * 2 * HALF)
        if WRITE_K:  # (also what feedback_chains reads: see CHAINS)
            k_dst = k_row + hk * (2 * HALF) + offs[None, :]
            tl.store(k_dst, k1, mask=mk)
            tl.store(k_dst + HALF, k2, mask=mk)
        slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: slot * stride can exceed 2**31
        if slot >= 0:
            cache_ty = k_cache_ptr.dtype.element_ty
            c_off = slot * stride_cslot + hk * stride_ch + offs[None, :]
            v_src = v_ptr + t * stride_vt + hk * stride_vh + offs[None, :]
            v1, v2 = tl.load(v_src, mask=mk), tl.load(v_src + HALF, mask=mk)
            if KV_FP8:
                ks = tl.load(k_scale_ptr + hk, mask=mk, other=1.0)
                vs = tl.load(v_scale_ptr + hk, mask=mk, other=1.0)
                if CHAINS:  # feedback_chains_kernel rounds and stores K next, from k_out
                    c1, c2 = None, None
                elif FEEDBACK:  # K rounded with error feedback, in units of its scale
                    store_tile(k1, k2, ks, fb_ptr, k_cache_ptr + slot * stride_cslot,
                               stride_ch, HKV, KV_ROWS, GROUP, FMAX, MANT, BIAS, SOFT,
                               ROWS_AHEAD)
                    c1, c2 = None, None
                else:
                    c1 = quantize_fp8(k1.to(tl.float32), ks, cache_ty, FMAX, MANT, BIAS, SOFT)
                    c2 = quantize_fp8(k2.to(tl.float32), ks, cache_ty, FMAX, MANT, BIAS, SOFT)
                c3 = quantize_fp8(v1.to(tl.float32), vs, cache_ty, FMAX, MANT, BIAS, SOFT)
                c4 = quantize_fp8(v2.to(tl.float32), vs, cache_ty, FMAX, MANT, BIAS, SOFT)
            elif KV_INT8:
                # A scale per (token, kv head) row over both halves, stored at the row's slot.
                s_off = ((slot // SCALE_BS) * stride_sblk + (slot % SCALE_BS) * stride_sslot
                         + hk * stride_sh)
                f1, f2 = k1.to(tl.float32), k2.to(tl.float32)
                ks = int8_row_scale(tl.maximum(tl.max(tl.abs(f1), axis=1),
                                               tl.max(tl.abs(f2), axis=1)))[:, None]
                c1, c2 = int8_codes(f1, ks), int8_codes(f2, ks)
                tl.store(k_scale_ptr + s_off, ks, mask=mk)
                f3, f4 = v1.to(tl.float32), v2.to(tl.float32)
                vs = int8_row_scale(tl.maximum(tl.max(tl.abs(f3), axis=1),
                                               tl.max(tl.abs(f4), axis=1)))[:, None]
                c3, c4 = int8_codes(f3, vs), int8_codes(f4, vs)
                tl.store(v_scale_ptr + s_off, vs, mask=mk)
            else:
                c1, c2, c3, c4 = k1.to(cache_ty), k2.to(cache_ty), v1.to(cache_ty), v2.to(cache_ty)
            if not FEEDBACK:  # (stored above)
                tl.store(k_cache_ptr + c_off, c1, mask=mk)
                tl.store(k_cache_ptr + c_off + HALF, c2, mask=mk)
            v_off = c_off
            v_half = HALF
            if V_TILE:  # V's pages tiled (triton_kv.v_tile_of)
                v_off = v_tile_offsets(slot, stride_cslot, hk * stride_ch, offs[None, :],
                                       BLOCK_SIZE, 2 * HALF, V_TILE)
                v_half = HALF * V_TILE
            tl.store(v_cache_ptr + v_off, c3, mask=mk)
            tl.store(v_cache_ptr + v_off + v_half, c4, mask=mk)


def norm_rope_store(q, k, v, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps,
                    k_cache, v_cache, slot_mapping, return_k: bool = False, k_scale=None,
                    v_scale=None, mix: bool = False, k_feedback=None):
    """q [T, Hq, D], k/v [T, Hkv, D] (strided views of the qkv output are fine) -> rotated q
    [T, Hq, D] (and rotated k when return_k); stores rotated k and v at slot_mapping (-1 skips).
    cos_sin_cache is [max_position, ..., D] float32 (cos half, then sin half); the norm
    weights are [D] or both None (no q/k norm). An fp8 cache needs k_scale / v_scale (fp32
    [Hkv]): it stores k / k_scale and v / v_scale; an int8 cache writes each row's scale into
    k_scale / v_scale (fp32 [blocks, block_size, Hkv]). mix: q and k times the Hadamard matrix
    after RoPE (kv_mix.hadamard_mix). k_feedback (fp32 [Hkv, D, G], an fp8 cache
    only, G a power of two dividing D / 2): K rounded with error feedback through it
    (kernels/kv_feedback.py). v_cache may be tiled (triton_kv.v_tile_of)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError(f"the fused RoPE kernel needs a power-of-two head_dim, got {head_dim}")
    assert q.stride(2) == k.stride(2) == v.stride(2) == 1 and k_cache.stride(3) == 1
    v_tile = v_tile_of(k_cache, v_cache)
    assert k_feedback is None or (head_dim // 2) % k_feedback.shape[-1] == 0, k_feedback.shape
    assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)
    has_norm = q_norm_weight is not None
    # Past a decode step's size, a kernel of their own runs K's feedback chains from k_out.
    chains = (k_feedback is not None and not INTERPRET and FEEDBACK_CHAINS
              and num_tokens > FUSED_FEEDBACK_MAX_TOKENS)
    q_out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(num_tokens if return_k or chains else 0, num_kv_heads, head_dim,
                        dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return (q_out, k_out) if return_k else q_out
    cos_sin = cos_sin_cache.reshape(cos_sin_cache.shape[0], head_dim)
    meta = fp8_meta(k_cache.dtype)
    kc, vc, ks, vs = fp8_args(k_cache, v_cache, k_scale, v_scale, meta)
    split = num_tokens <= SPLIT_QK_MAX_TOKENS
    _norm_rope_store_kernel[(num_tokens, 2 if split else 1)](
        q, k, v, positions, cos_sin, q_norm_weight if has_norm else q,
        k_norm_weight if has_norm else k, slot_mapping, q_out, k_out, kc, vc, ks, vs,
        k_feedback.contiguous() if k_feedback is not None else ks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin.stride(0), k_cache.stride(1), k_cache.stride(2),
        *row_scale_strides(k_cache, ks, vs), eps,
        HQ=num_heads, HKV=num_kv_heads, HQ_PAD=_pad(num_heads, mix),
        HKV_PAD=_pad(num_kv_heads, mix), HALF=head_dim // 2, HAS_NORM=has_norm,
        WRITE_K=return_k or chains, MIX=mix, LOG2_HALF=(head_dim // 2).bit_length() - 1,
        DOT_PREC=dot_precision(q.dtype), **meta, FEEDBACK=k_feedback is not None,
        GROUP=k_feedback.shape[-1] if k_feedback is not None else 1,
        KV_ROWS=triton.next_power_of_2(num_kv_heads), CHAINS=chains, SPLIT=split,
        PREFETCH=FEEDBACK_PREFETCH and not INTERPRET, BLOCK_SIZE=k_cache.shape[1], V_TILE=v_tile,
        ROWS_AHEAD=FEEDBACK_ROWS_AHEAD if FEEDBACK_ROWS_AHEAD != 2 or not INTERPRET else 0,
        GDC=pdl.enabled(q_out), **pdl.launch_kwargs(pdl.enabled(q_out)),
        # The feedback loop's tile is small: more warps would each repeat its chain.
        num_warps=4 if k_feedback is None else FEEDBACK_WARPS,
    )
    if chains:
        feedback_chains(k_out, k_feedback, ks, kc, slot_mapping)
    return (q_out, k_out) if return_k else q_out


# K's error feedback on a GPU: up to this many tokens (decode steps) the fused kernel rounds
# on its register tile (the interpreter's path at any size); past it (prefill),
# feedback_chains.feedback_chains runs a thread per chain after it. FEEDBACK_CHAINS False:
# the tile at every size (tools/bench_kv_feedback.py compares them).
FUSED_FEEDBACK_MAX_TOKENS = 512
FEEDBACK_CHAINS = True
# Up to this many tokens q and k/v run in programs of their own (the kernel's SPLIT). H100,
# tools/bench_kv_feedback.py, us per call split / not: 1 token 7.4 / 8.1, 64 tokens 7.5 / 8.3
# (with the feedback 9.4 / 10.1, 9.6 / 10.4), but 256 tokens 10.7 / 9.4 (14.2 / 12.2): two
# programs a token then fill the SMs with waiting warps.
SPLIT_QK_MAX_TOKENS = 64

# Whether the decode store prefetches its feedback rows into L2: between two steps the
# layers' weights stream through L2, so without it each step of the loop waits on HBM for
# its rows. H100, tools/profile_bench.py --kv-cache-dtype fp8_e4m3, us a call at
# batch 1: plain 7.5, feedback 10.6, prefetched 9.2 (L1 alike); at 256 tokens 9.5, 14.1,
# 15.1 with every program asking, 11.3 with only the first (the next session, one call:
# 15.2 -> 11.3; batch 8 9.1 -> 8.8). The kernel alone, its rows hot
# (tools/bench_kv_feedback.py): 7.4 -> 7.6 at batch 1.
FEEDBACK_PREFETCH = True
# How the decode store's feedback loop asks for the next 4 steps' matrix rows while the
# current 4 run (triton_feedback.feedback_round): 0 not (each block of 4 steps waits a round
# trip to L2: 8 a 32-step group), 1 loaded into registers (147 instead of 48 a thread at
# Qwen3-0.6B's shape, sm_90: one program an SM), 2 asked into L1 (GPU only). H200, one call
# (tools/fb_ahead_check.sh): us at 1 / 64 / 256 tokens 0: 10.9 / 11.2 / 12.1, 1: 7.5 / 8.1 /
# 12.2, 2: 10.7 / 11.2 / 15.0 (no feedback 3.6 / 4.3 / 7.5); bench.py fp8, alternating,
# 0: 30,296, 31,753; 2: 31,364, 31,426; 1: 32,376, 32,067 tok/s.
FEEDBACK_ROWS_AHEAD = 1
# Warps of a program whose store rounds K with feedback. H100, tools/bench_kv_feedback.py,
# us per call at 1 / 64 / 256 tokens: 4 warps 9.4 / 9.7 / 12.3, 8 warps 7.6 / 7.7 / 11.1,
# 16 warps 7.9 / 8.0 / 14.4 (plain rounding 7.4 / 7.5 / 9.4).
FEEDBACK_WARPS = 8


def _pad(heads: int, mix: bool) -> int:
    """Rows of a head tile: a power of two, and at least 16 where the mixing's dots need it
    (mix without FWHT)."""
    return max(triton.next_power_of_2(heads), 16 if mix and not FWHT else 1)
