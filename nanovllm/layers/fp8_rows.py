"""A normed activation handed to the fp8 matmul after it as e4m3 values with one fp32 scale a
row, so that matmul multiplies e4m3 by e4m3 (W8A8, vLLM's dynamic per-token recipe).

Why: at batched-decode sizes (17-256 rows) a weight-only fp8 GEMM widens each weight tile in
registers and sends it back through shared memory for the tensor cores, which made fp8's qkv
and gate_up slower than bf16's (6.6 against 5.4 and 9.7 against 6.9 us at 64 rows, Qwen3-0.6B,
H200). With both operands e4m3 the tiles go from TMA to the tensor cores as loaded (5.3 and
6.6 us). The activation's quantization costs a launch of its own (~1.6-2 us) unless the
RMSNorm before the matmul writes it, which DecoderLayer arranges for qkv_proj and gate_up_proj
(PERF_NOTES, fifty-seventh session). The activation's rounding (3 mantissa bits) is the
numerical price; batch 1-16 keeps bf16 activations.

Past the TMA GEMM's rows (prefills and mixed steps: > 256) row-scaled weights take the rows
through torch._scaled_mm (CUTLASS's e4m3 GEMM with a scale a row on each side), in place of
writing the weight out in bf16 for cuBLAS each call; gate_up's SiLU-and-mul then writes e4m3
rows for down_proj (LARGE). 128 x 128 block-scaled weights may take cuBLAS's blockwise form
of it (LARGE_BLOCKS).
"""
from typing import NamedTuple

import torch

from nanovllm.layers.split_k import SplitSum

# Past 256 rows: 0 keeps bf16 activations (dequantize + cuBLAS, kernels/fp8_gemm.py); 1 hands
# qkv and gate_up the norms' rows; 2 also down_proj the SiLU-and-mul's. H200, Qwen3-0.6B's
# layers at 16,384 rows, us (tools/bench_gemm.py --large-m): _scaled_mm on e4m3 rows qkv 151,
# gate_up 215, down 96 against dequantize + cuBLAS 195, 281, 136 (o 68 against 95, but its
# rows would take a launch of their own, 34 us); 128 x 128 blocks (cuBLAS's blockwise GEMM; a
# probe, the kernel alone) qkv 133, gate_up 196, down 90 against 201, 287, 143.
LARGE = 2
# Whether those blocks take it (its GPU tests, tests/layers/test_fp8_rows.py: 100 passed on
# an H200, sixtieth session: the GEMM at 257-1,001 rows, the engine at a 400-row prefill).
LARGE_BLOCKS = 1


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
    if m > tma_gemm.MAX_M:
        return takes_large(layer, t.dtype)
    if m < tma_gemm.MIN_M:  # (first: batch 1-16 skips the lookups)
        return False
    operands = layer.gemm_operands()
    if operands is None or operands[1] is None:
        return False
    weight, scale, block = operands
    return tma_gemm.takes_w8a8(m, k, weight, scale, block, gated)


def takes_large(layer, dtype: torch.dtype, down: bool = False) -> bool:
    """Whether layer takes more than 256 rows through torch._scaled_mm: LARGE (2 for down),
    W8A8 on, bf16 activations (the scaled GEMMs write bf16), e4m3 weights with row scales and
    sizes in 16s on a GPU with fp8 tensor cores (sm_89 on), or under LARGE_BLOCKS (and
    W8A8_BLOCKS) 128 x 128 blocks on Hopper, N in 128s and K in 512s: cuBLAS's blockwise
    GEMM there answered wrong sums without an error at K of 640, 896 and 1,664 (an odd
    count of 128-column groups; H200, torch 2.11 + CUDA 13, PERF_NOTES fifty-ninth
    session)."""
    from nanovllm.kernels import tma_config

    operands = layer.gemm_operands()
    if LARGE < (2 if down else 1) or not tma_config.W8A8 or operands is None:
        return False
    weight, scale, block = operands
    if scale is None or dtype != torch.bfloat16 or weight.dtype != torch.float8_e4m3fn:
        return False
    (n, k), major = weight.shape, torch.cuda.get_device_capability(weight.device)
    if block is not None:
        return (bool(LARGE_BLOCKS and tma_config.W8A8_BLOCKS) and tuple(block) == (128, 128)
                and n % 128 == 0 and k % 512 == 0 and weight.is_contiguous()
                and scale.is_contiguous() and major[0] == 9)
    return n % 16 == 0 and k % 16 == 0 and weight.is_contiguous() and major >= (8, 9)


def matmul(layer, rows: Fp8Rows, gated: bool = False, bias: bool = True) -> torch.Tensor:
    """layer's product of the activation rows (gated: silu(gate) * up), plus the layer's bias
    unless bias is False (a row-parallel rank past the first: rank 0 adds it)."""
    from nanovllm.kernels import tma_gemm

    weight, scale, block = layer.gemm_operands()
    b = layer.bias if bias else None
    m = rows.values.shape[0]
    if m <= tma_gemm.MAX_M:
        return tma_gemm.w8a8_gemm(rows.values, rows.scales, weight, scale, b, rows.dtype,
                                  gated=gated, block=block)
    if block is None:
        y = torch._scaled_mm(rows.values, weight.t(), scale_a=rows.scales.view(m, 1),
                             scale_b=scale.view(1, -1), out_dtype=rows.dtype,
                             bias=None if b is None else b.to(rows.dtype))
    else:
        y = _blockwise(rows, weight, scale)
        if b is not None:
            y += b.to(rows.dtype)
    if gated:
        from nanovllm.kernels.triton_norm import silu_and_mul

        return silu_and_mul(y)
    return y


def _blockwise(rows: Fp8Rows, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """rows @ weight^T through cuBLAS's blockwise GEMM: each row's scale for all its
    128-column groups (1 x 128, laid out group-major as torch asks) by the 128 x 128 weight
    blocks. It takes rows in fours (others: CUBLAS_STATUS_NOT_SUPPORTED), so up to three
    zero rows are added and their outputs dropped."""
    values, scales = rows.values, rows.scales
    m, k = values.shape
    pad = -m % 4
    if pad:
        padded = values.new_empty(m + pad, k)
        padded.view(torch.uint8)[:m].copy_(values.view(torch.uint8))
        padded.view(torch.uint8)[m:].zero_()
        values, scales = padded, torch.cat([scales, scales.new_ones(pad)])
    scale_a = scales.expand(k // 128, m + pad).contiguous().t()
    y = torch._scaled_mm(values, weight.t(), scale_a=scale_a, scale_b=scale.t(),
                         out_dtype=rows.dtype)
    return y[:m] if pad else y


def mlp(gate_up, down, rows: Fp8Rows) -> torch.Tensor:
    """down(silu(gate) * up) of the activation rows; past 256 rows the product goes to
    down_proj as e4m3 rows (SiLU-and-mul writes them) where it takes them (LARGE 2)."""
    from nanovllm.kernels import tma_gemm

    if rows.values.shape[0] > tma_gemm.MAX_M and takes_large(down, rows.dtype, down=True):
        from nanovllm.kernels.triton_norm import silu_and_mul

        values, scales = silu_and_mul(matmul(gate_up, rows), quantize=True)
        return down(Fp8Rows(values, scales, rows.dtype))
    return down(matmul(gate_up, rows, gated=True))
