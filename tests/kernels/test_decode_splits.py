"""The decode kernel's even splits (kernels/decode_splits.py): a row whose keys fall in one
split of a split call is the unsplit kernel's row to the bit (interpreter on CPU)."""
import pytest
import torch

from nanovllm.kernels.triton_decode import decode_attention
from tests.support.markers import needs_interpreter
from tests.support.paged import make_paged_case, naive_attention


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
def test_a_one_split_row_of_a_split_call_is_the_unsplit_output():
    """A row of one tile has one split with keys, whose combine of one partial gives the
    unsplit kernel's row to the bit; the counters are left at zero for the next call."""
    c = make_paged_case([(1, 9), (1, 60), (1, 3)], 16, 4, 2, 16, seed=5)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    two, one = decode_attention(*args, num_splits=2), decode_attention(*args, num_splits=1)
    assert torch.equal(two[0], one[0]) and torch.equal(two[2], one[2])
    torch.testing.assert_close(two, naive_attention(c).to(two.dtype), rtol=1e-5, atol=1e-5)
    again = decode_attention(*args, num_splits=2)
    assert torch.equal(again, two)


@needs_interpreter
@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("min_keys", [16, 40, 64])
def test_min_split_keys_gives_the_split_calls_output(monkeypatch, min_keys):
    """decode_config's MIN_SPLIT_KEYS (each split at least that many keys, rounded up to
    whole tiles; a row within one split writes its output directly): the same output as
    without it, to the bit for rows of one tile (one split either way: the combine of one
    partial is exact), and the counters left at zero for the next call."""
    from nanovllm.kernels import triton_decode

    c = make_paged_case([(1, 9), (1, 60), (1, 3), (1, 0), (1, 33)], 16, 4, 2, 16, seed=6)
    args = (c.q, c.k_cache, c.v_cache, c.context_lens, c.block_tables, c.scale)
    base = decode_attention(*args, num_splits=8)
    monkeypatch.setitem(triton_decode.CONFIG, "MIN_SPLIT_KEYS", min_keys)
    got = decode_attention(*args, num_splits=8)
    for r, n in enumerate(c.context_lens.tolist()):
        if n <= 16:
            assert torch.equal(got[r], base[r]), (r, n)
    torch.testing.assert_close(got, base, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, naive_attention(c).to(got.dtype), rtol=1e-5, atol=1e-5)
    assert torch.equal(decode_attention(*args, num_splits=8), got)
