"""Triton kernels vs the torch reference under TRITON_INTERPRET=1 (CPU, tiny fp32 shapes)."""
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests need TRITON_INTERPRET=1 (set by tests/conftest.py without CUDA)",
                allow_module_level=True)

from nanovllm.kernels import triton_decode  # noqa: E402
from nanovllm.kernels.torch_ref import decode_attention_torch, prefill_attention_torch  # noqa: E402
from nanovllm.kernels.triton_decode import decode_attention  # noqa: E402
from nanovllm.kernels.triton_kv import store_kvcache  # noqa: E402
from nanovllm.kernels.triton_prefill import prefill_attention  # noqa: E402
from tests.support.paged import make_paged_case, naive_attention, rel_err  # noqa: E402

TOL = 1e-4  # fp32 end to end; observed ~1e-6


def test_store_kvcache_skips_padding():
    k_cache = torch.full((3, 16, 2, 16), 7.0)
    v_cache = torch.full((3, 16, 2, 16), 7.0)
    k, v = torch.randn(6, 2, 16), torch.randn(6, 2, 16)
    slots = torch.tensor([5, -1, 16, 47, -1, 0], dtype=torch.int32)
    store_kvcache(k, v, k_cache, v_cache, slots)
    ref_k, ref_v = torch.full_like(k_cache, 7.0), torch.full_like(v_cache, 7.0)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            ref_k.view(48, 2, 16)[s] = k[t]
            ref_v.view(48, 2, 16)[s] = v[t]
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_store_kvcache_strided_input():
    # k/v often arrive as views of a fused qkv projection (non-contiguous token stride).
    qkv = torch.randn(4, 3 * 3 * 16)
    k = qkv[:, 48:96].view(4, 3, 16)
    v = qkv[:, 96:].view(4, 3, 16)
    k_cache, v_cache = torch.zeros(2, 16, 3, 16), torch.zeros(2, 16, 3, 16)
    slots = torch.tensor([31, 2, -1, 16], dtype=torch.int32)
    store_kvcache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(32, 3, 16)[slots[[0, 1, 3]].long()], k[[0, 1, 3]])
    assert torch.equal(v_cache.view(32, 3, 16)[slots[[0, 1, 3]].long()], v[[0, 1, 3]])


PREFILL_CASES = {
    "prefill": [(20, 20), (1, 1), (33, 33)],
    "prefix_hit": [(5, 37), (17, 40)],
    "chunk": [(16, 32), (7, 39), (1, 18)],
}


@pytest.mark.parametrize("kind", list(PREFILL_CASES))
@pytest.mark.parametrize("block_size,heads", [(16, (2, 2)), (16, (4, 2)), (32, (4, 1))])
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill(kind, block_size, heads):
    c = make_paged_case(PREFILL_CASES[kind], block_size, heads[0], heads[1], 16, seed=3)
    ref = prefill_attention_torch(c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables, c.scale)
    o = prefill_attention(c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k, c.block_tables,
                          c.scale, c.max_seqlen_q)
    assert rel_err(o, ref) < TOL
    assert rel_err(ref, naive_attention(c)) < 1e-5


@pytest.mark.parametrize("num_splits", [1, 2, 4])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode(num_splits, heads):
    # ctx 1 and 7 leave most splits empty; 40 spans 3 tiles of 16 keys.
    c = make_paged_case([(1, 1), (1, 40), (1, 7)], 16, heads[0], heads[1], 16, seed=4)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale, num_splits=num_splits)
    assert rel_err(o, ref) < TOL


@pytest.mark.usefixtures("poisoned_empty")
def test_decode_per_token_paging_and_workspace(monkeypatch):
    # BLOCK_N (32) larger than block_size (16): K/V tiles gather across pages token by token.
    monkeypatch.setitem(triton_decode.CONFIG, "BLOCK_N", 32)
    c = make_paged_case([(1, 45), (1, 3)], 16, 4, 2, 16, seed=5)
    ws = triton_decode.alloc_decode_workspace(4, 4, 16, 8, "cpu")  # larger than needed
    ws[0].fill_(float("nan"))
    ws[1].fill_(float("nan"))
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                         num_splits=3, workspace=ws)
    assert rel_err(o, ref) < TOL


@pytest.mark.parametrize("head_fast", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_launch_orders(head_fast, num_splits, monkeypatch):
    # kv heads fastest in the grid, and rows started in a given order (longest first): the
    # same attention, each row's output in its own place.
    monkeypatch.setitem(triton_decode.CONFIG, "HEAD_FAST", head_fast)
    monkeypatch.setitem(triton_decode.CONFIG, "LPT", True)
    c = make_paged_case([(1, 7), (1, 40), (1, 1), (1, 23)], 16, 4, 2, 16, seed=8)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    order = torch.argsort(c.context_lens, descending=True).int()
    assert order.tolist() == [1, 3, 0, 2]
    for o in (None, order):
        out = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale,
                               num_splits=num_splits, order=o)
        assert rel_err(out, ref) < TOL


@pytest.mark.usefixtures("poisoned_empty")
def test_decode_broadcast_variant(monkeypatch):
    monkeypatch.setitem(triton_decode.CONFIG, "USE_DOT", False)
    c = make_paged_case([(1, 30), (1, 2)], 16, 4, 2, 16, seed=6)
    ref = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    for splits in (1, 2):
        o = decode_attention(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale, num_splits=splits)
        assert rel_err(o, ref) < TOL


@pytest.mark.usefixtures("poisoned_empty")
def test_decode_zero_context_gives_zeros():
    # Padding rows of a captured decode batch have context_lens == 0: output must be finite.
    c = make_paged_case([(1, 5), (1, 1)], 16, 2, 2, 16, seed=7)
    ctx = torch.tensor([5, 0], dtype=torch.int32)
    for splits in (1, 2):
        o = decode_attention(c.q, c.k_cache, c.v_cache, ctx, c.block_tables, c.scale, num_splits=splits)
        assert torch.isfinite(o).all() and (o[1] == 0).all()


def test_default_split_choice():
    assert triton_decode.choose_num_splits(1, 8, "cpu") == triton_decode.MAX_SPLITS
    assert triton_decode.choose_num_splits(8, 8, "cpu") == 8
    assert triton_decode.choose_num_splits(32, 8, "cpu") == 1
    assert triton_decode.choose_num_splits(256, 8, "cpu") == 1
