"""AsyncLLM after its engine stopped: a request fails clearly ("shut down"), even one that got
past the is_running check just before the reader's last drain (at once instead of waiting
forever), and one whose send finds the dead core's pipe closed raises EngineDeadError, not
BrokenPipeError."""
import asyncio

import pytest

from nanovllm import SamplingParams
from nanovllm.async_llm import AsyncLLM, EngineDeadError


def test_after_shutdown_requests_fail_clearly_even_past_the_running_check(toy_models,
                                                                          monkeypatch):
    llm = AsyncLLM(toy_models["tied_mha_d16"], device="cpu", dtype="float32",
                   kvcache_block_size=16, max_model_len=128, num_kvcache_blocks=8,
                   max_num_seqs=2)
    assert llm.is_running
    llm.shutdown()
    llm.shutdown()  # idempotent
    assert not llm.is_running

    async def first_output():
        gen = llm.generate([5, 6, 7], SamplingParams(max_tokens=2))
        return await asyncio.wait_for(gen.__anext__(), timeout=5)

    with pytest.raises(EngineDeadError, match="shut down"):
        asyncio.run(first_output())
    # The race, made deterministic: the check still says "running" after the drain.
    monkeypatch.setattr(AsyncLLM, "is_running", property(lambda self: True))
    with pytest.raises(EngineDeadError):
        asyncio.run(first_output())
    assert not llm._live  # the request left no trace


def test_a_send_to_a_dead_core_raises_engine_dead_error(toy_models, monkeypatch):
    # The core died and the reader has not read the end of its pipe yet: the add's or the
    # stats call's send fails on the closed pipe, and the caller gets EngineDeadError.
    llm = AsyncLLM(toy_models["tied_mha_d16"], device="cpu", dtype="float32",
                   kvcache_block_size=16, max_model_len=128, num_kvcache_blocks=8,
                   max_num_seqs=2)
    real = llm.client._inbox

    class Broken:
        def send(self, msg):
            raise BrokenPipeError(32, "Broken pipe")

    try:
        llm.client._inbox = Broken()  # the race, made deterministic: the reader still reads
        # The core process is in fact alive, so the wait for its exit status (2 s per error)
        # always ends in "unknown": answer that at once.
        monkeypatch.setattr(llm.client.runner, "exitcode", lambda wait_s=0.0: None)

        async def first_output():
            gen = llm.generate([5, 6, 7], SamplingParams(max_tokens=2))
            return await asyncio.wait_for(gen.__anext__(), timeout=5)

        with pytest.raises(EngineDeadError, match=r"the engine core \(pid \d+\) died"):
            asyncio.run(first_output())
        assert not llm._live and not llm._streams
        with pytest.raises(EngineDeadError, match="died"):
            llm.stats()
    finally:
        llm.client._inbox = real
        llm.shutdown()
