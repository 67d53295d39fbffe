"""The end of a split decode program: count the split in; the last split of a (sequence,
kv head) combines the splits' partial outputs (see triton_decode.py)."""
import triton
import triton.language as tl


def reduce_tile(group: int, head_dim: int = 128) -> tuple[int, int]:
    """(GP, CHUNK) of combine_heads for G = group: [GP, CHUNK, head_dim] fp32 partials per
    load, 32 values a thread at 4 warps and head_dim 128, 64 at head_dim <= 64.

    Each chunk is a memory round trip, so at 64-dim heads (whose tile is half as big) a load
    takes more splits: H100, a graph of 24 layers, us a call, Qwen2.5-0.5B's 14/2 heads at
    batch 1 / 8, context <= 2048: 8.70 -> 5.71 / 12.58 -> 9.58 (CHUNK 4 -> 16); SmolLM2's
    9/3 at batch 4: 10.15 -> 8.01 (8 -> 32). At head_dim 128, 64 values a thread measured
    within +-2% either way (Qwen3-0.6B), so it stays at 32."""
    gp = triton.next_power_of_2(group)
    if head_dim > 64:
        return gp, max(2, 32 // gp)
    return gp, min(64, max(2, 8192 // (gp * head_dim)))


@triton.jit
def split_done(po_ptr, lse_ptr, o_ptr, cnt_ptr, b, kvh, n_valid, n_count, stride_pb,
               stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
               NUM_KV_HEADS: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
               CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Count this split in; the last of the n_count splits that take part combines the
    n_valid that hold keys (n_count = max(n_valid, 1): with no keys at all one split still
    writes the zero output)."""
    # acq_rel: every split's partial stores happen before its increment, and the last program
    # reads them after its own, so it sees them all.
    cnt = cnt_ptr + b * NUM_KV_HEADS + kvh
    if tl.atomic_add(cnt, 1, sem="acq_rel") == n_count - 1:
        combine_heads(po_ptr, lse_ptr, o_ptr, b, kvh * G, n_valid, stride_pb, stride_ph,
                      stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, G, GP, CHUNK,
                      HEAD_DIM)
        tl.atomic_xchg(cnt, 0)  # ready for the next call (and the next graph replay)


@triton.jit
def combine_heads(po_ptr, lse_ptr, o_ptr, b, h0, n_valid, stride_pb, stride_ph, stride_ps,
                  stride_lb, stride_lh, stride_ob, stride_oh, G: tl.constexpr,
                  GP: tl.constexpr, CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """o = sum_s 2^(lse_s - max) * o_s / sum_s 2^(lse_s - max) for the G query heads from h0,
    over splits 0 .. n_valid - 1; GP = G rounded up to a power of two (reduce_tile).

    All heads at once, CHUNK splits per load: at a short context (a batch-1 decode step) one
    load of the partials and one of their lse, side by side, and the combine is done. (Head by
    head, a lse load and then a partials load each, it cost 2G dependent memory round trips:
    H100, 7.9 us a call at G = 2, 11.2 at G = 4.) Chunks are folded in with a running max."""
    offs_g = tl.arange(0, GP)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = h0 + offs_g
    g_mask = offs_g < G
    m = tl.full([GP], float("-inf"), tl.float32)
    denom = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, HEAD_DIM], tl.float32)
    for s0 in range(0, n_valid, CHUNK):
        splits = s0 + offs_c
        mask = g_mask[:, None] & (splits < n_valid)[None, :]
        lse = tl.load(lse_ptr + b * stride_lb + heads[:, None] * stride_lh + splits[None, :],
                      mask=mask, other=float("-inf"))
        part = tl.load(po_ptr + b * stride_pb + heads[:, None, None] * stride_ph
                       + splits[None, :, None] * stride_ps + offs_d[None, None, :],
                       mask=mask[:, :, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # padded heads: no -inf - -inf
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe[:, None])
        denom = denom * alpha + tl.sum(w, axis=1)
        acc = acc * alpha[:, None] + tl.sum(part * w[:, :, None], axis=1)
        m = m_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]  # no keys (ctx == 0): zeros
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit
def combine_all(po_ptr, lse_ptr, n_valid, HQ: tl.constexpr, HQ_PAD: tl.constexpr,
                SPLITS: tl.constexpr, LOADED: tl.constexpr, HEAD_DIM: tl.constexpr,
                DTYPE: tl.constexpr):
    """Every head's combined output from splits 0 .. n_valid - 1 (n_valid <= LOADED; the
    partials [HQ, SPLITS, HEAD_DIM], their lse [HQ, SPLITS]), as combine_heads computes it,
    rounded to DTYPE, as fp32 [HQ_PAD * HEAD_DIM] (head h at h * HEAD_DIM, zeros past HQ):
    the layer kernel's o_proj input, built in registers by every program in one load instead
    of by the last split of each kv head after a count."""
    heads = tl.arange(0, HQ_PAD)
    splits = tl.arange(0, LOADED)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (heads < HQ)[:, None] & (splits < n_valid)[None, :]
    lse = tl.load(lse_ptr + heads[:, None] * SPLITS + splits[None, :], mask=mask,
                  other=float("-inf"), cache_modifier=".cg")
    part = tl.load(po_ptr + heads[:, None, None] * (SPLITS * HEAD_DIM)
                   + splits[None, :, None] * HEAD_DIM + offs_d[None, None, :],
                   mask=mask[:, :, None], other=0.0, cache_modifier=".cg")
    m = tl.max(lse, axis=1)
    m_safe = tl.where(m > float("-inf"), m, 0.0)
    w = tl.exp2(lse - m_safe[:, None])
    denom = tl.sum(w, axis=1)
    acc = tl.sum(part * w[:, :, None], axis=1)
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    return tl.reshape(out.to(DTYPE).to(tl.float32), [HQ_PAD * HEAD_DIM])
