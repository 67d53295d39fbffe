"""int8 KV cache (a scale per token and kv head): the torch reference's rounding, the Triton
stores writing the reference's bytes and scales, and the Triton decode/prefill kernels reading
the same cache as the reference (TRITON_INTERPRET=1 on CPU, tiny fp32 shapes; `gpu` tests at
real shapes)."""
import pytest
import torch

from nanovllm.kernels import triton_decode, triton_prefill
from nanovllm.kernels.torch_ref import (
    decode_attention_torch,
    prefill_attention_torch,
    quantize_rows,
    store_kvcache_torch,
)
from nanovllm.kernels.triton_kv import store_kvcache
from nanovllm.kernels.triton_rope import norm_rope_store
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
