"""W8A8 (kernels/fp8_w8a8.py): the per-token-group and per-token activation quantizers
against torch's rounding, the e4m3 x e4m3 GEMM and the row-wise torch._scaled_mm path
against the fp32 oracle of the same quantized operands; on CPU in the interpreter, marked gpu
on real shapes and prefill sizes."""
import pytest
import torch
import torch.nn.functional as F

from nanovllm.kernels.fp8_w8a8 import (GROUP, quantize_groups, quantize_tokens, rowwise_gemm,
                                       w8a8_gemm)
from nanovllm.layers.quant.fp8 import FP8, FP8_MAX, dequantize
from tests.support.gemm import check, make_weight

TINY = dict(BLOCK_M=16, BLOCK_N=16, GROUP_M=2, num_warps=1, num_stages=1)


def quantize_groups_ref(x: torch.Tensor, group: int = GROUP):
    """torch: per (row, group) scale amax / 448, values rounded to nearest even."""
    m, k = x.shape
    g = -(-k // group)
    xp = F.pad(x.float(), (0, g * group - k)).view(m, g, group)
    s = (xp.abs().amax(-1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (xp / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m, g * group)[:, :k]
    return q, s


def w8a8_ref(x, w, s, block, bias):
    """fp32 oracle on the quantized activations."""
    q, xs = quantize_groups_ref(x.reshape(-1, x.shape[-1]))
    xd = (q.float().view(q.shape[0], -1) * xs.repeat_interleave(GROUP, 1)[:, :q.shape[1]])
    return F.linear(xd, dequantize(w, s, block), None if bias is None else bias.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_groups_matches_torch(dtype):
    """Same bytes and scales as torch; a ragged last group; an all-zero group."""
    x = (torch.randn(5, 2 * GROUP + 40) * torch.logspace(-3, 2, 5)[:, None]).to(dtype)
    x[2, :GROUP] = 0
    q, s = quantize_groups(x)
    q_ref, s_ref = quantize_groups_ref(x)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.contiguous().view(torch.uint8))


def rowwise_ref(x, w, s, bias):
    """fp32 oracle on per-token quantized activations (one group = the whole row)."""
    x2 = x.reshape(-1, x.shape[-1])
    q, xs = quantize_groups_ref(x2, group=x2.shape[1])
    out = F.linear(q.float() * xs, dequantize(w, s, None), None if bias is None else bias.float())
    return out.view(*x.shape[:-1], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_tokens_matches_torch(dtype):
    """One scale per row, same bytes as torch; a row width that is no power of two; an
    all-zero row."""
    x = (torch.randn(5, 3 * 40) * torch.logspace(-3, 2, 5)[:, None]).to(dtype)
    x[2] = 0
    q, s = quantize_tokens(x)
    q_ref, s_ref = quantize_groups_ref(x, group=x.shape[1])
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.contiguous().view(torch.uint8))


@pytest.mark.parametrize("bias", [True, False])
def test_rowwise_matches_oracle(bias):
    """torch._scaled_mm on the quantized tokens and row-scaled weight, bias in x's dtype."""
    w, s, _ = make_weight(48, 80, "fp8_row", seed=3)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, 80, generator=g).to(torch.bfloat16)
    b = torch.randn(48, generator=g).to(torch.bfloat16) if bias else None
    y = rowwise_gemm(x, w, s, b)
    check(y.view(14, 48), rowwise_ref(x, w, s, b).view(14, 48), torch.bfloat16)


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,bias", [(3, 40, 2 * GROUP, True), (37, 33, GROUP + 50, False)])
def test_matches_oracle(kind, xdtype, m, n, k, bias):
    """Several row and column tiles (grouped ordering, ragged edges), even and ragged K."""
    w, s, block = make_weight(n, k, kind, block=(32, GROUP), seed=m)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(xdtype)
    b = torch.randn(n, generator=g) if bias else None
    y = w8a8_gemm(x, w, s, block, b, config=TINY)
    check(y, w8a8_ref(x, w, s, block, b), xdtype)


def test_close_to_weight_only():
    """Activation rounding costs a few percent at most against the W8A16 result."""
    w, s, block = make_weight(64, 3 * GROUP, "fp8_block", block=(32, GROUP))
    x = torch.randn(20, 3 * GROUP)
    y = w8a8_gemm(x, w, s, block, config=TINY)
    exact = F.linear(x, dequantize(w, s, block))
    assert (y - exact).norm() / exact.norm() < 0.05


def test_other_scale_blocks_refused():
    w, s, block = make_weight(32, 64, "fp8_block", block=(32, 32))
    with pytest.raises(NotImplementedError, match="128-wide"):
        w8a8_gemm(torch.randn(4, 64), w, s, block)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1024, 3072), (24576, 4096)])
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
def test_gpu_prefill_sizes(n, k, kind):
    w, s, block = make_weight(n, k, kind, block=(128, GROUP), device="cuda")
    bias = torch.randn(n, device="cuda")
    for m in (17, 1000):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y, ref = w8a8_gemm(x, w, s, block, bias), w8a8_ref(x, w, s, block, bias)
        # Hopper's fp8 tensor cores keep ~14 bits while summing a K tile (DeepSeek-V3, 3.3.2;
        # the kernel promotes to fp32 every 128 columns): measured ~1e-3 of the largest output
        # (H100) besides y's bf16 rounding.
        torch.testing.assert_close(y.float(), ref, rtol=2 ** -8,
                                   atol=2 ** -9 * ref.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1024, 3072), (6144, 1024), (24576, 4096)])
def test_gpu_rowwise_sizes(n, k):
    """Batched-decode and prefill row counts on Qwen3-0.6B / 8B shapes (row scales)."""
    w, s, _ = make_weight(n, k, "fp8_row", device="cuda")
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in (17, 256, 1000):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y, ref = rowwise_gemm(x, w, s, bias), rowwise_ref(x, w, s, bias)
        # fp8 tensor cores' reduced-precision sums as in test_gpu_prefill_sizes.
        torch.testing.assert_close(y.float(), ref, rtol=2 ** -8,
                                   atol=2 ** -9 * ref.abs().max().item())
