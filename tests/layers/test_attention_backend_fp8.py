"""A prefill over an fp8 cache attends to its own new K/V unquantized (torch path, CPU); the
Triton backend with transposed V pages gives what the usual layout gives (interpreter)."""
import torch

from nanovllm.kernels.torch_ref import prefill_attention_torch, quantize
from nanovllm.layers.attention_backend import TorchBackend, chunk_as_cache, exact_chunk
from nanovllm.utils.context import Context
from tests.support.markers import needs_interpreter
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
    from nanovllm.layers.attention_backend import hadamard_mix

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


@needs_interpreter
def test_triton_backend_gives_transposed_v_pages_to_every_kernel():
    # NANOVLLM_KV_V_T's backend: with v_transposed its store, prefill over cached tokens and
    # decode take V's pages as [kv head, dim, slot] and give what the usual layout gives.
    from nanovllm.layers.attention_backend import TritonBackend

    plain, flipped = TritonBackend(), TritonBackend()
    flipped.v_transposed = True
    t = lambda cache: cache.permute(0, 2, 3, 1).contiguous()  # noqa: E731
    c = fp8_case([(20, 20), (5, 37)], seed=2)
    args = (c.ctx, c.scale, c.k_scale, c.v_scale)
    o = plain.prefill(c.q, None, None, c.k_cache, c.v_cache, *args)
    assert torch.allclose(flipped.prefill(c.q, None, None, c.k_cache, t(c.v_cache), *args), o)
    d = fp8_case([(1, 40), (1, 7)], seed=3)
    ctx = Context(context_lens=d.cu_seqlens_k.diff().int(), block_tables=d.block_tables)
    o = plain.decode(d.q, d.k_cache, d.v_cache, ctx, d.scale, d.k_scale, d.v_scale)
    assert torch.allclose(flipped.decode(d.q, d.k_cache, t(d.v_cache), ctx, d.scale, d.k_scale,
                                         d.v_scale), o)
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(3, 2, 16, generator=g), torch.randn(3, 2, 16, generator=g)
    store = Context(slot_mapping=torch.tensor([4, -1, 33], dtype=torch.int32))
    kc, vc = d.k_cache.clone(), d.v_cache.clone()
    plain.store_kv(k, v, kc, vc, store, d.k_scale, d.v_scale)
    kt, vt = d.k_cache.clone(), t(d.v_cache)
    flipped.store_kv(k, v, kt, vt, store, d.k_scale, d.v_scale)
    bits = lambda x: x.view(torch.uint8)  # noqa: E731 (NaN != NaN: compare the bytes)
    assert torch.equal(bits(kt), bits(kc)) and torch.equal(bits(vt), bits(t(vc)))
