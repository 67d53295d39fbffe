"""Triton varlen causal prefill attention reading keys/values from the paged cache.

The new tokens' K/V must already be stored in the cache; query j of sequence i sits at absolute
position seqlen_k - seqlen_q + j, which covers plain prefill, prefix-cache hits and chunked prefill.
An int8 cache's row scales multiply the score columns after the QK dot and the probabilities
before the PV dot (see decode_tiles.attend_tiles).
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import (
    INTERPRET,
    LOG2E,
    dot_precision,
    fp8_meta,
    online_softmax_step,
    v_tile_offsets,
    v_tile_tile,
)
from nanovllm.kernels.triton_kv import check_row_scales, v_tile_of

# Tile configs (module level so tools/bench_kernels.py and tests can override them). Measured on
# H100 (16/8/128 bf16): 128x128 tiles win on long prompts (4x2048: 305 TFLOP/s vs 276 for 128x64),
# 64x64 on short ones (16x512: 188 vs 167) where more, smaller programs balance the causal work.
# The interpreter uses 16x16 so tiny test contexts span many tiles.
if INTERPRET:
    CONFIG = SHORT_CONFIG = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
else:
    CONFIG = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
    SHORT_CONFIG = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
SHORT_Q = 512  # max_seqlen_q at or below which SHORT_CONFIG is used
# With an fp8 cache and bf16 q, run the dots in fp16 (see triton_decode.CONFIG["FP16_DOT"]).
FP16_DOT = True


@triton.jit
def _load_kv_tile(cache_ptr, bt_row, n, offs_n, kv_head_off, offs_d, stride_kblk, stride_kslot,
                  BLOCK_SIZE: tl.constexpr, PAGE_TILE: tl.constexpr, MASKED: tl.constexpr, n_mask,
                  HEAD_DIM: tl.constexpr = 0, V_TILE: tl.constexpr = 0):
    """A cache's tile [BLOCK_N, D] of keys offs_n; V_TILE: from tiled V pages
    (triton_kv.v_tile_of), where the tile lies in one page read whole even when MASKED (the
    caller zeroes its keys past the end: a mask along V^T's contiguous axis splits the loads
    into bytes)."""
    BLOCK_N: tl.constexpr = offs_n.shape[0]
    if V_TILE and PAGE_TILE and (BLOCK_N % V_TILE == 0 or V_TILE % BLOCK_N == 0):
        return v_tile_tile(cache_ptr, bt_row, kv_head_off, n, stride_kblk, HEAD_DIM,
                           BLOCK_SIZE, BLOCK_N, V_TILE)
    slot = offs_n % BLOCK_SIZE
    if PAGE_TILE:
        # n is a multiple of BLOCK_N which divides BLOCK_SIZE: one page for the whole tile.
        page_off = tl.load(bt_row + n // BLOCK_SIZE).to(tl.int64) * stride_kblk
    else:
        page = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        page_off = (page * stride_kblk)[:, None]
    if V_TILE:
        in_page = v_tile_offsets(slot[:, None], stride_kslot, kv_head_off, offs_d[None, :],
                                 BLOCK_SIZE, HEAD_DIM, V_TILE)
    else:
        in_page = (slot * stride_kslot)[:, None] + kv_head_off + offs_d[None, :]
    ptrs = cache_ptr + page_off + in_page
    if MASKED:
        return tl.load(ptrs, mask=n_mask[:, None], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _load_row_scales(scale_ptr, bt_row, n, offs_n, stride_sblk, stride_sslot,
                     BLOCK_SIZE: tl.constexpr, PAGE_TILE: tl.constexpr, n_mask):
    """An int8 tile's row scales [BLOCK_N] (scale_ptr already at the kv head)."""
    if PAGE_TILE:
        page = tl.load(bt_row + n // BLOCK_SIZE).to(tl.int64)
    else:
        page = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    return tl.load(scale_ptr + page * stride_sblk + (offs_n % BLOCK_SIZE) * stride_sslot,
                   mask=n_mask, other=0.0)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, o_ptr, cu_q_ptr, cu_k_ptr, bt_ptr,
    k_scale_ptr, v_scale_ptr, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kblk, stride_kslot, stride_kh,
    stride_sblk, stride_sslot, stride_sh,
    stride_btb,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr, DOT_PREC: tl.constexpr,
    KV_FP8: tl.constexpr, FP16_DOT: tl.constexpr, KV_INT8: tl.constexpr,
    PV_F32: tl.constexpr, V_TILE: tl.constexpr,
):
    b = tl.program_id(0)
    # Reverse the q-tile order: the last tiles see the most keys, so start them first (less tail).
    mb = tl.num_programs(1) - 1 - tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    seqlen_q = tl.load(cu_q_ptr + b + 1) - q_start
    if mb * BLOCK_M >= seqlen_q:  # grid is sized for the longest sequence
        return
    seqlen_k = tl.load(cu_k_ptr + b + 1) - tl.load(cu_k_ptr + b)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < seqlen_q
    q_pos = seqlen_k - seqlen_q + offs_m  # absolute positions of this tile's queries
    q = tl.load(q_ptr + (q_start + offs_m)[:, None].to(tl.int64) * stride_qt + h * stride_qh
                + offs_d[None, :],
                mask=m_mask[:, None], other=0.0)
    if KV_FP8:
        # K's scale joins the softmax scale and V's scales the output: fp8 tiles are only
        # widened to q's dtype for the dots.
        qk_scale = qk_scale * tl.load(k_scale_ptr + h // G)
        if FP16_DOT:
            q = q.to(tl.float16)
    pv_dtype = q.dtype
    if PV_F32:  # int8 with fp16 q: p times V's row scales could underflow fp16 (tf32 dot)
        pv_dtype = tl.float32

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    bt_row = bt_ptr + b * stride_btb
    kv_head_off = (h // G) * stride_kh
    if KV_INT8:  # this kv head's row scales
        k_scale_ptr += (h // G) * stride_sh
        v_scale_ptr += (h // G) * stride_sh
    pos_lo = seqlen_k - seqlen_q + mb * BLOCK_M  # first query position in the tile
    kv_end = tl.minimum(pos_lo + BLOCK_M, seqlen_k)  # causal: no key beyond the last query
    full_end = (pos_lo // BLOCK_N) * BLOCK_N  # key tiles below this are visible to every row

    # Phase 1: key tiles fully below the diagonal, no masking at all.
    for n in range(0, full_end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        k = _load_kv_tile(k_cache_ptr, bt_row, n, offs_n, kv_head_off, offs_d, stride_kblk,
                          stride_kslot, BLOCK_SIZE, PAGE_TILE, False, offs_n < kv_end).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        if KV_INT8:
            qk = qk * _load_row_scales(k_scale_ptr, bt_row, n, offs_n, stride_sblk, stride_sslot,
                                       BLOCK_SIZE, PAGE_TILE, offs_n < kv_end)[None, :]
        m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, qk)
        v = _load_kv_tile(v_cache_ptr, bt_row, n, offs_n, kv_head_off, offs_d, stride_kblk,
                          stride_kslot, BLOCK_SIZE, PAGE_TILE, False, offs_n < kv_end, HEAD_DIM,
                          V_TILE).to(pv_dtype)
        if KV_INT8:
            p = p * _load_row_scales(v_scale_ptr, bt_row, n, offs_n, stride_sblk, stride_sslot,
                                     BLOCK_SIZE, PAGE_TILE, offs_n < kv_end)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)

    # Phase 2: tiles crossing the diagonal / sequence end, with causal + bounds masks.
    # Key 0..pos_lo is visible to every row, so each row's max is finite after the first tile.
    for n in range(full_end, kv_end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        k = _load_kv_tile(k_cache_ptr, bt_row, n, offs_n, kv_head_off, offs_d, stride_kblk,
                          stride_kslot, BLOCK_SIZE, PAGE_TILE, True, n_mask).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        if KV_INT8:
            qk = qk * _load_row_scales(k_scale_ptr, bt_row, n, offs_n, stride_sblk, stride_sslot,
                                       BLOCK_SIZE, PAGE_TILE, n_mask)[None, :]
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, qk)
        v = _load_kv_tile(v_cache_ptr, bt_row, n, offs_n, kv_head_off, offs_d, stride_kblk,
                          stride_kslot, BLOCK_SIZE, PAGE_TILE, True, n_mask, HEAD_DIM,
                          V_TILE).to(pv_dtype)
        if V_TILE:  # (read whole: its slots past the end may hold anything, NaN too)
            v = tl.where(n_mask[:, None], v, 0.0)
        if KV_INT8:
            p = p * _load_row_scales(v_scale_ptr, bt_row, n, offs_n, stride_sblk, stride_sslot,
                                     BLOCK_SIZE, PAGE_TILE, n_mask)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)

    out = acc / l_i[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale_ptr + h // G)
    tl.store(o_ptr + (q_start + offs_m)[:, None].to(tl.int64) * stride_ot + h * stride_oh
             + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None])


def prefill_attention(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_tables, scale,
                      max_seqlen_q, k_scale=None, v_scale=None):
    """Causal varlen attention of q [T, H, D] over paged cached keys; returns [T, H, D] in
    q's dtype.
    An fp8 cache needs its per-kv-head dequantization scales k_scale / v_scale (fp32 [Hkv]), an
    int8 cache its row scales (fp32, indexed [blocks, block_size, Hkv], any strides). v_cache
    may be tiled (triton_kv.v_tile_of)."""
    assert k_cache.stride(3) == 1
    v_tile = v_tile_of(k_cache, v_cache)
    kv_fp8 = fp8_meta(k_cache.dtype)["KV_FP8"]
    if kv_fp8 and (k_scale is None or v_scale is None):
        raise ValueError(f"a {k_cache.dtype} KV cache needs k_scale and v_scale")
    if k_cache.dtype == torch.int8:
        check_row_scales(k_cache, k_scale, v_scale)
    return _launch(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_tables, scale,
                   max_seqlen_q, k_scale, v_scale, k_cache.shape[1], k_cache.shape[2],
                   k_cache.stride()[:3], v_tile)


# A page no sequence outgrows: with it, a sequence's keys are one page starting at its row.
CONTIGUOUS_PAGE = 1 << 30


def prefill_attention_contiguous(q, k, v, cu_seqlens, scale, max_seqlen_q):
    """Causal varlen attention of q [T, H, D] over this step's own keys k, v [T, Hkv, D] (no
    cache: sequence b's keys are rows cu_seqlens[b]..cu_seqlens[b+1]); the paged kernel, with
    each sequence's first row as its one page, so the tiles load whole rows as from a page."""
    k, v = k.contiguous(), v.contiguous()  # v is a view into the qkv projection's rows
    starts = cu_seqlens[:-1].view(-1, 1)  # one "page" per sequence: its first row
    row = k.stride(0)
    return _launch(q, k, v, cu_seqlens, cu_seqlens, starts, scale, max_seqlen_q, None, None,
                   CONTIGUOUS_PAGE, k.shape[1], (row, row, k.stride(1)))


def _launch(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_tables, scale, max_seqlen_q,
            k_scale, v_scale, block_size, num_kv_heads, kv_strides, v_tile=0):
    """The prefill kernel over keys addressed as page * kv_strides[0] + slot * kv_strides[1]
    + head * kv_strides[2] (values alike, or in v_tile-key tiles: triton_kv.v_tile_of)."""
    num_tokens, num_heads, head_dim = q.shape
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1
    o = torch.empty_like(q)
    batch = cu_seqlens_q.numel() - 1
    if num_tokens == 0 or batch == 0:
        return o
    cfg = SHORT_CONFIG if max_seqlen_q <= SHORT_Q else CONFIG
    grid = (batch, triton.cdiv(max_seqlen_q, cfg["BLOCK_M"]), num_heads)
    kv_fp8 = fp8_meta(k_cache.dtype)["KV_FP8"]
    kv_int8 = k_cache.dtype == torch.int8
    _prefill_kernel[grid](
        q, k_cache, v_cache, o, cu_seqlens_q, cu_seqlens_k, block_tables,
        k_scale if kv_fp8 or kv_int8 else q, v_scale if kv_fp8 or kv_int8 else q, scale * LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        *kv_strides,
        *(k_scale.stride() if kv_int8 else (0, 0, 0)),
        block_tables.stride(0),
        G=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], PAGE_TILE=block_size % cfg["BLOCK_N"] == 0,
        DOT_PREC=dot_precision(q.dtype),
        KV_FP8=kv_fp8, FP16_DOT=kv_fp8 and FP16_DOT and q.dtype == torch.bfloat16,
        KV_INT8=kv_int8, PV_F32=kv_int8 and q.dtype == torch.float16, V_TILE=v_tile,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return o
