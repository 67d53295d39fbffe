"""An engine's shutdown frees its runner, then (on a GPU) returns the freed memory to the
driver, so no later tensor can be carved from the dead KV cache's segment."""
import gc
import weakref

from nanovllm import LLM
from nanovllm.worker import executor, kv_cache


def test_shutdown_hands_the_freed_memory_back(toy_models, monkeypatch):
    llm = LLM(toy_models["untied_gqa4_d64"], device="cpu", num_kvcache_blocks=8,
              kvcache_block_size=64, max_model_len=256, enforce_eager=True)
    runner = weakref.ref(llm.clients[0].core.executor.runner)
    calls = []

    def hand_back():
        gc.collect()
        calls.append(runner() is None)

    monkeypatch.setattr(kv_cache, "hand_back_freed_memory", hand_back)
    monkeypatch.setattr(executor.LocalExecutor, "on_gpu", property(lambda self: True))
    llm.shutdown()
    llm.shutdown()  # idempotent: once
    assert calls == [True]  # after the runner (weights, KV cache) was gone
