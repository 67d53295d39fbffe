"""SamplingParams.logprobs / prompt_logprobs end to end on CPU (float32): every value, top-k
set and rank against a float32 log_softmax of HF's logits (tolerance 1e-4), under chunked
prefill, prefix caching, preemption, async scheduling, n > 1 and tensor parallelism."""
from dataclasses import replace

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.worker import logprobs as worker_logprobs
from nanovllm.worker import model_runner
from tests.support.logprobs import assert_close, assert_lists_close, check_output
from tests.support.prompts import make_prompts

MODEL = "tied_gqa4_d16_l4"  # vocab 640, larger than its tokenizer's 400
SHARED = list(range(100, 137))  # two full 16-token blocks and a bit
BASE = dict(max_tokens=10, ignore_eos=True)
# (logprobs, prompt_logprobs) per request: greedy, then sampling with truncation filters.
MIX = [
    SamplingParams(temperature=0, logprobs=5, prompt_logprobs=3, **BASE),
    SamplingParams(temperature=1.5, top_k=3, top_p=0.9, seed=7, logprobs=20, prompt_logprobs=0,
                   **BASE),
    SamplingParams(temperature=0.7, seed=8, logprobs=0, **BASE),
    SamplingParams(temperature=0, prompt_logprobs=2, **BASE),
    SamplingParams(temperature=0.9, seed=9, **BASE),
]


def engine(toy_models, name=MODEL, **kw) -> LLM:
    args = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
                async_scheduling=False)
    args.update(kw)
    return LLM(toy_models[name], **args)


def params_for(n: int) -> list[SamplingParams]:
    return [MIX[i % len(MIX)] for i in range(n)]


def check_all(path, prompts, sps, outs) -> None:
    for p, sp, out in zip(prompts, sps, outs):
        assert out.prompt_token_ids == p
        check_output(path, out, sp.logprobs, sp.prompt_logprobs)


@pytest.mark.parametrize("name", ["tied_gqa4_d16_l4", "untied_gqa4_d64"])
def test_values_ranks_and_top_k_match_hf(toy_models, name):
    llm = engine(toy_models, name)
    prompts = make_prompts(11, n=10, shared=SHARED) + [[42]]  # a 1-token prompt: [None]
    sps = params_for(len(prompts))
    outs = llm.generate(prompts, sps, use_tqdm=False)
    check_all(toy_models[name], prompts, sps, outs)
    # Raw distribution: sampling with top_k=3 picks among the 3 best, while the logprobs stay
    # those of the untempered, unfiltered softmax (checked above against HF).
    for out, sp in zip(outs, sps):
        if sp.top_k == 3:
            assert all(d[t].rank <= 3 for d, t in zip(out.outputs[0].logprobs,
                                                       out.outputs[0].token_ids))
        if sp.logprobs == 0:  # just the sampled token
            assert all(len(d) == 1 for d in out.outputs[0].logprobs)
    assert sps[-1].prompt_logprobs is not None and outs[-1].prompt_logprobs == [None]
    # decoded_token: the token's own text, "" for ids the tokenizer lacks.
    d = outs[0].outputs[0].logprobs[0]
    assert all(lp.decoded_token == (llm.tokenizer.decode([t]) if t < len(llm.tokenizer) else "")
               for t, lp in d.items())


def test_none_asks_nothing_and_does_no_logprob_work(toy_models, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("logprob work for a batch that asked for none")

    monkeypatch.setattr(worker_logprobs.LogprobsStep, "__init__", boom)
    monkeypatch.setattr(worker_logprobs, "pack_logprobs", boom)
    monkeypatch.setattr(model_runner, "prompt_pass", boom)
    llm = engine(toy_models, max_num_batched_tokens=13, max_num_seqs=4)
    sp = SamplingParams(temperature=0.8, seed=3, **BASE)
    for out in llm.generate(make_prompts(2, n=5), sp, use_tqdm=False):
        assert out.prompt_logprobs is None
        assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None


def test_no_tokenizer_gives_no_decoded_tokens(toy_models):
    llm = engine(toy_models, skip_tokenizer_init=True)
    sp = SamplingParams(temperature=0, logprobs=2, prompt_logprobs=1, **BASE)
    out = llm.generate([[5, 6, 7, 8]], sp, use_tqdm=False)[0]
    check_output(toy_models[MODEL], out, 2, 1)
    dicts = out.prompt_logprobs[1:] + out.outputs[0].logprobs
    assert all(lp.decoded_token is None for d in dicts for lp in d.values())


@pytest.mark.parametrize("limits", [
    dict(max_num_batched_tokens=13, max_num_seqs=8),  # nearly every prompt is chunked
    dict(num_kvcache_blocks=12),  # decode preempts and recomputes
    dict(num_kvcache_blocks=14, max_num_batched_tokens=20, max_num_seqs=6),  # both
], ids=["chunked", "preemption", "chunked-preemption"])
def test_tight_limits_give_the_plain_values(toy_models, limits):
    prompts = make_prompts(12, n=9, shared=SHARED, max_len=60)
    sps = params_for(len(prompts))
    want = engine(toy_models).generate(prompts, sps, use_tqdm=False)
    llm = engine(toy_models, **limits)
    got = llm.generate(prompts, sps, use_tqdm=False)
    if "num_kvcache_blocks" in limits:
        assert llm.clients[0].core.scheduler.num_preemptions > 0
    for a, b in zip(got, want):
        assert_close(a, b)
    check_all(toy_models[MODEL], prompts, sps, got)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_recomputed_prompts_give_their_prompt_logprobs_once(toy_models, async_scheduling):
    # Every request asks for prompt logprobs, so every preempted one is recomputed with them
    # already taken (and may then read the prefix cache).
    prompts = make_prompts(16, n=8, shared=SHARED, max_len=60)
    sps = [SamplingParams(temperature=0.8, seed=i, logprobs=2, prompt_logprobs=2, **BASE)
           for i in range(len(prompts))]
    llm = engine(toy_models, num_kvcache_blocks=12, async_scheduling=async_scheduling)
    preempted = []
    preempt = llm.clients[0].core.scheduler.preempt
    llm.clients[0].core.scheduler.preempt = lambda seq: (preempted.append(seq), preempt(seq))
    check_all(toy_models[MODEL], prompts, sps, llm.generate(prompts, sps, use_tqdm=False))
    assert preempted and all(s.prompt_logprobs is not None for s in preempted)


def test_prompt_logprobs_skip_the_prefix_cache(toy_models):
    llm = engine(toy_models, enable_prefix_caching=True)
    bm = llm.clients[0].core.scheduler.block_manager
    greedy = SamplingParams(temperature=0, **BASE)
    llm.generate([SHARED + [5, 6, 7]], greedy, use_tqdm=False)  # fills the cache
    hits = bm.num_hit_tokens
    prompt = SHARED + [8, 9]
    sp = SamplingParams(temperature=0, logprobs=3, prompt_logprobs=4, **BASE)
    out = llm.generate([prompt], sp, use_tqdm=False)[0]
    assert bm.num_hit_tokens == hits  # cached positions would have had no logits
    check_output(toy_models[MODEL], out, 3, 4)
    # Without prompt logprobs the same prompt reads the cache, with the same logprobs.
    again = llm.generate([prompt], SamplingParams(temperature=0, logprobs=3, **BASE),
                         use_tqdm=False)[0]
    assert bm.num_hit_tokens > hits
    assert_close(again, replace(out, prompt_logprobs=None))


@pytest.mark.parametrize("limits", [
    dict(max_num_batched_tokens=24),
    dict(max_num_batched_tokens=24, num_kvcache_blocks=14),
], ids=["chunked", "chunked-preemption"])
def test_async_and_sync_give_identical_logprobs(toy_models, limits):
    prompts = make_prompts(13, n=9, shared=SHARED, max_len=50)
    sps = params_for(len(prompts))
    runs = []
    for async_scheduling in (False, True):
        llm = engine(toy_models, async_scheduling=async_scheduling, **limits)
        runs.append(llm.generate(prompts, sps, use_tqdm=False))
        assert llm.clients[0].core.async_scheduling is async_scheduling
        preempted = llm.clients[0].core.scheduler.num_preemptions > 0
        assert preempted == ("num_kvcache_blocks" in limits)
        llm.shutdown()
    if "num_kvcache_blocks" not in limits:
        # The same batches in both loops: bit for bit the same outputs.
        assert [{**vars(o), "request_id": 0} for o in runs[0]] == \
            [{**vars(o), "request_id": 0} for o in runs[1]]
    # Preemption comes at other steps in the two loops, and a recomputed sequence's K/V is
    # a prefill's rather than decode's: the same tokens, logprobs equal up to rounding.
    for a, b in zip(*runs):
        assert_close(a, b, tol=1e-5)


def test_parallel_samples_each_have_their_logprobs(toy_models):
    llm = engine(toy_models)
    prompt = list(range(10, 50))
    kw = dict(temperature=1.0, seed=5, logprobs=2, **BASE)
    out = llm.generate([prompt], SamplingParams(n=3, prompt_logprobs=1, **kw),
                       use_tqdm=False)[0]
    check_output(toy_models[MODEL], out, 2, 1)  # every sample, and the prompt once
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    # Sample i is n=1 with seed + i (its first token's logits come from a forked tail, not
    # a whole prefill: equal up to rounding).
    for i, c in enumerate(out.outputs):
        one = llm.generate([prompt], SamplingParams(**dict(kw, seed=5 + i)), use_tqdm=False)[0]
        assert c.token_ids == one.outputs[0].token_ids
        assert_lists_close(c.logprobs, one.outputs[0].logprobs, 1e-5)
    alone = llm.generate([prompt], SamplingParams(prompt_logprobs=1, **kw), use_tqdm=False)[0]
    assert out.prompt_logprobs == alone.prompt_logprobs


def test_a_bad_request_leaves_the_engine_serving(toy_models):
    llm = engine(toy_models, max_model_len=64)
    sp = SamplingParams(temperature=0, logprobs=2, prompt_logprobs=2, **BASE)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5, 6, 7], list(range(3, 80))], sp, use_tqdm=False)
    with pytest.raises(ValueError, match=r"SamplingParams\.logprobs"):
        llm.generate([[5, 6, 7]], SamplingParams(logprobs=21), use_tqdm=False)
    assert llm.is_finished()
    out = llm.generate([[5, 6, 7]], sp, use_tqdm=False)[0]
    check_output(toy_models[MODEL], out, 2, 2)


def test_prompt_positions_in_several_lm_head_passes(toy_models, monkeypatch):
    monkeypatch.setattr(worker_logprobs, "PROMPT_ROWS_PER_PASS", 5)
    prompts = make_prompts(15, n=4, max_len=40)
    sps = [SamplingParams(temperature=0, logprobs=1, prompt_logprobs=3, **BASE)] * len(prompts)
    llm = engine(toy_models, max_num_batched_tokens=24)
    check_all(toy_models[MODEL], prompts, sps, llm.generate(prompts, sps, use_tqdm=False))


def test_tp2_matches_tp1(toy_models):
    # The 300-token prompt takes two LM-head passes (256 rows each at most) on every rank;
    # the 320-token budget chunks the prompts behind it.
    prompts = [list(range(3, 303))] + make_prompts(14, n=6, shared=SHARED, max_len=40)
    sps = params_for(len(prompts))
    limits = dict(num_kvcache_blocks=40, max_num_batched_tokens=320, max_model_len=512)
    want = engine(toy_models, **limits).generate(prompts, sps, use_tqdm=False)
    with engine(toy_models, tensor_parallel_size=2, **limits) as llm:
        got = llm.generate(prompts, sps, use_tqdm=False)
        assert llm.clients[0].core.scheduler.num_preemptions > 0
    for a, b in zip(got, want):
        assert_close(a, b)
    check_all(toy_models[MODEL], prompts, sps, got)
