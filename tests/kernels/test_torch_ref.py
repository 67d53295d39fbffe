"""torch reference kernels vs an independent dense fp64 computation."""
import pytest
import torch

from nanovllm.kernels.torch_ref import (decode_attention_torch, prefill_attention_torch,
                                        store_kvcache_torch)
from tests.support.paged import make_paged_case, naive_attention, rel_err

SEQ_SETS = {
    "prefill": [(5, 5), (17, 17), (1, 1)],
    "prefix_hit": [(7, 40), (3, 19)],       # context partly cached already
    "chunk": [(16, 48), (32, 32), (9, 70)],  # chunked prefill: middle/last chunks
}


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("kind", list(SEQ_SETS))
@pytest.mark.usefixtures("poisoned_empty")
def test_prefill_ref(block_size, heads, kind):
    c = make_paged_case(SEQ_SETS[kind], block_size, heads[0], heads[1], 16, seed=1)
    o = prefill_attention_torch(c.q, c.k_cache, c.v_cache, c.cu_seqlens_q, c.cu_seqlens_k,
                                c.block_tables, c.scale)
    assert rel_err(o, naive_attention(c)) < 1e-5


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.usefixtures("poisoned_empty")
def test_decode_ref(block_size, heads):
    c = make_paged_case([(1, 1), (1, 33), (1, 300)], block_size, heads[0], heads[1], 16, seed=2)
    o = decode_attention_torch(c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    assert rel_err(o, naive_attention(c)) < 1e-5


def test_store_ref():
    k_cache = torch.zeros(4, 16, 2, 8)
    v_cache = torch.zeros(4, 16, 2, 8)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([3, -1, 17, 63, 0], dtype=torch.int32)
    store_kvcache_torch(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(64, 2, 8), v_cache.view(64, 2, 8)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k[t]) and torch.equal(flat_v[s], v[t])
    assert flat_k.abs().sum(dim=(1, 2)).count_nonzero() == 4  # the -1 token wrote nothing
