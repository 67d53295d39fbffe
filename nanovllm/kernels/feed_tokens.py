"""The pending input tokens of a decode step, fed in on the device in one launch (it runs
inside every decode graph; the torch form, five small launches, stays for the CPU)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _feed_kernel(ids_ptr, feed_ptr, sampled_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    feed = tl.load(feed_ptr + offs, mask=offs < n, other=-1)
    take = feed >= 0
    token = tl.load(sampled_ptr + tl.maximum(feed, 0), mask=take)
    tl.store(ids_ptr + offs, token.to(ids_ptr.dtype.element_ty), mask=take)


def feed_tokens_gpu(ids: torch.Tensor, feed_rows: torch.Tensor, sampled: torch.Tensor) -> None:
    """ids[i] = sampled[feed_rows[i]] where feed_rows[i] >= 0 (ids, feed_rows: [n])."""
    n = ids.numel()
    block = min(1024, triton.next_power_of_2(max(n, 16)))
    _feed_kernel[(triton.cdiv(n, block),)](ids, feed_rows, sampled, n, BLOCK=block)
