"""The end of a split decode program: count the split in; the last split of a (sequence,
kv head) combines every split's partial output (see triton_decode.py)."""
import triton
import triton.language as tl


@triton.jit
def split_done(po_ptr, lse_ptr, o_ptr, cnt_ptr, b, kvh, stride_pb, stride_ph, stride_ps,
               stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS: tl.constexpr,
               SPLITS_PAD: tl.constexpr, NUM_KV_HEADS: tl.constexpr, G: tl.constexpr,
               HEAD_DIM: tl.constexpr):
    """Count this split in; the last one of its (sequence, kv head) combines all of them."""
    # acq_rel: every split's partial stores happen before its increment, and the last program
    # reads them after its own, so it sees them all.
    cnt = cnt_ptr + b * NUM_KV_HEADS + kvh
    if tl.atomic_add(cnt, 1, sem="acq_rel") == NUM_SPLITS - 1:
        for g in tl.static_range(G):
            combine_head(po_ptr, lse_ptr, o_ptr, b, kvh * G + g, stride_pb, stride_ph, stride_ps,
                         stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS, SPLITS_PAD,
                         HEAD_DIM)
        tl.atomic_xchg(cnt, 0)  # ready for the next call (and the next graph replay)


@triton.jit
def combine_head(po_ptr, lse_ptr, o_ptr, b, h, stride_pb, stride_ph, stride_ps, stride_lb,
                 stride_lh, stride_ob, stride_oh, NUM_SPLITS: tl.constexpr,
                 SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    """o = sum_s 2^(lse_s - max) * o_s / sum_s 2^(lse_s - max) for one query head."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_s,
                  mask=offs_s < NUM_SPLITS, other=float("-inf"))
    valid = lse > float("-inf")
    m = tl.max(lse, axis=0)
    m = tl.where(m > float("-inf"), m, 0.0)  # all splits empty (ctx == 0): avoid -inf - -inf
    w = tl.where(valid, tl.exp2(lse - m), 0.0)
    # Empty splits never wrote their partial output: mask them out of the load (could be NaN).
    part = tl.load(po_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps
                   + offs_d[None, :], mask=valid[:, None], other=0.0)
    denom = tl.sum(w, axis=0)
    out = tl.sum(part * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))
