"""The fp8-weight GEMM for any M (kernels/fp8_gemm.py) against the dequantizing reference:
tall row tiles over a grid of M tiles, with and without K splits, and the dequantize +
matmul path of long prefills; on CPU in the interpreter
(16-row tiles, so a few dozen rows span several), marked gpu on real shapes and prefill sizes.
"""
import pytest
import torch
import torch.nn.functional as F

from nanovllm.kernels import fp8_gemm as fp8_gemm_module
from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.fp8_gemm import dequantize, fp8_gemm
from nanovllm.layers.quant import fp8 as fp8_ref
from tests.support.gemm import check, make_weight, reference

TALL = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1)


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,split", [(17, 1), (40, 2), (33, 3)])
def test_tall_tiles_match_reference(kind, xdtype, m, split):
    """M past one row tile (ragged last tile), N and K not tile multiples, K splits across
    several row tiles (one counter per output tile)."""
    n, k = 40, 100
    w, s, block = make_weight(n, k, kind, seed=m)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(xdtype)
    bias = torch.randn(n, generator=g)
    y = fp8_gemm(x, w, s, block, bias, config=dict(TALL, SPLIT_K=split))
    check(y, reference(x, w, s, block, bias), xdtype)


def test_default_configs_by_rows():
    """Without a config: the GEMV for one or two rows, the skinny table up to 16, then the
    default path of each M."""
    w, s, block = make_weight(24, 48, "fp8_block", block=(16, 16))
    for m in (1, 16, 17, 50):
        x = torch.randn(m, 48)
        check(fp8_gemm(x, w, s, block), reference(x, w, s, block, None), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1024, 3072), (24576, 4096)])
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float32])
def test_gpu_prefill_sizes(n, k, kind, xdtype):
    """Qwen3-0.6B / 8B shapes at batched-decode and prefill row counts. The tall tiles are
    checked against the fp32 oracle (their only rounding is y's); past 16 rows the weight is
    rounded to x's dtype first, as the reference does: checked against that product."""
    w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
    bias = torch.randn(n, device="cuda")
    for m in (17, 100, 600):
        x = torch.randn(m, k, device="cuda").to(xdtype)
        tall = fp8_gemm(x, w, s, block, bias, config=fp8_gemm_module.tall_config(m, xdtype))
        check(tall, reference(x, w, s, block, bias), xdtype)
        y = fp8_gemm(x, w, s, block, bias)  # the default path for m rows
        if m < fp8_gemm_module.DEQUANT_FROM_M:
            check(y, reference(x, w, s, block, bias), xdtype)
        else:  # the fp32 product of what it reads: the weight and bias rounded to x's dtype
            # (dequantize + cuBLAS, or tma_gemm's tiles, summed in another order)
            wq = fp8_ref.dequantize(w, s, block).to(xdtype).float()
            check(y, F.linear(x.float(), wq, bias.to(xdtype).float()), xdtype)


@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_the_references(kind, dtype):
    """The one-pass dequantize gives layers/quant/fp8's weight in x's dtype, to the bit."""
    w, s, block = make_weight(40, 100, kind)
    ref = fp8_ref.dequantize(w, s, block).to(dtype)
    out = dequantize(w, s, block, dtype)
    if INTERPRET and dtype == torch.bfloat16:  # the interpreter truncates fp32 -> bf16
        torch.testing.assert_close(out.float(), ref.float(), rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(out, ref)


def test_long_prefill_takes_dequantize_then_matmul(monkeypatch):
    """From DEQUANT_FROM_M rows: the reference's own matmul on the dequantized weight."""
    monkeypatch.setattr(fp8_gemm_module, "DEQUANT_FROM_M", 20)
    w, s, block = make_weight(24, 48, "fp8_block", block=(16, 16))
    x = torch.randn(20, 48)
    y = fp8_gemm(x, w, s, block)
    assert torch.equal(y, F.linear(x, dequantize(w, s, block, x.dtype)))
    check(y, reference(x, w, s, block, None), torch.float32)


def test_prefill_path_switch(monkeypatch):
    """NANOVLLM_FP8_PREFILL=w8a8 sends long prefills to the W8A8 kernel, rowwise row-scaled
    layers to torch._scaled_mm; bad values refused."""
    from nanovllm.kernels.fp8_w8a8 import GROUP, rowwise_gemm, w8a8_gemm

    monkeypatch.setattr(fp8_gemm_module, "DEQUANT_FROM_M", 20)
    w, s, block = make_weight(24, 2 * GROUP, "fp8_block", block=(16, GROUP))
    x = torch.randn(20, 2 * GROUP)
    try:
        monkeypatch.setenv("NANOVLLM_FP8_PREFILL", "w8a8")
        fp8_gemm_module.prefill_path.cache_clear()
        assert torch.equal(fp8_gemm(x, w, s, block), w8a8_gemm(x, w, s, block))
        monkeypatch.setenv("NANOVLLM_FP8_PREFILL", "rowwise")
        fp8_gemm_module.prefill_path.cache_clear()
        # Block scales have no row-wise form: W8A8 takes them; row scales go to _scaled_mm.
        assert torch.equal(fp8_gemm(x, w, s, block), w8a8_gemm(x, w, s, block))
        wr, sr, _ = make_weight(24, 2 * GROUP, "fp8_row")
        xb = x.to(torch.bfloat16)
        assert torch.equal(fp8_gemm(xb, wr, sr, None), rowwise_gemm(xb, wr, sr))
        monkeypatch.setenv("NANOVLLM_FP8_PREFILL", "fast")
        fp8_gemm_module.prefill_path.cache_clear()
        with pytest.raises(ValueError, match="NANOVLLM_FP8_PREFILL='fast'"):
            fp8_gemm(x, w, s, block)
    finally:
        monkeypatch.delenv("NANOVLLM_FP8_PREFILL")
        fp8_gemm_module.prefill_path.cache_clear()


def test_blocks_narrower_than_a_dot_tile_go_to_the_reference():
    """A valid checkpoint may use K blocks of 8 columns: the kernels need whole 16-column
    tiles, so the layer must not send it to them (it would hit their internal assert)."""
    assert fp8_gemm_module.takes(None) and fp8_gemm_module.takes((128, 128))
    assert fp8_gemm_module.takes((16, 48)) and not fp8_gemm_module.takes((128, 8))
    w, s, block = make_weight(24, 48, "fp8_block", block=(16, 8))
    with pytest.raises(AssertionError, match="too narrow"):
        fp8_gemm(torch.randn(3, 48), w, s, block)
