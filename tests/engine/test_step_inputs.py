"""Host-side step inputs from scheduled sequences: numpy only, no torch, no device."""
import numpy as np

from nanovllm.engine.block_tables import block_table_array
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import decode_inputs, prefill_inputs

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
    assert x.order.tolist() == [0, 1, 2, 3]  # longest first, then the padding rows
    assert x.decode_meta.shape == (7, 4) and x.decode_meta.dtype == np.int32
    assert x.decode_meta[5].tolist() == [-1] * 4  # no pending input token: no feed rows
    y = decode_inputs([b, a], BS, width=3, rows=4)
    assert y.order.tolist() == [1, 0, 2, 3]


def test_decode_meta_is_the_rows_and_temperatures_without_a_copy():
    from nanovllm.engine.sampling_rows import sampling_rows
    from nanovllm.sampling_params import SamplingParams

    a = seq(range(9), [3, 4, 6], cached=8, scheduled=1)
    b = seq(range(4), [8], cached=3, scheduled=1)
    x = decode_inputs([a, b], BS, width=3, rows=4)
    x.sampling = sampling_rows([SamplingParams(temperature=0.5), SamplingParams()], [0, 0], 50)
    meta = x.decode_meta
    rows = [x.input_ids, x.positions, x.slot_mapping, x.context_lens, x.order]
    assert all(np.shares_memory(meta, r) for r in rows)  # the fields are its rows
    assert np.array_equal(meta[:5], np.stack(rows))
    assert meta[6].view(np.float32).tolist() == [0.5, 1.0, 0.0, 0.0]
    # A fresh step gets fresh arrays: the last step's meta is left as it was.
    z = decode_inputs([b], BS, width=3, rows=4)
    assert z.context_lens.tolist() == [4, 0, 0, 0] and x.context_lens.tolist() == [9, 4, 0, 0]
    assert z.decode_meta[6].tolist() == [0] * 4 and z.slot_mapping.tolist()[1:] == [-1] * 3


def test_block_table_width_is_fixed():
    t = block_table_array([seq(range(5), [1, 2])], width=6, rows=3)
    assert t.shape == (3, 6) and t[0].tolist() == [1, 2, 0, 0, 0, 0]


def test_persistent_block_tables_match_a_rebuild_through_appends_preemption_and_reuse():
    import random

    from nanovllm.engine.block_tables import BlockTables

    rng = random.Random(0)
    width, capacity = 6, 8  # small capacity: rows get taken back and handed out again
    tables = BlockTables(capacity, width)
    pool = [Sequence([1, 2, 3]) for _ in range(12)]
    for s in pool:
        s.block_table = [rng.randrange(100)]
    for _ in range(400):
        batch = rng.sample(pool, rng.randint(1, capacity // 2))
        prefill = rng.random() < 0.2
        for s in batch:
            event = rng.random()
            if prefill or event < 0.1:
                # Preempted and prefilled again: a new table, possibly shorter.
                s.block_table = [rng.randrange(100) for _ in range(rng.randint(1, width))]
                prefill = True
            elif event < 0.4 and len(s.block_table) < width:
                s.block_table.append(rng.randrange(100))  # decode crossed a block boundary
        rows = len(batch) + rng.randint(0, 3)
        got = tables.gather(batch, rows, refresh=prefill)
        assert np.array_equal(got, block_table_array(batch, width, rows))


def test_decode_inputs_with_persistent_tables_equal_the_plain_ones():
    from nanovllm.engine.block_tables import BlockTables

    seqs = [Sequence(list(range(n))) for n in (5, 17, 33)]
    for i, s in enumerate(seqs):
        s.block_table = list(range(10 * i, 10 * i + -(-len(s) // 16)))
    tables = BlockTables(4, 8)
    for _ in range(3):
        a = decode_inputs(seqs, 16, 8, 8)
        b = decode_inputs(seqs, 16, 8, 8, tables=tables)
        assert np.array_equal(a.block_tables, b.block_tables)
        assert np.array_equal(a.slot_mapping, b.slot_mapping)
        for s in seqs:
            s.append_token(7)
            if len(s.block_table) * 16 < len(s):
                s.block_table.append(99)


def test_the_builder_adds_rank_0_rows_and_orders_the_parts():
    from nanovllm.engine.sampling_rows import sampling_rows
    from nanovllm.engine.step_inputs import StepBuilder
    from nanovllm.sampling_params import SamplingParams

    seqs = [Sequence(list(range(9)), SamplingParams(temperature=0.5, top_p=0.9,
                                                    repetition_penalty=1.2, logprobs=1), BS),
            Sequence([1, 2, 3], SamplingParams(temperature=0), BS)]
    seqs[0].block_table, seqs[1].block_table = [3, 4, 6], [8]
    for s in seqs:
        s.num_scheduled_tokens = len(s)
    rank0 = StepBuilder(BS, width=3, max_num_seqs=4, vocab_size=50).build(seqs, True)
    other = StepBuilder(BS, width=3, max_num_seqs=4, vocab_size=None).build(seqs, True)
    assert other.sampling is other.penalties is other.logprobs is None
    assert list(other.device_parts()) == ["input_ids", "positions", "slot_mapping",
                                          "cu_seqlens_q", "cu_seqlens_k", "block_tables"]
    want = sampling_rows([s.sampling_params for s in seqs], [0, 0], 50)
    assert np.array_equal(rank0.sampling.temperatures, want.temperatures)
    assert rank0.penalties.ids[:, 0].tolist() == [0]  # only the penalized row
    assert rank0.logprobs.sample == [(0, 1)]
    assert list(rank0.device_parts())[6:] == ["temperatures", "top_ps", "penalty_ids",
                                              "penalty_settings", "logprob_rows"]
    decode = StepBuilder(BS, width=3, max_num_seqs=4, vocab_size=50)
    for s in seqs:
        s.num_cached_tokens = len(s)
    assert list(decode.build(seqs, False, rows=4).device_parts())[:2] == ["decode_meta",
                                                                          "block_tables"]


def test_decode_steps_of_the_same_plain_batch_reuse_their_sampling_rows():
    from nanovllm.engine.step_inputs import StepBuilder
    from nanovllm.sampling_params import SamplingParams

    def decode_seqs(params):
        out = []
        for i, p in enumerate(params):
            s = Sequence(list(range(5)), p, BS)
            s.block_table, s.num_cached_tokens, s.num_scheduled_tokens = [2 * i, 2 * i + 1], 4, 1
            out.append(s)
        return out

    def step(builder, seqs):
        inputs = builder.build(seqs, False, rows=4)
        for s in seqs:  # the token sampled: the next step decodes after it
            s.append_token(9)
            s.num_cached_tokens, s.num_scheduled_tokens = s.num_tokens - 1, 1
        return inputs

    plain = decode_seqs([SamplingParams(temperature=0.7), SamplingParams(temperature=0)])
    builder = StepBuilder(BS, width=3, max_num_seqs=4, vocab_size=50)
    first, second = step(builder, plain), step(builder, plain)
    assert second.sampling is first.sampling
    assert second.sampling.temperatures.tolist() == [np.float32(0.7), 0.0]
    # A changed batch is built anew (and then kept for the next step).
    third = step(builder, plain[:1])
    assert third.sampling is not second.sampling and third.sampling.temperatures.size == 1
    assert step(builder, plain[:1]).sampling is third.sampling
    # Rows that change from step to step are built every step: a seeded row's step count.
    for params in (SamplingParams(temperature=0.7, seed=3), SamplingParams(logprobs=2),
                   SamplingParams(temperature=0.7, min_tokens=8)):
        seqs = decode_seqs([params])
        builder = StepBuilder(BS, width=3, max_num_seqs=4, vocab_size=50)
        a, b = step(builder, seqs), step(builder, seqs)
        assert a.sampling is not b.sampling
        if params.seed is not None:
            assert [r[2] for r in a.sampling.seeds] == [0] and b.sampling.seeds[0][2] == 1


def test_mixed_step_decode_rows_lead_and_take_pending_tokens_from_the_device():
    from nanovllm.engine.sequence import PLACEHOLDER

    a = seq(range(9), [3, 4, 6], cached=8, scheduled=1)   # decodes its 9th token
    b = seq([*range(4), PLACEHOLDER], [8, 2], cached=4, scheduled=1)  # its token is pending
    c = seq(range(20, 26), [5, 1], cached=0)             # a fresh prompt: the prefill part
    x = prefill_inputs([a, b, c], BS, width=3, prev_rows={b.seq_id: 7})
    assert x.is_prefill and x.num_decode_rows == 2 and x.num_seqs == 3
    assert x.input_ids.tolist() == [8, 0, 20, 21, 22, 23, 24, 25]  # b's comes from row 7
    assert x.feed_rows.tolist() == [-1, 7]
    assert x.positions.tolist() == [8, 4, 0, 1, 2, 3, 4, 5]
    assert x.slot_mapping.tolist() == [6 * BS, 2 * BS, 20, 21, 22, 23, 4, 5]
    lens, order = x.decode_rows[:, :2]
    assert lens.tolist() == [9, 5] and order.tolist() == [0, 1]
    assert x.decode_rows.shape[1] % 4 == 0  # the order row starts 16-byte aligned
    assert x.decode_tables.tolist() == [[3, 4, 6], [8, 2, 0]]
    # Every row's cu_seqlens (the LM head reads each sequence's last row); the lengths and the
    # block table describe the prefill part.
    assert x.cu_seqlens_q.tolist() == [0, 1, 2, 8] and x.cu_seqlens_k.tolist() == [0, 9, 14, 20]
    assert x.block_tables.tolist() == [[5, 1, 0]]
    assert (x.max_seqlen_q, x.max_seqlen_k, x.has_cached_context) == (6, 6, False)
    parts = x.device_parts()
    assert {"decode_rows", "decode_tables", "feed_rows"} <= set(parts)
