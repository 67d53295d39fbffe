"""AsyncLLM: concurrent streamed requests add up to exactly the offline outputs; a consumer
that leaves aborts its request and frees its blocks; bad requests fail alone."""
import asyncio

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.async_llm import AsyncLLM
from tests.support.prompts import make_prompts

MODEL = "tied_gqa4_d16_l4"
KW = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
          num_kvcache_blocks=48, max_num_seqs=4)
PROMPTS = ["The quick brown fox", "Hello, world!", "def fibonacci(n):", "Paged attention",
           "List all prime numbers", "0123456789", "What is the capital of France?"]


def params(i: int) -> SamplingParams:
    """A mix: greedy, seeded, n=2, stop strings, logprobs, ignore_eos."""
    return [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
            SamplingParams(temperature=0.8, seed=7, max_tokens=16),
            SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=12, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=24, stop=["e", "o w"], ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=10, logprobs=2, ignore_eos=True),
            SamplingParams(temperature=0.7, seed=1, max_tokens=30, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=8, min_tokens=4)][i % 7]


@pytest.fixture(scope="module")
def offline(toy_models):
    llm = LLM(toy_models[MODEL], **KW)
    outs = llm.generate(PROMPTS, [params(i) for i in range(len(PROMPTS))], use_tqdm=False)
    llm.shutdown()
    return outs


@pytest.fixture(scope="module", params=[True, False], ids=["process", "thread"])
def engine(toy_models, request):
    """AsyncLLM with the engine core in its own process, then on a thread; each started once
    for the module's tests (a test leaves it idle: its requests finished or aborted)."""
    llm = AsyncLLM(toy_models[MODEL], engine_process=request.param, **KW)
    yield llm
    llm.shutdown()


async def collect(llm, prompt, sp, request_id=None):
    """Concatenate a stream's deltas per sample; returns (samples, number of deltas)."""
    samples, n = {}, 0
    async for out in llm.generate(prompt, sp, request_id):
        n += 1
        for c in out.outputs:
            s = samples.setdefault(c.index, dict(text="", ids=[], reason=None, lps=[],
                                                 stop=None, cum=None))
            s["text"] += c.text
            s["ids"] += c.token_ids
            s["lps"] += c.logprobs or []
            s["reason"], s["stop"] = c.finish_reason or s["reason"], c.stop_reason or s["stop"]
            s["cum"] = c.cumulative_logprob
    # The last delta ends the request, and every sample has ended by then.
    assert out.finished and all(s["reason"] for s in samples.values())
    return samples, n


def all_free(llm) -> bool:
    stats = llm.stats()
    return stats["num_free_blocks"] == stats["num_blocks"]


async def wait_idle(llm):
    for _ in range(200):
        if llm.stats()["idle"] and all_free(llm):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine did not go idle")


@pytest.mark.parametrize("async_scheduling,engine_process", [(False, True), (True, False)])
def test_concurrent_streams_equal_the_offline_outputs(toy_models, offline, async_scheduling,
                                                      engine_process):
    engine = AsyncLLM(toy_models[MODEL], async_scheduling=async_scheduling,
                      engine_process=engine_process, **KW)

    async def main():
        return await asyncio.gather(*(collect(engine, p, params(i))
                                      for i, p in enumerate(PROMPTS)))

    assert_equal_offline(offline, asyncio.run(main()))
    assert engine.stats()["idle"] and all_free(engine)
    engine.shutdown()


def test_steps_sent_together_stream_the_offline_outputs(toy_models, offline, monkeypatch):
    """A core that sends several steps per message (here: every 200 ms) merges each sample's
    deltas into one: the streams carry the same outputs."""
    from nanovllm.engine import core_loop
    from nanovllm.engine.messages import Outputs

    monkeypatch.setattr(core_loop, "DELTA_COST_S", 1.0)
    monkeypatch.setattr(core_loop, "MAX_SEND_INTERVAL_S", 0.2)
    merged = []  # deltas before and after each merge
    coalesce = Outputs.coalesce

    def counted(self):
        before = len(self.samples)
        coalesce(self)
        merged.append((before, len(self.samples)))

    monkeypatch.setattr(Outputs, "coalesce", counted)
    engine = AsyncLLM(toy_models[MODEL], engine_process=False, **KW)

    async def main():
        return await asyncio.gather(*(collect(engine, p, params(i))
                                      for i, p in enumerate(PROMPTS)))

    results = asyncio.run(main())
    engine.shutdown()
    assert_equal_offline(offline, results)
    assert any(after < before for before, after in merged)


def assert_equal_offline(offline, results):
    """Streams (collect's results) carry exactly the offline outputs' text, ids, ends and
    logprobs."""
    for ref, (samples, _) in zip(offline, results):
        assert sorted(samples) == [c.index for c in ref.outputs]
        for c in ref.outputs:
            s = samples[c.index]
            assert (s["text"], s["ids"], s["reason"], s["stop"]) == \
                (c.text, c.token_ids, c.finish_reason, c.stop_reason)
            if c.logprobs is not None:
                # Same tokens and ranks; values to float32 noise (batches differ in shape).
                assert [{t: (v.rank, v.decoded_token) for t, v in d.items()} for d in s["lps"]] \
                    == [{t: (v.rank, v.decoded_token) for t, v in d.items()} for d in c.logprobs]
                assert [v.logprob for d in s["lps"] for v in d.values()] == pytest.approx(
                    [v.logprob for d in c.logprobs for v in d.values()], abs=1e-5)
                assert s["cum"] == pytest.approx(c.cumulative_logprob)


def test_leaving_the_stream_aborts_and_frees_blocks(engine, offline):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def leave_early():
        async for out in engine.generate(PROMPTS[0], long):
            # Streamed: the first delta comes long before the 200th token (the engine thread
            # yields the GIL every few ms; 200 CPU steps take far longer).
            assert not out.finished and len(out.outputs[0].token_ids) < 200
            break

    async def cancelled():
        task = asyncio.create_task(collect(engine, PROMPTS[1], long))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def main():
        # Others keep going while these leave; then everything is free.
        other = asyncio.create_task(collect(engine, PROMPTS[0], params(0)))
        await asyncio.gather(leave_early(), cancelled())
        samples, _ = await other
        await wait_idle(engine)
        return samples

    samples = asyncio.run(main())
    assert samples[0]["ids"] == offline[0].outputs[0].token_ids


def test_streaming_front_end_turns_the_prefill_graphs_on(engine, toy_models):
    """AsyncLLM's default: piecewise graphs for prefill steps (a GPU captures them; here the
    CPU path only records the reach); an explicit value stays."""
    from nanovllm.config import STREAMING_PREFILL_GRAPH_TOKENS

    assert engine.config.prefill_graph_tokens == STREAMING_PREFILL_GRAPH_TOKENS
    llm = AsyncLLM(toy_models[MODEL], engine_process=False, prefill_graph_tokens=0, **KW)
    try:
        assert llm.config.prefill_graph_tokens == 0
    finally:
        llm.shutdown()


def test_abort_by_request_id(engine):
    async def main():
        long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        task = asyncio.create_task(collect(engine, PROMPTS[2], long, request_id="r1"))
        await asyncio.sleep(0.05)
        await engine.abort("r1")
        await engine.abort("never-seen")  # unknown ids: a no-op, as in vLLM
        samples, _ = await task
        await wait_idle(engine)
        return samples

    samples = asyncio.run(main())
    assert samples[0]["reason"] == "abort" and len(samples[0]["ids"]) < 200


def test_bad_requests_fail_alone_and_the_engine_keeps_serving(engine, offline):
    async def main():
        with pytest.raises(ValueError, match="empty"):
            await collect(engine, "", params(0))
        with pytest.raises(ValueError, match="max_model_len"):
            await collect(engine, list(range(3, 300)), params(0))
        with pytest.raises(ValueError, match="sampling_params"):
            await collect(engine, "hi", "not params")
        long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
        first = asyncio.create_task(collect(engine, "x", long, request_id="dup"))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already in use"):
            await collect(engine, "y", long, request_id="dup")
        await first
        with pytest.raises(ValueError, match="one conversation"):
            async for _ in engine.chat([[{"role": "user", "content": "a"}]] * 2):
                pass
        return await collect(engine, PROMPTS[0], params(0))

    samples, _ = asyncio.run(main())
    assert samples[0]["text"] == offline[0].outputs[0].text


def test_chat_streams_the_offline_chat_reply(toy_models, engine):
    conv = [{"role": "user", "content": "Introduce yourself."}]
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = LLM(toy_models[MODEL], **KW)
    ref = llm.chat(conv, sp, use_tqdm=False)[0]
    llm.shutdown()

    async def main():
        text = ""
        async for out in engine.chat(conv, sp):
            text += out.outputs[0].text if out.outputs else ""
        return text

    assert asyncio.run(main()) == ref.outputs[0].text


# -- AsyncLLM on a GPU: streams under CUDA graphs and async scheduling add up to the offline
# outputs of the same engine settings, with preemption and chunked prefill.
GPU_MODEL = "untied_gqa4_d64"
GPU_PROMPTS = make_prompts(9, 16, shared=40, every=3, max_len=89)
GPU_KW = dict(device="cuda", dtype="float32", kvcache_block_size=16, max_model_len=512,
              max_num_seqs=8, num_kvcache_blocks=40, max_num_batched_tokens=64)


def gpu_params(i: int) -> SamplingParams:
    return [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
            SamplingParams(temperature=0.9, seed=i, max_tokens=33, ignore_eos=True),
            SamplingParams(temperature=0.7, seed=i, n=2, max_tokens=20, ignore_eos=True)][i % 3]


@pytest.mark.gpu
def test_streams_equal_offline_under_graphs_and_async(toy_models):
    path = toy_models[GPU_MODEL]
    llm = LLM(path, **GPU_KW)
    core = llm.clients[0].core
    assert core.async_scheduling and core.executor.runner.graphs is not None
    ref = [[c.token_ids for c in o.outputs]
           for o in llm.generate(GPU_PROMPTS, [gpu_params(i) for i in range(len(GPU_PROMPTS))],
                                 use_tqdm=False)]
    llm.shutdown()
    engine = AsyncLLM(path, **GPU_KW)
    assert engine.config.prefill_graph_tokens > 0  # its prefill steps replay piecewise graphs

    async def one(i):
        ids = {}
        async for out in engine.generate({"prompt_token_ids": GPU_PROMPTS[i]}, gpu_params(i)):
            for c in out.outputs:
                ids[c.index] = ids.get(c.index, []) + c.token_ids
        return [ids[k] for k in sorted(ids)]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(len(GPU_PROMPTS))))

    got = asyncio.run(main())
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_blocks"]
    engine.shutdown()
    assert got == ref


# The settings of test_async_llm_process.py, where this test ran in the engine process.
CHUNKED_MODEL = "tied_mha_d16"
CHUNKED_KW = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
                  num_kvcache_blocks=32, max_num_seqs=4)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prefill_streams_equal_offline(toy_models, async_scheduling):
    """Prompt chunks (and, with async scheduling, steps whose token is still in flight)
    bring a stream nothing: the streams still add up to the offline outputs. The core runs
    on a thread: the deltas are built in the core either way, and the process's pipe is
    covered above."""
    kw = dict(CHUNKED_KW, max_num_batched_tokens=16, async_scheduling=async_scheduling)
    prompts = [list(range(1, 60)), list(range(100, 140)), [7, 8, 9]]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(toy_models[CHUNKED_MODEL], **kw)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.shutdown()
    engine = AsyncLLM(toy_models[CHUNKED_MODEL], engine_process=False, **kw)

    async def one(prompt):
        ids = []
        async for out in engine.generate(prompt, sp):
            ids += out.outputs[0].token_ids if out.outputs else []
        return ids

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    try:
        assert asyncio.run(main()) == want
    finally:
        engine.shutdown()


def test_tokens_before_a_failed_step_still_arrive(toy_models, monkeypatch):
    """A stream read only after its request failed (the tokens and the failure arrive in one
    batch) still yields the tokens made before the failing step, then raises."""
    from nanovllm.engine.client import RequestFailedError
    from tests.support.failures import fail_steps_of_seed

    fail_steps_of_seed(monkeypatch, 4343, 3, "injected failure")
    llm = AsyncLLM(toy_models[MODEL], engine_process=False, **KW)
    sp = SamplingParams(temperature=1.0, seed=4343, max_tokens=20, ignore_eos=True)

    async def main():
        stream = llm.generate(PROMPTS[0], sp)
        first = await anext(stream)  # the request is queued; its first token is back
        await wait_idle(llm)  # everything else happened before the next read
        tokens = list(first.outputs[0].token_ids)
        with pytest.raises(RequestFailedError, match="injected failure"):
            async for out in stream:
                assert not out.finished and out.outputs[0].finish_reason is None
                tokens += out.outputs[0].token_ids
        return tokens

    try:
        assert len(asyncio.run(main())) == 3  # steps 0, 1 and 2 sampled; step 3 raised
    finally:
        llm.shutdown()
