"""The RMSNorm and SwiGLU Triton kernels against the layers' torch path.

Runs under the Triton interpreter on CPU (small shapes) and, marked gpu, on the device with the
hidden sizes of the supported models.
"""
import os

import pytest
import torch
import torch.nn.functional as F

from nanovllm.kernels.triton_norm import rms_norm, silu_and_mul
from nanovllm.layers.layernorm import _add_rms_norm, _rms_norm

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _inputs(rows, n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, res = (3 * torch.randn(rows, n, generator=g) for _ in range(2))
    w = 1 + 0.5 * torch.randn(n, generator=g)
    return [t.to(dtype).to(device) for t in (x, res, w)]


def _check_norm(rows, n, dtype, device, ulps):
    x, res, w = _inputs(rows, n, dtype, device)
    # A strided view (every other row) as the models' split outputs can be.
    xs = torch.cat([x, x]).view(2, rows, n).transpose(0, 1)[:, 0]
    for inp in (x, xs):
        want = _rms_norm(inp, w, 1e-6)
        got = rms_norm(inp, w, 1e-6)
        torch.testing.assert_close(got, want, rtol=ulps, atol=ulps)
    want_out, want_res = _add_rms_norm(x, res, w, 1e-6)
    got_out, got_res = rms_norm(x, w, 1e-6, residual=res)
    assert torch.equal(got_res, want_res)  # one rounding of an exact fp32 sum
    torch.testing.assert_close(got_out, want_out, rtol=ulps, atol=ulps)


def _check_swiglu(rows, d, dtype, device, ulps):
    x, _, _ = _inputs(rows, 2 * d, dtype, device)
    gate, up = x.chunk(2, -1)
    torch.testing.assert_close(silu_and_mul(x), F.silu(gate) * up, rtol=ulps, atol=ulps)
    three_d = x.view(rows, 1, 2 * d)  # leading dims are kept
    assert silu_and_mul(three_d).shape == (rows, 1, d)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("n", [8, 40])
def test_rms_norm_interpreter(n):
    _check_norm(5, n, torch.float32, "cpu", 1e-5)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
def test_silu_and_mul_interpreter():
    _check_swiglu(3, 24, torch.float32, "cpu", 1e-5)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
def test_no_rows():
    x = torch.empty(0, 8)
    assert rms_norm(x, torch.ones(8), 1e-6).shape == (0, 8)
    assert silu_and_mul(x).shape == (0, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [576, 896, 1024, 2048, 4096])
@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_norm_kernels_gpu(n, dtype, ulps):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for rows in (1, 7, 300):
        _check_norm(rows, n, dtype, "cuda", ulps)
        _check_swiglu(rows, n, dtype, "cuda", ulps)
