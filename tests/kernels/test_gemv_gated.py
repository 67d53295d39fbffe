"""The GEMV's gated epilogue (kernels/gemv_gated.py): one launch gives the GEMV's gate_up
then SiLU·mul to the bit, for fp8 row-scaled and plain weights, ragged shapes (interpreter
on CPU); on a GPU the same on the Qwen3-8B / 0.6B MLP shapes, and the engine's greedy tokens
with it on and off."""
import pytest
import torch

from nanovllm.kernels import gemv, gemv_gated
from nanovllm.kernels.triton_norm import silu_and_mul
from tests.support.gemm import make_weight


def _both(half, k, kind, xdtype, bias, device="cpu"):
    w, s, _ = make_weight(2 * half, k, kind, device=device)
    g = torch.Generator().manual_seed(half + k)
    x = torch.randn(1, k, generator=g).to(device=device, dtype=xdtype)
    b = torch.randn(2 * half, generator=g).to(device) if bias else None
    fused = gemv.gemv(x, w, s, None, b, gated=True)
    return fused, silu_and_mul(gemv.gemv(x, w, s, None, b))


@pytest.mark.parametrize("kind,xdtype", [("fp8_row", torch.bfloat16),
                                          ("fp8_row", torch.float32), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("half,k,bias", [(10, 70, False), (16, 64, True), (3, 100, True)])
def test_gated_is_gemv_then_silu_mul(kind, xdtype, half, k, bias):
    """Outputs past a whole program's (half not a multiple of BLOCK_N / 2) and K past a
    whole tile included; the same fp32 sums, so the same bits. (Plain weights take x in
    their own dtype.)"""
    fused, ref = _both(half, k, kind, xdtype, bias)
    assert fused.shape == (1, half) and fused.dtype == xdtype
    assert torch.equal(fused, ref)


def test_takes_only_one_row_without_blocks(monkeypatch):
    """Only on a GPU, one row, row scales or 16-bit weights, an even row count; off, never."""
    w = torch.zeros(8, 16, dtype=torch.bfloat16)
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    assert not gemv_gated.takes(x, w, None)  # no GPU here
    monkeypatch.setattr(gemv_gated, "GATED", 1)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    assert gemv_gated.takes(x, w, None)
    assert not gemv_gated.takes(torch.zeros(2, 16, dtype=torch.bfloat16), w, None)
    assert not gemv_gated.takes(x, w, (128, 128))
    assert not gemv_gated.takes(x, torch.zeros(7, 16, dtype=torch.bfloat16), None)
    assert not gemv_gated.takes(x, w.float(), None)
    monkeypatch.setattr(gemv_gated, "GATED", 0)
    assert not gemv_gated.takes(x, w, None)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fp8_row", "bf16"])
@pytest.mark.parametrize("half,k", [(12288, 4096), (3072, 1024), (4864, 896)])
def test_gpu_gated_is_gemv_then_silu_mul(kind, half, k):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fused, ref = _both(half, k, kind, torch.bfloat16, False, device="cuda")
    assert torch.equal(fused, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_engine_greedy_with_and_without_gated(toy_models, monkeypatch, dtype):
    """The engine's greedy tokens at batch 1 (graphs) with GATED off and on."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nanovllm import LLM, SamplingParams

    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "0")  # the launch-per-op chain
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for on in (0, 1):
        monkeypatch.setattr(gemv_gated, "GATED", on)
        llm = LLM(toy_models["untied_gqa4_d64"], device="cuda", dtype=dtype,
                  num_kvcache_blocks=64, max_model_len=1024)
        try:
            outs[on] = llm.generate([[5, 17, 99, 3]], sp, use_tqdm=False)[0]["token_ids"]
        finally:
            llm.shutdown()
    assert outs[0] == outs[1]
