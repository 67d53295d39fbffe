"""Split-K partials handed to the RMSNorm (layers/split_k.py): the norm adds them in split order
and rounds as the unsplit matmul does, so its outputs are the bits of the norm over the summed
product; the decoder lets only o_proj and down_proj split; nothing splits on a CPU. The
kernels run under the Triton interpreter here and on the GPU (marked gpu)."""
import os

import pytest
import torch

from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.split_k import SplitSum, matmul

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _parts(splits, rows, n, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(splits, rows, n, generator=g) * 3).to(device)


def _check(device, dtype):
    n = 40 if device == "cpu" else 1024
    norm = RMSNorm(n, 1e-6).to(device)
    norm.weight.data = (1 + 0.3 * torch.randn(n)).to(device)
    for splits in (1, 2, 3, 8):
        parts = _parts(splits, 6, n, device, seed=splits)
        s = SplitSum(parts, dtype)
        total = sum(parts[1:], parts[0]).to(dtype)  # in split order, rounded once
        residual = torch.randn(6, n).to(device=device, dtype=dtype)
        got, got_res = norm(s, residual)
        want, want_res = norm(total, residual)
        assert torch.equal(got, want) and torch.equal(got_res, want_res)
        assert torch.equal(norm(s), norm(total))


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
def test_norm_adds_partials_in_order_interpreter():
    """Through the Triton kernel (the interpreter): the same bits as the norm over the total,
    with and without a residual, for 1-8 partials."""
    from nanovllm.kernels.triton_norm import rms_norm

    parts = _parts(3, 4, 16)
    norm_w = torch.ones(16)
    got = rms_norm(parts, norm_w, 1e-6, dtype=torch.float16)
    want = rms_norm(sum(parts[1:], parts[0]).to(torch.float16), norm_w, 1e-6)
    assert got.dtype == torch.float16 and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_norm_adds_partials_in_order(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _check("cuda", dtype)


def test_only_o_and_down_may_split():
    """DecoderLayer marks o_proj and down_proj (an RMSNorm follows each), nothing else."""
    from types import SimpleNamespace

    from nanovllm.layers.linear import RowParallelLinear
    from nanovllm.models.decoder import DecoderAttention, DecoderLayer, GatedMLP

    cfg = SimpleNamespace(head_dim=16, hidden_size=64, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e4,
                          rope_scaling=None, rms_norm_eps=1e-6, quantization=None)
    attn = DecoderAttention(cfg)
    mlp = GatedMLP(64, 128, cfg=cfg)
    assert not attn.o_proj.split_ok and not RowParallelLinear.split_ok
    DecoderLayer(cfg, attn, mlp)
    assert attn.o_proj.split_ok and mlp.down_proj.split_ok
    x = torch.randn(20, 64)
    assert matmul(attn.o_proj, x) is None  # no GPU here
    y = mlp.down_proj(torch.randn(20, 128))
    assert isinstance(y, torch.Tensor) and y.shape == (20, 64)
