"""AsyncLLM's engine process: it starts, stops without leaving a process behind, reports a
failed start from the constructor, and a process that dies under way fails every stream with
EngineDeadError instead of leaving callers waiting."""
import asyncio
import multiprocessing
import os
import signal

import pytest

from nanovllm import SamplingParams
from nanovllm.async_llm import AsyncLLM, EngineDeadError
from tests.support.checkpoints import broken_tokenizer_copy

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


def test_a_tokenizer_that_fails_to_load_stops_the_engine_process(toy_models, tmp_path):
    # The engine process builds the model while the front end loads the tokenizer: a broken
    # tokenizer raises from the constructor, and the process started for it is stopped.
    model = broken_tokenizer_copy(toy_models[MODEL], tmp_path / "broken_tokenizer")
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="could not load a tokenizer"):
        AsyncLLM(model, **KW)
    assert set(multiprocessing.active_children()) <= before


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
