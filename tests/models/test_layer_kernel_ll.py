"""The batch-1 layer kernel's flagged hand-overs (layer_launch.CONFIG["LL"]: phases hand
their outputs over as words that carry an epoch, polled by their readers, instead of grid
barriers) against the launch-per-op path."""
import pytest
import torch

from nanovllm.kernels import layer_launch
from tests.models.test_layer_kernel import CPU, GPU, _logits, counted  # noqa: F401 (a fixture)


def test_flagged_handoffs_in_the_interpreter(toy_models, monkeypatch, counted):
    """Level 2 (every hand-over level 1 makes, and the attention output's) in the
    interpreter's launch per phase (each phase's words complete before the next reads them,
    so no poll waits): the words' packing, their epochs, h by layer parity and the residual
    summed again in phase A give the launch-per-op path's logits."""
    monkeypatch.setitem(layer_launch.CONFIG, "LL", 2)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted, **CPU)
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_gpu_flagged_handoffs(toy_models, monkeypatch, counted, kv, level):
    """On the device, polls that wait, over CUDA graph replays (each launch's epochs new; the
    warm-up's launch over stand-ins, context 0, too): the launch-per-op path's logits."""
    monkeypatch.setitem(layer_launch.CONFIG, "LL", level)
    runs = {on: _logits(toy_models["untied_gqa4_d64"], on, monkeypatch, counted,
                        kv_cache_dtype=kv, **dict(GPU, enforce_eager=False))
            for on in (False, True)}
    torch.testing.assert_close(runs[True], runs[False], rtol=0.05, atol=0.05)
