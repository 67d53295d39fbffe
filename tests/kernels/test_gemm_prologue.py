"""The skinny GEMM's prologues (kernels/gemm_prologue.py) against the unfused torch path: the
residual add + RMSNorm of layers/layernorm.py, or SiluAndMul's silu(gate) * up, then the
fp32 oracle matmul (tests/support/gemm.py).

Tolerance: the fused kernel rounds the activation differently from the unfused path (the norm
rounds h * g once where the unfused path rounds h * rstd and then its product with g; silu's
exp may differ by an ulp), so each activation element may differ by a few units of the model
dtype's rounding u (2^-8 for bf16, 2^-7 in the interpreter, which truncates; for fp32 2^-17,
which also covers fp32 summation order over the real models' K on a GPU).
The test bound per output is that, summed over K with the weights' magnitudes, plus y's own
rounding: |y - ref| <= 3u * (|a| @ |W|^T) + u * |ref|, a the unfused activation (in the
interpreter the new residual itself is one truncation off, inside the same bound). The
interpreter cases use 0.3-0.5 of it; a wrong rstd, a missing g or a lost split's sum of
squares miss it by far (checked by breaking each).
"""
import pytest
import torch
import torch.nn.functional as F

from nanovllm.kernels import skinny_config
from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.skinny_gemm import gemm
from nanovllm.layers.layernorm import _add_rms_norm, _rms_norm
from nanovllm.layers.quant.fp8 import dequantize
from nanovllm.utils.model_shapes import SHAPES, linear_shapes
from tests.support.gemm import make_weight

TINY = dict(BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1)
EPS = 1e-6


def _inputs(m, k, xdtype, seed, device="cpu", packed=False):
    """(x or a packed gate_up, residual, norm weight) on the scale of real activations."""
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(m, 2 * k if packed else k, generator=g)
    r = 3 * torch.randn(m, k, generator=g)
    nw = 1 + 0.5 * torch.randn(k, generator=g)
    return x.to(xdtype).to(device), r.to(xdtype).to(device), nw.to(xdtype).to(device)


def _check(y, a, w, s, block, bias=None):
    """y against the oracle matmul of the unfused activation a, within the bound above."""
    wf = (w.float() if s is None else dequantize(w, s, block)).to(a.device)
    ref = F.linear(a.float(), wf, None if bias is None else bias.float())
    if a.dtype == torch.float32:
        u = 2 ** -17
    else:
        u = 2 ** -7 if INTERPRET else 2 ** -8
    bound = 3 * u * (a.float().abs() @ wf.abs().T) + u * ref.abs() + 1e-6
    assert y.dtype == a.dtype and y.shape == ref.shape
    err = (y.float() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, excess {(err - bound).max():.3g}"


def _check_residual(res, want):
    """The new residual is the unfused one bit for bit (one rounding of an exact fp32 sum),
    but in the interpreter, whose bf16 casts truncate: there within one unit."""
    if INTERPRET and res.dtype == torch.bfloat16:
        torch.testing.assert_close(res, want, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(res, want)


# (m, n, k, split): N and K ragged over 16-wide tiles; splits of whole K tiles, the last
# one partial (72 = 32 + 32 + 8).
SHAPES_TINY = [(1, 40, 72, 1), (5, 40, 72, 3), (16, 33, 64, 2), (16, 48, 100, 4)]
KINDS = ["bf16", "fp8_row", "fp8_block"]


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n,k,split", SHAPES_TINY)
def test_add_rms_norm(kind, xdtype, m, n, k, split):
    """(y, x + r) = gemm(x, W, norm_weight, residual): the new residual is the unfused one
    bit for bit, y the matmul of the unfused norm's output."""
    w, s, block = make_weight(n, k, kind, seed=m)
    x, r, nw = _inputs(m, k, xdtype, seed=m)
    a, want_res = _add_rms_norm(x, r, nw, EPS)
    bias = torch.randn(n) if m % 2 else None
    y, res = gemm(x, w, bias, s, block, config=dict(TINY, SPLIT_K=split), norm_weight=nw,
                  residual=r, eps=EPS)
    _check_residual(res, want_res)
    _check(y, a, w, s, block, bias)


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m,n,k,split", SHAPES_TINY[:2])
def test_rms_norm_without_residual(kind, m, n, k, split):
    """norm_weight alone: y = RMSNorm(x) @ W^T (a model's first layer has no residual)."""
    w, s, block = make_weight(n, k, kind, seed=m)
    x, _, nw = _inputs(m, k, torch.bfloat16, seed=m)
    y = gemm(x, w, None, s, block, config=dict(TINY, SPLIT_K=split), norm_weight=nw, eps=EPS)
    _check(y, _rms_norm(x, nw, EPS), w, s, block)


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n,k,split", SHAPES_TINY)
def test_silu_mul(kind, xdtype, m, n, k, split):
    """gemm(gate_up, W, act='silu_mul') is SiluAndMul's output times W^T."""
    w, s, block = make_weight(n, k, kind, seed=m)
    x, _, _ = _inputs(m, k, xdtype, seed=m, packed=True)
    gate, up = x.chunk(2, -1)
    y = gemm(x, w, None, s, block, config=dict(TINY, SPLIT_K=split), act="silu_mul")
    _check(y, F.silu(gate) * up, w, s, block)


def test_leading_dims_strided_and_counters():
    """x with leading dims and a row stride: y and the residual keep x's shape; two calls give
    the same bits (split order) and leave the split-K counters at zero."""
    w, s, block = make_weight(24, 40, "fp8_block", block=(16, 16))
    wide, r, nw = _inputs(6, 56, torch.bfloat16, seed=3)
    x = wide[:, 8:48].view(2, 3, 40)
    r, nw = r[:, :40].reshape(2, 3, 40), nw[:40]
    cfg = dict(TINY, SPLIT_K=3)
    y, res = gemm(x, w, None, s, block, config=cfg, norm_weight=nw, residual=r, eps=EPS)
    assert y.shape == (2, 3, 24) and res.shape == (2, 3, 40)
    a, want_res = _add_rms_norm(x, r, nw, EPS)
    _check_residual(res, want_res)
    _check(y.view(6, 24), a.view(6, 40), w, s, block)
    y2, _ = gemm(x, w, None, s, block, config=cfg, norm_weight=nw, residual=r, eps=EPS)
    assert torch.equal(y, y2)
    _, counters = skinny_config._WORKSPACE[x.device]
    assert not counters.any()


def test_empty_rows_and_bad_arguments():
    w, _, _ = make_weight(16, 32, "bf16")
    x, r, nw = torch.empty(0, 32), torch.empty(0, 32), torch.ones(32)
    y, res = gemm(x, w, norm_weight=nw, residual=r)
    assert y.shape == (0, 16) and res.shape == (0, 32)
    with pytest.raises(ValueError, match="act"):
        gemm(x, w, act="gelu")
    with pytest.raises(ValueError, match="one prologue"):
        gemm(x, w, norm_weight=nw, act="silu_mul")
    with pytest.raises(ValueError, match="residual"):
        gemm(x, w, residual=r)


# ---- GPU: every supported model's layers a prologue feeds ---------------------------------

# The norm feeds qkv and gate_up (K = hidden), silu_mul feeds down (K = intermediate).
GPU_CASES = sorted({(layer, nk, kind) for name in SHAPES
                    for layer, nk in linear_shapes(name).items()
                    if layer in ("qkv", "gate_up", "down")
                    for kind in KINDS})


@pytest.mark.gpu
@pytest.mark.parametrize("layer,nk,kind", GPU_CASES)
def test_gpu_model_shapes(layer, nk, kind):
    """Real shapes with the table's configs (splits included), bf16 activations, M = 1..16."""
    n, k = nk
    w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
    for m in (1, 5, 16):
        x, r, nw = _inputs(m, k, torch.bfloat16, seed=m, device="cuda",
                           packed=layer == "down")
        if layer == "down":
            gate, up = x.chunk(2, -1)
            _check(gemm(x, w, None, s, block, act="silu_mul"), F.silu(gate) * up, w, s, block)
        else:
            a, want_res = _add_rms_norm(x, r, nw, EPS)
            y, res = gemm(x, w, None, s, block, norm_weight=nw, residual=r, eps=EPS)
            _check_residual(res, want_res)
            _check(y, a, w, s, block)
    torch.cuda.synchronize()
    _, counters = skinny_config._WORKSPACE.get(w.device, (None, torch.zeros(1)))
    assert not counters.any()


@pytest.mark.gpu
def test_gpu_fp32_activations():
    """An fp32 model's path (fp32 x, fp32 weights: ieee dots) on Qwen3-0.6B's qkv shape."""
    n, k = 4096, 1024
    w, _, _ = make_weight(n, k, "fp32", device="cuda")
    x, r, nw = _inputs(3, k, torch.float32, seed=0, device="cuda")
    a, want_res = _add_rms_norm(x, r, nw, EPS)
    y, res = gemm(x, w, norm_weight=nw, residual=r, eps=EPS)
    _check_residual(res, want_res)
    _check(y, a, w, None, None)
