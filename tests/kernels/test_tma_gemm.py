"""The TMA GEMM for batched decode (kernels/tma_gemm.py): x @ W^T (+ bias) and the gated
SiLU-and-mul form against torch, ragged shapes, split K summed in order (interpreter on CPU,
fp32 and fp16: its bf16 descriptor loads are wrong there); on a GPU, bf16 at the models'
layer shapes, inside a CUDA graph, and the engine's greedy tokens with it on and off."""
import pytest
import torch

from nanovllm.kernels import tma_gemm
from nanovllm.kernels.skinny_config import workspace
from nanovllm.kernels.triton_norm import silu_and_mul

SPLIT1 = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=1, STAGES=1, num_warps=4)


def _inputs(m, n, k, dtype, bias, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed + m + n + k)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=g).to(device=device, dtype=dtype) if bias else None
    return x, w, b


def _ref(x, w, b):
    y = x.double() @ w.double().T
    return y + b.double() if b is not None else y


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("m,n,k,bias", [(17, 40, 80, True), (33, 48, 64, False),
                                         (20, 16, 200, True)])
@pytest.mark.parametrize("config", [None, SPLIT1], ids=["split", "whole"])
def test_matches_matmul(dtype, tol, m, n, k, bias, config):
    """Rows, columns and K past whole tiles; K split in two (the interpreter's default
    config at K >= 64) or whole."""
    x, w, b = _inputs(m, n, k, dtype, bias)
    y = tma_gemm.tma_gemm(x, w, b, config=config)
    assert y.shape == (m, n) and y.dtype == dtype
    ref = _ref(x, w, b)
    assert (y.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


def test_split_sum_is_the_same_bits_every_call_and_counters_end_zero():
    """The last split sums the partials in split order, whichever split arrives last."""
    x, w, b = _inputs(24, 40, 96, torch.float32, True)
    first = tma_gemm.tma_gemm(x, w, b)
    for _ in range(2):
        assert torch.equal(tma_gemm.tma_gemm(x, w, b), first)
    _, counters = workspace(x.device, 1, 1)
    assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3)])
@pytest.mark.parametrize("m,half,k,bias", [(17, 24, 48, False), (30, 16, 64, True)])
def test_gated_is_matmul_then_silu_mul(dtype, tol, m, half, k, bias):
    """silu(gate) * up from one launch, as the ungated call (the same fp32 sums and roundings)
    followed by silu_and_mul; outputs past a whole column tile included."""
    x, w, b = _inputs(m, 2 * half, k, dtype, bias)
    fused = tma_gemm.tma_gemm(x, w, b, gated=True, config=SPLIT1)
    ref = silu_and_mul(tma_gemm.tma_gemm(x, w, b, config=SPLIT1))
    assert fused.shape == (m, half)
    torch.testing.assert_close(fused, ref, rtol=tol, atol=tol)


def test_takes_only_batched_16_bit_calls_on_hopper(monkeypatch):
    """17-256 rows of bf16 / fp16 on a GPU of capability 9+, rows 16-byte aligned, shapes
    with a config (ungated: PLAIN; gated: GATED_TILES); ON 0: never."""
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    x = torch.zeros(17, 64, dtype=torch.bfloat16)
    assert not tma_gemm.takes(x, w)  # no GPU here
    monkeypatch.setattr(tma_gemm, "INTERPRET", False)
    monkeypatch.setattr(tma_gemm, "PLAIN", 1)
    monkeypatch.setattr(tma_gemm, "GATED_TILES", {(16, 64): {256: (64, 32, 64, 4)}})
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert tma_gemm.takes(x, w) and tma_gemm.takes(torch.zeros(256, 64, dtype=torch.bfloat16), w)
    assert tma_gemm.takes(x, w, gated=True)
    assert not tma_gemm.takes(torch.zeros(16, 64, dtype=torch.bfloat16), w)
    assert not tma_gemm.takes(torch.zeros(257, 64, dtype=torch.bfloat16), w)
    assert not tma_gemm.takes(x.float(), w.float())
    assert not tma_gemm.takes(torch.zeros(17, 36, dtype=torch.bfloat16),
                              torch.zeros(32, 36, dtype=torch.bfloat16))  # 72-byte rows
    assert not tma_gemm.takes(x, torch.zeros(31, 64, dtype=torch.bfloat16), gated=True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert not tma_gemm.takes(x, w)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert not tma_gemm.takes(x, torch.zeros(48, 64, dtype=torch.bfloat16), gated=True)
    monkeypatch.setattr(tma_gemm, "PLAIN", 0)
    assert not tma_gemm.takes(x, w) and tma_gemm.takes(x, w, gated=True)
    monkeypatch.setattr(tma_gemm, "ON", 0)
    assert not tma_gemm.takes(x, w, gated=True)


def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


# (N, K) of Qwen2.5-0.5B's qkv / o / gate_up / down, Qwen3-0.6B's qkv / o / down, SmolLM2's o
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864), (4096, 1024), (1024, 2048),
          (1024, 3072), (576, 576)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [17, 64, 129, 256])
def test_gpu_bf16_model_shapes_near_fp32(n, k, m):
    """Within bf16's rounding of the fp32 product (as cuBLAS is: both checked)."""
    _gpu()
    x, w, b = _inputs(m, n, k, torch.bfloat16, n == 1152, device="cuda")
    ref = _ref(x, w, b)
    err = (tma_gemm.tma_gemm(x, w, b).double() - ref).abs().max().item()
    err_cublas = (torch.nn.functional.linear(x, w, b).double() - ref).abs().max().item()
    assert err <= 2 * err_cublas + 1e-3 * ref.abs().max().item(), (err, err_cublas)


@pytest.mark.gpu
@pytest.mark.parametrize("half,k", [(4864, 896), (3072, 1024), (1536, 576)])
@pytest.mark.parametrize("m", [17, 100, 256])
def test_gpu_gated_is_matmul_then_silu_mul(half, k, m):
    _gpu()
    x, w, b = _inputs(m, 2 * half, k, torch.bfloat16, False, device="cuda")
    cfg = (tma_gemm.choose_config(m, half, k, gated=True)
           or tma_gemm.default_config(m, half, k, gated=True))
    fused = tma_gemm.tma_gemm(x, w, gated=True, config=cfg)
    ref = silu_and_mul(tma_gemm.tma_gemm(x, w, config=cfg))
    assert torch.equal(fused, ref)


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    """Captured with split K (Qwen2.5-0.5B's down at 64 rows), replayed on new rows."""
    _gpu()
    x, w, _ = _inputs(64, 896, 4864, torch.bfloat16, False, device="cuda")
    assert tma_gemm.default_config(64, 896, 4864)["SPLIT"] > 1
    tma_gemm.tma_gemm(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = tma_gemm.tma_gemm(x, w)
    for seed in (1, 2):
        x.copy_(_inputs(64, 896, 4864, torch.bfloat16, False, device="cuda", seed=seed)[0])
        graph.replay()
        assert torch.equal(y, tma_gemm.tma_gemm(x, w))


@pytest.mark.gpu
def test_gpu_engine_tokens_with_and_without(toy_models, monkeypatch):
    """24 sequences decoding together (graphs) in bf16, the TMA GEMM off and on: the same
    greedy tokens but where bf16's different summation order flips a near tie (at most 2 of
    24 sequences)."""
    _gpu()
    from nanovllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5 + i, 17, 99 + 2 * i, 3] for i in range(24)]
    outs = {}
    for on in (0, 1):
        monkeypatch.setattr(tma_gemm, "ON", on)
        llm = LLM(toy_models["untied_gqa4_d64"], device="cuda", dtype="bfloat16",
                  num_kvcache_blocks=256, max_model_len=1024)
        try:
            outs[on] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
        finally:
            llm.shutdown()
    assert sum(a != b for a, b in zip(outs[0], outs[1])) <= 2
