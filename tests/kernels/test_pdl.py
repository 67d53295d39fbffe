"""Programmatic dependent launch (kernels/pdl.py): off on a CPU and on GPUs other than
NVIDIA's 9.0+; there the decode chain it covers (add + RMSNorm, the GEMV at one row or the
skinny GEMM at 4-16, SiLU·mul; the TMA GEMM past 16) gives the same bits with it as
without, eagerly and replayed in a CUDA graph, and an engine decoding through that chain
gives the same greedy tokens."""
import pytest
import torch

from nanovllm.kernels import pdl
from tests.support.gemm import make_weight


def test_off_without_a_gpu(monkeypatch):
    monkeypatch.setattr(pdl, "ON", True)
    assert not pdl.enabled(torch.zeros(1))
    assert pdl.launch_kwargs(False) == {} and pdl.launch_kwargs(True) == {"launch_pdl": True}


@pytest.mark.parametrize("hip, capability, want", [
    (None, (9, 0), True), (None, (10, 0), True), (None, (8, 9), False), ("6.2", (9, 4), False)])
def test_nvidia_hopper_or_later_only(monkeypatch, hip, capability, want):
    """PDL needs an NVIDIA GPU of compute capability 9.0+; ROCm's numbers do not count."""
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    pdl._hopper_or_later.cache_clear()
    try:
        assert pdl._hopper_or_later(0) is want
    finally:
        pdl._hopper_or_later.cache_clear()


def _needs_hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9.0 or later")


def _chain(x, residual, norm_w, w1, s1, w2):
    """A decode MLP's kernels: add + norm, an fp8 gate_up, SiLU·mul, a bf16 down, add + norm
    again; the GEMMs on the GEMV at one row, on the skinny kernel past two."""
    from nanovllm.kernels import gemv, skinny_gemm
    from nanovllm.kernels.triton_norm import rms_norm, silu_and_mul

    h, res = rms_norm(x, norm_w, 1e-6, residual)
    if x.shape[0] <= 2:
        a = silu_and_mul(gemv.gemv(h, w1, s1, None))
        return rms_norm(gemv.gemv(a, w2, None, None), norm_w, 1e-6, res)
    a = silu_and_mul(skinny_gemm.gemm(h, w1, scale=s1))
    return rms_norm(skinny_gemm.gemm(a, w2), norm_w, 1e-6, res)


def _same_bits_with_pdl(monkeypatch, chain, rows, d, inter):
    """chain's outputs on random inputs (an fp8 gate_up, a bf16 down) with PDL on, eagerly
    and replayed in a CUDA graph, equal PDL-off's bit for bit."""
    x = torch.randn(rows, d, device="cuda").to(torch.bfloat16)
    residual = torch.randn(rows, d, device="cuda").to(torch.bfloat16)
    norm_w = (torch.rand(d, device="cuda") + 0.5).to(torch.bfloat16)
    w1, s1, _ = make_weight(2 * inter, d, "fp8_row", device="cuda")
    w2, _, _ = make_weight(d, inter, "bf16", seed=1, device="cuda")
    args = (x, residual, norm_w, w1, s1, w2)
    monkeypatch.setattr(pdl, "ON", False)
    off = chain(*args)
    monkeypatch.setattr(pdl, "ON", True)
    assert pdl.enabled(x)
    eager = chain(*args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = chain(*args)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for want, got_eager, got_graph in zip(off, eager, replayed):
        assert torch.equal(got_eager, want) and torch.equal(got_graph, want)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, early", [(1, False), (1, True), (4, False), (16, False)])
def test_gpu_chain_same_bits_eager_and_in_a_graph(monkeypatch, rows, early):
    """The chain with PDL (the GEMV releasing the next launch late, the default, or early;
    at 4 and 16 rows the skinny kernel, launched without it, between PDL kernels) gives
    PDL-off's bits eagerly and replayed in a CUDA graph."""
    from nanovllm.kernels import gemv

    _needs_hopper()
    monkeypatch.setattr(gemv, "PDL_EARLY_RELEASE", early)
    _same_bits_with_pdl(monkeypatch, _chain, rows, 4096, 12288)


def _tma_chain(x, residual, norm_w, w1, s1, w2):
    """Batched decode's MLP on the TMA GEMM (17-256 rows): add + norm writing e4m3 rows, the
    W8A8 gated gate_up, the bf16 down as split-K partials, their sum in the next add + norm."""
    from nanovllm.kernels import tma_config, tma_gemm
    from nanovllm.kernels.triton_norm import rms_norm

    m, inter = x.shape[0], w2.shape[1]
    (values, scales), res = rms_norm(x, norm_w, 1e-6, residual, quantize=True)
    a = tma_gemm.w8a8_gemm(values, scales, w1, s1, None, x.dtype, gated=True,
                           config=tma_config.default_config(m, inter, x.shape[1], True))
    split = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, SPLIT=2, STAGES=4, num_warps=4)
    parts = tma_gemm.tma_partials(a, w2, None, None, split)
    return (a, *rms_norm(parts, norm_w, 1e-6, res, dtype=x.dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, release", [(64, 1), (200, 1), (200, 2)])
def test_gpu_tma_chain_same_bits_eager_and_in_a_graph(monkeypatch, rows, release):
    """The TMA GEMM under PDL (waiting only before its K loop, releasing the next launch at
    its start, 1, or after its K loop, 2: tma_gemm.PDL) between PDL norms: PDL-off's bits,
    eagerly and in a graph."""
    from nanovllm.kernels import tma_gemm

    _needs_hopper()
    monkeypatch.setattr(tma_gemm, "PDL", release)
    _same_bits_with_pdl(monkeypatch, _tma_chain, rows, 1024, 3072)


@pytest.mark.gpu
def test_gpu_engine_greedy_tokens_unchanged(toy_models, monkeypatch):
    """A toy Qwen3 in bf16 with a launch per op (its decode GEMMs on the GEMV), CUDA graphs
    on: the same greedy tokens with PDL as without."""
    _needs_hopper()
    from nanovllm import LLM, SamplingParams
    from nanovllm.models import one_launch

    monkeypatch.setenv("NANOVLLM_LAYER_KERNEL", "0")
    one_launch.layer_kernel_mode.cache_clear()
    prompts = [[3, 14, 15, 92], [65, 35], [89, 79, 32, 38, 46]]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    try:
        for on in (False, True):
            monkeypatch.setattr(pdl, "ON", on)
            llm = LLM(toy_models["untied_gqa4_d64"], max_model_len=256, dtype="bfloat16")
            try:
                outs[on] = [llm.generate([p], greedy, use_tqdm=False)[0]["token_ids"]
                            for p in prompts]
                outs[on] += [o["token_ids"] for o in llm.generate(prompts, greedy,
                                                                   use_tqdm=False)]
            finally:
                llm.shutdown()
    finally:
        monkeypatch.delenv("NANOVLLM_LAYER_KERNEL")
        one_launch.layer_kernel_mode.cache_clear()
    assert outs[True] == outs[False]
