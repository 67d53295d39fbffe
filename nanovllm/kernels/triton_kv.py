"""Triton kernel writing new tokens' K/V into the paged cache."""
import triton
import triton.language as tl


@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cslot, stride_ch,
    NUM_KV_HEADS: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
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
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kvcache(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write k/v [T, Hkv, D] into k_cache/v_cache [blocks, block_size, Hkv, D] at slot_mapping (-1 skipped)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1
    # Slots index the flattened (block, offset) dims, so those must be contiguous with each other.
    assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)
    assert slot_mapping.numel() == num_tokens
    if num_tokens == 0:
        return
    _store_kvcache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, H_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
        num_warps=4,
    )
