"""Small copies between pinned host memory and the device done by a kernel, not the copy
engine.

A decode step's inputs (a few KB) and its sampled ids (a word a sequence) used to travel as
cudaMemcpyAsync calls in the step's stream. Each one hands the stream from the compute engine
to a copy engine and back, and on an H100 that costs more than the bytes: at batch 1 the GPU
sat idle ~26 us a step between the sampler, the ids' copy, the next inputs' copy and the next
forward (docs/PERF_NOTES.md, twenty-seventh session). Pinned host memory is mapped into the
device's address space (unified addressing), so a kernel can read or write it directly and
the stream never leaves the compute engine.
"""
import torch
import triton
import triton.language as tl

BLOCK = 1024
# False: cudaMemcpyAsync as before (A/B timing on a device: .dev scripts flip it).
KERNEL = True


@triton.jit(do_not_specialize=["n"])
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy_words(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[:n] = src (n = src.numel()), 32-bit words, by a kernel; either side may be pinned
    host memory, the other on the current device. Asynchronous, in the current stream."""
    assert src.element_size() == 4 and dst.element_size() == 4
    assert src.is_contiguous() and dst.is_contiguous() and dst.numel() >= src.numel()
    n = src.numel()
    if not KERNEL:
        dst[:n].copy_(src, non_blocking=True)
    elif n:
        _copy_kernel[(triton.cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK)
