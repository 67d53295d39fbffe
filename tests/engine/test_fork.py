"""Parallel sampling in the control plane (no torch): a request with n > 1 is prefilled once,
then forks n - 1 samples that share its prompt blocks by reference count and compute only
the prompt's tail; preemption, aborts and admission keep every block's count exact."""
from types import SimpleNamespace

import pytest

from nanovllm import SamplingParams
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence, SequenceStatus
from tests.engine.test_scheduler import run_step

BS = 16


def scheduler(**kw) -> Scheduler:
    # Steps all prefill or all decode, whose batches these tests spell out (mixed steps are
    # covered by test_scheduler's random runs, n > 1 included).
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
               kvcache_block_size=BS, enable_prefix_caching=True, enable_mixed_steps=False)
    blocks = kw.pop("num_kvcache_blocks", 32)
    cfg.update(kw)
    return Scheduler(SimpleNamespace(**cfg), blocks, {-1})


def request(prompt_len: int, n: int, max_tokens: int = 4, **kw) -> Sequence:
    sp = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True, **kw)
    return Sequence(list(range(1, prompt_len + 1)), sp, block_size=BS)


def step(sched: Scheduler) -> tuple[list[tuple[int, int, int]], bool]:
    """One synchronous step; returns ((sample index, first position, tokens) per scheduled
    sequence, is_prefill)."""
    batch, is_prefill = sched.schedule()
    work = [(s.index, s.num_cached_tokens, s.num_scheduled_tokens) for s in batch]
    run_step(sched, batch, [7] * len(batch))
    return work, is_prefill


def assert_all_free(sched: Scheduler) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prompt_is_prefilled_once_and_its_blocks_shared(prefix_caching):
    sched = scheduler(enable_prefix_caching=prefix_caching)
    req = request(40, n=4)  # blocks 0 and 1 end before the last prompt token; 8 tokens left
    sched.add(req)
    assert step(sched) == ([(0, 0, 40)], True)
    children = req.samples[1:]
    assert [c.index for c in children] == [1, 2, 3] and len(sched.running) == 4
    shared = req.block_table[:2]
    for c in children:
        assert c.block_table[:2] == shared and c.block_table[2] != req.block_table[2]
        assert c.num_cached_tokens == 32 and c.request_id == req.seq_id
    assert [sched.block_manager.blocks[b].ref_count for b in shared] == [4, 4]
    # The children compute the prompt's tail only; then everyone decodes.
    assert step(sched) == ([(1, 32, 8), (2, 32, 8), (3, 32, 8)], True)
    work, is_prefill = step(sched)
    assert not is_prefill and len(work) == 4
    while not sched.is_finished():
        step(sched)
    assert all(s.completion_token_ids == [7] * 4 for s in req.samples)
    assert req.request_finished
    assert_all_free(sched)


def test_a_one_token_tail_is_computed_by_a_decode_step():
    sched = scheduler()
    req = request(33, n=3)  # the last prompt token starts block 2
    sched.add(req)
    assert step(sched) == ([(0, 0, 33)], True)
    work, is_prefill = step(sched)
    assert not is_prefill and sorted(work) == [(0, 33, 1), (1, 32, 1), (2, 32, 1)]
    assert [len(s.completion_token_ids) for s in req.samples] == [2, 1, 1]
    while not sched.is_finished():
        step(sched)
    assert_all_free(sched)


def test_seeds_and_params_of_the_samples():
    req = request(5, n=3, seed=11, temperature=0.7)
    sched = scheduler()
    sched.add(req)
    step(sched)
    assert [s.sampling_params.seed for s in req.samples] == [11, 12, 13]
    assert [s.sampling_params.n for s in req.samples] == [3, 1, 1]
    assert all(s.sampling_params.temperature == 0.7 for s in req.samples)
    assert req.sampling_params is not req.samples[1].sampling_params


def test_admission_waits_for_room_for_the_samples():
    sched = scheduler(max_num_seqs=3)
    other = request(5, n=1, max_tokens=3)
    req = request(20, n=3)
    sched.add(other)
    step(sched)
    sched.add(req)
    # other runs: req's three samples would make four sequences; it waits.
    work, is_prefill = step(sched)
    assert not is_prefill and [s for s in sched.waiting] == [req]
    while other.status is SequenceStatus.RUNNING:
        step(sched)
    assert step(sched) == ([(0, 0, 20)], True)
    assert len(sched.running) == 3 and all(len(s.block_table) == 2 for s in req.samples)


def test_alone_a_request_starts_even_if_its_samples_must_wait():
    # max_num_seqs=2: one sample forks beside the first, the last waits and is recomputed
    # (from the prefix cache) when a slot frees up.
    sched = scheduler(max_num_seqs=2)
    req = request(40, n=3, max_tokens=2)
    sched.add(req)
    step(sched)
    third = req.samples[2]
    assert third.status is SequenceStatus.WAITING and not third.block_table
    while not sched.is_finished():
        step(sched)
    assert all(len(s.completion_token_ids) == 2 for s in req.samples)
    assert sched.block_manager.num_hit_tokens == 32  # third's prompt came from the cache
    assert_all_free(sched)


@pytest.mark.parametrize("victim", [0, 1])
def test_preempting_the_parent_or_a_child_keeps_the_shared_blocks(victim):
    sched = scheduler(enable_prefix_caching=False)
    req = request(40, n=3, max_tokens=6)
    sched.add(req)
    step(sched)
    shared = req.block_table[:2]
    sched.running.remove(req.samples[victim])
    sched.preempt(req.samples[victim])
    # The others still hold the shared blocks: nothing freed twice, nothing lost.
    assert [sched.block_manager.blocks[b].ref_count for b in shared] == [2, 2]
    while not sched.is_finished():
        step(sched)
    assert all(len(s.completion_token_ids) == 6 for s in req.samples)
    assert_all_free(sched)


def test_abort_stops_every_sample_and_frees_everything():
    sched = scheduler()
    req, other = request(40, n=4, max_tokens=8), request(10, n=1, max_tokens=8)
    sched.add(req)
    sched.add(other)
    step(sched)
    step(sched)
    launched = sched.on_launch(sched.schedule()[0])  # a step in flight
    aborted = sched.abort({req.request_id})
    assert set(aborted) == set(req.samples) and req.request_finished
    assert all(s.finish_reason == "abort" and not s.block_table for s in req.samples)
    sched.on_result(launched, [7] * len(launched.seqs))  # late results are ignored
    assert list(sched.running) == [other] and not sched.waiting
    sched.abort({other.request_id})
    assert_all_free(sched)


def test_abort_before_the_prompt_is_computed_makes_no_samples():
    sched = scheduler(max_num_batched_tokens=16)
    req = request(40, n=4)
    sched.add(req)
    step(sched)  # the first 16-token chunk only
    assert req.samples == [req]
    assert sched.abort({req.request_id}) == [req] and req.request_finished
    assert sched.is_finished()
    assert_all_free(sched)


def test_chunked_prompt_forks_when_its_last_chunk_runs():
    sched = scheduler(max_num_batched_tokens=16)
    req = request(40, n=2)
    sched.add(req)
    assert [step(sched)[0] for _ in range(4)] == [
        [(0, 0, 16)], [(0, 16, 16)], [(0, 32, 8)], [(1, 32, 8)]]
    while not sched.is_finished():
        step(sched)
    assert_all_free(sched)
