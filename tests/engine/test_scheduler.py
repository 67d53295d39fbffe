import random
from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest

from nanovllm import SamplingParams
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.engine.stop_rules import length_done


def sched_config(**kw):
    """The limits the Scheduler reads, without a model directory, plus what the engine would
    pass it (num_kvcache_blocks, eos)."""
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, eos=-1,
                num_kvcache_blocks=32, kvcache_block_size=16, enable_prefix_caching=True,
                enable_mixed_steps=True, max_mixed_prefill_tokens=None)
    base.update(kw)
    return SimpleNamespace(**base)


def make_scheduler(cfg) -> Scheduler:
    """A Scheduler as the engine builds it: the block count and end tokens passed in."""
    return Scheduler(cfg, cfg.num_kvcache_blocks, {cfg.eos})


def run_step(sched: Scheduler, seqs: list[Sequence], token_ids: list[int]) -> list[Sequence]:
    """Record a step that ran to completion (launch and result at once); returns the
    sequences that finished."""
    return sched.on_result(sched.on_launch(seqs), token_ids)


def fake_model(seq: Sequence) -> int:
    """Next token as a pure function of the known tokens so far (like greedy decoding); a
    pending (in-flight) token's value depends only on the tokens before it."""
    known = seq.token_ids[: seq.num_tokens - seq.num_pending]
    return (sum(known) * 31 + len(known)) % 97


def simulate(sched: Scheduler, seqs, cfg, rng=None, max_steps=20000, lag=False,
             abort_rate=0.0):
    """Run the scheduler to completion, checking every step's invariants. With lag, each
    step's results arrive only after the next step was scheduled (async scheduling); with
    abort_rate, a random live request is aborted after that share of the steps. Requests
    with n > 1 fork their other samples on the way: those are checked like the rest."""
    for s in seqs:
        sched.add(s)
    computed = defaultdict(list)  # positions computed since the last (re)start, by seq_id
    original_preempt = sched.preempt

    def preempt(seq):
        # The victim ranks lowest (largest (priority, arrival)) of what is still running.
        assert all(seq.sort_key >= s.sort_key for s in sched.running)
        computed[seq.seq_id] = []
        original_preempt(seq)

    sched.preempt = preempt
    waits = defaultdict(int)
    in_flight = None
    for _ in range(max_steps):
        if sched.is_finished() and in_flight is None:
            break
        if abort_rate and rng.random() < abort_rate:
            live = [s for s in seqs if not s.request_finished]
            if live:
                victim = rng.choice(live)
                samples = {x for x in victim.samples if not x.is_finished}
                assert set(sched.abort({victim.request_id, -5})) == samples
                assert all(x.finish_reason == "abort" and not x.block_table for x in samples)
        if sched.is_finished() and in_flight is None:
            break
        preemptions = sched.num_preemptions
        # Running sequences whose prompts are computed: each decodes one token this step.
        ready = [s for s in sched.running if s.num_tokens - s.num_cached_tokens == 1
                 and not (s.num_pending and length_done(s, cfg.max_model_len))]
        waiting = set(sched.waiting)
        batch, is_prefill = sched.schedule()
        assert batch or in_flight, "nothing scheduled and nothing to wait for"
        check_step_shape(sched, cfg, batch, is_prefill, ready, waiting, preemptions)
        for queue in (sched.waiting, sched.running):
            keys = [s.sort_key for s in queue]
            assert keys == sorted(keys), "queues stay in (priority, arrival) order"
        assert len(batch) <= cfg.max_num_seqs
        assert len({s.seq_id for s in batch}) == len(batch)
        assert sum(s.num_scheduled_tokens for s in batch) <= cfg.max_num_batched_tokens
        assert len(sched.running) <= cfg.max_num_seqs
        for s in batch:
            assert s.status == SequenceStatus.RUNNING
            assert len(s.block_table) == s.num_blocks, "every token needs a slot"
            start, n = s.num_cached_tokens, s.num_scheduled_tokens
            assert n >= 1 and start + n <= s.num_tokens
            if not is_prefill:
                assert n == 1 and start == s.num_tokens - 1
            if computed[s.seq_id]:
                assert start == computed[s.seq_id][-1] + 1, "skipped or repeated tokens"
            computed[s.seq_id] += range(start, start + n)
            if start + n == s.num_tokens:
                # Chunks covered every position exactly once (prefix hits count as covered).
                covered = computed[s.seq_id]
                first = covered[0]
                assert covered == list(range(first, s.num_tokens))
                assert first % s.block_size == 0
        for s in (x for r in seqs for x in r.samples):
            waits[s.seq_id] = 0 if s in batch or s.is_finished else waits[s.seq_id] + 1
            assert waits[s.seq_id] < 5000, "starved"
        # Every reference to a block is a running sequence's (waiting ones hold none), and
        # each block's count says how many: so each block is freed exactly once.
        assert not any(s.block_table for s in sched.waiting)
        refs = Counter(b for s in sched.running for b in s.block_table)
        assert all(b.ref_count == refs[b.block_id] for b in sched.block_manager.blocks)
        launched = sched.on_launch(batch) if batch else None
        done, in_flight = (in_flight, launched) if lag else (launched, None)
        if done is not None:
            sched.on_result(done, [fake_model(s) for s in done.seqs])
        # Extra preemptions at random points (as memory pressure would cause).
        if rng is not None and rng.random() < 0.02 and sched.running:
            sched.preempt(sched.running.pop())
    assert sched.is_finished(), "did not finish"
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "leaked blocks"
    assert all(b.ref_count == 0 for b in bm.blocks)


def check_step_shape(sched, cfg, batch, is_prefill, ready, waiting, preemptions) -> None:
    """Mixed steps: the decodes lead, every ready sequence decodes when the limits allow, and
    the prompt part keeps to its budget. Otherwise a prefill step holds no decode."""
    decodes = [s for s in batch if s in ready]
    chunks = batch[len(decodes):]
    if not cfg.enable_mixed_steps:
        assert not (is_prefill and decodes), "a prefill step holds no decode"
        return
    assert batch[:len(decodes)] == decodes, "decode rows lead the step"
    assert is_prefill == bool(chunks) or not batch
    if decodes:
        cap = cfg.max_mixed_prefill_tokens or cfg.max_num_batched_tokens
        assert sum(s.num_scheduled_tokens for s in chunks) <= cap
        if sched.num_preemptions > preemptions:
            assert not waiting & set(chunks), "admitted right after preempting"
    if sched.num_preemptions == preemptions and len(ready) <= min(cfg.max_num_seqs,
                                                                  cfg.max_num_batched_tokens):
        assert len(decodes) == len(ready), "a ready sequence was left without a token"


def expected_completion(prompt, max_tokens):
    s = Sequence(prompt)
    for _ in range(max_tokens):
        s.append_token(fake_model(s))
    return s.completion_token_ids


def make_seqs(rng, n, cfg, max_prompt=100, shared_prefix=True, priorities=(0,), samples=(1,)):
    prefix = [rng.randrange(97) for _ in range(40)]
    out = []
    for _ in range(n):
        p = [rng.randrange(97) for _ in range(rng.randrange(1, max_prompt))]
        if shared_prefix and rng.random() < 0.5:
            p = prefix[: rng.randrange(1, 41)] + p
        sp = SamplingParams(max_tokens=rng.randrange(1, 40), ignore_eos=True,
                            n=rng.choice(samples))
        out.append(Sequence(p, sp, block_size=cfg.kvcache_block_size,
                            priority=rng.choice(priorities)))
    return out


@pytest.mark.parametrize("steps", ["mixed", "separate"])
@pytest.mark.parametrize("lag", [False, True], ids=["sync", "lag"])
@pytest.mark.parametrize("mix", ["fcfs", "priority+abort", "n>1+priority+abort"])
@pytest.mark.parametrize("seed", range(12))
def test_random_runs_keep_invariants_and_tokens(seed, mix, lag, steps):
    rng = random.Random(seed)
    cfg = sched_config(
        max_num_seqs=rng.choice([1, 3, 8]),
        max_num_batched_tokens=rng.choice([7, 33, 64, 512]),
        num_kvcache_blocks=rng.choice([12, 20, 64]),
        kvcache_block_size=16,
        enable_prefix_caching=rng.random() < 0.7,
        enable_mixed_steps=steps == "mixed",
        max_mixed_prefill_tokens=rng.choice([None, 1, 5, 16]),
    )
    sched = make_scheduler(cfg)
    mixed = mix != "fcfs"
    samples = (1, 2, 3, 5) if mix.startswith("n>1") else (1,)
    seqs = make_seqs(rng, 25, cfg, priorities=(-3, 0, 0, 2, 7) if mixed else (0,),
                     samples=samples)
    simulate(sched, seqs, cfg, rng, lag=lag, abort_rate=0.03 if mixed else 0.0)
    assert sched.num_in_flight == 0
    for s in (x for r in seqs for x in r.samples):
        # fake_model is deterministic: every sample of a request has the same tokens.
        want = expected_completion(s.prompt_token_ids, s.sampling_params.max_tokens)
        if s.finish_reason == "abort":
            # An abort keeps the tokens known so far; nothing in flight leaks into them.
            assert want[: len(s.completion_token_ids)] == s.completion_token_ids
            assert s.num_pending == 0
            continue
        assert s.finish_reason == "length"
        # Preempted-and-recomputed sequences resume with exactly the same tokens.
        assert s.completion_token_ids == want
    if mixed:
        assert any(s.finish_reason == "abort" for s in seqs)  # the aborts did happen
    for r in seqs:
        # All n samples exist, or the request was aborted before its prompt was computed.
        assert len(r.samples) == r.sampling_params.n or r.finish_reason == "abort"
        assert [x.index for x in r.samples] == list(range(len(r.samples)))


def test_chunked_prefill_of_a_long_prompt_and_a_second_one():
    cfg = sched_config(max_num_batched_tokens=16, num_kvcache_blocks=64, max_model_len=512,
                       enable_mixed_steps=False)
    sched = make_scheduler(cfg)
    a = Sequence(list(range(50)), SamplingParams(max_tokens=2), block_size=16)
    b = Sequence(list(range(100, 140)), SamplingParams(max_tokens=2), block_size=16)
    sched.add(a)
    sched.add(b)
    chunks = []
    while a.num_cached_tokens < 50 or b.num_cached_tokens < 40:
        batch, is_prefill = sched.schedule()
        assert is_prefill
        chunks.append([(s.seq_id, s.num_cached_tokens, s.num_scheduled_tokens) for s in batch])
        run_step(sched, batch, [0] * len(batch))
    # max_model_len (512) exceeds the budget (16): both prompts arrive in chunks.
    assert chunks[0] == [(a.seq_id, 0, 16)]
    assert sum(n for step in chunks for sid, _, n in step if sid == b.seq_id) == 40
    assert len(a.completion_token_ids) == 1 and len(b.completion_token_ids) == 1


def test_decode_preempts_newest_and_it_resumes_first():
    cfg = sched_config(max_num_batched_tokens=64, num_kvcache_blocks=4, max_num_seqs=4)
    sched = make_scheduler(cfg)
    a = Sequence(list(range(16)), SamplingParams(max_tokens=30, ignore_eos=True), block_size=16)
    b = Sequence(list(range(20, 36)), SamplingParams(max_tokens=30, ignore_eos=True), block_size=16)
    sched.add(a)
    sched.add(b)
    batch, _ = sched.schedule()
    run_step(sched, batch, [1, 1])  # both hold 1 block, 17 tokens -> need a 2nd
    batch, is_prefill = sched.schedule()
    assert not is_prefill and len(batch) == 2
    run_step(sched, batch, [1, 1])
    # Fill the remaining blocks and watch b (newest) get preempted first.
    while b.status == SequenceStatus.RUNNING:
        batch, is_prefill = sched.schedule()
        run_step(sched, batch, [1] * len(batch))
    assert b.status == SequenceStatus.WAITING and sched.waiting[0] is b
    assert a.status == SequenceStatus.RUNNING


def test_finish_reasons():
    cfg = sched_config(eos=5, max_model_len=20, num_kvcache_blocks=8)
    sched = make_scheduler(cfg)
    eos = Sequence([1, 2], SamplingParams(max_tokens=10), block_size=16)
    stop = Sequence([1, 2], SamplingParams(max_tokens=10, stop_token_ids=[9]), block_size=16)
    ign = Sequence([1, 2], SamplingParams(max_tokens=3, ignore_eos=True), block_size=16)
    longseq = Sequence(list(range(18)), SamplingParams(max_tokens=100, ignore_eos=True),
                       block_size=16)
    for s in (eos, stop, ign, longseq):
        sched.add(s)
    batch, _ = sched.schedule()
    run_step(sched, batch, [5, 9, 5, 5])
    assert (eos.finish_reason, stop.finish_reason) == ("stop", "stop")
    assert (eos.stop_reason, stop.stop_reason) == (None, 9)  # vLLM: an end token has none
    assert ign.finish_reason is None and not ign.is_finished
    while not sched.is_finished():
        batch, _ = sched.schedule()
        run_step(sched, batch, [5] * len(batch))
    assert ign.finish_reason == "length" and len(ign.completion_token_ids) == 3
    assert ign.stop_reason is None
    assert longseq.finish_reason == "length" and len(longseq) == 20  # hit max_model_len
    assert sched.block_manager.num_free_blocks == 8


@pytest.mark.parametrize("lag", [False, True])
def test_end_tokens_and_stop_ids_do_not_stop_before_min_tokens(lag):
    # The sampler keeps them out; should one arrive anyway, it does not end the sequence
    # until min_tokens tokens are there (vLLM's rule), counting only known tokens.
    sched = make_scheduler(sched_config(eos=5))
    eos = Sequence([1, 2], SamplingParams(max_tokens=10, min_tokens=3), block_size=16)
    stop = Sequence([1, 2], SamplingParams(max_tokens=10, min_tokens=3, stop_token_ids=[9]),
                    block_size=16)
    for s in (eos, stop):
        sched.add(s)
    in_flight = None
    while not sched.is_finished() or in_flight is not None:
        batch, _ = sched.schedule() if not sched.is_finished() else ([], True)
        launched = sched.on_launch(batch) if batch else None
        if lag:
            launched, in_flight = in_flight, launched
        if launched is not None:
            sched.on_result(launched, [5 if s is eos else 9 for s in launched.seqs])
    for s, token, reason in ((eos, 5, None), (stop, 9, 9)):
        assert s.finish_reason == "stop" and s.stop_reason == reason
        assert s.completion_token_ids == [token] * 3


def test_requests_that_cannot_fit_are_rejected():
    cfg = sched_config(max_model_len=64, num_kvcache_blocks=2)
    sched = make_scheduler(cfg)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add(Sequence(list(range(64)), block_size=16))
    with pytest.raises(ValueError, match="empty"):
        sched.add(Sequence([], block_size=16))
    with pytest.raises(ValueError, match="blocks"):
        sched.add(Sequence(list(range(20)), SamplingParams(max_tokens=40), block_size=16))
    assert sched.is_finished()


def test_prefix_hit_in_scheduler_skips_cached_tokens():
    cfg = sched_config(num_kvcache_blocks=16, max_num_batched_tokens=256)
    sched = make_scheduler(cfg)
    p = list(range(40))
    a = Sequence(p, SamplingParams(max_tokens=1), block_size=16)
    simulate(sched, [a], cfg)
    b = Sequence(p + [1], SamplingParams(max_tokens=1), block_size=16)
    sched.add(b)
    batch, _ = sched.schedule()
    assert batch == [b] and b.num_cached_tokens == 32 and b.num_scheduled_tokens == 9


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    cfg = sched_config(max_num_seqs=1, num_kvcache_blocks=16)
    sched = make_scheduler(cfg)
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    seqs = {name: Sequence([i + 1, i + 2], one, block_size=16, priority=p)
            for i, (name, p) in enumerate([("a", 0), ("b", -1), ("c", 0), ("d", -1), ("e", 3)])}
    for s in seqs.values():
        sched.add(s)
    order = []
    while not sched.is_finished():
        batch, _ = sched.schedule()
        order += [name for name, s in seqs.items() if s in batch]
        run_step(sched, batch, [0] * len(batch))
    assert order == ["b", "d", "a", "c", "e"]


def test_preemption_evicts_the_lowest_priority_even_if_it_came_first():
    cfg = sched_config(num_kvcache_blocks=4, max_num_seqs=4)
    sched = make_scheduler(cfg)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    a = Sequence(list(range(16)), sp, block_size=16, priority=5)  # first, but lowest priority
    b = Sequence(list(range(20, 36)), sp, block_size=16)
    c = Sequence(list(range(40, 56)), sp, block_size=16)
    for s in (a, b, c):
        sched.add(s)
    batch, is_prefill = sched.schedule()
    assert is_prefill and batch == [b, c, a]  # admitted in priority order
    run_step(sched, batch, [1, 1, 1])
    # One 40-token request (3 blocks) arrives with a middling priority: it cannot fit now.
    d = Sequence(list(range(60, 100)), SamplingParams(max_tokens=8), block_size=16, priority=1)
    sched.add(d)
    # Each of a, b, c needs a second block for its 17th token; only one is free.
    batch, is_prefill = sched.schedule()
    assert not is_prefill and batch == [b, c]
    assert a.status == SequenceStatus.WAITING and not a.block_table
    # a waits behind d, which outranks it, though a arrived first.
    assert list(sched.waiting) == [d, a]


def test_equal_priorities_are_first_come_first_served():
    cfg = sched_config(max_num_seqs=2, num_kvcache_blocks=16)
    sched = make_scheduler(cfg)
    seqs = [Sequence([7, i], SamplingParams(max_tokens=1), block_size=16, priority=4)
            for i in range(5)]
    for s in reversed(seqs):  # arrival is creation order (the request id), not add order
        sched.add(s)
    assert list(sched.waiting) == seqs


def test_abort_frees_blocks_of_waiting_running_and_in_flight_requests():
    cfg = sched_config(num_kvcache_blocks=8, max_num_seqs=2)
    sched = make_scheduler(cfg)
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    run1, run2, wait = (Sequence(list(range(k, k + 20)), sp, block_size=16)
                        for k in (0, 30, 60))
    for s in (run1, run2, wait):
        sched.add(s)
    batch, _ = sched.schedule()
    assert batch == [run1, run2]
    launched = sched.on_launch(batch)  # in flight: each holds a pending token
    assert sched.abort({wait.seq_id, run1.seq_id, 12345}) == [run1, wait]
    assert [s.finish_reason for s in (run1, wait)] == ["abort", "abort"]
    assert run1.num_pending == 0 and len(run1) == 20  # the in-flight token is dropped
    assert list(sched.running) == [run2] and not sched.waiting
    # The late result of the aborted request is ignored; the other one's is kept.
    assert sched.on_result(launched, [3, 4]) == []
    assert run1.completion_token_ids == [] and run2.completion_token_ids == [4]
    assert sched.abort({run1.seq_id}) == []  # already finished: a no-op
    sched.abort({run2.seq_id})
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks and sched.is_finished()


def test_mixed_step_decodes_first_then_chunks_a_new_prompt_within_the_cap():
    cfg = sched_config(max_num_batched_tokens=64, max_mixed_prefill_tokens=8)
    sched = make_scheduler(cfg)
    a = Sequence(list(range(10)), SamplingParams(max_tokens=5, ignore_eos=True), block_size=16)
    sched.add(a)
    batch, is_prefill = sched.schedule()
    assert is_prefill and batch == [a] and a.num_scheduled_tokens == 10  # nothing decodes yet
    run_step(sched, batch, [1])
    b = Sequence(list(range(40)), SamplingParams(max_tokens=2), block_size=16)
    sched.add(b)
    chunks = []
    while b.num_cached_tokens < 40:
        batch, is_prefill = sched.schedule()
        assert is_prefill and batch[-1] is b
        if not a.is_finished:  # a decodes in every step, ahead of the chunk
            assert batch == [a, b] and a.num_scheduled_tokens == 1
        chunks.append(b.num_scheduled_tokens)
        run_step(sched, batch, [1] * len(batch))
    assert chunks == [8] * 5 and sched.num_mixed_steps == 4  # a ended after 4 of them
    assert len(a.completion_token_ids) == 5


def test_mixed_step_admits_nobody_right_after_a_preemption():
    cfg = sched_config(num_kvcache_blocks=3, max_num_seqs=4)
    sched = make_scheduler(cfg)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    a, b = (Sequence(list(range(k, k + 16)), sp, block_size=16) for k in (0, 20))
    sched.add(a)
    sched.add(b)
    run_step(sched, sched.schedule()[0], [1, 1])  # one block each; one left
    c = Sequence([5, 6, 7], SamplingParams(max_tokens=2), block_size=16, priority=-1)
    sched.add(c)
    # a takes the free block for its 17th token; b finds none and is preempted, which frees
    # one: c would fit, but a step that preempted admits nobody (the freed blocks are wanted
    # back by what runs).
    batch, is_prefill = sched.schedule()
    assert batch == [a] and not is_prefill
    assert list(sched.waiting) == [c, b] and sched.num_preemptions == 1


@pytest.mark.parametrize("streaming, cap, budget, want", [
    (False, None, 16384, 16384), (True, None, 16384, 2048), (True, None, 1000, 1000),
    (True, 300, 16384, 300), (False, 300, 16384, 300)])
def test_prompt_budget_beside_decodes(streaming, cap, budget, want):
    cfg = sched_config(max_num_batched_tokens=budget, max_mixed_prefill_tokens=cap)
    sched = Scheduler(cfg, cfg.num_kvcache_blocks, {cfg.eos}, streaming=streaming)
    assert sched.max_mixed_prefill_tokens == want
