"""NANOVLLM_FUSED_PROLOGUES=1: decode steps fold each RMSNorm (with its residual add) and
SiLU-and-mul into the skinny GEMM after it (models/decoder.DecoderLayer.forward_fused)."""
import random

import pytest
import torch

from nanovllm import LLM
from nanovllm.models import decoder
from tools.fp8_accuracy import context_logits

CPU = dict(device="cpu", num_kvcache_blocks=16, kvcache_block_size=64, max_model_len=512,
           enforce_eager=True)


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_fused_layers_match_separate_kernels(toy_models, monkeypatch, quantization):
    """Forced on the CPU (the interpreter runs the kernels): the logits of
    a teacher-forced context equal the separate norm / SiLU-and-mul path's to float
    rounding (the fused norm rounds its product with the weight once, not twice)."""
    path = toy_models["tied_mha_d16"]
    ctx = [random.Random(0).randrange(400) for _ in range(12)]  # 3 decode steps
    runs = {}
    for fused in (False, True):
        monkeypatch.setenv("NANOVLLM_FUSED_PROLOGUES", "1" if fused else "0")
        decoder.fused_prologues_enabled.cache_clear()
        monkeypatch.setattr(decoder, "fused_rows", lambda x: x.shape[0] <= 16)
        llm = LLM(path, quantization=quantization, **CPU)
        layers = llm.clients[0].core.executor.runner.model.model.layers
        assert all(layer.fusable == fused for layer in layers)
        runs[fused] = context_logits(llm, ctx, 8)
        llm.shutdown()
    decoder.fused_prologues_enabled.cache_clear()
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


def test_bad_flag_is_a_value_error(monkeypatch):
    monkeypatch.setenv("NANOVLLM_FUSED_PROLOGUES", "yes")
    decoder.fused_prologues_enabled.cache_clear()
    with pytest.raises(ValueError, match="NANOVLLM_FUSED_PROLOGUES='yes'"):
        decoder.fused_prologues_enabled()
    decoder.fused_prologues_enabled.cache_clear()
