"""AsyncLLM's engine process: it starts, stops without leaving a process behind, reports a
failed start from the constructor, and a process that dies under way fails every stream with
EngineDeadError instead of leaving callers waiting."""
import asyncio
import os
import signal

import pytest

from nanovllm import SamplingParams
from nanovllm.async_llm import AsyncLLM, EngineDeadError

MODEL = "tied_mha_d16"
KW = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256,
          num_kvcache_blocks=32, max_num_seqs=4)


def test_bad_arguments_raise_before_a_process_starts(toy_models):
    with pytest.raises(ValueError, match="unknown argument"):
        AsyncLLM(toy_models[MODEL], not_an_option=1, **KW)
    with pytest.raises(ValueError, match="max_num_seqs"):
        AsyncLLM(toy_models[MODEL], **{**KW, "max_num_seqs": 0})


def test_a_failed_start_raises_from_the_constructor(toy_models, tmp_path):
    # config.json is fine but the weights are missing: only the engine process finds out.
    model = tmp_path / "no_weights"
    model.mkdir()
    for name in os.listdir(toy_models[MODEL]):
        if not name.endswith(".safetensors"):
            os.symlink(os.path.join(toy_models[MODEL], name), model / name)
    with pytest.raises(Exception, match="safetensors"):
        AsyncLLM(str(model), **KW)


def test_a_dead_engine_process_fails_every_stream(toy_models):
    llm = AsyncLLM(toy_models[MODEL], **KW)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        async def read(prompt):
            got = 0
            async for out in llm.generate(prompt, long):
                got += len(out.outputs[0].token_ids) if out.outputs else 0
                if got >= 2:  # both streams run: the engine process dies now
                    os.kill(llm.client.runner.proc.pid, signal.SIGKILL)
            return got

        results = await asyncio.wait_for(
            asyncio.gather(read("a b c"), read("d e f"), return_exceptions=True), timeout=60)
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, EngineDeadError) for r in results), results
    assert not llm.is_running
    assert "died (signal SIGKILL)" in str(results[0])

    async def new_request():
        async for _ in llm.generate("x", SamplingParams(max_tokens=2)):
            pass

    with pytest.raises(EngineDeadError):
        asyncio.run(new_request())
    llm.shutdown()
    assert not llm.client.runner.proc.is_alive()


def test_shutdown_stops_the_process_and_ends_open_streams(toy_models):
    llm = AsyncLLM(toy_models[MODEL], **KW)
    pid = llm.client.runner.proc.pid

    async def main():
        gen = llm.generate("a b c", SamplingParams(temperature=0, max_tokens=200,
                                                    ignore_eos=True))
        await gen.__anext__()
        await asyncio.to_thread(llm.shutdown)
        with pytest.raises(EngineDeadError, match="shut down"):
            async for _ in gen:
                pass

    asyncio.run(main())
    assert not llm.client.runner.proc.is_alive() and llm.client.runner.proc.exitcode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(EngineDeadError):
        llm.stats()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prefill_streams_equal_offline(toy_models, async_scheduling):
    """Prompt chunks (and, with async scheduling, steps whose token is still in flight)
    bring a stream nothing: the streams still add up to the offline outputs."""
    from nanovllm import LLM

    kw = dict(KW, max_num_batched_tokens=16, async_scheduling=async_scheduling)
    prompts = [list(range(1, 60)), list(range(100, 140)), [7, 8, 9]]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(toy_models[MODEL], **kw)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.shutdown()
    engine = AsyncLLM(toy_models[MODEL], **kw)

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
