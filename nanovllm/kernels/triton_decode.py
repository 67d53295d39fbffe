"""Triton paged decode attention: one split-K (flash-decoding) kernel with an in-kernel reduce.

CUDA-graph safe: the grid depends only on shapes and python ints; each program derives its
key range from context_lens in-kernel, so no host sync is ever needed. With several splits, the
last program of a (sequence, kv head) to finish combines the splits' partial outputs (it learns
it is last from an atomic counter), so a decode step is one kernel per layer, not two: at small
batches each launch costs more than the work it does.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels import pdl
from nanovllm.kernels._common import INTERPRET, LOG2E, dot_precision, fp8_meta
from nanovllm.kernels.decode_config import CONFIG, CONFIG_FP8, CONFIG_INT8, MAX_SPLITS
from nanovllm.kernels.decode_reduce import reduce_tile, split_done
from nanovllm.kernels.decode_rope import NewToken, kernel_args, new_token
from nanovllm.kernels.decode_splits import choose_num_splits
from nanovllm.kernels.decode_tiles import attend_tiles
from nanovllm.kernels.triton_kv import check_row_scales, v_tile_of


@triton.jit
def _decode_partial_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, ctx_ptr, bt_ptr, o_ptr, lse_ptr, out_ptr, cnt_ptr,
    k_scale_ptr, v_scale_ptr, order_ptr, qk_scale,
    stride_qb, stride_qh,
    stride_kblk, stride_kslot, stride_kh,
    stride_sblk, stride_sslot, stride_sh,
    stride_btb,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    stride_outb, stride_outh,
    qkv_ptr, stride_qkv, pos_ptr, slot_ptr, cos_sin_ptr, qw_ptr, kw_ptr, eps,
    NUM_SPLITS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    G: tl.constexpr, G_PAD: tl.constexpr, RED_GP: tl.constexpr, RED_CHUNK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr,
    USE_DOT: tl.constexpr, DIRECT: tl.constexpr, DOT_PREC: tl.constexpr,
    KV_FP8: tl.constexpr, FP16_DOT: tl.constexpr, KV_INT8: tl.constexpr,
    INT8_F16: tl.constexpr, PV_F32: tl.constexpr,
    HEAD_FAST: tl.constexpr, ORDERED: tl.constexpr, V_WORDS: tl.constexpr, V_TILE: tl.constexpr,
    V_LAST: tl.constexpr, FUSE: tl.constexpr, QK_NORM: tl.constexpr, GDC: tl.constexpr,
):
    pdl.release_next(GDC)  # under PDL (kernels/pdl.py): o_proj's GEMV may start its loads
    # Program = (sequence, kv head, split): all G query heads of the kv head share each K/V tile.
    # Programs start in launch order, axis 0 fastest; see HEAD_FAST and `order` in
    # decode_attention for why the order matters.
    if HEAD_FAST:
        kvh = tl.program_id(0)
        r = tl.program_id(1)
    else:
        r = tl.program_id(0)
        kvh = tl.program_id(1)
    s = tl.program_id(2)
    if ORDERED:
        b = tl.load(order_ptr + r)
    else:
        b = r
    ctx = tl.load(ctx_ptr + b)
    if FUSE:
        pos = tl.load(pos_ptr + b).to(tl.int64)
    # Split length rounded up to whole tiles so tiles never straddle splits (and pages, see
    # PAGE_TILE).
    split_len = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = s * split_len
    end = tl.minimum(start + split_len, ctx)
    # Splits that hold keys, and those that count in (at least one, so that a row with no
    # keys, a padding row of a captured batch, still gets its zeros written).
    n_valid = tl.where(ctx > 0, tl.cdiv(ctx, tl.maximum(split_len, 1)), 0)
    n_count = tl.maximum(n_valid, 1)
    if start >= end and s >= n_count:
        # Past the last split with keys: nothing to count in (the combine reads n_valid
        # splits), so the many empty programs of a short context leave at once, before the
        # PDL wait: they read only the host's row order, lengths and positions, and write
        # nothing.
        return
    pdl.wait_previous(GDC)  # for the kernel that wrote q and this token's K / V

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_mask = offs_g < G
    heads = kvh * G + offs_g
    o_off = b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :]
    if start >= end:
        if DIRECT:  # only when ctx == 0 (padding rows of a captured batch): emit zeros, not garbage
            tl.store(o_ptr + o_off,
                     tl.zeros([G_PAD, HEAD_DIM], tl.float32).to(o_ptr.dtype.element_ty),
                     mask=g_mask[:, None])
        else:  # ctx == 0: split 0 alone counts in, and writes the zeros
            split_done(o_ptr, lse_ptr, out_ptr, cnt_ptr, b, kvh, n_valid, n_count, stride_ob,
                       stride_oh, stride_os, stride_lb, stride_lh, stride_outb, stride_outh,
                       NUM_KV_HEADS, G, RED_GP, RED_CHUNK, HEAD_DIM)
        return

    if FUSE:  # q/k norms, RoPE and this token's K/V store from the qkv row (decode_rope)
        q = new_token(qkv_ptr + b.to(tl.int64) * stride_qkv, pos, slot_ptr + b, kvh,
                      heads, g_mask, s == n_valid - 1, cos_sin_ptr, qw_ptr, kw_ptr, eps,
                      k_cache_ptr, v_cache_ptr, stride_kslot, NUM_KV_HEADS * G, NUM_KV_HEADS,
                      HEAD_DIM, QK_NORM, DOT_PREC, BLOCK_SIZE)
    else:
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=g_mask[:, None], other=0.0)
    if KV_FP8:
        # Dequantizing costs nothing per key: K's scale joins the softmax scale, V's scales
        # the output once; the fp8 tiles are only widened to q's dtype for the dots.
        qk_scale = qk_scale * tl.load(k_scale_ptr + kvh)
        if FP16_DOT:
            q = q.to(tl.float16)
    if INT8_F16:
        q = q.to(tl.float16)  # see attend_tiles
    pv_dtype = q.dtype
    if PV_F32:
        pv_dtype = tl.float32
    bt_row = bt_ptr + b * stride_btb
    kv_head_off = kvh * stride_kh
    acc, m_i, l_i = attend_tiles(q, k_cache_ptr, v_cache_ptr, k_scale_ptr + kvh * stride_sh,
                                 v_scale_ptr + kvh * stride_sh, bt_row, kv_head_off, start, end,
                                 qk_scale, stride_kblk, stride_kslot, stride_sblk, stride_sslot,
                                 G_PAD, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PAGE_TILE, USE_DOT,
                                 DOT_PREC, KV_FP8, KV_INT8, pv_dtype, INT8_F16, V_WORDS,
                                 V_TILE, V_LAST)

    out = acc / l_i[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale_ptr + kvh)
    if DIRECT:
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        tl.store(o_ptr + o_off, out, mask=g_mask[:, None])
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + s, m_i + tl.log2(l_i), mask=g_mask)
        split_done(o_ptr, lse_ptr, out_ptr, cnt_ptr, b, kvh, n_valid, n_count, stride_ob,
                   stride_oh, stride_os, stride_lb, stride_lh, stride_outb, stride_outh,
                   NUM_KV_HEADS, G, RED_GP, RED_CHUNK, HEAD_DIM)


def alloc_decode_workspace(batch, num_heads, head_dim, num_splits, device):
    """fp32 (partial_out [B, H, S, D], lse [B, H, S]) buffers for
    decode_attention(workspace=...)."""
    return (torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
            torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=device))


def decode_attention(q, k_cache, v_cache, context_lens, block_tables, scale, num_splits=None,
                     workspace=None, k_scale=None, v_scale=None, order=None,
                     new: NewToken | None = None):
    """Paged decode attention: q [B, H, D] over the first context_lens[b] cached tokens ->
    [B, H, D].
    An fp8 cache needs its per-kv-head dequantization scales k_scale / v_scale (fp32 [Hkv]), an
    int8 cache its row scales (fp32, indexed [blocks, block_size, Hkv], any strides).
    order (int32 [B], a permutation of the rows, optional): the order in which rows' programs
    start. Longest context first keeps a long row from starting last and running alone
    while the rest of the GPU idles (the tail of a batch of mixed lengths).
    new (a 16-bit cache only): q is the raw query of new.qkv's rows; the kernel norms and
    rotates it and stores this step's K/V first (decode_rope)."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and q.stride(2) == 1
    assert k_cache.stride(3) == 1
    v_tile = v_tile_of(k_cache, v_cache)
    group = num_heads // num_kv_heads
    kv_fp8 = fp8_meta(k_cache.dtype)["KV_FP8"]
    kv_int8 = k_cache.dtype == torch.int8
    if kv_fp8 and (k_scale is None or v_scale is None):
        raise ValueError(f"a {k_cache.dtype} KV cache needs k_scale and v_scale")
    if kv_int8:
        check_row_scales(k_cache, k_scale, v_scale)
    cfg = CONFIG_FP8 if kv_fp8 else CONFIG_INT8 if kv_int8 else CONFIG
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, q.device)
    num_splits = max(1, min(MAX_SPLITS, int(num_splits)))
    if not cfg["LPT"]:
        order = None
    block_n = cfg["BLOCK_N"]
    use_dot = cfg["USE_DOT"]
    short_rows = cfg is CONFIG and head_dim * k_cache.element_size() <= 128
    stages = cfg["SHORT_ROW_STAGES"] if short_rows else cfg["num_stages"]
    g_pad = max(16, triton.next_power_of_2(group)) if use_dot else triton.next_power_of_2(group)
    if new is not None:
        assert not (kv_fp8 or kv_int8) and k_cache.stride(2) == head_dim, k_cache.dtype
        assert k_cache.stride(0) == block_size * k_cache.stride(1), k_cache.stride()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return o
    direct = num_splits == 1
    if direct:  # no reduce needed: the partial kernel writes normalised output in q's dtype
        po, lse = o, o  # lse unused
        po_strides = (o.stride(0), o.stride(1), 0)
        lse_strides = (0, 0)
        counters = o  # unused
    else:
        if workspace is None:
            workspace = alloc_decode_workspace(batch, num_heads, head_dim, num_splits, q.device)
        po_buf, lse_buf = workspace
        need = batch * num_heads * num_splits
        po = po_buf.view(-1)[: need * head_dim].view(batch, num_heads, num_splits, head_dim)
        lse = lse_buf.view(-1)[:need].view(batch, num_heads, num_splits)
        po_strides = po.stride()[:3]
        lse_strides = lse.stride()[:2]
        counters = _split_counters(q.device, batch * num_kv_heads)
    head_fast = cfg["HEAD_FAST"]
    fp16_dot = cfg.get("FP16_DOT", False) and (
        q.dtype == torch.bfloat16 or (kv_int8 and q.dtype == torch.float16))
    # V_WORDS: an e4m3 V tile widened to fp16 as it is loaded (the PV dot in fp16 then).
    v_words = (cfg.get("V_WORDS", False) and not INTERPRET and not v_tile
               and k_cache.dtype == torch.float8_e4m3fn and (fp16_dot or q.dtype == torch.float16))
    # Tiled V pages: a tile's keys lie in one V_TILE run of one page.
    assert not v_tile or (v_tile % block_n == 0 and block_size % block_n == 0), (v_tile, block_n)
    red_gp, red_chunk = reduce_tile(group, head_dim)
    grid = (num_kv_heads, batch, num_splits) if head_fast else (batch, num_kv_heads, num_splits)
    gdc = pdl.enabled(o)
    _decode_partial_kernel[grid](
        q, k_cache, v_cache, context_lens, block_tables, po, lse, o, counters,
        k_scale if kv_fp8 or kv_int8 else q, v_scale if kv_fp8 or kv_int8 else q,
        order if order is not None else context_lens, scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        *(k_scale.stride() if kv_int8 else (0, 0, 0)),
        block_tables.stride(0),
        *po_strides, *lse_strides,
        o.stride(0), o.stride(1),
        NUM_SPLITS=num_splits, NUM_KV_HEADS=num_kv_heads, G=group, G_PAD=g_pad,
        RED_GP=red_gp, RED_CHUNK=red_chunk, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, PAGE_TILE=block_size % block_n == 0,
        USE_DOT=use_dot, DIRECT=direct, DOT_PREC=dot_precision(q.dtype),
        KV_FP8=kv_fp8, FP16_DOT=fp16_dot, KV_INT8=kv_int8, INT8_F16=kv_int8 and fp16_dot,
        PV_F32=kv_int8 and not fp16_dot and q.dtype == torch.float16,
        HEAD_FAST=head_fast, ORDERED=order is not None, V_WORDS=v_words, V_TILE=v_tile,
        V_LAST=cfg.get("V_LAST", 0), **kernel_args(new, q), GDC=gdc,
        num_warps=cfg["num_warps"], num_stages=stages, **pdl.launch_kwargs(gdc),
    )
    return o


_COUNTERS: dict = {}


def _split_counters(device, n: int) -> torch.Tensor:
    """Zeroed int32 counters, one per (sequence, kv head); each kernel call leaves them zero.

    One buffer per device, made once outside any graph capture (splitting only happens while
    batch * kv_heads is below the SM count, so the first size covers every later call). Calls
    on one stream never overlap, which is what sharing the buffer needs."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf
