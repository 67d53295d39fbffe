"""kernels/hadamard.mix_halves (butterflies) against kv_mix.hadamard_mix.

Runs under the Triton interpreter on CPU and, marked gpu, on the device.
"""
import os

import pytest
import torch
import triton
import triton.language as tl

from nanovllm.kernels.hadamard import mix_halves
from nanovllm.layers.kv_mix import hadamard_mix

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _mix_kernel(x_ptr, y_ptr, R: tl.constexpr, HALF: tl.constexpr, LOG2_HALF: tl.constexpr,
                BUTTERFLIES: tl.constexpr):
    rows = tl.arange(0, R)[:, None] * (2 * HALF)
    offs = tl.arange(0, HALF)[None, :]
    x1 = tl.load(x_ptr + rows + offs).to(tl.float32)
    x2 = tl.load(x_ptr + rows + HALF + offs).to(tl.float32)
    y1, y2 = mix_halves(x1, x2, x_ptr.dtype.element_ty, HALF, LOG2_HALF, "ieee", BUTTERFLIES)
    tl.store(y_ptr + rows + offs, y1)
    tl.store(y_ptr + rows + HALF + offs, y2)


def _mixed(x: torch.Tensor, butterflies: bool = True) -> torch.Tensor:
    """x [R, D] through mix_halves (butterflies or the dots), fp32 out."""
    rows, d = x.shape
    y = torch.empty(rows, d, dtype=torch.float32, device=x.device)
    _mix_kernel[(1,)](x, y, R=rows, HALF=d // 2, LOG2_HALF=(d // 2).bit_length() - 1,
                      BUTTERFLIES=butterflies)
    return y


@pytest.mark.skipif(not INTERPRET, reason="interpreter (CPU)")
@pytest.mark.parametrize("rows,d", [(1, 32), (2, 64), (16, 128), (4, 256)])
def test_butterflies_equal_the_hadamard_product(rows, d):
    """Rows of 32-256 dims, one row too (no padding to the dots' 16): within fp32 rounding of
    the fp32 product, and orthonormal (norms kept)."""
    x = torch.randn(rows, d, generator=torch.Generator().manual_seed(d))
    y = _mixed(x)
    torch.testing.assert_close(y, hadamard_mix(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.norm(dim=1), x.norm(dim=1), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# Every tile the fused store and the layer kernel mix: q and k rows of each model's heads.
@pytest.mark.parametrize("rows,d", [(1, 64), (2, 64), (4, 64), (16, 64), (1, 128), (2, 128),
                                    (8, 128), (16, 128), (32, 64)])
def test_gpu_butterflies_equal_the_hadamard_product(rows, d):
    """bf16 rows on the GPU: the same values as the fp32 product of the bf16 inputs (and the
    dots', ieee, at 16 rows and more)."""
    x = (torch.randn(rows, d, device="cuda") * 30).to(torch.bfloat16)
    want = hadamard_mix(x.float())
    torch.testing.assert_close(_mixed(x), want, rtol=1e-5, atol=1e-4)
    if rows >= 16:
        torch.testing.assert_close(_mixed(x, butterflies=False), want, rtol=1e-5, atol=1e-4)
