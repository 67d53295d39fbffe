"""abort_request: waiting, running and in-flight requests stop at once, free their KV blocks
exactly once, come back from the next step() with finish_reason "abort", and leave every
other request's tokens as they would have been without them."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.prompts import make_prompts

MODEL = "tied_gqa4_d16_l4"
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = make_prompts(5, n=6, shared=range(100, 120), max_len=30)


def engine(toy_models, async_scheduling: bool, device: str = "cpu") -> LLM:
    # Two sequences at a time, so that some requests are still waiting when others run.
    return LLM(toy_models[MODEL], device=device, dtype="float32", kvcache_block_size=16,
               max_model_len=256, num_kvcache_blocks=32, max_num_seqs=2,
               async_scheduling=async_scheduling)


def held_blocks(llm) -> int:
    return sum(len(s.block_table) for s in llm.clients[0].core.scheduler.running)


def run_with_aborts(llm, prompts, abort_at: int, pick) -> tuple[list, list[int]]:
    """Add every prompt, step; before step `abort_at`, abort the ids `pick(llm, ids)` names.
    Returns (outputs in input order, the aborted ids)."""
    ids = [llm.add_request(p, GREEDY) for p in prompts]
    outs, victims, step = {}, [], 0
    bm = llm.clients[0].core.scheduler.block_manager
    while not llm.is_finished():
        if step == abort_at:
            victims = pick(llm, ids)
            llm.abort_request(victims)
            # Freed at once: only the requests still running hold blocks.
            assert bm.num_free_blocks == bm.num_blocks - held_blocks(llm)
            sched = llm.clients[0].core.scheduler
            live = list(sched.running) + list(sched.waiting)
            assert not {s.request_id for s in live} & set(victims)
        finished, _ = llm.step()
        if step == abort_at:
            assert {o.request_id for o in finished} >= set(victims)  # the very next step
        for o in finished:
            assert o.request_id not in outs, "one output per request"
            outs[o.request_id] = o
        step += 1
    assert bm.num_free_blocks == bm.num_blocks and llm.clients[0].core.scheduler.num_in_flight == 0
    assert all(b.ref_count == 0 for b in bm.blocks)
    return [outs[i] for i in ids], victims


def waiting_and_running(llm, ids):
    running = [s.request_id for s in llm.clients[0].core.scheduler.running]
    waiting = [s.request_id for s in llm.clients[0].core.scheduler.waiting]
    assert running and waiting
    return [running[0], waiting[-1]]


def in_flight(llm, ids):
    # Async scheduling: the step launched last is still on its way with a token of each.
    pending = [s.request_id for s in llm.clients[0].core.scheduler.running if s.num_pending]
    assert pending and llm.clients[0].core._in_flight is not None
    return pending[:1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("async_scheduling, pick, abort_at", [
    (False, waiting_and_running, 3),
    (True, waiting_and_running, 3),
    (True, in_flight, 1),
    (True, in_flight, 4),
], ids=["sync", "async", "in-flight-prefill", "in-flight-decode"])
def test_abort_frees_blocks_and_keeps_other_outputs(toy_models, async_scheduling, pick,
                                                    abort_at, device):
    # On a GPU the aborted request's step really is still running when it is aborted.
    llm = engine(toy_models, async_scheduling, device)
    full = {tuple(p): o.outputs[0].token_ids
            for p, o in zip(PROMPTS, llm.generate(PROMPTS, GREEDY, use_tqdm=False))}
    outs, victims = run_with_aborts(llm, PROMPTS, abort_at, pick)
    assert victims
    kept = [p for p, o in zip(PROMPTS, outs) if o.request_id not in victims]
    alone = llm.generate(kept, GREEDY, use_tqdm=False)  # a run without the aborted ones
    for p, o in zip(PROMPTS, outs):
        c = o.outputs[0]
        if o.request_id in victims:
            assert c.finish_reason == "abort" and o.finished and c.stop_reason is None
            # What it had generated is kept: a prefix of its full greedy completion.
            assert full[tuple(p)][: len(c.token_ids)] == c.token_ids
            assert len(c.token_ids) < GREEDY.max_tokens
        else:
            assert c.finish_reason == "length"
    assert [o.outputs[0].token_ids for o in outs if o.request_id not in victims] == \
        [o.outputs[0].token_ids for o in alone]
    llm.shutdown()


def test_unknown_finished_and_repeated_ids_are_ignored(toy_models):
    llm = engine(toy_models, async_scheduling=True)
    done = llm.generate([[4, 5, 6]], GREEDY, use_tqdm=False)[0]
    llm.abort_request(done.request_id)  # finished already
    llm.abort_request([10 ** 9, -1])  # never existed
    assert llm.is_finished()
    assert llm.step() == ([], 0)  # nothing to do, nothing owed
    rid = llm.add_request([7, 8], GREEDY)
    llm.abort_request(rid)
    llm.abort_request((rid, rid))  # aborted already: no second output, no double free
    assert not llm.is_finished()  # its output is still owed
    with pytest.raises(ValueError, match="pending"):
        llm.generate(["x"], GREEDY, use_tqdm=False)
    finished, num_tokens = llm.step()
    assert [(o.request_id, o["finish_reason"], o["token_ids"]) for o in finished] == \
        [(rid, "abort", [])]
    assert num_tokens == 0 and llm.is_finished() and llm.step() == ([], 0)
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    llm.shutdown()


@pytest.mark.parametrize("bad", ["3", b"3", 2.0, [1, "2"], [True], None])
def test_bad_request_ids(toy_models, bad):
    llm = engine(toy_models, async_scheduling=False)
    rid = llm.add_request([4, 5], GREEDY)
    with pytest.raises(ValueError, match="request id"):
        llm.abort_request(bad)
    # Nothing was aborted: the request still completes.
    outs = []
    while not llm.is_finished():
        outs += llm.step()[0]
    assert [(o.request_id, o["finish_reason"]) for o in outs] == [(rid, "length")]
    llm.shutdown()


def test_abort_all_drops_outputs_too(toy_models):
    llm = engine(toy_models, async_scheduling=True)
    rids = [llm.add_request(p, GREEDY) for p in PROMPTS[:3]]
    llm.step()
    llm.abort_request(rids[0])
    llm.abort_all()
    assert llm.is_finished() and llm.step() == ([], 0)
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert len(llm.generate(["x"], GREEDY, use_tqdm=False)) == 1
    llm.shutdown()
