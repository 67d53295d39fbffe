"""A normed activation handed to the fp8 matmul after it as e4m3 values with one fp32 scale a
row, so that matmul multiplies e4m3 by e4m3 (W8A8, vLLM's dynamic per-token recipe).

Why: at batched-decode sizes (17-256 rows) a weight-only fp8 GEMM widens each weight tile in
registers and sends it back through shared memory for the tensor cores, which made fp8's qkv
and gate_up slower than bf16's (6.6 against 5.4 and 9.7 against 6.9 us at 64 rows, Qwen3-0.6B,
H200). With both operands e4m3 the tiles go from TMA to the tensor cores as loaded (5.3 and
6.6 us). The activation's quantization costs a launch of its own (~1.6-2 us) unless the
RMSNorm before the matmul writes it, which DecoderLayer arranges for qkv_proj and gate_up_proj
(PERF_NOTES, fifty-seventh session). The activation's rounding (3 mantissa bits) is the
numerical price; prefill (> 256 rows) and batch 1-16 keep bf16 activations.
"""
from typing import NamedTuple

import torch

from nanovllm.layers.split_k import SplitSum


class Fp8Rows(NamedTuple):
    """values [rows, K] e4m3 and scales [rows] fp32: the activation is values * scales; the
    product comes in `dtype` (the model's)."""
    values: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype


def takes(layer, x: torch.Tensor | SplitSum, gated: bool = False) -> bool:
    """Whether the norm of x (a hidden state or a split matmul's partials) should hand layer
    (the fp8 qkv or gate_up projection after it) Fp8Rows: fp8 weights whose scales and row
    count the TMA GEMM takes on this GPU (kernels/tma_gemm.takes_w8a8)."""
    t = x.parts[0] if isinstance(x, SplitSum) else x
    if not t.is_cuda or layer.quant_method is None:
        return False
    from nanovllm.kernels import tma_gemm  # (CPU-only installs may have no triton)

    k = t.shape[-1]
    m = t.numel() // k
    if not tma_gemm.MIN_M <= m <= tma_gemm.MAX_M:  # (first: prefills skip the lookups)
        return False
    operands = layer.gemm_operands()
    if operands is None or operands[1] is None:
        return False
    weight, scale, block = operands
    return tma_gemm.takes_w8a8(m, k, weight, scale, block, gated)


def matmul(layer, rows: Fp8Rows, gated: bool = False) -> torch.Tensor:
    """layer's product of the activation rows (gated: silu(gate) * up), bias included."""
    from nanovllm.kernels import tma_gemm

    weight, scale, block = layer.gemm_operands()
    return tma_gemm.w8a8_gemm(rows.values, rows.scales, weight, scale, layer.bias, rows.dtype,
                              gated=gated, block=block)
