"""The skinny GEMM (kernels/skinny_gemm.py) against the torch reference: y = x @ W^T (+ bias)
with W in bf16/fp32 or fp8 with row or block scales.

On CPU it runs in the Triton interpreter on tiny ragged shapes (16-wide tiles, so N and K not
multiples of a tile, several tiles and K splits); marked gpu, on every supported model's
linear shapes at M = 1..16.
"""
import pytest
import torch

from nanovllm.kernels import skinny_config
from nanovllm.kernels.skinny_gemm import gemm
from nanovllm.layers.quant.fp8 import FP8
from nanovllm.utils.model_shapes import SHAPES, linear_shapes
from tests.support.gemm import check, make_weight, reference

# Interpreter tile config: 16 x 16 tiles; the K splits come from SPLIT_K.
TINY = dict(BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1)


@pytest.mark.usefixtures("poisoned_empty")
@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp8_row", "fp8_block"])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,split,bias", [
    (1, 40, 72, 1, False),    # N and K not tile multiples
    (3, 33, 100, 2, True),    # two K splits over a ragged K
    (7, 64, 96, 3, False),
    (16, 50, 130, 4, True),   # K splits of 48, 48, 34 (the last one partial)
    (13, 17, 16, 1, True),    # one K tile
])
def test_matches_reference(kind, xdtype, m, n, k, split, bias):
    w, s, block = make_weight(n, k, kind, seed=m)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, k, generator=g).to(xdtype)
    b = torch.randn(n, generator=g) if bias else None
    y = gemm(x, w, b, s, block, config=dict(TINY, SPLIT_K=split))
    check(y, reference(x, w, s, block, b), xdtype)


def test_ragged_rows_and_leading_dims():
    """Every M from 1 to 16, x with leading dims and a row stride (a slice of a wider tensor)."""
    w, s, block = make_weight(24, 40, "fp8_block", block=(16, 16))
    wide = torch.randn(16, 56)
    for m in range(1, 17):
        x = wide[:m, 8:48]  # row stride 56
        y = gemm(x.view(1, m, 40), w, None, s, block, config=dict(TINY, SPLIT_K=2))
        assert y.shape == (1, m, 24)
        check(y[0], reference(x, w, s, block, None), torch.float32)


def test_block_scale_narrower_than_k_tile():
    """A scale block narrower than the config's K tile: the tile shrinks to the block, so no
    tile straddles two scale blocks (16-wide blocks, 64-wide configured tiles)."""
    w, s, block = make_weight(40, 80, "fp8_block", block=(16, 16))
    x = torch.randn(5, 80)
    y = gemm(x, w, None, s, block, config=dict(TINY, BLOCK_K=64, SPLIT_K=2))
    check(y, reference(x, w, s, block, None), torch.float32)


def test_every_fp8_code_widens_exactly():
    """One-hot rows of x pick single weight columns: y must be value * scale exactly, for every
    finite e4m3 code (normals and subnormals, both signs)."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    codes = codes[~codes.float().isnan()]  # 254 finite codes
    w = codes.view(-1, 2)  # [127, 2]: every code once
    s = torch.rand(w.shape[0]) + 0.5
    x = torch.eye(2)
    y = gemm(x, w, None, s, None, config=dict(TINY, SPLIT_K=1))
    assert torch.equal(y, (w.float() * s[:, None]).T)


def test_split_k_is_deterministic_and_resets_counters():
    """Split-K sums the partials in split order: two calls give the same bits; every call
    leaves its counters at zero (the next call, or graph replay, needs that)."""
    w, _, _ = make_weight(48, 160, "bf16")
    x = torch.randn(9, 160)
    cfg = dict(TINY, SPLIT_K=5)
    y1 = gemm(x, w, None, config=cfg)
    y2 = gemm(x, w, None, config=cfg)
    assert torch.equal(y1, y2)
    _, counters = skinny_config._WORKSPACE[x.device]
    assert not counters.any()


def test_auto_split_k(monkeypatch):
    """Few column tiles split K (powers of two up to the program target); many do not."""
    monkeypatch.setattr(skinny_config, "TARGET_PROGRAMS", 264)
    monkeypatch.setattr(skinny_config, "MIN_K_PER_SPLIT", 512)
    monkeypatch.setattr(skinny_config, "MAX_SPLIT_K", 16)
    assert skinny_config.auto_split_k(32, 2048, 256) == 4  # capped: 512 columns per split
    assert skinny_config.auto_split_k(128, 4096, 256) == 4  # 256 programs: short of 264
    assert skinny_config.auto_split_k(200, 4096, 256) == 2
    assert skinny_config.auto_split_k(4096, 4096, 256) == 1
    assert skinny_config.auto_split_k(8, 1024, 512) == 2  # a split keeps one whole K tile


def test_empty_rows():
    w, _, _ = make_weight(16, 32, "bf16")
    assert gemm(torch.empty(0, 32), w).shape == (0, 16)


# ---- GPU: every supported model's shapes --------------------------------------------------

# Every (N, K) of a supported model; the LM heads (never fp8) only in bf16. x in bf16 for
# every weight kind, in fp32 with fp32 weights (an fp32 model's).
GPU_CASES = sorted({(nk, kind, xdtype) for name in SHAPES
                    for layer, nk in linear_shapes(name).items()
                    for kind, xdtype in (("bf16", "bfloat16"), ("fp8_row", "bfloat16"),
                                         ("fp8_block", "bfloat16"), ("fp32", "float32"))
                    if layer != "lm_head" or kind in ("bf16", "fp32")})
GPU_ROWS = (1, 3, 8, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("nk,kind,xdtype", GPU_CASES)
def test_gpu_model_shapes(nk, kind, xdtype):
    """Real shapes with the table's configs (splits included), ragged and full row tiles."""
    n, k = nk
    xdtype = getattr(torch, xdtype)
    w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
    b = torch.randn(n, device="cuda")
    for m in GPU_ROWS:
        x = torch.randn(m, k, device="cuda").to(xdtype)
        bias = b if m % 2 else None
        y = gemm(x, w, bias, s, block)
        check(y, reference(x, w, s, block, bias), xdtype)
    torch.cuda.synchronize()
    _, counters = skinny_config._WORKSPACE.get(x.device, (None, torch.zeros(1)))
    assert not counters.any()


@pytest.mark.gpu
def test_gpu_graph_replay_matches_eager():
    """Captured in a CUDA graph (split-K counters and all), replays give the eager result."""
    n, k = 1024, 3072  # Qwen3-0.6B's down projection: split K
    w, _, _ = make_weight(n, k, "bf16", device="cuda")
    x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
    eager = gemm(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemm(x, w)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y, gemm(x, w), rtol=0, atol=0)
    assert not torch.equal(y, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", ["row", "block"])
def test_gpu_e4m3_widening_is_exact(scale):
    """e4m3_to_bf16 (integer widening, the default for e4m3 weights and bf16 x) gives the
    cast path's result bit for bit: a weight holding every finite e4m3 pattern (subnormals,
    both zeros), one x row of powers of two so each product is exact, and random rows."""
    patterns = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n, k = 64, 1024
    w = patterns[torch.arange(n * k) % patterns.numel()].view(n, k).view(FP8).cuda()
    if scale == "row":
        s, block = torch.rand(n, device="cuda") + 0.5, None
    else:
        s, block = torch.rand(1, k // 128, device="cuda") + 0.5, (128, 128)
    x = torch.randn(5, k, device="cuda").to(torch.bfloat16)
    x[0] = 2.0 ** torch.randint(-4, 4, (k,), device="cuda")
    fast = gemm(x, w, None, s, block)
    cast = gemm(x, w, None, s, block, config=dict(
        skinny_config.choose_config(n, k, w.dtype), BITS_TO_BF16=False))
    assert torch.equal(fast, cast)
    check(fast, reference(x, w, s, block, None), torch.bfloat16)


def test_bf16_k_tiles_divide_k(monkeypatch):
    # Off the interpreter: a bf16 weight's K tile divides K where the table's does not.
    monkeypatch.setattr(skinny_config, "INTERPRET", False)
    bf16 = torch.bfloat16
    assert skinny_config.choose_config(49152, 576, bf16)["BLOCK_K"] == 64
    assert skinny_config.choose_config(151936, 896, bf16)["BLOCK_K"] == 128
    assert skinny_config.choose_config(151936, 1024, bf16)["BLOCK_K"] == 256
    assert skinny_config.choose_config(151936, 1024, bf16) == skinny_config.BF16_TABLE[-1][2]
