"""Speculative decoding end to end on the CPU (n-gram drafts, toy Qwen3): greedy outputs are
token for token those of plain decoding, under preemption, chunked prefill, prefix hits,
n = 2 and stop strings; drafts are accepted; every block is free afterwards."""
import random

import pytest

from nanovllm import LLM, SamplingParams

# Speculating at every batch size these tests run (the default stops above 4 sequences).
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1, "disable_by_batch_size": 16}
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def repeating_prompts(seed: int, n: int) -> list[list[int]]:
    """Random ids, each prompt its own piece said twice: text that n-gram lookup can hit."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 400) for _ in range(rng.randrange(4, 30))] * 2 for _ in range(n)]


@pytest.fixture(scope="module")
def spec_llm(toy_models):
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              speculative_config=NGRAM)
    yield llm
    llm.shutdown()


def core(llm):
    return llm.clients[0].core


def assert_idle(llm):
    stats = llm.stats()[0] if isinstance(llm.stats(), list) else llm.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]


def ids(outs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_greedy_matches_plain_decoding_and_reports_acceptance(spec_llm, small_llm):
    prompts = repeating_prompts(0, 6)
    want = small_llm.generate(prompts, GREEDY, use_tqdm=False)
    got = spec_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert ids(got) == ids(want)
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in got)  # no overshoot
    stats = core(spec_llm).stats()
    assert stats["spec_accepted"] > 0 and 0 < stats["spec_acceptance_rate"] <= 1
    per_request = [o.spec_metrics for o in got]
    assert sum(m.num_accepted_tokens for m in per_request) > 0
    assert all(m.mean_accepted_length >= 1 or m.num_verify_steps == 0 for m in per_request)
    assert_idle(spec_llm)


def test_prefix_hits_and_n2(spec_llm, small_llm):
    prompts = repeating_prompts(1, 4)
    n2 = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2)
    want = small_llm.generate(prompts, n2, use_tqdm=False)
    bm = core(spec_llm).scheduler.block_manager
    first = spec_llm.generate(prompts, n2, use_tqdm=False)
    hits = bm.num_hit_tokens
    again = spec_llm.generate(prompts, n2, use_tqdm=False)  # now from the prefix cache
    assert bm.num_hit_tokens > hits
    assert ids(first) == ids(again) == ids(want)
    assert_idle(spec_llm)


def test_stop_strings_end_where_plain_decoding_ends(spec_llm, small_llm):
    prompts = repeating_prompts(2, 4)
    texts = [o.outputs[0].text for o in small_llm.generate(prompts, GREEDY, use_tqdm=False)]
    for prompt, text in zip(prompts, texts):
        stop = text[len(text) // 2: len(text) // 2 + 2]
        if len(stop.strip()) < 2:
            continue
        sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop)
        want = small_llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
        got = spec_llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason) == (
            want.token_ids, want.text, "stop")
    assert_idle(spec_llm)


def test_seeded_sampling_repeats_and_plain_requests_mix_in(spec_llm):
    prompts = repeating_prompts(3, 3)
    params = [SamplingParams(temperature=0.8, seed=7, max_tokens=20),
              SamplingParams(temperature=1.0, top_k=5, seed=8, max_tokens=20),
              SamplingParams(temperature=0, max_tokens=20, logprobs=2)]
    a = spec_llm.generate(prompts, params, use_tqdm=False)
    b = spec_llm.generate(prompts, params, use_tqdm=False)
    assert ids(a) == ids(b)
    assert len(a[2].outputs[0].logprobs) == len(a[2].outputs[0].token_ids)
    assert_idle(spec_llm)


def test_logprobs_are_those_of_plain_decoding(spec_llm, small_llm):
    """Each accepted token's logprob entry (its logprob, rank and top-k) is plain decoding's
    for the same token, also where a stop string cut the verify step's tokens."""
    prompts = repeating_prompts(11, 3)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    want = small_llm.generate(prompts, sp, use_tqdm=False)
    before = core(spec_llm).scheduler.spec_stats.accepted
    got = spec_llm.generate(prompts, sp, use_tqdm=False)
    assert core(spec_llm).scheduler.spec_stats.accepted > before
    for g, w in zip(got, want):
        g, w = g.outputs[0], w.outputs[0]
        assert g.token_ids == w.token_ids and len(g.logprobs) == len(g.token_ids)
        for a, b in zip(g.logprobs, w.logprobs):
            assert a.keys() == b.keys()
            for t in a:
                assert a[t].rank == b[t].rank
                assert abs(a[t].logprob - b[t].logprob) < 1e-4
        assert abs(g.cumulative_logprob - w.cumulative_logprob) < 1e-3
    for w in want:  # a stop string: the entries end with the tokens
        text = w.outputs[0].text
        stop = text[len(text) // 2: len(text) // 2 + 2]
        if len(stop.strip()) == 2:
            cut = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1,
                                 stop=stop)
            g = spec_llm.generate([w.prompt_token_ids], cut, use_tqdm=False)[0].outputs[0]
            p = small_llm.generate([w.prompt_token_ids], cut, use_tqdm=False)[0].outputs[0]
            assert g.token_ids == p.token_ids and len(g.logprobs) == len(p.token_ids)
    assert_idle(spec_llm)


def test_preemption_and_chunked_prefill(toy_models, small_llm):
    prompts = repeating_prompts(4, 8)
    want = small_llm.generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              num_kvcache_blocks=14, max_num_batched_tokens=48, speculative_config=NGRAM)
    try:
        got = llm.generate(prompts, GREEDY, use_tqdm=False)
        sched = core(llm).scheduler
        assert sched.num_preemptions > 0 and sched.spec_stats.accepted > 0
        assert ids(got) == ids(want)
        assert_idle(llm)
    finally:
        llm.shutdown()


def test_speculation_switches_off_above_its_batch_size(toy_models):
    spec = {**NGRAM, "disable_by_batch_size": 2}
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              speculative_config=spec)
    try:
        sched = core(llm).scheduler
        llm.generate(repeating_prompts(5, 6), GREEDY, use_tqdm=False)
        many = sched.spec_stats.steps
        # Six requests with 40 tokens each: they all end together, so no step ran <= 2.
        assert many == 0
        llm.generate(repeating_prompts(5, 2), GREEDY, use_tqdm=False)
        assert sched.spec_stats.steps > 0
    finally:
        llm.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
def test_gpu_greedy_matches_plain_decoding(toy_models, eager):
    """Triton kernels, with and without decode graphs: verify rows (and a self-draft's
    rows) run in the decode graphs."""
    prompts = repeating_prompts(6, 12)
    kw = dict(device="cuda", dtype="float32", kvcache_block_size=16, max_model_len=256,
              enforce_eager=eager, max_num_seqs=16)
    path = toy_models["untied_gqa4_d64"]
    outs = {}
    for name, spec in (("plain", None), ("ngram", NGRAM), ("self", draft_config(path, k=4))):
        llm = LLM(path, speculative_config=spec, **kw)
        try:
            outs[name] = ids(llm.generate(prompts, GREEDY, use_tqdm=False))
            stats = core(llm).scheduler.spec_stats
            if name == "self":  # float32: the draft's argmax is the target's
                assert stats.steps > 0 and stats.accepted == stats.proposed
            elif spec is not None:
                assert stats.accepted > 0
            assert_idle(llm)
        finally:
            llm.shutdown()
    assert outs["ngram"] == outs["plain"] and outs["self"] == outs["plain"]


def test_async_scheduling_hands_over_to_speculation(toy_models, small_llm):
    """With the host a step ahead while many sequences run, and verify steps once few are
    left (requests of different lengths), the outputs are still plain decoding's."""
    prompts = repeating_prompts(7, 6)
    params = [SamplingParams(temperature=0, max_tokens=8 + 6 * i, ignore_eos=True)
              for i in range(6)]
    want = small_llm.generate(prompts, params, use_tqdm=False)
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              async_scheduling=True, speculative_config={**NGRAM, "disable_by_batch_size": 3})
    try:
        got = llm.generate(prompts, params, use_tqdm=False)
        sched = core(llm).scheduler
        assert ids(got) == ids(want) and sched.spec_stats.steps > 0
        assert sched.num_in_flight == 0
        assert_idle(llm)
    finally:
        llm.shutdown()


def test_tensor_parallel_workers_verify_the_same_rows(toy_models, small_llm):
    """Two ranks (gloo): the drafts travel with the sequences to the worker."""
    prompts = repeating_prompts(8, 3)
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = small_llm.generate(prompts, sp, use_tqdm=False)
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              tensor_parallel_size=2, speculative_config=NGRAM)
    try:
        got = llm.generate(prompts, sp, use_tqdm=False)
        assert ids(got) == ids(want)
        assert llm.stats()[0]["spec_verify_steps"] > 0
    finally:
        llm.shutdown()


# -- a draft model ----------------------------------------------------------------------------
def draft_config(path: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": k,
            "disable_by_batch_size": 16}


def test_self_draft_accepts_every_token(toy_models, small_llm):
    """The target as its own draft: every draft is accepted, under preemption, chunked
    prefill, prefix hits and n = 2 (the draft's cache recomputed where blocks were not its
    own), and the outputs are plain decoding's."""
    path = toy_models["tied_gqa4_d16_l4"]
    prompts = repeating_prompts(9, 6)
    n2 = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2)
    want = ids(small_llm.generate(prompts, n2, use_tqdm=False))
    llm = LLM(path, kvcache_block_size=16, max_model_len=256, num_kvcache_blocks=20,
              max_num_batched_tokens=48, speculative_config=draft_config(path))
    try:
        first = llm.generate(prompts, n2, use_tqdm=False)
        again = llm.generate(prompts, n2, use_tqdm=False)
        sched = core(llm).scheduler
        assert ids(first) == ids(again) == want
        assert sched.num_preemptions > 0 and sched.block_manager.num_hit_tokens > 0
        stats = sched.spec_stats
        assert stats.steps > 0 and stats.accepted == stats.proposed
        assert all(o.spec_metrics.acceptance_rate == 1.0 for o in first + again)
        assert_idle(llm)
    finally:
        llm.shutdown()


def test_a_smaller_draft_keeps_the_targets_outputs(toy_models, small_llm):
    """Another (random) model proposes: most drafts are rejected, the outputs stay the
    target's, greedy and with a stop string; sampled requests run too."""
    prompts = repeating_prompts(10, 3)
    want = small_llm.generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
              speculative_config=draft_config(toy_models["tied_mha_d16"], k=2))
    try:
        assert ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == ids(want)
        text = want[0].outputs[0].text
        stop = text[len(text) // 2: len(text) // 2 + 2]
        sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop)
        if len(stop.strip()) == 2:
            got = llm.generate(prompts[:1], sp, use_tqdm=False)[0].outputs[0]
            plain = small_llm.generate(prompts[:1], sp, use_tqdm=False)[0].outputs[0]
            assert (got.token_ids, got.text) == (plain.token_ids, plain.text)
        sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=12)
        a, b = (llm.generate(prompts, sampled, use_tqdm=False) for _ in range(2))
        assert ids(a) == ids(b) and core(llm).scheduler.spec_stats.steps > 0
        assert_idle(llm)
    finally:
        llm.shutdown()


def test_draft_model_errors(toy_models, tmp_path):
    from tests.support.checkpoints import write_config_dir

    big = write_config_dir(tmp_path / "big", vocab_size=1024)
    with pytest.raises(ValueError, match="vocab_size"):
        LLM(toy_models["tied_gqa4_d16_l4"], kvcache_block_size=16, max_model_len=256,
            load_format="dummy", speculative_config=draft_config(big))
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(toy_models["tied_gqa4_d16_l4"], tensor_parallel_size=2,
            speculative_config=draft_config(toy_models["tied_mha_d16"]))


def test_streaming_deltas_of_several_tokens_and_abort(toy_models, small_llm):
    """AsyncLLM (engine on a thread): the deltas of a speculating stream add up to the
    offline output; a consumer that leaves aborts its request and frees its blocks."""
    import asyncio

    from nanovllm.async_llm import AsyncLLM

    prompt = repeating_prompts(19, 1)[0]
    want = small_llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    llm = AsyncLLM(toy_models["tied_gqa4_d16_l4"], engine_process=False, kvcache_block_size=16,
                   max_model_len=256, speculative_config=NGRAM)

    async def stream(sp, leave_after=None):
        tokens, deltas, metrics = [], 0, None
        async for out in llm.generate({"prompt_token_ids": prompt}, sp):
            tokens += out.outputs[0].token_ids
            deltas, metrics = deltas + 1, out.spec_metrics
            if leave_after is not None and deltas >= leave_after:
                break
        return tokens, deltas, metrics

    async def main():
        got, deltas, metrics = await stream(GREEDY)
        left, _, _ = await stream(SamplingParams(temperature=0, max_tokens=200,
                                                 ignore_eos=True), leave_after=2)
        for _ in range(200):
            stats = llm.stats()
            if stats["idle"] and stats["num_free_blocks"] == stats["num_blocks"]:
                break
            await asyncio.sleep(0.01)
        return got, deltas, metrics, left, stats

    try:
        got, deltas, metrics, left, stats = asyncio.run(main())
        # A verify step's accepted drafts arrive with its token, in one delta.
        assert got == want and metrics.num_accepted_tokens > 0
        assert deltas <= len(want) - metrics.num_accepted_tokens
        assert len(left) < 200 and stats["num_free_blocks"] == stats["num_blocks"]
        assert stats["num_aborted"] == 1
    finally:
        llm.shutdown()


def test_penalties_and_min_tokens_see_each_rows_drafts(spec_llm, small_llm):
    """Each verify row is penalized with the drafts before it counted as output, and end
    tokens stay banned on the rows short of min_tokens: the outputs are plain decoding's."""
    prompts = repeating_prompts(13, 4)
    params = [SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=24, frequency_penalty=0.5,
                             presence_penalty=0.3),
              SamplingParams(temperature=0, max_tokens=24, min_tokens=20),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)]
    want = small_llm.generate(prompts, params, use_tqdm=False)
    before = core(spec_llm).scheduler.spec_stats.steps
    got = spec_llm.generate(prompts, params, use_tqdm=False)
    assert core(spec_llm).scheduler.spec_stats.steps > before
    assert ids(got) == ids(want)
    assert_idle(spec_llm)


@pytest.mark.parametrize("kind", ["fp8_e4m3", "int8"])
def test_8bit_kv_cache(toy_models, kind):
    """Verify rows store and read an fp8 (int8) cache as decode rows do: the same greedy tokens
    as plain decoding over the same cache (fp8 scales calibrated on the same first prefill;
    int8 scales per row)."""
    prompts = repeating_prompts(14, 3)
    kw = dict(kvcache_block_size=16, max_model_len=256, kv_cache_dtype=kind)
    outs = []
    for spec in (None, NGRAM):
        llm = LLM(toy_models["tied_gqa4_d16_l4"], speculative_config=spec, **kw)
        try:
            outs.append(ids(llm.generate(prompts, GREEDY, use_tqdm=False)))
            if spec is not None:
                assert core(llm).scheduler.spec_stats.accepted > 0
        finally:
            llm.shutdown()
    assert outs[0] == outs[1]
