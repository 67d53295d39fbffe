"""fp8 KV cache: the Triton store kernels quantize exactly as the torch reference does, and
the Triton decode/prefill kernels read the same quantized cache as the reference does
(TRITON_INTERPRET=1 on CPU, tiny fp32 shapes)."""
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests need TRITON_INTERPRET=1 (set by tests/conftest.py without CUDA)",
                allow_module_level=True)

from nanovllm.kernels.torch_ref import (decode_attention_torch, prefill_attention_torch,  # noqa: E402
                                        quantize, store_kvcache_torch)
from nanovllm.kernels import triton_decode  # noqa: E402
from nanovllm.kernels.triton_decode import decode_attention  # noqa: E402
from nanovllm.kernels.triton_kv import store_kvcache  # noqa: E402
from nanovllm.kernels.triton_prefill import prefill_attention  # noqa: E402
from nanovllm.kernels.triton_rope import norm_rope_store  # noqa: E402
from tests.support.paged import make_paged_case, naive_attention, rel_err  # noqa: E402

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
TOL = 1e-4  # same quantized cache, fp32 arithmetic: only summation order differs


def quantized_case(case, dtype, seed=0):
    """The case's cache re-stored as `dtype` with random per-head scales; its NaN slots (never
    to be read) stay NaN."""
    g = torch.Generator().manual_seed(seed)
    hkv = case.k_cache.shape[2]
    case.k_scale = 0.01 + torch.rand(hkv, generator=g) * 0.05
    case.v_scale = 0.01 + torch.rand(hkv, generator=g) * 0.05
    flat = case.k_cache.shape[0] * case.k_cache.shape[1]
    case.k_cache = quantize(case.k_cache.view(flat, hkv, -1), case.k_scale, dtype).view(
        case.k_cache.shape)
    case.v_cache = quantize(case.v_cache.view(flat, hkv, -1), case.v_scale, dtype).view(
        case.v_cache.shape)
    return case


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", FP8)
def test_store_matches_reference_bytes(dtype):
    # Values across the whole range (subnormals, round-ups into the next binade, clamping).
    g = torch.Generator().manual_seed(0)
    k = torch.randn(24, 2, 16, generator=g) * torch.logspace(-5, 3, 16)
    v = -k.flip(0) * 3
    slots = torch.tensor([5, -1, 16, 47] + list(range(20, 40)), dtype=torch.int32)
    ks, vs = torch.tensor([0.5, 0.03]), torch.tensor([1.0, 0.007])
    out = [torch.zeros(3, 16, 2, 16, dtype=dtype) for _ in range(4)]
    store_kvcache(k, v, out[0], out[1], slots, ks, vs)
    store_kvcache_torch(k, v, out[2], out[3], slots, ks, vs)
    assert same_bytes(out[0], out[2]) and same_bytes(out[1], out[3])


def test_fused_rope_store_quantizes_like_reference():
    g = torch.Generator().manual_seed(1)
    t, hq, hkv, d = 6, 4, 2, 16
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    pos = torch.arange(t)
    cos_sin = torch.randn(16, 1, d, generator=g)
    slots = torch.tensor([3, 9, -1, 17, 30, 0], dtype=torch.int32)
    ks, vs = torch.tensor([0.01, 0.02]), torch.tensor([0.004, 0.05])
    kc, vc = (torch.zeros(2, 16, hkv, d, dtype=torch.float8_e4m3fn) for _ in range(2))
    _, k_rot = norm_rope_store(q, k, v, pos, cos_sin, None, None, 0.0, kc, vc, slots,
                               return_k=True, k_scale=ks, v_scale=vs)
    rk, rv = torch.zeros_like(kc), torch.zeros_like(vc)
    store_kvcache_torch(k_rot, v, rk, rv, slots, ks, vs)
    assert same_bytes(kc, rk) and same_bytes(vc, rv)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_fp8(dtype, num_splits):
    c = quantized_case(make_paged_case([(1, 40), (1, 7), (1, 1)], 16, 4, 2, 16, seed=4), dtype)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables,
                                 c.scale, c.k_scale, c.v_scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                         num_splits=num_splits, k_scale=c.k_scale, v_scale=c.v_scale)
    assert rel_err(o, ref) < TOL


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill_fp8(dtype):
    # Plain prefill, a prefix hit and a chunk, GQA 2.
    c = make_paged_case([(20, 20), (5, 37), (7, 39)], 16, 4, 2, 16, seed=3)
    exact = naive_attention(c)
    c = quantized_case(c, dtype)
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    ref = prefill_attention_torch(*args, c.k_scale, c.v_scale)
    o = prefill_attention(*args, c.max_seqlen_q, k_scale=c.k_scale, v_scale=c.v_scale)
    assert rel_err(o, ref) < TOL
    # And the quantized cache stays close to exact attention: e4m3 rounds to 3 mantissa bits.
    assert rel_err(ref, exact) < (0.05 if dtype == torch.float8_e4m3fn else 0.1)


def test_fp8_cache_without_scales_is_refused():
    c = quantized_case(make_paged_case([(1, 5)], 16, 2, 2, 16), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale"):
        decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)


@pytest.mark.usefixtures("poisoned_empty")
def test_triton_backend_prefill_attends_to_its_unquantized_kv():
    from nanovllm.layers.attention_backend import TritonBackend
    from nanovllm.utils.context import Context

    c = quantized_case(make_paged_case([(20, 20), (1, 1), (37, 37)], 16, 4, 2, 16, seed=5),
                       torch.float8_e4m3fn)
    ctx = Context(is_prefill=True, cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
                  max_seqlen_q=c.max_seqlen_q, max_seqlen_k=c.max_seqlen_k,
                  block_tables=c.block_tables)
    # v as a strided view, as it comes out of the qkv projection.
    v = torch.cat([torch.cat(c.vs), torch.zeros_like(torch.cat(c.vs))], -1)[..., :16]
    backend = TritonBackend()
    backend.exact_prefill = True  # off by default on the GPU (see TritonBackend)
    o = backend.prefill(c.q, torch.cat(c.ks), v, c.k_cache, c.v_cache, ctx, c.scale,
                                c.k_scale, c.v_scale)
    assert rel_err(o, naive_attention(c)) < TOL  # not the ~3% of reading the e4m3 cache
