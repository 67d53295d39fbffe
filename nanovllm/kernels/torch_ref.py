"""Plain-torch attention over a paged KV cache and mixture-of-experts: the test oracles and
the CPU code path.

Cache layout: [num_blocks, block_size, num_kv_heads, head_dim];
slot = block_id * block_size + offset.
Everything is computed in fp32 and cast back to q's dtype. An fp8 cache (float8_e4m3fn or
float8_e5m2) holds x / scale[kv head] per layer: stores divide and round, reads multiply back.
An int8 cache holds round(x / s) with s = max|x| / 127 of each (token, kv head) row, s kept
beside it in a scale tensor indexed like the cache without its last dim ([num_blocks,
block_size, num_kv_heads], fp32, any strides: the engine's is a head-major view).
"""
import torch

from nanovllm.kernels.kv_feedback import quantize_feedback

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
INT8_MAX = 127
# A row's scale is max|x| times fp32(1 / 127), a multiply rather than a division: torch on a
# GPU divides a tensor by a Python number as a multiply by its reciprocal (CPU torch and Triton
# divide exactly, which rounds differently for ~4% of values), so only the multiply gives the
# same scale on every device and in the Triton stores.
INT8_INV_MAX = 1.0 / INT8_MAX
# Adding then subtracting 1.5 * 2^23 rounds an fp32 |y| < 2^22 to the nearest integer, ties to
# even, as torch.round does; the Triton stores round the same way (the interpreter has no rint).
ROUND_MAGIC = 12582912.0


def quantize_rows(x):
    """x [..., D] as (int8 codes [..., D], fp32 scales [...]): each row divided by its
    max|x| / 127 and rounded (an all-zero row gets scale 1)."""
    xf = x.float()
    amax = xf.abs().amax(-1)
    scale = torch.where(amax > 0, amax * INT8_INV_MAX, 1.0)
    codes = ((xf / scale[..., None] + ROUND_MAGIC) - ROUND_MAGIC).clamp(-INT8_MAX, INT8_MAX)
    return codes.to(torch.int8), scale


def quantize(x, scale, dtype):
    """x [..., Hkv, D] as `dtype`: divided by scale [Hkv] and clamped to its range when fp8
    (NaN as 0, as the kernels' quantize_fp8 stores it)."""
    if dtype not in FP8_DTYPES:
        return x.to(dtype)
    fmax = torch.finfo(dtype).max
    # Clamp first: torch's cast does not saturate every out-of-range value the same way.
    y = (x.float() / scale.float()[:, None]).nan_to_num(nan=0.0)
    return y.clamp(-fmax, fmax).to(dtype)


def dequantize(x, scale):
    """fp32 values of cache entries x [..., Hkv, D]; scale [Hkv] (fp8), [..., Hkv] (int8,
    a scale per row) or None (a plain cache)."""
    if scale is None:
        return x.float()
    if x.dtype == torch.int8:
        return x.float() * scale.float()[..., None]
    return x.float() * scale.float()[:, None]


def store_kvcache_torch(k, v, k_cache, v_cache, slot_mapping, k_scale=None,
                        v_scale=None, k_feedback=None) -> None:
    """Write new tokens' K/V [T, Hkv, D] into the paged cache at slot_mapping (-1 = skip);
    an int8 cache's row scales go to k_scale / v_scale at the same slots. k_feedback (an fp8
    cache): K rounded with error feedback through it (kv_feedback.quantize_feedback)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        # View caches as [num_slots, Hkv, D]; valid because the two leading dims are contiguous.
        rows = cache.view(-1, *cache.shape[2:])
        if cache.dtype == torch.int8:
            codes, row_scales = quantize_rows(x[keep])
            rows[slots] = codes
            scale[slots // cache.shape[1], slots % cache.shape[1]] = row_scales
        elif k_feedback is not None and x is k:
            rows[slots] = quantize_feedback(x[keep], scale, k_feedback, cache.dtype)
        else:
            rows[slots] = quantize(x[keep], scale, cache.dtype)


def _gather_seq(cache, block_row, seqlen):
    """Dense [seqlen, Hkv, D] keys/values of one sequence, read through its block table row."""
    block_size = cache.shape[1]
    nblocks = (seqlen + block_size - 1) // block_size
    blocks = block_row[:nblocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seqlen]


def _read_seq(cache, scale, block_row, seqlen):
    """fp32 [seqlen, Hkv, D] keys/values of one sequence (an int8 cache's scales are paged
    like it)."""
    if cache.dtype == torch.int8:
        scale = _gather_seq(scale, block_row, seqlen)
    return dequantize(_gather_seq(cache, block_row, seqlen), scale)


def _attend(q, k, v, scale, q_pos):
    """q [M, H, D], k/v [N, Hkv, D]; query m sees keys 0..q_pos[m]. Returns fp32 [M, H, D]."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)                                    # [H, M, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)    # [H, N, D]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    s = torch.matmul(qf, kf.transpose(1, 2)) * scale                  # [H, M, N]
    key_pos = torch.arange(k.shape[0], device=q.device)
    s = s.masked_fill(key_pos[None, :] > q_pos[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vf).transpose(0, 1)                        # [M, H, D]


def prefill_attention_torch(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_tables, scale,
                            k_scale=None, v_scale=None):
    """Causal varlen attention of new queries over each sequence's cached keys (prefix and
    chunk aware)."""
    o = torch.empty_like(q)
    cu_q = cu_seqlens_q.tolist()
    cu_k = cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        q0, q1 = cu_q[i], cu_q[i + 1]
        seqlen_q, seqlen_k = q1 - q0, cu_k[i + 1] - cu_k[i]
        if seqlen_q == 0:
            continue
        k = _read_seq(k_cache, k_scale, block_tables[i], seqlen_k)
        v = _read_seq(v_cache, v_scale, block_tables[i], seqlen_k)
        # New queries are the last seqlen_q tokens of the sequence.
        q_pos = torch.arange(seqlen_k - seqlen_q, seqlen_k, device=q.device)
        o[q0:q1] = _attend(q[q0:q1], k, v, scale, q_pos).to(q.dtype)
    return o


def decode_attention_torch(q, k_cache, v_cache, context_lens, block_tables, scale, k_scale=None,
                           v_scale=None):
    """One query per sequence (q [B, H, D]) attending to its first context_lens[i] cached tokens."""
    o = torch.empty_like(q)
    for i, ctx in enumerate(context_lens.tolist()):
        k = _read_seq(k_cache, k_scale, block_tables[i], ctx)
        v = _read_seq(v_cache, v_scale, block_tables[i], ctx)
        q_pos = torch.tensor([ctx - 1], device=q.device)
        o[i] = _attend(q[i:i + 1], k, v, scale, q_pos)[0].to(q.dtype)
    return o


def fused_moe_torch(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """What kernels/triton_moe.fused_moe computes, expert by expert, in fp32.

    x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights / topk_ids
    [T, k]. Returns [T, H] in x's dtype.
    """
    top_k = topk_ids.shape[1]
    flat = topk_ids.flatten().long()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    weights = topk_weights.flatten().float()
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start: start + n]
        start += n
        rows = pairs // top_k
        gate, up = (x[rows].float() @ w13[e].float().t()).chunk(2, -1)
        y = (torch.nn.functional.silu(gate) * up) @ w2[e].float().t()
        out.index_add_(0, rows, y * weights[pairs, None])
    return out.to(x.dtype)
