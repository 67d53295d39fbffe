"""Triton kernel writing new tokens' K/V into the paged cache (quantizing for an fp8 or int8
cache)."""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import (
    fp8_meta,
    int8_codes,
    int8_row_scale,
    quantize_fp8,
    v_tile_offsets,
)


@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cslot, stride_ch, stride_sblk, stride_sslot, stride_sh, SCALE_BS,
    NUM_KV_HEADS: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    KV_FP8: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
    SOFT: tl.constexpr, KV_INT8: tl.constexpr, BLOCK_SIZE: tl.constexpr, V_TILE: tl.constexpr,
):
    # One program per token: copies its [Hkv, D] K and V rows (a few KB) to the cache slot.
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: slot * stride can exceed 2**31
    if slot < 0:
        return
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_h < NUM_KV_HEADS)[:, None]
    src = offs_h[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + src, mask=mask)
    src_v = offs_h[:, None] * stride_vh + offs_d[None, :]
    v = tl.load(v_ptr + t * stride_vt + src_v, mask=mask)
    dst = slot * stride_cslot + offs_h[:, None] * stride_ch + offs_d[None, :]
    cache_ty = k_cache_ptr.dtype.element_ty
    if KV_FP8:
        hmask = offs_h < NUM_KV_HEADS
        ks = tl.load(k_scale_ptr + offs_h, mask=hmask, other=1.0)[:, None]
        vs = tl.load(v_scale_ptr + offs_h, mask=hmask, other=1.0)[:, None]
        k = quantize_fp8(k.to(tl.float32), ks, cache_ty, FMAX, MANT, BIAS, SOFT)
        v = quantize_fp8(v.to(tl.float32), vs, cache_ty, FMAX, MANT, BIAS, SOFT)
    if KV_INT8:
        # A scale per (token, kv head) row, stored at the row's slot.
        hmask = offs_h < NUM_KV_HEADS
        s_off = (slot // SCALE_BS) * stride_sblk + (slot % SCALE_BS) * stride_sslot \
            + offs_h * stride_sh
        k = k.to(tl.float32)
        ks = int8_row_scale(tl.max(tl.abs(k), axis=1))
        k = int8_codes(k, ks[:, None])
        tl.store(k_scale_ptr + s_off, ks, mask=hmask)
        v = v.to(tl.float32)
        vs = int8_row_scale(tl.max(tl.abs(v), axis=1))
        v = int8_codes(v, vs[:, None])
        tl.store(v_scale_ptr + s_off, vs, mask=hmask)
    tl.store(k_cache_ptr + dst, k.to(cache_ty), mask=mask)
    if V_TILE:  # V's pages tiled (v_tile_of)
        dst = v_tile_offsets(slot, stride_cslot, offs_h[:, None] * stride_ch, offs_d[None, :],
                             BLOCK_SIZE, HEAD_DIM, V_TILE)
    tl.store(v_cache_ptr + dst, v.to(cache_ty), mask=mask)


def v_tile_of(k_cache, v_cache) -> int:
    """V_TILE of a cache pair as the kernels take it: 0 when v_cache has k_cache's shape and
    strides ([blocks, block_size, Hkv, D]); T when v_cache is the same memory viewed as
    [blocks, Hkv, block_size / T, D, T] (kv_cache.tile_v_pages: a page holds each kv head's
    V in T-key tiles, each tile's V^T one contiguous run, so the decode reads it whole)."""
    if v_cache.dim() == 4:
        assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
        return 0
    blocks, heads, tiles, dim, tile = v_cache.shape
    assert k_cache.shape == (blocks, tiles * tile, heads, dim), (k_cache.shape, v_cache.shape)
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    return tile


def store_kvcache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """Write k/v [T, Hkv, D] into k_cache/v_cache [blocks, block_size, Hkv, D] at slot_mapping
    (-1 skipped). An fp8 cache stores k / k_scale[head] (v likewise), the scales fp32 [Hkv];
    an int8 cache stores each row's codes and writes its scale into k_scale / v_scale (fp32
    [blocks, block_size, Hkv]) at the same slot (torch_ref.quantize_rows). v_cache may be
    tiled (v_tile_of)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    v_tile = v_tile_of(k_cache, v_cache)
    assert v.shape == k.shape and k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1
    # Slots index the flattened (block, offset) dims, so those must be contiguous with each other.
    assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)
    assert slot_mapping.numel() == num_tokens
    if num_tokens == 0:
        return
    meta = fp8_meta(k_cache.dtype)
    kc, vc, ks, vs = fp8_args(k_cache, v_cache, k_scale, v_scale, meta)
    _store_kvcache_kernel[(num_tokens,)](
        k, v, kc, vc, slot_mapping, ks, vs,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2), *row_scale_strides(k_cache, ks, vs),
        NUM_KV_HEADS=num_kv_heads, H_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
        **meta, BLOCK_SIZE=k_cache.shape[1], V_TILE=v_tile, num_warps=4,
    )


def fp8_args(k_cache, v_cache, k_scale, v_scale, meta):
    """(k_cache, v_cache, k_scale, v_scale) as a store kernel takes them: byte views of an fp8
    cache under the interpreter (SOFT writes bit patterns), the caches as dummy scales when
    the cache is neither fp8 nor int8."""
    if not (meta["KV_FP8"] or meta["KV_INT8"]):
        return k_cache, v_cache, k_cache, v_cache
    if k_scale is None or v_scale is None:
        raise ValueError(f"a {k_cache.dtype} KV cache needs k_scale and v_scale")
    if meta["KV_INT8"]:
        check_row_scales(k_cache, k_scale, v_scale)
        return k_cache, v_cache, k_scale, v_scale
    if meta["SOFT"]:
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    return k_cache, v_cache, k_scale, v_scale


def row_scale_strides(cache, k_scale, v_scale) -> tuple[int, int, int, int]:
    """(block, slot, head) strides and block size of an int8 cache's row scales, indexed
    [blocks, block_size, Hkv] with any strides (zeros and 1 for any other cache)."""
    if cache.dtype != torch.int8:
        return 0, 0, 0, 1
    return (*k_scale.stride(), k_scale.shape[1])


def check_row_scales(cache, k_scale, v_scale) -> None:
    """An int8 cache's row scales: fp32, indexed like the cache without its head dim, K's and
    V's with the same strides (the kernels take one set)."""
    if k_scale is None or v_scale is None:
        raise ValueError(f"a {cache.dtype} KV cache needs k_scale and v_scale")
    assert k_scale.shape == v_scale.shape == cache.shape[:3], (k_scale.shape, cache.shape)
    assert k_scale.stride() == v_scale.stride() and k_scale.dtype == torch.float32
