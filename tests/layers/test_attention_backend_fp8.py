"""A prefill over an fp8 cache attends to its own new K/V unquantized (torch path, CPU)."""
import torch

from nanovllm.kernels.torch_ref import prefill_attention_torch, quantize
from nanovllm.layers.attention_backend import TorchBackend, chunk_as_cache, exact_chunk
from nanovllm.utils.context import Context
from tests.support.paged import make_paged_case, naive_attention, rel_err


def fp8_case(seqs, seed=0):
    """A paged case whose cache holds e4m3 values with per-kv-head scales, and its context."""
    c = make_paged_case(seqs, 16, 4, 2, 16, seed=seed)
    c.k_scale, c.v_scale = torch.tensor([0.01, 0.03]), torch.tensor([0.02, 0.005])
    for name, scale in (("k_cache", c.k_scale), ("v_cache", c.v_scale)):
        cache = getattr(c, name)
        setattr(c, name, quantize(cache.flatten(0, 1), scale, torch.float8_e4m3fn).view(
            cache.shape))
    c.ctx = Context(is_prefill=True, cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
                    max_seqlen_q=c.max_seqlen_q, max_seqlen_k=c.max_seqlen_k,
                    block_tables=c.block_tables,
                    has_cached_context=any(sq < sk for sq, sk in seqs))
    return c


def test_plain_prefill_attends_to_its_unquantized_kv():
    c = fp8_case([(20, 20), (1, 1), (37, 37)])
    k, v = torch.cat(c.ks), torch.cat(c.vs)  # this step's own K/V, as the layer holds them
    o = TorchBackend().prefill(c.q, k, v, c.k_cache, c.v_cache, c.ctx, c.scale, c.k_scale,
                               c.v_scale)
    # Exact up to fp32 summation order; reading the e4m3 cache back gives ~3% here.
    assert rel_err(o, naive_attention(c)) < 1e-5


def test_prefill_over_cached_tokens_reads_the_fp8_cache():
    c = fp8_case([(20, 20), (5, 37)])
    assert not exact_chunk(c.ctx, c.k_scale)
    o = TorchBackend().prefill(c.q, None, None, c.k_cache, c.v_cache, c.ctx, c.scale,
                               c.k_scale, c.v_scale)
    ref = prefill_attention_torch(c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k,
                                  c.block_tables, c.scale, c.k_scale, c.v_scale)
    assert torch.equal(o, ref)


def test_exact_chunk_only_for_fp8_prefill_without_cached_tokens():
    scale = torch.ones(2)
    assert exact_chunk(Context(is_prefill=True), scale)
    assert not exact_chunk(Context(is_prefill=True), None)  # a model-dtype cache
    assert not exact_chunk(Context(is_prefill=False), scale)
    assert not exact_chunk(Context(is_prefill=True, has_cached_context=True), scale)


def test_chunk_as_cache_maps_each_sequence_to_its_tokens():
    k = torch.arange(6.0).view(6, 1, 1).expand(6, 2, 4)
    v = -k
    ctx = Context(is_prefill=True, cu_seqlens_q=torch.tensor([0, 2, 6], dtype=torch.int32),
                  max_seqlen_q=4)
    kc, vc, tables = chunk_as_cache(k, v, ctx)
    assert kc.shape == vc.shape == (6, 1, 2, 4) and kc.stride() == vc.stride()
    assert tables.tolist() == [[0, 1, 2, 3], [2, 3, 4, 5]]
    assert torch.equal(kc[tables[1].long(), 0], k[2:6])


def test_hadamard_mix_keeps_dot_products_and_spreads_spiky_keys():
    from nanovllm.layers.kv_mix import hadamard_mix

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
    # A few large channels in both, as RoPE's slow channels give real queries and keys.
    q[:, :4] *= 10
    k[:, :4] *= 30
    assert torch.allclose(hadamard_mix(q) @ hadamard_mix(k).T, q @ k.T, rtol=1e-4, atol=1e-3)

    def fp8_dot_error(qq, kk):
        kq = kk.to(torch.float8_e4m3fn).float()
        return ((qq @ kq.T) - (qq @ kk.T)).abs().mean()
    # Rounding errors of the spread key average out in the dot products.
    assert fp8_dot_error(hadamard_mix(q), hadamard_mix(k)) < 0.5 * fp8_dot_error(q, k)
