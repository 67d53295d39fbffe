"""The fused RoPE store with Hadamard mixing into 8-bit caches, at the supported models' head
shapes on a GPU: its q and k against the torch path's, and the cache's K dequantized against
its k. (Written when SmolLM2's int8-cache decode drifted on an H200; the stager was at fault,
not the mix: docs/PERF_NOTES.md, forty-eighth session.)
Run them under NANOVLLM_FWHT=1 and =0 (hadamard.FWHT is read once, at import)."""
import pytest
import torch

from nanovllm.layers.attention_backend import norm_and_rotate
from nanovllm.layers.rotary_embedding import RotaryEmbedding
from tests.support.markers import on_gpu

# (heads, kv heads, head_dim): SmolLM2-135M, Qwen2.5-0.5B, Qwen3-0.6B / 8B, Llama-3.2-1B.
SHAPES = [(9, 3, 64), (14, 2, 64), (16, 8, 128), (32, 8, 128), (32, 8, 64)]


def _case(tokens, heads, kv_heads, head_dim, dtype, kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g) * 4
    # A few large channels, as real keys have (what the mixing spreads out).
    qkv[:, ::37] *= 20
    qkv = qkv.to(dtype).cuda()
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    pos = torch.randint(0, 500, (tokens,), generator=g).cuda()
    blocks, bs = 4, 256
    slots = torch.randperm(blocks * bs, generator=g)[:tokens].int().cuda()
    cache_dtype = torch.int8 if kind == "int8" else torch.float8_e4m3fn
    kc, vc = (torch.zeros(blocks, bs, kv_heads, head_dim, dtype=cache_dtype, device="cuda")
              for _ in range(2))
    if kind == "int8":  # row scales, head-major as the engine keeps them
        ks, vs = (torch.zeros(blocks, kv_heads, bs, device="cuda").transpose(1, 2)
                  for _ in range(2))
    else:
        ks, vs = (torch.ones(kv_heads, device="cuda") for _ in range(2))
    return q, k, v, pos, slots, kc, vc, ks, vs


@on_gpu
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES)
def test_gpu_mixed_store_matches_torch(heads, kv_heads, head_dim, dtype, tokens, kind):
    """One token (q and k/v in programs of their own) and 37 (one program a token)."""
    from nanovllm.kernels.triton_rope import norm_rope_store

    q, k, v, pos, slots, kc, vc, ks, vs = _case(tokens, heads, kv_heads, head_dim, dtype, kind)
    rope = RotaryEmbedding(head_dim, 512, 1e5).cuda()
    ref_q, ref_k = norm_and_rotate(q, k, pos, rope, None, None, True)
    out_q, out_k = norm_rope_store(q, k, v, pos, rope.cos_sin_cache, None, None, 0.0, kc, vc,
                                   slots, return_k=True, k_scale=ks, v_scale=vs, mix=True)
    # bf16: a unit in the last place of a rotated value near 100 (0.5) differs where the two
    # paths contract differently, and mixing spreads it over the row; a wrong mix is off by
    # tens.
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=2 ** -5, atol=0.5)
    torch.testing.assert_close(out_q.float(), ref_q.float(), **tol)
    torch.testing.assert_close(out_k.float(), ref_k.float(), **tol)
    # The cache's K, dequantized, is the kernel's k within half a step of its rounding.
    blk, off = (slots // 256).long(), (slots % 256).long()
    codes = kc[blk, off].float()
    if kind == "int8":
        scale = ks[blk, off][..., None]
        assert ((codes * scale - out_k.float()).abs() <= 0.5 * scale * 1.001 + 1e-6).all()
        # Each row's largest |k| maps to code +-127.
        assert (codes.abs().amax(-1) == 127).all()
    else:
        deq = codes * ks[None, :, None]
        err = (deq - out_k.float()).abs()
        # e4m3 keeps 3 mantissa bits: half a step is 2^-4 of |k| (2^-10 in subnormals).
        assert (err <= 2 ** -4 * out_k.float().abs() * 1.001 + 2 ** -10).all()
