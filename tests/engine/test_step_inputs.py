"""Host-side step inputs from scheduled sequences: numpy only, no torch, no device."""
import numpy as np

from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import block_table_array, decode_inputs, prefill_inputs

BS = 4  # tokens per block


def seq(tokens, table, cached=0, scheduled=None):
    s = Sequence(list(tokens), block_size=BS)
    s.block_table = list(table)
    s.num_cached_tokens = cached
    s.num_scheduled_tokens = len(tokens) - cached if scheduled is None else scheduled
    return s


def test_prefill_with_a_cached_prefix_and_a_chunk():
    a = seq(range(10, 16), [7, 2])                      # 6 new tokens: blocks 7, 2
    b = seq(range(20, 29), [5, 1, 9], cached=4, scheduled=3)  # tokens 4..6 of 9
    x = prefill_inputs([a, b], BS, width=5)
    assert x.is_prefill and x.num_seqs == 2
    assert x.input_ids.tolist() == [10, 11, 12, 13, 14, 15, 24, 25, 26]
    assert x.positions.tolist() == [0, 1, 2, 3, 4, 5, 4, 5, 6]
    # a: slots 28..31 of block 7 then 8, 9 of block 2; b: positions 4..6 live in block 1.
    assert x.slot_mapping.tolist() == [28, 29, 30, 31, 8, 9, 4, 5, 6]
    assert x.cu_seqlens_q.tolist() == [0, 6, 9]
    assert x.cu_seqlens_k.tolist() == [0, 6, 13]
    assert (x.max_seqlen_q, x.max_seqlen_k, x.has_cached_context) == (6, 7, True)
    assert x.block_tables.tolist() == [[7, 2, 0, 0, 0], [5, 1, 9, 0, 0]]
    assert all(arr.dtype == np.int32 for arr in (x.input_ids, x.slot_mapping, x.block_tables))


def test_decode_rows_are_padded_to_write_nowhere_and_attend_to_nothing():
    a = seq(range(9), [3, 4, 6], cached=8, scheduled=1)   # the 9th token sits in block 6
    b = seq(range(4), [8], cached=3, scheduled=1)
    x = decode_inputs([a, b], BS, width=3, rows=4)
    assert not x.is_prefill and x.num_seqs == 2
    assert x.input_ids.tolist() == [8, 3, 0, 0]
    assert x.positions.tolist() == [8, 3, 0, 0]
    assert x.slot_mapping.tolist() == [6 * BS + 0, 8 * BS + 3, -1, -1]
    assert x.context_lens.tolist() == [9, 4, 0, 0]
    assert x.block_tables.tolist() == [[3, 4, 6], [8, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert x.decode_meta.shape == (4, 4) and x.decode_meta.dtype == np.int32


def test_block_table_width_is_fixed():
    t = block_table_array([seq(range(5), [1, 2])], width=6, rows=3)
    assert t.shape == (3, 6) and t[0].tolist() == [1, 2, 0, 0, 0, 0]
