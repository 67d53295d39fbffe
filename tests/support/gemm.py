"""Weights and the fp32 oracle of the GEMM kernel tests (tests/kernels/test_*_gemm.py)."""
import torch
import torch.nn.functional as F

from nanovllm.kernels._common import INTERPRET
from nanovllm.layers.quant.fp8 import FP8, dequantize, quantize_rows


def make_weight(n: int, k: int, kind: str, block=(32, 48), seed: int = 0, device="cpu"):
    """(weight, scale, block) of one kind: 'bf16', 'fp32', 'fp8_row' or 'fp8_block'."""
    g = torch.Generator(device).manual_seed(seed)  # on the device: LM heads are 600M values
    w = torch.randn(n, k, generator=g, device=device) / k ** 0.5
    if kind in ("bf16", "fp32"):
        return w.to(torch.bfloat16 if kind == "bf16" else torch.float32), None, None
    if kind == "fp8_row":
        return (*quantize_rows(w), None)
    q = (w * 300).clamp(-448, 448).to(FP8)
    nb, kb = -(-n // block[0]), -(-k // block[1])
    s = torch.rand(nb, kb, generator=g, device=device) * 0.01 + 0.001
    return q, s, block


def reference(x, w, s, block, bias):
    """fp32 oracle: the dequantized weight (fp8) or the weight itself, fp32 matmul."""
    wf = w.float() if s is None else dequantize(w, s, block)
    return F.linear(x.float(), wf, None if bias is None else bias.float())


def check(y, ref, dtype):
    """y is the oracle rounded once to dtype (and fp32 summation order)."""
    assert y.dtype == dtype and y.shape == ref.shape
    scale = ref.abs().max().item() + 1e-6
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * scale)
    else:
        # One bf16 rounding: half a unit in the last place (2^-8 relative) on a GPU; the
        # interpreter truncates fp32 to bf16 (Triton 3.9), up to a whole unit.
        rtol = 2 ** -7 if INTERPRET else 2 ** -8
        torch.testing.assert_close(y.float(), ref, rtol=rtol, atol=1e-5 * scale)
