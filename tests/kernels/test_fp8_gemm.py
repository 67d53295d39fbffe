"""The fp8-weight GEMM for any M (kernels/fp8_gemm.py) against the dequantizing reference:
tall row tiles over a grid of M tiles, with and without K splits; on CPU in the interpreter
(16-row tiles, so a few dozen rows span several), marked gpu on real shapes and prefill sizes.
"""
import pytest
import torch

from nanovllm.kernels.fp8_gemm import fp8_gemm
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
    """Without a config: the skinny table up to 16 rows, tall tiles past it."""
    w, s, block = make_weight(24, 48, "fp8_block", block=(16, 16))
    for m in (1, 16, 17, 50):
        x = torch.randn(m, 48)
        check(fp8_gemm(x, w, s, block), reference(x, w, s, block, None), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072), (24576, 4096), (4096, 12288)])
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float32])
def test_gpu_prefill_sizes(n, k, kind, xdtype):
    """Qwen3-0.6B / 8B shapes at batched-decode and prefill row counts."""
    w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
    bias = torch.randn(n, device="cuda")
    for m in (17, 64, 100, 256, 1000, 4096):
        x = torch.randn(m, k, device="cuda").to(xdtype)
        check(fp8_gemm(x, w, s, block, bias), reference(x, w, s, block, bias), xdtype)
