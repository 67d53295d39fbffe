"""A batch-1 decode step runs each dense layer as one launch (kernels/layer_kernel.py; on by
default on a GPU, NANOVLLM_LAYER_KERNEL=1 forces it on the CPU, 0 turns it off). On the CPU
the interpreter runs it a phase per launch; marked gpu, the persistent launch with its grid
barriers runs on the device."""
import random

import pytest
import torch

from nanovllm import LLM
from nanovllm.kernels import layer_kernel
from nanovllm.models import decoder
from tools.fp8_accuracy import context_logits

CPU = dict(device="cpu", num_kvcache_blocks=16, kvcache_block_size=16, max_model_len=512,
           enforce_eager=True)


def _logits(path, on: bool, monkeypatch, calls: list, **engine) -> torch.Tensor:
    """Teacher-forced logits of a 24-token context (8 prefilled, then batch-1 decode steps
    over contexts that cross a cache block and span two key splits)."""
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "1" if on else "0")
    decoder.layer_kernel_mode.cache_clear()
    llm = LLM(path, **engine)
    try:
        layers = llm.clients[0].core.executor.runner.model.model.layers
        assert all(layer.one_launch == on for layer in layers)
        ctx = [random.Random(1).randrange(400) for _ in range(24)]
        before = len(calls)
        out = context_logits(llm, ctx, 8)
        if on:  # every layer of every decode step went through the kernel
            assert len(calls) - before == len(layers) * (len(ctx) - 9)
        return out
    finally:
        llm.shutdown()
        decoder.layer_kernel_mode.cache_clear()


@pytest.fixture
def counted(monkeypatch):
    """Calls of layer_kernel.decode_layer, recorded."""
    calls = []
    real = layer_kernel.decode_layer

    def wrapper(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_kernel, "decode_layer", wrapper)
    return calls


@pytest.mark.parametrize("name", ["tied_mha_d16", "untied_gqa4_d64"])
def test_qwen3_layers_in_one_launch_match_op_by_op(toy_models, monkeypatch, counted, name):
    """Qwen3 (per-head q/k norms; GQA 1 and 4): the logits equal the op-by-op path's to
    float rounding (only the order of the matmuls' sums differs)."""
    runs = {on: _logits(toy_models[name], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2_untied_gqa7", "llama_untied_linear"])
def test_qwen2_and_llama_layers_in_one_launch(arch_models, monkeypatch, counted, name):
    """Qwen2 (q/k/v bias, a hidden size and GQA group that are not powers of two) and Llama
    (scaled RoPE, no bias)."""
    runs = {on: _logits(arch_models[name], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


def test_layers_it_cannot_run_keep_their_path(arch_models, monkeypatch):
    """An MLP with bias (Llama's mlp_bias) is not one the kernel computes."""
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "1")
    decoder.layer_kernel_mode.cache_clear()
    llm = LLM(arch_models["llama3_tied_bias"], **CPU)
    try:
        layers = llm.clients[0].core.executor.runner.model.model.layers
        assert not any(layer.one_launch for layer in layers)
    finally:
        llm.shutdown()
        decoder.layer_kernel_mode.cache_clear()


def test_bad_flag_is_a_value_error(monkeypatch):
    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "on")
    decoder.layer_kernel_mode.cache_clear()
    with pytest.raises(ValueError, match="NANOVLLM_LAYER_KERNEL='on'"):
        decoder.layer_kernel_mode()
    decoder.layer_kernel_mode.cache_clear()


GPU = dict(kvcache_block_size=16, max_model_len=512, enforce_eager=True, dtype="bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["untied_gqa4_d64", "tied_gqa4_d16_l4"])
def test_gpu_one_launch_matches_op_by_op(toy_models, monkeypatch, counted, name):
    """On the device, one persistent launch with grid barriers, bf16."""
    runs = {on: _logits(toy_models[name], on, monkeypatch, counted, **GPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)
