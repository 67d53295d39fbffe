"""The decode kernel's optional prologue (triton_decode, FUSE_ROPE): a decode step's q/k norms,
RoPE and K/V store done by the attention programs themselves, from the qkv projection's rows,
so a pure decode step over a 16-bit cache needs no triton_rope launch before its attention.

Each program rotates its kv head's query rows; the program whose split holds the new key
(the last) also stores that key and value at the step's slot and reads them back from the
cache after a block barrier, as the layer kernel does (layer_attn.store_new_kv, queries:
the same steps and roundings as triton_rope's). Only 16-bit caches: an fp8 or int8 store
(scales, mixing, K's feedback) stays in triton_rope.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from nanovllm.kernels.layer_attn import queries, store_new_kv


class NewToken(NamedTuple):
    """A decode step's fused-prologue inputs: the qkv projection [B, (H + 2 Hkv) * D] (q, k,
    v side by side in each row), positions and cache slots [B], the rotary cos|sin table
    [positions, D] (fp32) and the per-head q/k norm weights (None: no qk norm)."""
    qkv: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    cos_sin: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    eps: float


def new_token_of(q, k, v, positions, cos_sin_cache, q_norm, k_norm,
                 slots) -> NewToken | None:
    """The NewToken for q [B, H, D], k / v [B, Hkv, D] when they are the three parts of one
    qkv row each (the decoder's split of its projection), else None (the caller runs the
    unfused path). q_norm / k_norm: RMSNorm modules or None."""
    hq, hkv, hd = q.shape[1], k.shape[1], q.shape[2]
    row = (hq + 2 * hkv) * hd
    size = q.element_size()
    # One row's dim-0 strides are whatever view() made of a size-1 dim (q's is hq * hd
    # there), and no row follows: only the in-row layout counts.
    packed = ((q.shape[0] == 1 or (q.stride(0) == row and k.stride(0) == row
                                   and v.stride(0) == row))
              and q.stride(1) == hd and k.stride(1) == hd and v.stride(1) == hd
              and q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
              and k.data_ptr() == q.data_ptr() + hq * hd * size
              and v.data_ptr() == k.data_ptr() + hkv * hd * size)
    if not packed or cos_sin_cache.shape[-1] != hd:
        return None
    qkv = q.as_strided((q.shape[0], row), (row, 1))
    return NewToken(qkv, positions, slots, cos_sin_cache.reshape(-1, hd),
                    None if q_norm is None else q_norm.weight,
                    None if k_norm is None else k_norm.weight,
                    0.0 if q_norm is None else q_norm.eps)


@triton.jit
def new_token(qkv_row, pos, slot_ptr, kvh, heads, g_mask, is_new, cos_sin_ptr, qw_ptr,
              kw_ptr, eps, k_cache, v_cache, stride_kslot, HQ: tl.constexpr,
              HKV: tl.constexpr, HD: tl.constexpr, QK_NORM: tl.constexpr,
              DOT_PREC: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """kv head kvh's query rows (heads, masked by g_mask) normed and rotated in the model
    dtype (qkv_row's); where is_new, its new K (normed, rotated) and V stored at the row's
    slot first, then a block barrier, so the split's tiles read them back from the cache.
    pos: the row's position (int64; the caller loads it before its PDL wait)."""
    DTYPE: tl.constexpr = qkv_row.dtype.element_ty
    store_new_kv(qkv_row, kvh, is_new, True, slot_ptr, stride_kslot, pos, cos_sin_ptr, kw_ptr,
                 eps, k_cache, v_cache, None, None, None, HQ, HKV, HD, QK_NORM, DTYPE, False,
                 False, 0, False, "", 1, 0.0, 0, 0, False, DOT_PREC, BLOCK_SIZE, 0)
    q, _ = queries(qkv_row, heads, g_mask, pos, cos_sin_ptr, qw_ptr, eps, 1.0, None, kvh, HD,
                   QK_NORM, DTYPE, False, False, 0, False, DOT_PREC)
    return q


def kernel_args(nt: NewToken | None, q: torch.Tensor) -> dict:
    """_decode_partial_kernel's prologue arguments (placeholders without a NewToken)."""
    if nt is None:
        return dict(qkv_ptr=q, stride_qkv=0, pos_ptr=q, slot_ptr=q, cos_sin_ptr=q, qw_ptr=None,
                    kw_ptr=None, eps=0.0, FUSE=False, QK_NORM=False)
    return dict(qkv_ptr=nt.qkv, stride_qkv=nt.qkv.stride(0), pos_ptr=nt.positions,
                slot_ptr=nt.slots, cos_sin_ptr=nt.cos_sin, qw_ptr=nt.q_norm, kw_ptr=nt.k_norm,
                eps=nt.eps, FUSE=True, QK_NORM=nt.q_norm is not None)
