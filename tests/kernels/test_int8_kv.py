"""int8 KV cache (a scale per token and kv head): the torch reference's rounding, the Triton
stores writing the reference's bytes and scales, and the Triton decode/prefill kernels reading
the same cache as the reference (TRITON_INTERPRET=1 on CPU, tiny fp32 shapes; `gpu` tests at
real shapes)."""
import pytest
import torch
import triton
import triton.language as tl

from nanovllm.kernels import triton_decode, triton_prefill
from nanovllm.kernels._common import int8_to_fp16
from nanovllm.kernels.torch_ref import (
    decode_attention_torch,
    prefill_attention_torch,
    quantize_rows,
    store_kvcache_torch,
)
from nanovllm.kernels.triton_kv import store_kvcache
from nanovllm.kernels.triton_rope import norm_rope_store
from tests.support.kv_engine import blocks_and_tokens
from tests.support.markers import needs_interpreter, on_gpu
from tests.support.paged import make_paged_case, naive_attention, rel_err

TOL = 1e-4  # same int8 cache, fp32 arithmetic: only summation order differs


def head_major(scales):
    """The same scales [blocks, slots, Hkv] in the engine's layout: a view of a tensor stored
    [blocks, Hkv, slots] (worker/kv_cache.allocate_row_scales)."""
    return scales.transpose(1, 2).contiguous().transpose(1, 2)


def int8_case(case):
    """The case's cache re-stored as int8 codes with their row scales (head-major, as the
    engine keeps them); slots never written (NaN in the float cache, never to be read) get
    scale NaN, so a stray read still shows."""
    shape = case.k_cache.shape
    for name in ("k", "v"):
        codes, scales = quantize_rows(getattr(case, f"{name}_cache").nan_to_num(0.0))
        scales[getattr(case, f"{name}_cache").isnan().any(-1)] = float("nan")
        setattr(case, f"{name}_cache", codes.view(shape))
        setattr(case, f"{name}_scale", head_major(scales))
    return case


def test_rows_round_to_half_a_step_and_use_the_whole_range():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 16, generator=g) * torch.logspace(-6, 3, 50)[:, None, None]
    x[7, 1] = 0.0  # an all-zero row
    codes, scale = quantize_rows(x)
    assert codes.dtype == torch.int8 and scale.shape == (50, 3)
    back = codes.float() * scale[..., None]
    assert ((back - x).abs() <= scale[..., None] / 2 * (1 + 1e-6)).all()
    assert (codes.abs().amax(-1)[scale != 1] == 127).all()  # each row's max maps to +-127
    assert scale[7, 1] == 1 and (codes[7, 1] == 0).all()
    # Ties go to even, as torch.round does.
    ties = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 127.0]])
    assert quantize_rows(ties)[0].tolist() == [[0, 2, 2, 0, -2, 127]]


def _store_case(seed, t=24, hkv=3, d=16):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(t, hkv, d, generator=g) * torch.logspace(-4, 2, t)[:, None, None]
    v = -k.flip(0) * 3
    v[4, 1] = 0.0
    slots = torch.tensor([5, -1, 16, 47] + list(range(20, 40)), dtype=torch.int32)[:t]
    return k, v, slots


def _empty_cache(hkv=3, d=16, device="cpu"):
    """Caches of 3 blocks of 16 slots and their (head-major) scale tensors, all zeros."""
    caches = [torch.zeros(3, 16, hkv, d, dtype=torch.int8, device=device) for _ in range(2)]
    scales = [head_major(torch.zeros(3, 16, hkv, device=device)) for _ in range(2)]
    return caches + scales


@needs_interpreter
def test_store_writes_the_reference_codes_and_scales():
    k, v, slots = _store_case(0)
    got, ref = _empty_cache(), _empty_cache()
    store_kvcache(k, v, *got[:2], slots, *got[2:])
    store_kvcache_torch(k, v, *ref[:2], slots, *ref[2:])
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert (ref[2].flatten(0, 1)[slots[slots >= 0].long()] > 0).all()  # every row written


@needs_interpreter
@pytest.mark.parametrize("mix", [False, True])
def test_fused_rope_store_quantizes_like_reference(mix):
    g = torch.Generator().manual_seed(1)
    t, hq, hkv, d = 6, 4, 2, 32
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    pos = torch.arange(t)
    cos_sin = torch.randn(16, 1, d, generator=g)
    slots = torch.tensor([3, 9, -1, 17, 30, 0], dtype=torch.int32)
    got, ref = _empty_cache(hkv, d), _empty_cache(hkv, d)
    _, k_rot = norm_rope_store(q, k, v, pos, cos_sin, None, None, 0.0, *got[:2], slots,
                               return_k=True, k_scale=got[2], v_scale=got[3], mix=mix)
    store_kvcache_torch(k_rot, v, *ref[:2], slots, *ref[2:])
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


@needs_interpreter
def test_int8_cache_without_scales_is_refused():
    k, v, slots = _store_case(0)
    caches = _empty_cache()
    with pytest.raises(ValueError, match="k_scale"):
        store_kvcache(k, v, *caches[:2], slots)


@needs_interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("use_dot", [True, False])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_int8(num_splits, use_dot, monkeypatch):
    monkeypatch.setitem(triton_decode.CONFIG_INT8, "USE_DOT", use_dot)
    c = make_paged_case([(1, 40), (1, 7), (1, 1)], 16, 4, 2, 16, seed=4)
    exact = naive_attention(c)
    c = int8_case(c)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    ref = decode_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_decode.decode_attention(*args, num_splits=num_splits, k_scale=c.k_scale,
                                       v_scale=c.v_scale)
    assert rel_err(o, ref) < TOL
    # ~7 significant bits per element: well under e4m3's ~3% on the same kind of case.
    assert rel_err(ref, exact) < 0.01


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_int8_without_scales_is_refused():
    c = int8_case(make_paged_case([(1, 5)], 16, 2, 2, 16))
    with pytest.raises(ValueError, match="k_scale"):
        triton_decode.decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens,
                                       c.block_tables, c.scale)


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill_int8():
    # Plain prefill, a prefix hit and a chunk, GQA 2; blocks of 16 = the interpreter's tiles,
    # and of 8 (tiles straddling pages).
    for block_size in (16, 8):
        c = make_paged_case([(20, 20), (5, 37), (7, 39)], block_size, 4, 2, 16, seed=3)
        exact = naive_attention(c)
        c = int8_case(c)
        args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables,
                c.scale)
        ref = prefill_attention_torch(*args, c.k_scale, c.v_scale)
        o = triton_prefill.prefill_attention(*args, c.max_seqlen_q, k_scale=c.k_scale,
                                             v_scale=c.v_scale)
        assert rel_err(o, ref) < TOL
        assert rel_err(ref, exact) < 0.01


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_triton_backend_int8_prefill_attends_to_its_unquantized_kv():
    from nanovllm.layers.attention_backend import TritonBackend
    from nanovllm.utils.context import Context

    c = make_paged_case([(20, 20), (1, 1), (37, 37)], 16, 4, 2, 16, seed=5)
    exact = naive_attention(c)
    c = int8_case(c)
    ctx = Context(is_prefill=True, cu_seqlens_q=c.cu_seqlens_q, cu_seqlens_k=c.cu_seqlens_k,
                  max_seqlen_q=c.max_seqlen_q, max_seqlen_k=c.max_seqlen_k,
                  block_tables=c.block_tables)
    o = TritonBackend().prefill(c.q, torch.cat(c.ks), torch.cat(c.vs), c.k_cache, c.v_cache,
                                ctx, c.scale, c.k_scale, c.v_scale)
    assert rel_err(o, exact) < TOL  # not int8's rounding: the step's own K/V


GPU_TOL = 1e-2  # bf16 q, probabilities and output; the same int8 cache


def gpu_case(seqs, block_size, seed):
    """A bf16 case at a real shape (16 heads, 8 kv heads, head_dim 128) on the GPU, its exact
    output, and its cache as int8 with head-major row scales."""
    c = make_paged_case(seqs, block_size, 16, 8, 128, seed=seed, dtype=torch.bfloat16,
                        device="cuda")
    c.exact = naive_attention(c)
    return int8_case(c)


@pytest.mark.parametrize("mix", [False, True])
@on_gpu
def test_store_gpu_same_codes_and_scales_as_torch(mix):
    t, hkv, d = 300, 8, 128
    k = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16) * torch.logspace(
        -4, 2, d, device="cuda").bfloat16()
    v, q = torch.randn_like(k) * 3, torch.randn(t, 16, d, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(8 * 64, device="cuda")[:t].int()
    slots[::7] = -1

    def cache():
        return ([torch.zeros(8, 64, hkv, d, dtype=torch.int8, device="cuda") for _ in range(2)]
                + [head_major(torch.zeros(8, 64, hkv, device="cuda")) for _ in range(2)])

    got, ref, fused = cache(), cache(), cache()
    store_kvcache(k, v, *got[:2], slots, *got[2:])
    store_kvcache_torch(k, v, *ref[:2], slots, *ref[2:])
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    # The fused RoPE-store quantizes its rotated (and mixed) k like the plain store does.
    cos_sin = torch.randn(4096, 1, d, device="cuda")
    pos = torch.randint(0, 4096, (t,), device="cuda")
    _, k_rot = norm_rope_store(q, k, v, pos, cos_sin, None, None, 0.0, *fused[:2], slots,
                               return_k=True, k_scale=fused[2], v_scale=fused[3], mix=mix)
    ref = cache()
    store_kvcache_torch(k_rot, v, *ref[:2], slots, *ref[2:])
    assert all(torch.equal(a, b) for a, b in zip(fused, ref))


@pytest.mark.parametrize("fp16_qk", [False, True])
@pytest.mark.parametrize("batch,ctx", [(1, 3000), (4, 700), (64, 300)])
@on_gpu
def test_decode_int8_gpu(batch, ctx, fp16_qk, monkeypatch):
    monkeypatch.setitem(triton_decode.CONFIG_INT8, "FP16_DOT", fp16_qk)
    c = gpu_case([(1, ctx - i % 5) for i in range(batch)], 256, seed=batch)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    ref = decode_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_decode.decode_attention(*args, k_scale=c.k_scale, v_scale=c.v_scale)
    assert rel_err(o, ref) < GPU_TOL
    assert rel_err(ref, c.exact) < 0.02  # e4m3 here: ~0.04-0.06


@pytest.mark.parametrize("seqs", [[(1000, 1000), (7, 7)], [(300, 1500), (257, 257)]])
@on_gpu
def test_prefill_int8_gpu(seqs):
    c = gpu_case(seqs, 256, seed=len(seqs))
    args = (c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    ref = prefill_attention_torch(*args, c.k_scale, c.v_scale)
    o = triton_prefill.prefill_attention(*args, c.max_seqlen_q, k_scale=c.k_scale,
                                         v_scale=c.v_scale)
    assert rel_err(o, ref) < GPU_TOL


@on_gpu
def test_engine_int8_gpu_blocks_and_tokens(tmp_path):
    blocks, outs = blocks_and_tokens(tmp_path, ("auto", "int8"))
    # bf16: 256 bytes per token and kv head; int8: 2 x (64 + 4) = 136.
    assert blocks["int8"] > 1.8 * blocks["auto"]
    assert all(len(o) == 32 for o in outs["int8"])


@needs_interpreter
@pytest.mark.parametrize("fp16_dot", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_int8_fp16_q(fp16_dot, num_splits, monkeypatch):
    # fp16 q: FP16_DOT runs both dots in fp16 (codes widened by integer ops, V's scales
    # relative to their running max); without it the PV dot runs in fp32. V rows span 1e-4..10
    # in scale, so p * s would underflow fp16 without the normalization.
    monkeypatch.setitem(triton_decode.CONFIG_INT8, "FP16_DOT", fp16_dot)
    c = make_paged_case([(1, 40), (1, 7), (1, 33)], 16, 4, 2, 16, seed=6)
    c.vs = [v * torch.logspace(-4, 1, v.shape[0])[:, None, None] for v in c.vs]
    for i, v in enumerate(c.vs):
        pos = torch.arange(v.shape[0])
        c.v_cache[c.block_tables[i, pos // 16].long(), pos % 16] = v
    exact = naive_attention(c)
    c = int8_case(c)
    q16 = c.q.half()
    args = (c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    ref = decode_attention_torch(q16.float(), *args, c.k_scale, c.v_scale)
    o = triton_decode.decode_attention(q16, *args, num_splits=num_splits, k_scale=c.k_scale,
                                       v_scale=c.v_scale)
    assert o.dtype == torch.float16
    assert rel_err(o, ref) < 2e-3  # fp16 output (and probabilities)
    assert rel_err(ref, exact) < 0.01


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill_int8_fp16_q():
    # fp16 q: the PV dot runs in fp32, where p * s cannot underflow (V rows span 1e-4..10).
    c = make_paged_case([(20, 20), (5, 37)], 16, 4, 2, 16, seed=7)
    c.v_cache = c.v_cache * torch.logspace(-4, 1, 16)[None, :, None, None]
    c = int8_case(c)
    q16 = c.q.half()
    args = (c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    ref = prefill_attention_torch(q16.float(), *args, c.k_scale, c.v_scale)
    o = triton_prefill.prefill_attention(q16, *args, c.max_seqlen_q, k_scale=c.k_scale,
                                         v_scale=c.v_scale)
    assert o.dtype == torch.float16 and rel_err(o, ref) < 2e-3


@triton.jit
def _widen(x_ptr, o_ptr):
    offs = tl.arange(0, 256)
    tl.store(o_ptr + offs, int8_to_fp16(tl.load(x_ptr + offs)))


def _check_widening(device):
    codes = torch.arange(-128, 128, device=device).to(torch.int8)
    out = torch.empty(256, dtype=torch.float16, device=device)
    _widen[(1,)](codes, out)
    assert torch.equal(out.float(), codes.float())


@needs_interpreter
def test_int8_to_fp16_is_exact_for_every_code():
    _check_widening("cpu")


@on_gpu
def test_int8_to_fp16_is_exact_for_every_code_gpu():
    _check_widening("cuda")
