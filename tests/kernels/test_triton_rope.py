"""The fused q/k-norm + RoPE + KV-store kernel against the unfused torch modules.

Runs under the Triton interpreter on CPU (tiny shapes) and, marked gpu, on the device in bf16.
"""
import os

import pytest
import torch

from nanovllm.kernels.torch_ref import store_kvcache_torch
from nanovllm.layers.attention_backend import norm_and_rotate
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.rotary_embedding import RotaryEmbedding

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _case(num_tokens, heads, kv_heads, head_dim, dtype, device, with_norm, block_size=16,
          seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = num_tokens // block_size + 2  # room for every token's slot
    width = (heads + 2 * kv_heads) * head_dim
    # q/k/v as views of one fused projection output: a token stride wider than the heads.
    qkv = torch.randn(num_tokens, width, generator=g).to(dtype).to(device)
    q = qkv[:, : heads * head_dim].view(-1, heads, head_dim)
    k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(-1, kv_heads, head_dim)
    positions = torch.randint(0, 500, (num_tokens,), generator=g).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens].int()
    slots[::3] = -1  # padding rows write nowhere
    rope = RotaryEmbedding(head_dim, 512, 1e6).to(device)
    norms = (None, None)
    if with_norm:
        norms = tuple(RMSNorm(head_dim, 1e-6).to(device=device, dtype=dtype) for _ in range(2))
        for n in norms:
            n.weight.data = (1 + 0.5 * torch.randn(head_dim, generator=g)).to(dtype).to(device)
    caches = [torch.full((num_blocks, block_size, kv_heads, head_dim), 3.0, dtype=dtype,
                         device=device) for _ in range(2)]
    return q, k, v, positions, slots.to(device), rope, norms, caches


def _check(num_tokens, heads, kv_heads, head_dim, dtype, device, with_norm, rtol, atol,
           mix=False):
    from nanovllm.kernels.triton_rope import norm_rope_store

    q, k, v, pos, slots, rope, (qn, kn), (kc, vc) = _case(num_tokens, heads, kv_heads, head_dim,
                                                          dtype, device, with_norm)
    ref_q, ref_k = norm_and_rotate(q, k, pos, rope, qn, kn, mix)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    store_kvcache_torch(ref_k, v, ref_kc, ref_vc, slots)
    weights = (qn.weight, kn.weight, qn.eps) if with_norm else (None, None, 0.0)
    out_q, out_k = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, *weights, kc, vc, slots,
                                   return_k=True, mix=mix)
    for got, want in ((out_q, ref_q), (out_k, ref_k), (kc, ref_kc), (vc, ref_vc)):
        assert got.dtype == want.dtype and got.shape == want.shape
        # Elementwise: the two paths may round intermediate values differently (torch.compile
        # keeps fused intermediates in fp32), a unit or two of the dtype's last place.
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
    assert torch.equal(vc, ref_vc)  # v is copied, never rounded
    # Without return_k only q comes back, and the cache is written the same way.
    kc2, vc2 = torch.full_like(kc, 3.0), torch.full_like(vc, 3.0)
    q2 = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, *weights, kc2, vc2, slots, mix=mix)
    # Two compiled variants may contract multiply-adds differently: close, not bitwise.
    for got, want in ((q2, ref_q), (kc2, ref_kc)):
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
    assert torch.equal(vc2, ref_vc)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (3, 1, 8), (2, 2, 32)])
def test_norm_rope_store_interpreter(heads, kv_heads, head_dim, with_norm):
    _check(7, heads, kv_heads, head_dim, torch.float32, "cpu", with_norm, 1e-5, 1e-5)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("split_max", [0, 1 << 20])
def test_norm_rope_store_one_or_two_programs_a_token(split_max, monkeypatch):
    """q and k/v in one program per token or in two (triton_rope.SPLIT_QK_MAX_TOKENS)."""
    from nanovllm.kernels import triton_rope

    monkeypatch.setattr(triton_rope, "SPLIT_QK_MAX_TOKENS", split_max)
    _check(5, 4, 2, 16, torch.float32, "cpu", True, 1e-5, 1e-5)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (3, 1, 16)])
def test_norm_rope_store_mix_interpreter(heads, kv_heads, head_dim):
    """q and k multiplied by the Hadamard matrix after RoPE, as hadamard_mix does."""
    _check(5, heads, kv_heads, head_dim, torch.float32, "cpu", True, 1e-5, 1e-5, mix=True)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
def test_norm_rope_store_rejects_odd_head_dim():
    from nanovllm.kernels.triton_rope import norm_rope_store

    q, k, v, pos, slots, rope, _, (kc, vc) = _case(2, 2, 1, 12, torch.float32, "cpu", False)
    with pytest.raises(ValueError, match="head_dim"):
        norm_rope_store(q, k, v, pos, rope.cos_sin_cache, None, None, 0.0, kc, vc, slots)


@pytest.mark.gpu
# bf16: the compiled torch path keeps fused intermediates in fp32 while the kernel rounds them
# as eager torch does, so values may differ by a unit or two in the last place (0.03 at |x| ~ 4;
# measured worst 0.021); a wrong rotation or norm is off by O(1).
@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float32, 1e-5, 1e-5),
                                             (torch.bfloat16, 2 ** -6, 2 ** -4)])
@pytest.mark.parametrize("num_tokens", [1, 37, 4096])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 8, 128), (32, 4, 64), (5, 1, 128)])
def test_norm_rope_store_gpu(num_tokens, heads, kv_heads, head_dim, dtype, rtol, atol):
    for with_norm, mix in ((True, False), (False, False), (True, True)):
        _check(num_tokens, heads, kv_heads, head_dim, dtype, "cuda", with_norm, rtol, atol, mix)
