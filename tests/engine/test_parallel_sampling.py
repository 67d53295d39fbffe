"""SamplingParams(n=k) end to end on CPU: one RequestOutput with k completions; sample i is
what n=1 with seed s + i gives; the prompt is prefilled once; preemption, chunked prefill,
aborts and async scheduling keep the tokens, and every block comes back."""
import pytest

from nanovllm import LLM, SamplingParams
from tests.support.prompts import make_prompts

MODEL = "tied_gqa4_d16_l4"
PROMPT = list(range(10, 50))  # 40 tokens: two shared 16-token blocks and an 8-token tail
GREEDY = dict(temperature=0, max_tokens=12, ignore_eos=True)
SEEDED = dict(temperature=1.0, max_tokens=12, ignore_eos=True, seed=123)


def engine(toy_models, async_scheduling=False, **kw) -> LLM:
    args = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
                num_kvcache_blocks=48, async_scheduling=async_scheduling)
    args.update(kw)
    return LLM(toy_models[MODEL], **args)


def token_ids(out) -> list[list[int]]:
    return [c.token_ids for c in out.outputs]


def assert_all_free(llm) -> None:
    bm = llm.clients[0].core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)


def references(llm, prompts, kw, n) -> list[list[list[int]]]:
    """Per prompt, the n=1 completions with seeds seed + i (or greedy), one run each."""
    out = []
    for p in prompts:
        seed = kw.get("seed")
        seeds = [None] * n if seed is None else [seed + i for i in range(n)]
        sps = [SamplingParams(**dict(kw, seed=s)) for s in seeds]
        out.append([o.outputs[0].token_ids
                    for o in llm.generate([p] * n, sps, use_tqdm=False)])
    return out


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_samples_equal_the_single_completion(toy_models, async_scheduling):
    llm = engine(toy_models, async_scheduling)
    one = llm.generate([PROMPT], SamplingParams(**GREEDY), use_tqdm=False)[0]
    out = llm.generate([PROMPT], SamplingParams(**GREEDY, n=3), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    assert token_ids(out) == [one.outputs[0].token_ids] * 3
    assert out["token_ids"] == one["token_ids"]  # the dict view reads the first completion
    assert_all_free(llm)
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_seeded_sample_i_is_n1_with_seed_plus_i(toy_models, async_scheduling):
    llm = engine(toy_models, async_scheduling)
    out = llm.generate([PROMPT], SamplingParams(**SEEDED, n=4), use_tqdm=False)[0]
    assert token_ids(out) == references(llm, [PROMPT], SEEDED, 4)[0]
    assert len({tuple(t) for t in token_ids(out)}) == 4, "samples should differ"
    again = llm.generate([PROMPT], SamplingParams(**SEEDED, n=4), use_tqdm=False)[0]
    assert token_ids(again) == token_ids(out)  # reproducible (prefix-cache hits this time)
    assert_all_free(llm)
    llm.shutdown()


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prompt_is_prefilled_once(toy_models, prefix_caching):
    llm = engine(toy_models, enable_prefix_caching=prefix_caching)
    rid = llm.add_request(PROMPT, SamplingParams(**SEEDED, n=4))
    prefill_tokens, outputs, step = [], [], 0
    while not llm.is_finished():
        finished, num_tokens = llm.step()
        step += 1
        if step == 1:  # the prompt is in: the samples share its first two blocks
            seqs = list(llm.clients[0].core.scheduler.running)
            assert len(seqs) == 4 and all(s.request_id == rid for s in seqs)
            shared = seqs[0].block_table[:2]
            assert all(s.block_table[:2] == shared for s in seqs)
            assert len({s.block_table[2] for s in seqs}) == 4
            blocks = llm.clients[0].core.scheduler.block_manager.blocks
            assert [blocks[b].ref_count for b in shared] == [4, 4]
        if num_tokens > 0:
            prefill_tokens.append(num_tokens)
        outputs += finished
    # 40 prompt tokens once, then each other sample's 8-token tail (in one step, beside
    # sample 0's first decode: a mixed step).
    assert prefill_tokens == [40, 3 * 8 + 1]
    assert [o.request_id for o in outputs] == [rid] and len(outputs[0].outputs) == 4
    assert all(c.finish_reason == "length" for c in outputs[0].outputs)
    assert_all_free(llm)
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_step_returns_a_request_once_when_its_last_sample_ends(toy_models, async_scheduling):
    llm = engine(toy_models, async_scheduling)
    # Sample 0 stops early on a stop token of its own draw; the others run to max_tokens.
    first = llm.generate([PROMPT], SamplingParams(**SEEDED), use_tqdm=False)[0]
    stop = first.outputs[0].token_ids[2]
    others = references(llm, [PROMPT], SEEDED, 3)[0][1:]
    if stop in others[0][:SEEDED["max_tokens"]] or stop in others[1]:
        pytest.skip("the stop token also occurs in another sample")
    rid = llm.add_request(PROMPT, SamplingParams(**SEEDED, n=3, stop_token_ids=[stop]))
    seen = []
    while not llm.is_finished():
        seen += llm.step()[0]
    assert [o.request_id for o in seen] == [rid]
    out = seen[0]
    assert [c.finish_reason for c in out.outputs] == ["stop", "length", "length"]
    assert out.outputs[0].stop_reason == stop and out.outputs[0].token_ids[-1] == stop
    assert token_ids(out)[1:] == others
    assert_all_free(llm)
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("abort_at", [0, 1, 3])
def test_abort_stops_all_samples_and_frees_everything(toy_models, async_scheduling, abort_at):
    llm = engine(toy_models, async_scheduling, max_num_batched_tokens=32)
    keep = llm.add_request([5, 6, 7], SamplingParams(**GREEDY))
    rid = llm.add_request(PROMPT, SamplingParams(**SEEDED, n=3))
    outputs = []
    for _ in range(abort_at):
        outputs += llm.step()[0]
    llm.abort_request(rid)
    assert not any(s.request_id == rid for s in (*llm.clients[0].core.scheduler.running,
                                                 *llm.clients[0].core.scheduler.waiting))
    finished, _ = llm.step()
    aborted = [o for o in finished if o.request_id == rid]
    assert len(aborted) == 1 and aborted[0].finished
    assert [c.index for c in aborted[0].outputs] == [0, 1, 2]
    assert all(c.finish_reason == "abort" for c in aborted[0].outputs)
    outputs += finished
    while not llm.is_finished():
        outputs += llm.step()[0]
    assert sorted(o.request_id for o in outputs) == sorted([keep, rid])
    assert_all_free(llm)
    llm.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("limits", [
    dict(num_kvcache_blocks=10),  # preemption: 4 samples x 4 blocks each do not fit
    dict(num_kvcache_blocks=10, enable_prefix_caching=False),  # sharing by fork alone
    dict(max_num_batched_tokens=24, max_num_seqs=5),  # chunked prefill
], ids=["preemption", "preemption-no-prefix-cache", "chunked"])
def test_tight_limits_keep_the_tokens(toy_models, async_scheduling, limits):
    prompts = make_prompts(7, n=3, shared=range(100, 120), max_len=40)
    params = [SamplingParams(**SEEDED, n=4), SamplingParams(**GREEDY, n=2),
              SamplingParams(**dict(SEEDED, seed=7), n=3)]
    roomy = engine(toy_models)
    want = [references(roomy, [p], {k: v for k, v in vars(sp).items() if k != "n"}, sp.n)[0]
            for p, sp in zip(prompts, params)]
    roomy.shutdown()
    llm = engine(toy_models, async_scheduling, **limits)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [token_ids(o) for o in outs] == want
    if "num_kvcache_blocks" in limits:
        assert llm.clients[0].core.scheduler.num_preemptions > 0
    assert_all_free(llm)
    llm.shutdown()


def test_async_and_sync_give_the_same_outputs(toy_models):
    prompts = make_prompts(9, n=5, shared=range(100, 137), max_len=50)
    params = [SamplingParams(n=(1, 2, 3)[i % 3], temperature=0.8, top_k=20, max_tokens=10,
                             seed=50 + 10 * i) for i in range(len(prompts))]
    runs = []
    for async_scheduling in (False, True):
        llm = engine(toy_models, async_scheduling, num_kvcache_blocks=16)
        runs.append([[(c.token_ids, c.finish_reason) for c in o.outputs]
                     for o in llm.generate(prompts, params, use_tqdm=False)])
        assert_all_free(llm)
        llm.shutdown()
    assert runs[0] == runs[1]
    assert [len(r) for r in runs[0]] == [p.n for p in params]
