"""An 8-bit LM head (opt-in: NANOVLLM_INT8_LM_HEAD=1): the head's weight quantized at load to
int8 codes with one fp32 scale per row and block of up to 128 columns, read by the skinny GEMM
at batch sizes up to 16, where reading the head is a large share of a step (the Qwen3-8B
shape's bf16 head: 1.24 GB, ~0.41 ms of a ~4.3 ms token with fp8 layers).

Why int8 in blocks, not e4m3: the head's rounding lands on the logits directly. On
SmolLM2-135M-Instruct (fp32, CPU, tools/fp8_text.txt teacher-forced against the unquantized
head): e4m3 with row scales mean / max |Δlogprob| 0.113 / 0.54, top-1 agreement 0.928; int8
with row scales 0.033 / 0.19, 0.985 (bf16's own rounding of the same matmul: 0.020); smaller
blocks cut it further. Codes are |c| <= 127, exact in bf16, so the kernel widens them to x's
dtype and applies each block's scale to its fp32 partial products.

More than 16 rows (prefills' last positions, batched decode) dequantize the head and call
cuBLAS: slower than the bf16 head there (the head is written and read again in bf16), the
price of the opt-in.
"""
import functools
import os

import torch
import torch.nn.functional as F

ENV = "NANOVLLM_INT8_LM_HEAD"
BLOCKS = (128, 64, 32, 16)  # the widest that divides K (tl.dot takes 16-column tiles)


@functools.cache
def enabled() -> bool:
    """NANOVLLM_INT8_LM_HEAD: "1" quantizes the LM head to int8 at load, "0" (default) not."""
    value = os.environ.get(ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: use 1 (an int8 LM head, quantized at load) or 0 "
                         "(the checkpoint's head)")
    return value == "1"


def block_for(k: int) -> int:
    """Columns per scale block for a head of K columns."""
    block = next((b for b in BLOCKS if k % b == 0), None)
    if block is None:
        raise ValueError(f"{ENV}=1 needs a hidden size divisible by 16, not {k}; unset it")
    return block


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes int8 [N, K], scales fp32 [N, K / block], block): each row's blocks of `block`
    columns scaled so their largest magnitude maps to 127, rounded to nearest."""
    n, k = weight.shape
    block = block_for(k)
    w = weight.float().view(n, k // block, block)
    scales = w.abs().amax(-1) / 127
    # An all-zero block keeps scale 0 (its codes are 0): divide by 1 there instead.
    codes = torch.round(w / torch.where(scales > 0, scales, 1.0)[..., None])
    return codes.clamp_(-127, 127).to(torch.int8).view(n, k), scales.contiguous(), block


def dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int,
               dtype: torch.dtype) -> torch.Tensor:
    """codes * scale per block, rounded once to `dtype` (the reference the kernel matches)."""
    n, k = codes.shape
    w = codes.float().view(n, k // block, block) * scales[..., None]
    return w.view(n, k).to(dtype)


def matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
           block: int) -> torch.Tensor:
    """x @ dequantize(codes, scales)^T in x's dtype: the skinny GEMM on a GPU up to 16 rows,
    else the reference."""
    if x.is_cuda:  # imported here: CPU-only installs may have no triton
        from nanovllm.kernels.skinny_gemm import MAX_M, gemm

        if x.numel() <= MAX_M * x.shape[-1]:
            return gemm(x, codes, scale=scales, block=(1, block))
    return F.linear(x, dequantize(codes, scales, block, x.dtype))
