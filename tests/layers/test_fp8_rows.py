"""The norm's e4m3 rows for an fp8 matmul (layers/fp8_rows.py): the norm's quantized output is
its rounded output times the reciprocal of quantize_tokens's scale, rounded to e4m3, bit for
bit (also over split-K partials); the
W8A8 TMA GEMM is the product of the dequantized operands to one rounding (gated too); the
decoder hands the rows only to qkv_proj and gate_up_proj and nothing quantizes on a CPU. The
kernels run under the Triton interpreter here and on the GPU (marked gpu)."""
import os
from types import SimpleNamespace

import pytest
import torch

from nanovllm.layers import fp8_rows
from nanovllm.layers.fp8_rows import Fp8Rows
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.split_k import SplitSum

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FP8 = torch.float8_e4m3fn


def _gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")


def _check_norm(device, dtype, n, rows=6):
    from nanovllm.kernels.fp8_w8a8 import quantize_tokens
    from nanovllm.kernels.triton_norm import rms_norm

    g = torch.Generator().manual_seed(n + rows)
    norm = RMSNorm(n, 1e-6).to(device)
    norm.weight.data = (1 + 0.3 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)
    x = (torch.randn(rows, n, generator=g) * 3).to(device=device, dtype=dtype)
    residual = torch.randn(rows, n, generator=g).to(device=device, dtype=dtype)
    parts = SplitSum((torch.randn(3, rows, n, generator=g) * 2).to(device), dtype)
    for inp, res in ((x, None), (x, residual), (parts, residual)):
        # (the Triton kernel's unquantized output: on a CPU the module takes torch's path)
        args = (inp.parts, norm.weight, norm.eps, res) if isinstance(inp, SplitSum) else (
            inp, norm.weight, norm.eps, res)
        want = rms_norm(*args, dtype=dtype if isinstance(inp, SplitSum) else None)
        want = want if res is not None else (want, None)
        got = norm(inp, res, quantize=True) if res is not None else (norm(inp, quantize=True),
                                                                     None)
        assert isinstance(got[0], Fp8Rows) and got[0].dtype == dtype
        y = want[0].reshape(-1, n)
        s = quantize_tokens(y)[1].view(-1)  # (the same scale)
        q = (y.float() * (1.0 / s)[:, None]).to(FP8)  # (times the reciprocal, rounded once)
        assert torch.equal(got[0].scales, s)
        assert torch.equal(got[0].values.view(torch.uint8), q.view(torch.uint8))
        if res is not None:
            assert torch.equal(got[1], want[1])


def _operands(m, n, k, device, seed=0):
    from nanovllm.kernels.fp8_w8a8 import quantize_tokens

    g = torch.Generator().manual_seed(seed + m + n + k)
    xq, xs = quantize_tokens(torch.randn(m, k, generator=g).to(device))
    w = (torch.randn(n, k, generator=g) * 4).to(FP8).to(device)
    s = (torch.rand(n, generator=g) * 0.01 + 0.005).to(device)
    b = torch.randn(n, generator=g).to(device)
    return xq, xs.view(-1), w, s, b


def _ref(xq, xs, w, s, b, gated, dtype):
    from nanovllm.kernels.triton_norm import silu_and_mul

    y = (xq.double() * xs.double()[:, None]) @ (w.double() * s.double()[:, None]).T
    y = y + b.double() if b is not None else y
    # gated: gate and up rounded to dtype first, as the kernel (and the unfused path) does
    return silu_and_mul(y.to(dtype)).double() if gated else y


def _check_gemm(m, n, k, device, dtype, gated, bias, tol):
    from nanovllm.kernels import tma_gemm

    xq, xs, w, s, b = _operands(m, n, k, device)
    b = b if bias else None
    y = tma_gemm.w8a8_gemm(xq, xs, w, s, b, dtype, gated=gated)
    want = _ref(xq, xs, w, s, b, gated, dtype)
    assert y.dtype == dtype and y.shape == (m, n // 2 if gated else n)
    assert ((y.double() - want).abs().max() / want.abs().max()).item() < tol


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_norm_quantizes_its_output_interpreter(dtype):
    _check_norm("cpu", dtype, 40)


def _check_silu_rows(device, dtype, d, rows=5):
    from nanovllm.kernels.fp8_w8a8 import quantize_tokens
    from nanovllm.kernels.triton_norm import silu_and_mul

    g = torch.Generator().manual_seed(d + rows)
    x = (torch.randn(rows, 2 * d, generator=g) * 3).to(device=device, dtype=dtype)
    y = silu_and_mul(x)
    values, scales = silu_and_mul(x, quantize=True)
    s = quantize_tokens(y)[1].view(-1)
    q = (y.float() * (1.0 / s)[:, None]).to(FP8)
    assert values.dtype == FP8 and values.shape == (rows, d)
    assert torch.equal(scales, s)
    assert torch.equal(values.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_quantizes_its_output_interpreter(dtype):
    """SiLU-and-mul's e4m3 rows (down_proj's input past 256 rows): its rounded product
    quantized as the norm quantizes, bit for bit."""
    _check_silu_rows("cpu", dtype, 48)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m,n,k,bias", [(17, 40, 64, True), (30, 64, 96, False)])
def test_w8a8_gemm_matches_dequantized_interpreter(m, n, k, gated, bias):
    _check_gemm(m, n, k, "cpu", torch.float32, gated, bias, 1e-5)


def _check_block_gemm(m, n, k, device, dtype, gated, block, tol):
    from nanovllm.kernels import tma_gemm
    from nanovllm.kernels.triton_norm import silu_and_mul
    from nanovllm.layers.quant.fp8 import dequantize

    xq, xs, w, _, _ = _operands(m, n, k, device)
    g = torch.Generator().manual_seed(m)
    s = (torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 0.01 + 0.005)
    s = s.to(device)
    y = tma_gemm.w8a8_gemm(xq, xs, w, s, None, dtype, gated=gated, block=block)
    want = (xq.double() * xs.double()[:, None]) @ dequantize(w, s, block).double().T
    want = silu_and_mul(want.to(dtype)).double() if gated else want
    assert ((y.double() - want).abs().max() / want.abs().max()).item() < tol


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (CPU)")
@pytest.mark.parametrize("gated", [False, True])
def test_w8a8_gemm_block_scales_interpreter(gated):
    """Block-scaled weights (tma_config.W8A8_BLOCKS): each K tile's product times its
    blocks' scales, then the rows' scales."""
    _check_block_gemm(20, 64, 96, "cpu", torch.float32, gated, (16, 32), 1e-5)


def test_decoder_hands_rows_to_qkv_and_gate_up_only(monkeypatch):
    """DecoderAttention and GatedMLP take Fp8Rows through fp8_rows.matmul (gated for
    gate_up; down_proj gets a tensor); plain layers never ask; nothing quantizes on a CPU."""
    from nanovllm.models.decoder import DecoderAttention, DecoderLayer, GatedMLP

    cfg = SimpleNamespace(head_dim=16, hidden_size=64, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e4,
                          rope_scaling=None, rms_norm_eps=1e-6, quantization=None)
    attn, mlp = DecoderAttention(cfg), GatedMLP(64, 128, cfg=cfg)
    layer = DecoderLayer(cfg, attn, mlp)
    assert not layer.fp8_in  # plain weights
    assert not fp8_rows.takes(attn.qkv_proj, torch.randn(20, 64))
    calls = []

    def fake(layer_, rows, gated=False):
        calls.append((layer_, gated))
        return torch.zeros(rows.values.shape[0], layer_.out_features // (2 if gated else 1))

    monkeypatch.setattr(fp8_rows, "matmul", fake)
    rows = Fp8Rows(torch.zeros(20, 64, dtype=FP8), torch.ones(20), torch.float32)
    assert mlp(rows).shape == (20, 64)
    assert calls == [(mlp.gate_up_proj, True)]
    calls.clear()
    monkeypatch.setattr(attn, "attend", lambda positions, qkv: qkv)
    assert attn(None, rows).shape == (20, (4 + 2 * 2) * 16)
    assert calls == [(attn.qkv_proj, False)]


def test_mlp_past_256_rows_hands_down_proj_rows(monkeypatch):
    """Past 256 rows (LARGE 2) gate_up's product is SiLU-and-mul'ed into e4m3 rows that
    down_proj multiplies through fp8_rows.matmul (rank 0 alone adding the bias); where down_proj
    does not take them (LARGE 1), the gated product goes to it as a tensor."""
    from nanovllm.models.decoder import GatedMLP

    cfg = SimpleNamespace(quantization=None)
    mlp = GatedMLP(64, 128, bias=True, cfg=cfg)
    calls = []

    def fake(layer_, rows, gated=False, bias=True):
        calls.append((layer_, gated, bias))
        return torch.randn(rows.values.shape[0], layer_.out_features // (2 if gated else 1))

    monkeypatch.setattr(fp8_rows, "matmul", fake)
    monkeypatch.setattr(fp8_rows, "takes_large",
                        lambda layer, dtype, down=False: fp8_rows.LARGE >= (2 if down else 1))
    rows = Fp8Rows(torch.zeros(300, 64, dtype=FP8), torch.ones(300), torch.float32)
    assert mlp(rows).shape == (300, 64)
    assert calls == [(mlp.gate_up_proj, False, True), (mlp.down_proj, False, True)]
    calls.clear()
    monkeypatch.setattr(mlp.down_proj, "tp_rank", 1)  # (a rank past the first: no bias)
    mlp(rows)
    assert calls[1] == (mlp.down_proj, False, False)
    monkeypatch.setattr(mlp.down_proj, "tp_rank", 0)
    calls.clear()
    monkeypatch.setattr(fp8_rows, "LARGE", 1)
    monkeypatch.setattr(mlp.down_proj, "matmul", lambda x, bias: torch.zeros(x.shape[0], 64))
    assert mlp(rows).shape == (300, 64)
    assert calls == [(mlp.gate_up_proj, True, True)]


def _fake_blockwise_mm(a, b, scale_a, scale_b, out_dtype):
    """torch._scaled_mm's 1 x 128 by 128 x 128 case as cuBLAS took it on the H200: the
    layouts torch checks, rows in fours (else cuBLAS's NOT_SUPPORTED), the product in fp64."""
    from nanovllm.layers.quant.fp8 import dequantize

    m, k = a.shape
    n = b.shape[1]
    assert scale_a.shape == (m, k // 128) and scale_a.stride() == (1, m)
    assert scale_b.shape == (k // 128, n // 128) and scale_b.stride() == (1, k // 128)
    if m % 4:
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
    x = a.double() * scale_a.double().repeat_interleave(128, 1)
    return (x @ dequantize(b.t().contiguous(), scale_b.t(), (128, 128)).double().T).to(out_dtype)


def test_which_layers_take_scaled_mm_past_256_rows(monkeypatch):
    """takes_large: row scales on sm_89 on; 128 x 128 blocks only under LARGE_BLOCKS, on
    Hopper, with K in 512s (cuBLAS summed odd counts of 128-column groups wrong); bf16
    activations only; LARGE 0 or W8A8 off: none."""
    from nanovllm.kernels import tma_config

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))

    def layer(k, block):
        scale = torch.ones(2, k // 128) if block else torch.ones(256)
        return SimpleNamespace(gemm_operands=lambda: (torch.zeros(256, k, dtype=FP8), scale,
                                                      (128, 128) if block else None))

    assert fp8_rows.takes_large(layer(896, False), torch.bfloat16)
    assert not fp8_rows.takes_large(layer(896, False), torch.float16)
    monkeypatch.setattr(fp8_rows, "LARGE_BLOCKS", 0)
    assert not fp8_rows.takes_large(layer(512, True), torch.bfloat16)
    monkeypatch.setattr(fp8_rows, "LARGE_BLOCKS", 1)
    assert fp8_rows.takes_large(layer(512, True), torch.bfloat16)
    assert not fp8_rows.takes_large(layer(896, True), torch.bfloat16)
    assert fp8_rows.takes_large(layer(512, True), torch.bfloat16, down=True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert not fp8_rows.takes_large(layer(512, True), torch.bfloat16)
    assert fp8_rows.takes_large(layer(896, False), torch.bfloat16)
    monkeypatch.setattr(fp8_rows, "LARGE", 1)
    assert not fp8_rows.takes_large(layer(896, False), torch.bfloat16, down=True)
    monkeypatch.setattr(tma_config, "W8A8", 0)
    assert not fp8_rows.takes_large(layer(896, False), torch.bfloat16)


@pytest.mark.parametrize("m", [257, 258, 259, 260])
def test_blockwise_rows_pad_to_fours(m, monkeypatch):
    """fp8_rows' block-scaled _scaled_mm call (LARGE_BLOCKS) lays its scales out as torch
    asks and pads the rows to a multiple of 4, dropping the extra outputs (CPU: the GEMM
    emulated)."""
    monkeypatch.setattr(torch, "_scaled_mm", _fake_blockwise_mm)
    from nanovllm.layers.quant.fp8 import dequantize

    xq, xs, w, _, _ = _operands(m, 256, 512, "cpu")
    s = torch.rand(2, 4, generator=torch.Generator().manual_seed(m)) * 0.01 + 0.005
    y = fp8_rows._blockwise(Fp8Rows(xq, xs, torch.float32), w, s)
    want = (xq.double() * xs.double()[:, None]) @ dequantize(w, s, (128, 128)).double().T
    assert y.shape == (m, 256) and torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,rows", [(1024, 17), (896, 256), (576, 64), (4096, 100)])
def test_gpu_norm_quantizes_its_output(dtype, n, rows):
    _gpu()
    _check_norm("cuda", dtype, n, rows)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,gated", [(4096, 1024, False), (6144, 1024, True),
                                       (1152, 896, False), (9728, 896, True),
                                       (960, 576, False), (3072, 576, True),
                                       (6144, 4096, False), (24576, 4096, True)])
@pytest.mark.parametrize("m", [17, 64, 129, 256])
def test_gpu_w8a8_gemm_matches_dequantized(n, k, gated, m):
    """Every model's qkv / gate_up shape against the fp64 product of the dequantized
    operands, relative to the largest output: 4e-3 (about two bf16 roundings; the kernel
    adds each K tile's e4m3 products in fp32: PERF_NOTES, fifty-seventh session) and gated
    1e-2 (gate, up, silu and the product each rounded: ~4.3 roundings of 2^-9 at worst)."""
    _gpu()
    _check_gemm(m, n, k, "cuda", torch.bfloat16, gated, n == 1152, 1e-2 if gated else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,gated", [(4096, 1024, False), (6144, 1024, True),
                                       (6144, 4096, False), (24576, 4096, True)])
@pytest.mark.parametrize("m", [17, 129, 256])
def test_gpu_w8a8_gemm_block_scales(n, k, gated, m):
    """128 x 128 blocks (Qwen's *-FP8 checkpoints), the tolerances above."""
    _gpu()
    _check_block_gemm(m, n, k, "cuda", torch.bfloat16, gated, (128, 128),
                      1e-2 if gated else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("d,rows", [(3072, 300), (4864, 1000), (12288, 257)])
def test_gpu_silu_and_mul_quantizes_its_output(d, rows):
    _gpu()
    _check_silu_rows("cuda", torch.bfloat16, d, rows)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,gated,bias", [(4096, 1024, False, False), (1152, 896, False, True),
                                            (6144, 1024, True, False), (1024, 3072, False, False)])
@pytest.mark.parametrize("m", [257, 258, 260, 1000, 1001])
@pytest.mark.parametrize("block", [None, (128, 128)])
def test_gpu_rows_past_256_take_scaled_mm(n, k, gated, bias, m, block, monkeypatch):
    """Past the TMA GEMM's rows the layer's rows go through torch._scaled_mm (fp8_rows.LARGE):
    takes_large says so for bf16 with row scales, or (LARGE_BLOCKS) 128 x 128 blocks where K
    is in 512s (Qwen2.5's 896 is not), and the product (silu(gate) * up gated) is the
    dequantized operands' within the TMA path's tolerances, whatever the rows' count mod 4."""
    _gpu()
    monkeypatch.setattr(fp8_rows, "LARGE_BLOCKS", 1)
    from nanovllm.kernels.triton_norm import silu_and_mul
    from nanovllm.layers.quant.fp8 import dequantize

    xq, xs, w, s, b = _operands(m, n, k, "cuda")
    if block is not None:
        s = torch.rand(n // 128, k // 128, device="cuda") * 0.01 + 0.005
    layer = SimpleNamespace(gemm_operands=lambda: (w, s, block), bias=b if bias else None)
    if block is not None and k % 512:
        assert not fp8_rows.takes_large(layer, torch.bfloat16)
        return
    assert fp8_rows.takes_large(layer, torch.bfloat16)
    assert not fp8_rows.takes_large(layer, torch.float16)
    y = fp8_rows.matmul(layer, Fp8Rows(xq, xs, torch.bfloat16), gated=gated)
    want = (xq.double() * xs.double()[:, None]) @ dequantize(w, s, block).double().T
    want = want + layer.bias.double() if bias else want
    want = silu_and_mul(want.to(torch.bfloat16)).double() if gated else want
    assert y.dtype == torch.bfloat16 and y.shape == want.shape
    assert ((y.double() - want).abs().max() / want.abs().max()).item() < (
        1e-2 if gated else 4e-3)


@pytest.mark.gpu
def test_gpu_w8a8_graph_replay_equals_eager():
    _gpu()
    from nanovllm.kernels import tma_gemm

    xq, xs, w, s, _ = _operands(64, 6144, 1024, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = tma_gemm.w8a8_gemm(xq, xs, w, s, None, torch.bfloat16, gated=True)
    for seed in (1, 2):
        xq2, xs2 = _operands(64, 6144, 1024, "cuda", seed=seed)[:2]
        xq.copy_(xq2)
        xs.copy_(xs2)
        graph.replay()
        assert torch.equal(y, tma_gemm.w8a8_gemm(xq, xs, w, s, None, torch.bfloat16,
                                                 gated=True))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,length", [("rows", 60), ("block", 60), ("rows", 100),
                                        ("block", 100)])
def test_gpu_engine_with_and_without_w8a8(wide_toy, fmt, length, tmp_path, monkeypatch):
    """The fp8 wide toy (Qwen3-0.6B's layer shapes; rows: quantized at load, block: a
    128 x 128 block-scaled checkpoint), teacher-forced prompt logprobs of four prompts (one
    prefill of 240 rows: the TMA GEMM's range; of 400: torch._scaled_mm's, row-wise
    or block-wise, down_proj's rows too), the e4m3 rows off and on: the run takes them, and
    the logprobs move by the activations' rounding only (2x what the H200 measured; random
    weights magnify it: SmolLM2's real ones move 0.069, test_linear_dispatch's fp8 test)."""
    _gpu()
    from nanovllm import LLM, SamplingParams
    from nanovllm.kernels import tma_config
    from tests.support.fp8_checkpoints import write_fp8

    path, quantization = wide_toy, "fp8"
    if fmt == "block":
        path, quantization = write_fp8(wide_toy, str(tmp_path / "block"), "block"), None
        monkeypatch.setattr(fp8_rows, "LARGE_BLOCKS", 1)

    calls = []
    real = fp8_rows.matmul
    monkeypatch.setattr(fp8_rows, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 500, (length,), generator=g).tolist() for _ in range(4)]
    sp = SamplingParams(max_tokens=1, prompt_logprobs=0)
    lps = {}
    for on in (0, 1):
        monkeypatch.setattr(tma_config, "W8A8", on)
        llm = LLM(path, device="cuda", dtype="bfloat16", quantization=quantization,
                  num_kvcache_blocks=256, max_model_len=1024)
        try:
            outs = llm.generate(prompts, sp, use_tqdm=False)
        finally:
            llm.shutdown()
        lps[on] = torch.tensor([o.prompt_logprobs[i][ids[i]].logprob for o, ids in
                                zip(outs, prompts) for i in range(1, len(ids))])
        assert bool(calls) == bool(on)
    delta = (lps[1] - lps[0]).abs()
    print(f"W8A8 prompt logprobs ({fmt}, {length}): mean |delta| {delta.mean():.4f} "
          f"max {delta.max():.4f}")
    assert delta.mean() <= 0.3 and delta.max() <= 1.0  # (measured 0.15 / 0.47)


def test_w8a8_switch_names_its_values():
    """NANOVLLM_FP8_W8A8 takes 0 or 1; anything else is refused with both named."""
    import subprocess
    import sys

    env = {**os.environ, "NANOVLLM_FP8_W8A8": "2"}
    r = subprocess.run([sys.executable, "-c", "import nanovllm.kernels.tma_config"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "NANOVLLM_FP8_W8A8='2'" in r.stderr and "or 0" in r.stderr
