"""A narrow matmul's product left as fp32 partial sums over slices of K, for the RMSNorm after
it to add (in split order, so the same bits every call) as it loads its input.

Why: at batched-decode sizes o_proj and down_proj (N = hidden size) give too few output tiles
to fill the GPU, and splitting K needs the partials summed: by a reduce launch (cuBLAS's
split-K) or by the last program to finish, in order (~2.5 us on the H200). The residual-add
RMSNorm that follows both in every decoder layer reads the product anyway, so it does the sum
(kernels/triton_norm.py) and the split costs one fp32 read more a partial (PERF_NOTES,
fifty-sixth session).
"""
from typing import NamedTuple

import torch


class SplitSum(NamedTuple):
    """parts [S, rows, N] fp32, whose in-order sum rounded to `dtype` is the product."""
    parts: torch.Tensor
    dtype: torch.dtype


def matmul(layer, x: torch.Tensor) -> SplitSum | None:
    """layer's x @ W^T as a SplitSum where the TMA GEMM splits it (kernels/tma_gemm.py:
    17-256 rows on Hopper, plain or fp8 weights, no bias), else None. The caller checks
    NANOVLLM_SKINNY_GEMM for plain weights (linear.skinny_gemm_enabled)."""
    if not x.is_cuda or layer.bias is not None:
        return None
    from nanovllm.kernels import tma_gemm  # (CPU-only installs may have no triton)

    operands = layer.gemm_operands()
    if operands is None:
        return None
    weight, scale, block = operands
    if not tma_gemm.takes(x, weight, scale=scale, block=block, split=True):
        return None
    return SplitSum(tma_gemm.tma_partials(x, weight, scale, block), x.dtype)
