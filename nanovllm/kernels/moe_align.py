"""Grouping a MoE step's (token, expert) pairs by expert for kernels/triton_moe.py: each
expert's run padded to whole row tiles, in three small kernels."""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET


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
