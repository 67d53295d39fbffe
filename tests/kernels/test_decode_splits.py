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
