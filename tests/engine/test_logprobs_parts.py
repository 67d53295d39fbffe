"""The pieces of logprobs without a model: which prompt positions a step computes (chunks,
recomputes, worker copies), the prefix-cache rule and the host-side dicts (the packed device
layout: tests/worker/test_logprobs.py)."""
import pickle

import pytest

from nanovllm import Logprob, SamplingParams
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.logprobs import StepLogprobs, position_logprobs, prompt_logprobs, record
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.engine.step_inputs import prefill_inputs

WANTS = SamplingParams(prompt_logprobs=2, logprobs=1)


def schedule(seq: Sequence, n: int) -> tuple[int, int]:
    seq.num_scheduled_tokens = n
    return seq.prompt_logit_rows()


def test_chunks_cover_each_prompt_position_once():
    seq = Sequence(list(range(10, 20)), WANTS, block_size=4)  # 10 prompt tokens
    assert seq.prompt_logprobs == [None] and seq.logprobs == [] and seq.needs_prompt_logits
    # Positions 0..8 predict tokens 1..9; position 9 predicts the first completion token.
    assert schedule(seq, 4) == (0, 4)
    seq.launch_scheduled()
    assert (seq.num_cached_tokens, seq.prompt_logits_next) == (4, 4)
    assert schedule(seq, 6) == (0, 5)  # the chunk's last position samples
    seq.launch_scheduled()
    assert seq.prompt_logits_next == 9 and not seq.needs_prompt_logits
    seq.append_token(7)
    # Preempted and recomputed (prompt + completion): no prompt position again.
    seq.num_cached_tokens = 0
    assert schedule(seq, 11) == (9, 0)
    # A request without prompt logprobs never computes any.
    plain = Sequence(list(range(10)), SamplingParams(), block_size=4)
    assert schedule(plain, 10) == (0, 0) and not plain.needs_prompt_logits
    assert plain.logprobs is None and plain.prompt_logprobs is None


def test_a_chunk_ending_one_short_of_the_prompt_leaves_the_last_position_to_decode():
    seq = Sequence(list(range(6)), WANTS, block_size=4)
    assert schedule(seq, 5) == (0, 5)
    seq.launch_scheduled()
    assert not seq.needs_prompt_logits


def test_worker_copies_pick_the_same_rows():
    seq = Sequence(list(range(40)), WANTS, block_size=16)
    seq.block_table = [3, 4, 5]
    seq.num_cached_tokens, seq.num_scheduled_tokens = 16, 24
    other = Sequence(list(range(50, 70)), SamplingParams(), block_size=16)
    other.block_table = [6, 7]
    other.num_scheduled_tokens = 20
    copies = pickle.loads(pickle.dumps([other, seq]))
    assert copies[1].prompt_logit_rows() == seq.prompt_logit_rows() == (0, 23)
    want = list(range(20, 20 + 23))  # after other's 20 rows
    for batch in ([other, seq], copies):
        assert prefill_inputs(batch, 16, 4).prompt_rows.tolist() == want
    assert prefill_inputs([other], 16, 4).prompt_rows is None


def test_a_prompt_needing_logprobs_reads_no_prefix_cache():
    bm = BlockManager(16, 4)
    first = Sequence(list(range(12)), block_size=4)
    bm.allocate(first)
    first.num_cached_tokens = 12
    bm.commit(first)
    seq = Sequence(list(range(12)) + [99], WANTS, block_size=4)
    assert bm.blocks_needed(seq) == seq.num_blocks
    bm.allocate(seq)
    assert seq.num_cached_tokens == 0
    # Once its prompt logprobs are launched, a recompute may use the cache.
    seq.prompt_logits_next = 12
    bm.deallocate(seq)
    bm.allocate(seq)
    assert seq.num_cached_tokens == 12


def test_position_dicts_follow_vllm():
    decode = {5: "a", 6: "b", 7: "c"}.get
    # The chosen token outside the top-k: k + 1 entries, it first with its own rank.
    d = position_logprobs((-3.0, 9, [6, 7], [-0.5, -1.0]), 5, decode)
    assert list(d) == [5, 6, 7]
    assert d[5] == Logprob(-3.0, 9, "a") and d[7] == Logprob(-1.0, 2, "c")
    # Among the top-k: k entries, still first, with its top-k rank.
    d = position_logprobs((-1.0, 2, [6, 7], [-0.5, -1.0]), 7, decode)
    assert list(d) == [7, 6] and d[7].rank == 2
    assert position_logprobs((-1.0, 2, [], []), 7, decode) == {7: Logprob(-1.0, 2, "c")}


def test_record_skips_ended_sequences_and_prompt_output_has_a_leading_none():
    a = Sequence([1, 2, 3], WANTS)
    b = Sequence([4, 5], WANTS)
    b.status = SequenceStatus.FINISHED
    entry = (-0.5, 1, [9], [-0.5])
    record([a, b], StepLogprobs([entry, entry], [[entry, entry], [entry]]))
    assert a.logprobs == [entry] and a.prompt_logprobs == [None, entry, entry]
    assert b.logprobs == [] and b.prompt_logprobs == [None]
    out = prompt_logprobs(a.prompt_logprobs, a.prompt_token_ids, lambda t: None)
    assert out[0] is None and list(out[1]) == [2, 9] and list(out[2]) == [3, 9]
    a.prompt_logprobs.append(entry)  # one more than the prompt has: a bug, never hidden
    with pytest.raises(ValueError):
        prompt_logprobs(a.prompt_logprobs, a.prompt_token_ids, lambda t: None)


def test_samples_other_than_the_first_skip_prompt_logprobs():
    parent = Sequence(list(range(8)), SamplingParams(n=3, prompt_logprobs=1, logprobs=0))
    child = parent.spawn_sample()
    assert child.prompt_logprobs is None and child.prompt_logits_next is None
    assert child.logprobs == [] and parent.sampling_params.for_sample(0).prompt_logprobs == 1
