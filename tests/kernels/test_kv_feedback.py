"""kernels/kv_feedback.py: K rounded to e4m3 with GPTQ's error feedback against the queries'
second moments."""
import torch

from nanovllm.kernels.kv_feedback import feedback_factor, quantize_feedback
from nanovllm.kernels.torch_ref import dequantize, quantize

FP8 = torch.float8_e4m3fn


def make(t=64, hkv=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(t, hkv, d, generator=g) * 3
    scale = k.abs().amax(dim=(0, 2)) * 8 / 448  # the engine's margin-8 calibration
    return k, scale, g


def test_no_feedback_without_correlations():
    """A diagonal factor pushes no error anywhere: plain rounding, code for code."""
    k, scale, _ = make()
    factor = torch.eye(k.shape[-1]).expand(k.shape[1], -1, -1) * 0.7
    assert torch.equal(quantize_feedback(k, scale, factor).view(torch.uint8),
                       quantize(k, scale, FP8).view(torch.uint8))


def test_scores_err_less_on_anisotropic_queries():
    """Queries in a few directions (as attention's are): held-out queries' score errors
    E[(q.d)^2] fall well below plain rounding's, while every code stays a finite e4m3 value."""
    k, scale, g = make(t=256)
    hq, d = 4, k.shape[-1]
    basis = torch.randn(2, 3, d, generator=g)  # a 3-direction subspace per kv head

    def queries(n):
        z = torch.randn(n, 2, 2, 3, generator=g)  # [T, Hkv, G, 3]
        return (torch.einsum("tkgr,krd->tkgd", z, basis)
                + 0.05 * torch.randn(n, 2, 2, d, generator=g)).reshape(n, hq, d)

    factor = feedback_factor(queries(512), num_kv_heads=2)
    fb = quantize_feedback(k, scale, factor)
    assert torch.isfinite(fb.float()).all()
    q = queries(512).view(512, 2, 2, d)
    plain = dequantize(quantize(k, scale, FP8), scale) - k
    fed = dequantize(fb, scale) - k

    def score_err(delta):  # mean over queries, keys and heads of (q . delta)^2
        return torch.einsum("qkgd,tkd->qtkg", q, delta).pow(2).mean()

    assert score_err(fed) < 0.6 * score_err(plain)
