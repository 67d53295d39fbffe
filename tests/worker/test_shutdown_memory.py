"""An engine's shutdown frees its runner, then (on a GPU) returns the freed memory to the
driver, so no later tensor can be carved from the dead KV cache's segment."""
import gc
import weakref

import pytest
import torch

from nanovllm import LLM
from nanovllm.worker import executor, kv_cache


def test_shutdown_hands_the_freed_memory_back(toy_models, monkeypatch):
    llm = LLM(toy_models["untied_gqa4_d64"], device="cpu", num_kvcache_blocks=8,
              kvcache_block_size=64, max_model_len=256, enforce_eager=True)
    runner = weakref.ref(llm.clients[0].core.executor.runner)
    calls = []

    def hand_back(at_shutdown=False):
        gc.collect()
        calls.append(at_shutdown and runner() is None)

    monkeypatch.setattr(kv_cache, "hand_back_freed_memory", hand_back)
    monkeypatch.setattr(executor.LocalExecutor, "on_gpu", property(lambda self: True))
    llm.shutdown()
    llm.shutdown()  # idempotent: once
    assert calls == [True]  # after the runner (weights, KV cache) was gone


def test_a_broken_context_at_shutdown_is_logged_not_raised(monkeypatch, caplog):
    def broken():
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch.cuda, "empty_cache", broken)
    kv_cache.hand_back_freed_memory(at_shutdown=True)
    assert "could not return" in caplog.text
    with pytest.raises(RuntimeError, match="device-side assert"):
        kv_cache.hand_back_freed_memory()  # while sizing a cache: the caller must know
