"""The decode kernel's inner loop: one program's online softmax over its K/V tiles, and the
paged address of a tile (and of its int8 row scales)."""
import triton
import triton.language as tl

from nanovllm.kernels._common import (
    e4m3_words_to_f16,
    int8_to_fp16,
    online_softmax_step,
    v_tile_tile,
)


@triton.jit
def _tile_tokens(bt_row, n, end, stride_kblk, stride_kslot, stride_sblk, stride_sslot,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr):
    """(mask, cache offset, row-scale offset) of the keys n .. n + BLOCK_N of one sequence
    (paged)."""
    offs_n = n + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    if PAGE_TILE:
        # BLOCK_N divides block_size and tiles are aligned: the whole tile lives in one page.
        page = tl.load(bt_row + n // BLOCK_SIZE).to(tl.int64)
    else:
        page = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    slot = offs_n % BLOCK_SIZE
    return (n_mask, page * stride_kblk + slot * stride_kslot,
            page * stride_sblk + slot * stride_sslot)


@triton.jit
def tile_of(cache_ptr, bt_row, kv_head_off, n, end, stride_kblk, stride_kslot,
            HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
            PAGE_TILE: tl.constexpr):
    """A cache's tile [BLOCK_N, HEAD_DIM] of keys n .. n + BLOCK_N, zeros from end on."""
    n_mask, tok_off, _ = _tile_tokens(bt_row, n, end, stride_kblk, stride_kslot, 0, 0,
                                      BLOCK_SIZE, BLOCK_N, PAGE_TILE)
    kv_off = tok_off[:, None] + kv_head_off + tl.arange(0, HEAD_DIM)[None, :]
    return tl.load(cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)


@triton.jit
def prefetch_tile(cache_ptr, bt_row, kv_head_off, n, end, stride_kblk, stride_kslot,
                  HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGE_TILE: tl.constexpr):
    """Ask for the rows of tile_of's tile (keys before end) to be brought into L2, not
    waiting for them."""
    n_mask, tok_off, _ = _tile_tokens(bt_row, n, end, stride_kblk, stride_kslot, 0, 0,
                                      BLOCK_SIZE, BLOCK_N, PAGE_TILE)
    LINE: tl.constexpr = 1024 // cache_ptr.dtype.element_ty.primitive_bitwidth  # a 128 B line
    NL: tl.constexpr = max(1, HEAD_DIM // LINE)
    cols = tl.arange(0, NL) * LINE
    addr = (cache_ptr + tok_off[:, None] + kv_head_off + cols[None, :]).to(tl.int64)
    on = (n_mask[:, None] & (cols[None, :] >= 0)).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [addr, on], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def attend_one_tile(q, k, v, n_mask, qk_scale, DOT_PREC: tl.constexpr):
    """attend_tiles over one tile already in registers (K and V [BLOCK_N, D], the keys of
    n_mask): (acc [G_PAD, D], m, l), the same values as that loop's one step."""
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    qk = tl.where(n_mask[None, :], qk * qk_scale, float("-inf"))
    rows: tl.constexpr = q.shape[0]
    m_i, l_i, p, _ = online_softmax_step(tl.full([rows], float("-inf"), tl.float32),
                                         tl.zeros([rows], tl.float32), qk)
    return tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC), m_i, l_i


@triton.jit
def attend_tiles(q, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt_row, kv_head_off,
                 start, end, qk_scale, stride_kblk, stride_kslot, stride_sblk, stride_sslot,
                 G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr,
                 USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, KV_FP8: tl.constexpr,
                 KV_INT8: tl.constexpr, PV_DTYPE: tl.constexpr, INT8_F16: tl.constexpr,
                 V_WORDS: tl.constexpr, V_TILE: tl.constexpr, V_LAST: tl.constexpr = 0):
    """Online softmax over keys start..end as S = Q K^T, O = P V: (acc [G_PAD, D], m, l); an
    8-bit cache's tiles are widened to q's dtype for the QK dot, to PV_DTYPE for the PV dot.

    An int8 cache's row scales (k_scale_ptr / v_scale_ptr already at this kv head) cost no
    multiply per element: key j's scale multiplies column j of the scores after the dot, and
    value j's scales the probabilities of column j before the PV dot. INT8_F16 (q in fp16):
    both dots in fp16, the codes widened by int8_to_fp16, and V's scales taken relative to
    their running max c, so the fp16 probabilities p * s / c stay in [0, 1] (p * s alone
    could underflow fp16); acc is kept in units of c, rescaled like the softmax's max.

    V_TILE (pages tiled, triton_kv.v_tile_of; PAGE_TILE, BLOCK_N dividing V_TILE): V's
    tiles are read whole, unmasked (a mask along the keys, V^T's contiguous axis, splits
    the loads into bytes: H200, the last tile so read cost the whole gain at 256 rows), and
    the last partial tile's V (its slots past end hold anything, and 0 * NaN reaches the
    sums): V_LAST 0 zeroed after the load in a step after the loop; 1 the same inside the
    loop under a run-time test; 2 read as is, trusting the cache to hold no NaN codes
    (kv_cache.tile_v_pages zeroes V, quantize_fp8 stores NaN as 0), its p 0 already. start
    is a multiple of BLOCK_N, or (V_LAST 0, 1) end - start <= BLOCK_N: the layer kernel's
    new key apart, its split starting anywhere."""
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], tl.float32)
    c_i = tl.full([G_PAD], 1e-30, tl.float32)  # INT8_F16: running max of V's row scales
    whole_end = end
    if V_TILE and V_LAST == 0:
        whole_end = start + (end - start) // BLOCK_N * BLOCK_N
    in_loop: tl.constexpr = 2 if V_TILE and V_LAST == 1 else 0  # _tile_step's V_MASKED
    for n in range(start, whole_end, BLOCK_N):
        acc, m_i, l_i, c_i = _tile_step(
            acc, m_i, l_i, c_i, q, n, end, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
            bt_row, kv_head_off, qk_scale, stride_kblk, stride_kslot, stride_sblk, stride_sslot,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, PAGE_TILE, USE_DOT, DOT_PREC, KV_FP8, KV_INT8,
            PV_DTYPE, INT8_F16, V_WORDS, V_TILE, in_loop)
    if V_TILE and V_LAST == 0:
        if whole_end < end:
            acc, m_i, l_i, c_i = _tile_step(
                acc, m_i, l_i, c_i, q, whole_end, end, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                v_scale_ptr, bt_row, kv_head_off, qk_scale, stride_kblk, stride_kslot,
                stride_sblk, stride_sslot, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PAGE_TILE, USE_DOT,
                DOT_PREC, KV_FP8, KV_INT8, PV_DTYPE, INT8_F16, V_WORDS, V_TILE, 1)
    if KV_INT8 and INT8_F16:
        acc = acc * c_i[:, None]
    return acc, m_i, l_i


@triton.jit
def _tile_step(acc, m_i, l_i, c_i, q, n, end, k_cache_ptr, v_cache_ptr, k_scale_ptr,
               v_scale_ptr, bt_row, kv_head_off, qk_scale, stride_kblk, stride_kslot,
               stride_sblk, stride_sslot, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr, USE_DOT: tl.constexpr,
               DOT_PREC: tl.constexpr, KV_FP8: tl.constexpr, KV_INT8: tl.constexpr,
               PV_DTYPE: tl.constexpr, INT8_F16: tl.constexpr, V_WORDS: tl.constexpr,
               V_TILE: tl.constexpr, V_MASKED: tl.constexpr):
    """attend_tiles' step over keys n .. n + BLOCK_N: the running (acc, m, l, c) after them
    (V_MASKED: keys n .. end of the aligned tile holding n, V's others zeroed: 1 always, 2
    only where the tile is partial, tested at run time)."""
    offs_d = tl.arange(0, HEAD_DIM)
    lo = n
    if V_MASKED:  # a tiled V is read whole from an aligned tile (the layer kernel's new key
        n = n // BLOCK_N * BLOCK_N  # apart, NEW_APART, starts anywhere)
    n_mask, tok_off, s_off = _tile_tokens(bt_row, n, end, stride_kblk, stride_kslot,
                                          stride_sblk, stride_sslot, BLOCK_SIZE, BLOCK_N,
                                          PAGE_TILE)
    if V_MASKED:
        n_mask = n_mask & (n + tl.arange(0, BLOCK_N) >= lo)
    kv_off = tok_off[:, None] + kv_head_off + offs_d[None, :]
    k = tl.load(k_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
    if KV_INT8 and INT8_F16:
        k = int8_to_fp16(k)
    elif KV_FP8 or KV_INT8:
        k = k.to(q.dtype)  # int8 codes (|c| <= 127) are exact in bf16 and fp16
    if USE_DOT:
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    else:
        qk = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
    if KV_INT8:
        qk = qk * tl.load(k_scale_ptr + s_off, mask=n_mask, other=0.0)[None, :]
    # exp2 domain: qk_scale already includes log2(e).
    qk = tl.where(n_mask[None, :], qk * qk_scale, float("-inf"))
    m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, qk)
    if V_TILE:
        v = v_tile_tile(v_cache_ptr, bt_row, kv_head_off, n, stride_kblk, HEAD_DIM,
                        BLOCK_SIZE, BLOCK_N, V_TILE)
    elif V_WORDS:  # e4m3 V as 32-bit words, widened to fp16 where loaded (e4m3_words_to_f16)
        offs_w = tl.arange(0, HEAD_DIM // 4)
        w_ptr = (v_cache_ptr + kv_head_off).to(tl.pointer_type(tl.int32), bitcast=True)
        w_off = (tok_off >> 2)[:, None] + offs_w[None, :]
        v = e4m3_words_to_f16(tl.load(w_ptr + w_off, mask=n_mask[:, None], other=0))
    else:
        v = tl.load(v_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
    if KV_INT8 and INT8_F16:
        v = int8_to_fp16(v)
    elif (KV_FP8 or KV_INT8) and not V_WORDS:
        v = v.to(PV_DTYPE)
    if V_MASKED == 1:  # the slots past end: anything (NaN too, and 0 * NaN reaches the sums)
        v = tl.where(n_mask[:, None], v, 0.0)
    elif V_MASKED == 2:
        if (n != lo) | (n + BLOCK_N > end):
            v = tl.where(n_mask[:, None], v, 0.0)
    pw = p
    if KV_INT8:
        vs = tl.load(v_scale_ptr + s_off, mask=n_mask, other=0.0)
        if INT8_F16:
            c_new = tl.maximum(c_i, tl.max(vs, axis=0))
            r = 1.0 / c_new
            alpha = alpha * (c_i * r)
            c_i = c_new
            pw = p * vs[None, :] * r[:, None]
        else:
            pw = p * vs[None, :]
    if USE_DOT:
        pv = tl.dot(pw.to(v.dtype), v, input_precision=DOT_PREC)
    else:
        pv = tl.sum(pw[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    return acc * alpha[:, None] + pv, m_i, l_i, c_i
