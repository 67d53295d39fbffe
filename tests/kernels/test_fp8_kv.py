"""fp8 KV cache: the Triton store kernels quantize exactly as the torch reference does, and
the Triton decode/prefill kernels read the same quantized cache as the reference does
(TRITON_INTERPRET=1 on CPU, tiny fp32 shapes)."""
import pytest
import torch

from nanovllm.kernels import triton_decode, triton_prefill
from nanovllm.kernels.torch_ref import (
    decode_attention_torch,
    prefill_attention_torch,
    quantize,
    store_kvcache_torch,
)
from nanovllm.kernels.triton_decode import decode_attention
from nanovllm.kernels.triton_kv import store_kvcache
from nanovllm.kernels.triton_prefill import prefill_attention
from nanovllm.kernels.triton_rope import norm_rope_store
from tests.support.kv_engine import blocks_and_tokens
from tests.support.markers import needs_interpreter, on_gpu
from tests.support.paged import make_paged_case, naive_attention, rel_err

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
    case.k_cache = quantize_nan(case.k_cache.view(flat, hkv, -1), case.k_scale, dtype).view(
        case.k_cache.shape)
    case.v_cache = quantize_nan(case.v_cache.view(flat, hkv, -1), case.v_scale, dtype).view(
        case.v_cache.shape)
    return case


def quantize_nan(x, scale, dtype):
    """quantize, but NaN stays a NaN code (quantize stores 0, as the kernels do): the cases'
    poison for reads outside a context."""
    codes = quantize(x, scale, dtype)
    codes.view(torch.uint8)[x.isnan()] = 0x7F
    return codes


def nan_codes_finite(cache):
    """An fp8 cache with its NaN codes made 448 (0x7E), as slots never read but read whole
    (a tiled V's last tile, V_LAST 2) hold: anything finite."""
    out = cache.clone()
    b = out.view(torch.uint8)
    b[(b & 0x7F) == 0x7F] = 0x7E
    return out


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@needs_interpreter
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


@needs_interpreter
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


@needs_interpreter
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


@needs_interpreter
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


@needs_interpreter
def test_fp8_cache_without_scales_is_refused():
    c = quantized_case(make_paged_case([(1, 5)], 16, 2, 2, 16), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale"):
        decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)


@needs_interpreter
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


GPU_TOL = 1e-2  # bf16 q and output, same quantized cache


def fp8_case(seqs, block_size, dtype, seed):
    c = make_paged_case(seqs, block_size, 16, 8, 128, seed=seed, dtype=torch.bfloat16,
                        device="cuda")
    c.exact = naive_attention(c)
    c.k_scale = 0.01 + torch.rand(8, device="cuda") * 0.02
    c.v_scale = 0.01 + torch.rand(8, device="cuda") * 0.02
    shape = c.k_cache.shape
    c.k_cache = quantize_nan(c.k_cache.view(-1, 8, 128), c.k_scale, dtype).view(shape)
    c.v_cache = quantize_nan(c.v_cache.view(-1, 8, 128), c.v_scale, dtype).view(shape)
    return c


@pytest.mark.parametrize("dtype", FP8)
@on_gpu
def test_store_gpu_same_bytes_as_torch(dtype):
    from nanovllm.kernels.triton_kv import store_kvcache
    from nanovllm.kernels.triton_rope import norm_rope_store
    t, hkv, d = 300, 8, 128
    k = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16) * torch.logspace(
        -4, 2, d, device="cuda").bfloat16()
    v, q = torch.randn_like(k) * 3, torch.randn(t, 16, d, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(8 * 64, device="cuda")[:t].int()
    slots[::7] = -1
    ks, vs = torch.rand(hkv, device="cuda") * 0.1 + 1e-3, torch.rand(hkv, device="cuda") + 1e-3
    caches = [torch.zeros(8, 64, hkv, d, dtype=dtype, device="cuda") for _ in range(6)]
    store_kvcache(k, v, caches[0], caches[1], slots, ks, vs)
    store_kvcache_torch(k, v, caches[2], caches[3], slots, ks, vs)
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))
    # The fused RoPE-store quantizes its rotated k like the plain store does.
    cos_sin = torch.randn(4096, 1, d, device="cuda")
    pos = torch.randint(0, 4096, (t,), device="cuda")
    _, k_rot = norm_rope_store(q, k, v, pos, cos_sin, None, None, 0.0, caches[4], caches[5],
                               slots, return_k=True, k_scale=ks, v_scale=vs)
    store_kvcache_torch(k_rot, v, caches[2], caches[3], slots, ks, vs)
    assert torch.equal(caches[4].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[5].view(torch.uint8), caches[3].view(torch.uint8))


@pytest.mark.parametrize("fp16_dot", [True, False])
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("batch,ctx", [(1, 3000), (4, 700), (64, 300)])
@on_gpu
def test_decode_fp8_gpu(dtype, batch, ctx, fp16_dot, monkeypatch):
    monkeypatch.setitem(triton_decode.CONFIG_FP8, "FP16_DOT", fp16_dot)
    c = fp8_case([(1, ctx - i % 5) for i in range(batch)], 256, dtype, seed=batch)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    ref = decode_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_decode.decode_attention(*args, k_scale=c.k_scale, v_scale=c.v_scale)
    assert rel_err(o, ref) < GPU_TOL
    assert rel_err(ref, c.exact) < (0.06 if dtype == torch.float8_e4m3fn else 0.12)


@pytest.mark.parametrize("batch,ctx,splits", [(1, 3000, None), (4, 700, None), (64, 301, None),
                                              (64, 301, 3)])
@on_gpu
def test_decode_fp8_gpu_v_words(batch, ctx, splits, monkeypatch):
    """CONFIG_FP8["V_WORDS"] (V's e4m3 tile read as words, widened where loaded): the same
    output as the byte-wise widening, ragged contexts and forced splits too."""
    c = fp8_case([(1, ctx - i % 5) for i in range(batch)], 256, torch.float8_e4m3fn, seed=batch)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    outs = []
    for on in (False, True):
        monkeypatch.setitem(triton_decode.CONFIG_FP8, "V_WORDS", on)
        outs.append(triton_decode.decode_attention(*args, num_splits=splits, k_scale=c.k_scale,
                                                   v_scale=c.v_scale))
    assert rel_err(outs[1], outs[0]) < 1e-3
    assert rel_err(outs[1], decode_attention_torch(*args, c.k_scale, c.v_scale)) < GPU_TOL


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("seqs", [[(1000, 1000), (7, 7)], [(300, 1500), (257, 257)]])
@on_gpu
def test_prefill_fp8_gpu(dtype, seqs):
    c = fp8_case(seqs, 256, dtype, seed=len(seqs))
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    ref = prefill_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_prefill.prefill_attention(*args, c.max_seqlen_q, k_scale=c.k_scale,
                                         v_scale=c.v_scale)
    assert rel_err(o, ref) < GPU_TOL


@on_gpu
def test_backend_prefill_fp8_gpu_attends_to_its_unquantized_kv():
    from nanovllm.layers.attention_backend import TritonBackend
    from nanovllm.utils.context import Context

    seqs = [(1000, 1000), (7, 7), (300, 300)]
    c = fp8_case(seqs, 256, torch.float8_e4m3fn, seed=7)
    ctx = Context(is_prefill=True, cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
                  max_seqlen_q=c.max_seqlen_q, max_seqlen_k=c.max_seqlen_k,
                  block_tables=c.block_tables)
    backend = TritonBackend()
    backend.exact_prefill = True  # off by default on the GPU (see TritonBackend)
    o = backend.prefill(c.q, torch.cat(c.ks), torch.cat(c.vs), c.k_cache, c.v_cache,
                                ctx, c.scale, c.k_scale, c.v_scale)
    assert rel_err(o, c.exact) < GPU_TOL  # bf16 rounding only, not e4m3's


@on_gpu
def test_engine_fp8_gpu_calibrates_and_doubles_blocks(tmp_path):
    def calibrated(llm, kind):
        if kind != "auto":
            scales = llm.clients[0].core.executor.runner.kv_scales
            assert (scales != 1).all() and torch.isfinite(scales).all()

    blocks, outs = blocks_and_tokens(tmp_path, ("auto", "fp8_e4m3"), calibrated)
    assert blocks["fp8_e4m3"] > 1.8 * blocks["auto"]
    assert all(len(o) == 32 for o in outs["fp8_e4m3"])
