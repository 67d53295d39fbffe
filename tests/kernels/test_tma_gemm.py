"""The TMA GEMM for batched decode (kernels/tma_gemm.py): x @ W^T (+ bias) and the gated
SiLU-and-mul form against torch, ragged shapes, split K summed in order (interpreter on CPU,
fp32 and fp16: its bf16 descriptor loads are wrong there); on a GPU, bf16 at the models'
layer shapes, inside a CUDA graph, and the engine's greedy tokens with it on and off."""
import pytest
import torch

from nanovllm.kernels import tma_config, tma_gemm
from nanovllm.kernels.triton_norm import silu_and_mul

SPLIT1 = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=1, STAGES=1, num_warps=4)
SPLIT2 = dict(SPLIT1, SPLIT=2)


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
@pytest.mark.parametrize("config", [SPLIT2, SPLIT1], ids=["split", "whole"])
def test_matches_matmul(dtype, tol, m, n, k, bias, config):
    """Rows, columns and K past whole tiles; K whole or split in two (the partials added by
    tma_gemm, in split order)."""
    if config == SPLIT2 and bias:
        bias = False  # (a split call carries no bias: the norm after it adds none)
    x, w, b = _inputs(m, n, k, dtype, bias)
    y = tma_gemm.tma_gemm(x, w, b, config=config)
    assert y.shape == (m, n) and y.dtype == dtype
    ref = _ref(x, w, b)
    assert (y.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("k,splits", [(96, 2), (40, 2), (16, 1)])
def test_partials_add_up_in_order(k, splits):
    """tma_partials: one fp32 partial a split that gets columns (a short K leaves fewer), and
    their sum in split order is the whole product."""
    x, w, _ = _inputs(20, 24, k, torch.float32, False)
    parts = tma_gemm.tma_partials(x, w, None, None, SPLIT2)
    assert parts.shape == (splits, 20, 24) and parts.dtype == torch.float32
    torch.testing.assert_close(parts.sum(0).double(), _ref(x, w, None), rtol=1e-5, atol=1e-5)
    assert torch.equal(tma_gemm.tma_gemm(x, w, config=SPLIT2), sum(parts[1:], parts[0]))


def _fp8(n, k, block, device="cpu", seed=0):
    """An e4m3 weight and its scales: one a row (block None) or one a block."""
    g = torch.Generator().manual_seed(seed + n + k)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    shape = (n,) if block is None else (-(-n // block[0]), -(-k // block[1]))
    scale = (torch.rand(shape, generator=g) + 0.5) / 100
    return w.to(device), scale.to(device)


@pytest.mark.parametrize("block", [None, (16, 32)], ids=["rows", "blocks"])
@pytest.mark.parametrize("gated", [False, True])
def test_fp8_weights_match_dequantized(block, gated):
    """e4m3 weights: each tile dequantized as fp8_gemm.dequantize writes it, so the result is
    the dequantized weight's matmul (fp16 x; gated: then silu_and_mul)."""
    from nanovllm.layers.quant.fp8 import dequantize

    m, n, k = 19, 64, 96
    w, scale = _fp8(n, k, block)
    x = _inputs(m, n, k, torch.float16, False)[0]
    y = tma_gemm.tma_gemm(x, w, gated=gated, config=SPLIT1, scale=scale, block=block)
    want = x.float() @ dequantize(w, scale, block).to(torch.float16).float().T
    want = silu_and_mul(want.to(torch.float16)) if gated else want
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-3, atol=2e-3)
    if not gated:
        parts = tma_gemm.tma_partials(x, w, scale, block, SPLIT2)
        torch.testing.assert_close(parts.sum(0), want, rtol=1e-3, atol=1e-3)


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
    """17-256 rows of bf16 / fp16 on a GPU of capability 9+, rows 16-byte aligned, a weight
    of x's dtype (or e4m3 with scales), shapes with a config (ungated: PLAIN; gated:
    GATED_TILES; split; fp8: FP8_TILES, wide layers); ON 0: never. PLAIN: the widest plain
    layer taken."""
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    x = torch.zeros(17, 64, dtype=torch.bfloat16)
    assert not tma_gemm.takes(x, w)  # no GPU here
    for module in (tma_gemm, tma_config):
        monkeypatch.setattr(module, "INTERPRET", False)
    monkeypatch.setattr(tma_config, "PLAIN", 32)
    monkeypatch.setattr(tma_config, "GATED_TILES", {(16, 64): {256: (64, 32, 64, 4)}})
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
    assert not tma_gemm.takes(x, torch.zeros(48, 64, dtype=torch.bfloat16))  # wider than PLAIN
    monkeypatch.setattr(tma_config, "PLAIN", 0)
    assert not tma_gemm.takes(x, w) and tma_gemm.takes(x, w, gated=True)
    # Split K: where K gives two splits of MIN_SPLIT_K columns; SPLIT 0: never.
    narrow = torch.zeros(1024, 2048, dtype=torch.bfloat16)
    x2k = torch.zeros(64, 2048, dtype=torch.bfloat16)
    assert tma_gemm.takes(x2k, narrow, split=True) and not tma_gemm.takes(x, w, split=True)
    assert tma_config.choose_config(64, 1024, 2048, split=True)["SPLIT"] == 4  # SPLIT_TILES'
    assert tma_config.choose_config(64, 1000, 2048, split=True)["SPLIT"] == 8  # the rule's
    monkeypatch.setattr(tma_config, "SPLIT", 0)
    assert not tma_gemm.takes(x2k, narrow, split=True)
    # fp8: wide ungated layers and gated ones up to 128 rows; scales by rows or 128-wide blocks
    wide8 = torch.zeros(4096, 2048, dtype=torch.float8_e4m3fn)
    s = torch.ones(4096)
    assert tma_gemm.takes(x2k, wide8, scale=s) and tma_gemm.takes(x2k, wide8, True, s)
    assert tma_gemm.takes(x2k, wide8, scale=s, block=(128, 128))
    assert not tma_gemm.takes(x2k, wide8, scale=s, block=(128, 64))
    assert not tma_gemm.takes(x2k, wide8[:2048], scale=s)  # narrow: dequantize + cuBLAS
    assert not tma_gemm.takes(torch.zeros(129, 2048, dtype=torch.bfloat16), wide8, True, s)
    assert not tma_gemm.takes(x2k, wide8)  # (fp8 without scales: no)
    monkeypatch.setattr(tma_config, "FP8", 0)
    assert not tma_gemm.takes(x2k, wide8, scale=s)
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
    cfg = (tma_config.choose_config(m, half, k, gated=True)
           or tma_config.default_config(m, half, k, gated=True))
    fused = tma_gemm.tma_gemm(x, w, gated=True, config=cfg)
    ref = silu_and_mul(tma_gemm.tma_gemm(x, w, config=cfg))
    assert torch.equal(fused, ref)


# (N, K) of the narrow layers the split takes: Qwen2.5-0.5B's o / down, Qwen3-0.6B's
NARROW = [(896, 896), (896, 4864), (1024, 2048), (1024, 3072)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", NARROW)
@pytest.mark.parametrize("m", [17, 64, 200, 256])
def test_gpu_split_partials_near_fp32(n, k, m):
    """The partials' in-order sum, rounded to bf16 as the norm rounds it, within cuBLAS's
    error of the fp32 product."""
    _gpu()
    x, w, _ = _inputs(m, n, k, torch.bfloat16, False, device="cuda")
    cfg = tma_config.choose_config(m, n, k, split=True)
    if cfg is None:  # long splits (Qwen2.5-0.5B's down past 128 rows): cuBLAS
        assert m > 128 and k > 4096
        return
    assert cfg["SPLIT"] > 1
    parts = tma_gemm.tma_partials(x, w, None, None)
    y = sum(parts[1:], parts[0]).to(torch.bfloat16)
    ref = _ref(x, w, None)
    err = (y.double() - ref).abs().max().item()
    err_cublas = (torch.nn.functional.linear(x, w).double() - ref).abs().max().item()
    assert err <= 2 * err_cublas + 1e-3 * ref.abs().max().item(), (err, err_cublas)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["rows", "blocks"])
@pytest.mark.parametrize("n,k,gated", [(4096, 1024, False), (6144, 1024, True),
                                       (1024, 3072, False), (24576, 4096, True),
                                       (576, 576, False), (3072, 576, True), (576, 1536, False)])
@pytest.mark.parametrize("m", [17, 64, 128, 256])
def test_gpu_fp8_near_dequantized_cublas(block, n, k, gated, m):
    """fp8 weights (Qwen3-0.6B / 8B layer shapes; SmolLM2-135M's, whose K = 576 ends in a
    part tile): unsplit, gated or split as the engine takes them, against dequantize +
    cuBLAS (+ silu_and_mul) in bf16."""
    _gpu()
    from nanovllm.kernels.fp8_gemm import dequantize

    w, scale = _fp8(n, k, block, device="cuda")
    x = _inputs(m, n, k, torch.bfloat16, False, device="cuda")[0]
    dq = dequantize(w, scale, block, torch.bfloat16)
    want = torch.nn.functional.linear(x, dq)
    want = (silu_and_mul(want) if gated else want).float()
    if n <= 2048:  # narrow: split
        parts = tma_gemm.tma_partials(x, w, scale, block)
        y = sum(parts[1:], parts[0]).to(torch.bfloat16)
    else:
        cfg = (tma_config.choose_config(m, n // 2 if gated else n, k, gated, fp8=True)
               or tma_config.default_config(m, n, k, gated))
        y = tma_gemm.tma_gemm(x, w, gated=gated, config=cfg, scale=scale, block=block)
    tol = 1e-2 * want.abs().max().item()
    assert (y.float() - want).abs().max().item() <= tol


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    """Split partials captured (Qwen2.5-0.5B's down at 64 rows), replayed on new rows."""
    _gpu()
    x, w, _ = _inputs(64, 896, 4864, torch.bfloat16, False, device="cuda")
    tma_gemm.tma_partials(x, w, None, None)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = tma_gemm.tma_partials(x, w, None, None)
    for seed in (1, 2):
        x.copy_(_inputs(64, 896, 4864, torch.bfloat16, False, device="cuda", seed=seed)[0])
        graph.replay()
        assert torch.equal(y, tma_gemm.tma_partials(x, w, None, None))


@pytest.mark.gpu
@pytest.mark.parametrize("model,quantization", [("untied_gqa4_d64", None), ("wide", None),
                                                ("wide", "fp8")])
def test_gpu_engine_tokens_with_and_without(toy_models, wide_toy, monkeypatch, model,
                                            quantization):
    """24 sequences decoding together (graphs) in bf16, the TMA GEMM (split o / down, the
    gated gate_up, fp8 weights) off and on: each generated token's logprob within bf16's
    noise while the tokens agree, and where they part, a near tie in the run without."""
    _gpu()
    path = wide_toy if model == "wide" else toy_models[model]
    # (the norm's e4m3 rows for fp8 qkv / gate_up round activations: test_fp8_rows.py)
    monkeypatch.setattr(tma_config, "W8A8", 0)
    outs = {on: _generate(path, quantization, monkeypatch, tma_gemm, "ON", on) for on in (0, 1)}
    check_logprobs_agree(outs[0], outs[1], 0.1, 0.1, 0.02)


def _generate(path, quantization, monkeypatch, module, knob, value):
    """Greedy outputs of 24 four-token prompts (16 tokens each, top-2 logprobs) with
    module.knob = value."""
    from nanovllm import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    prompts = [[5 + i, 17, 99 + 2 * i, 3] for i in range(24)]
    monkeypatch.setattr(module, knob, value)
    llm = LLM(path, device="cuda", dtype="bfloat16", quantization=quantization,
              num_kvcache_blocks=256, max_model_len=1024)
    try:
        return [o.outputs[0] for o in llm.generate(prompts, sp, use_tqdm=False)]
    finally:
        llm.shutdown()


def check_logprobs_agree(outs_a, outs_b, tie, worst, mean):
    """While two runs' tokens agree, each token's logprob within `worst` (mean within
    `mean`); where they first part, run a's top two within `tie` (a near tie)."""
    deltas = []
    for off, on in zip(outs_a, outs_b):
        for t_off, t_on, lp_off, lp_on in zip(off.token_ids, on.token_ids, off.logprobs,
                                              on.logprobs):
            if t_off != t_on:  # the first parting: a near tie (top two within the noise)
                top = sorted((v.logprob for v in lp_off.values()), reverse=True)
                print(f"parting at a gap of {top[0] - top[1]:.4f}")
                assert top[0] - top[1] <= tie, (top, lp_off, lp_on)
                break
            deltas.append(abs(lp_off[t_off].logprob - lp_on[t_on].logprob))
    print(f"logprob deltas: max {max(deltas):.4f} mean {sum(deltas) / len(deltas):.4f} "
          f"over {len(deltas)}")
    assert max(deltas) <= worst and sum(deltas) / len(deltas) <= mean, max(deltas)
