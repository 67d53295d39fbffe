"""Fused mixture-of-experts: (token, expert) pairs sorted by expert, then two grouped GEMMs.

Each token picks top_k experts; the pairs are sorted by expert and each expert's run is padded
to a whole number of BLOCK_M rows (`align_pairs`), so a program of the GEMM kernel reads one
expert's weight tile once for up to BLOCK_M pairs. The first GEMM computes the gate and the up
tile of the same columns and writes silu(gate) * up (the activation never goes to memory); the
second multiplies by w2 and by the pair's routing weight; a sum over each token's top_k rows
finishes it. Decode steps are weight-bound: a step reads each routed expert once.

CUDA-graph safe: every shape and the grid depend only on the number of tokens, never on the
routing; programs past the padded end exit at once (their count is read on the device).
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET, dot_precision

# Tile configs by the number of (token, expert) pairs per expert on average: few pairs (decode)
# want short BLOCK_M (less padding; every small config measured the same, ~2.4 TB/s at 32-256
# tokens for Qwen3-30B-A3B's experts on H100); many pairs (prefill) want tall tiles: 64 rows
# from 48 pairs per expert (1024 tokens: 644 us vs 900 for 16 rows), 128 rows and 8 warps from
# 256 (16384 tokens: 3.2 ms vs 3.7 for 64 rows). Module level so tests and tools can override.
SMALL_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
LARGE_CONFIG = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)
HUGE_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
# Average pairs per expert from which LARGE_CONFIG / HUGE_CONFIG are used.
LARGE_FROM, HUGE_FROM = 48, 256
# The interpreter uses the smallest tiles tl.dot accepts, so tiny test shapes span several.
INTERPRET_CONFIG = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1)


def choose_config(num_pairs: int, num_experts: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The tile config for this many (token, expert) pairs."""
    if INTERPRET:
        return INTERPRET_CONFIG
    per_expert = num_pairs / num_experts
    cfg = (HUGE_CONFIG if per_expert >= HUGE_FROM else LARGE_CONFIG if per_expert >= LARGE_FROM
           else SMALL_CONFIG)
    if dtype.itemsize == 4:  # fp32 tiles take twice the shared memory: pipeline less deep
        cfg = dict(cfg, num_stages=min(cfg["num_stages"], 2))
    return cfg


@triton.jit
def _rank_kernel(ids_ptr, counts_ptr, rank_ptr, n, BLOCK: tl.constexpr):
    # Each pair takes the next free slot of its expert: the atomic's old value is its rank.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    expert = tl.load(ids_ptr + offs, mask=mask, other=0)
    rank = tl.atomic_add(counts_ptr + expert, 1, mask=mask)
    tl.store(rank_ptr + offs, rank, mask=mask)


@triton.jit
def _offsets_kernel(counts_ptr, starts_ptr, expert_ids_ptr, num_padded_ptr, num_experts,
                    num_blocks, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr,
                    BLOCKS_TILE: tl.constexpr):
    # One program: each expert's run padded to BLOCK_M rows, their starts, and the expert of
    # every block of rows (blocks past the end get num_experts).
    e = tl.arange(0, E_PAD)
    real = e < num_experts
    counts = tl.load(counts_ptr + e, mask=real, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(starts_ptr + e, ends - padded, mask=real)
    tl.store(num_padded_ptr, tl.sum(padded, 0))
    for b0 in range(0, num_blocks, BLOCKS_TILE):
        b = b0 + tl.arange(0, BLOCKS_TILE)
        done = (ends[None, :] <= (b * BLOCK_M)[:, None]) & real[None, :]
        tl.store(expert_ids_ptr + b, tl.sum(done.to(tl.int32), 1), mask=b < num_blocks)


@triton.jit
def _scatter_kernel(ids_ptr, rank_ptr, starts_ptr, sorted_ids_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    expert = tl.load(ids_ptr + offs, mask=mask, other=0)
    dest = tl.load(starts_ptr + expert, mask=mask, other=0) + tl.load(rank_ptr + offs, mask=mask)
    tl.store(sorted_ids_ptr + dest, offs, mask=mask)


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Group the (token, expert) pairs by expert, each expert's run padded to block_m rows.

    Returns sorted_ids [max_padded] (pair index = token * top_k + slot; padding holds
    num_pairs), expert_ids [max_padded // block_m] (the expert of each block of rows; blocks
    past the end get num_experts) and num_padded [1] (rows in use), all on the device with
    shapes that depend only on topk_ids' shape. Three small kernels: the torch equivalent
    (bincount, sort, cumsums, searchsorted) was ~25 launches, most of a decode step's MoE time
    at batch 1. Pairs of one expert come in no particular order; each row's result depends
    only on its own pair, so outputs are the same whatever the order.
    """
    ids = topk_ids.flatten().int()
    n, dev = ids.numel(), ids.device
    # At most min(n, E) experts are hit, each padding fewer than block_m rows.
    max_padded = triton.cdiv(n + min(n, num_experts) * (block_m - 1), block_m) * block_m
    num_blocks = max_padded // block_m
    counts = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    rank = torch.empty(n, dtype=torch.int32, device=dev)
    starts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    block = 16 if INTERPRET else 256
    grid = (triton.cdiv(n, block),)
    _rank_kernel[grid](ids, counts, rank, n, BLOCK=block)
    _offsets_kernel[(1,)](counts, starts, expert_ids, num_padded, num_experts, num_blocks,
                          BLOCK_M=block_m, E_PAD=triton.next_power_of_2(num_experts),
                          BLOCKS_TILE=64)
    _scatter_kernel[grid](ids, rank, starts, sorted_ids, n, BLOCK=block)
    return sorted_ids, expert_ids, num_padded


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, topk_w_ptr,
    N, K, num_pairs,
    stride_am, stride_we, stride_wn, stride_om,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # Program = (block of one expert's pairs, block of output columns); the column index runs
    # fastest, so neighbouring programs share the gathered activation rows.
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = pairs < num_pairs
    rows = (pairs // A_ROW_DIV).to(tl.int64)  # first GEMM: pair -> its token's row of x
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    # Weights are [E, N_total, K] (a row per output feature): a [BLOCK_K, BLOCK_N] tile.
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up_ptrs = w_ptrs + N * stride_wn  # the up half starts N rows below the gate half
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PREC)
        if GATED:
            w_up = tl.load(up_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            acc_up = tl.dot(a, w_up, acc_up, input_precision=DOT_PREC)
            up_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_dtype = out_ptr.dtype.element_ty
    if GATED:
        # Rounded to the activation dtype where the unfused SiluAndMul would round.
        gate = acc.to(out_dtype).to(tl.float32)
        acc = (gate * tl.sigmoid(gate)).to(out_dtype).to(tl.float32) * acc_up.to(out_dtype).to(
            tl.float32)
    if MUL_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + pairs, mask=m_mask, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_dtype), mask=m_mask[:, None] & n_mask[None, :])


def _gemm(a, w, out, aligned, topk_weights, num_pairs, a_row_div, gated, cfg):
    sorted_ids, expert_ids, num_padded = aligned
    n = w.shape[1] // 2 if gated else w.shape[1]
    grid = (expert_ids.numel() * triton.cdiv(n, cfg["BLOCK_N"]),)
    _moe_gemm_kernel[grid](
        a, w, out, sorted_ids, expert_ids, num_padded, topk_weights,
        n, w.shape[2], num_pairs, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=not gated,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        DOT_PREC=dot_precision(a.dtype), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              config: dict | None = None) -> torch.Tensor:
    """sum_k topk_weights[t, k] * w2[e] @ (silu(gate_e x_t) * (up_e x_t)), e = topk_ids[t, k].

    x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights [T, k]
    (float32) and topk_ids [T, k] (int). Returns [T, H] in x's dtype.
    """
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    cfg = config or choose_config(num_pairs, num_experts, x.dtype)
    assert x.stride(1) == w13.stride(2) == w2.stride(2) == 1
    inter = torch.empty(num_pairs, two_i // 2, dtype=x.dtype, device=x.device)
    out = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out.view(0, top_k, hidden).sum(1)
    aligned = align_pairs(topk_ids, num_experts, cfg["BLOCK_M"])
    weights = topk_weights.float().contiguous()
    _gemm(x, w13, inter, aligned, weights, num_pairs, top_k, True, cfg)
    _gemm(inter, w2, out, aligned, weights, num_pairs, 1, False, cfg)
    return out.view(num_tokens, top_k, hidden).sum(1)


__all__ = ["fused_moe", "align_pairs", "choose_config"]
