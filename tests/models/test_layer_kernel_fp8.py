"""The batch-1 layer kernel over an fp8 KV cache (kernels/layer_attn.py) in the interpreter,
against the launch-per-op path (a file of its own: these are the slowest of the layer
kernel's CPU tests, and the suite spreads files over its workers)."""
import pytest
import torch

from tests.models.test_layer_kernel import CPU, _logits, counted  # noqa: F401 (a fixture)


@pytest.mark.parametrize("kv,mix,feedback", [("fp8_e4m3", "1", "1"), ("fp8_e4m3", "0", "0"),
                                              ("fp8_e5m2", "1", "1")])
def test_fp8_cache_in_one_launch(toy_models, monkeypatch, counted,  # noqa: F811
                                 kv, mix, feedback):
    """An fp8 KV cache: the new K and V rounded as the fused RoPE store rounds them (with
    Hadamard mixing and K's error feedback, the defaults, or neither; e5m2 has no feedback),
    attention over the fp8 tiles with the scales applied as the decode kernel applies them.
    With the feedback the new key is a split of its own (CONFIG["NEW_APART"]'s default where
    the feedback runs on the register tile, as it always does in the interpreter)."""
    monkeypatch.setenv("NANOVLLM_KV_MIX", mix)
    monkeypatch.setenv("NANOVLLM_KV_FEEDBACK", feedback)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        kv_cache_dtype=kv, **CPU) for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)
