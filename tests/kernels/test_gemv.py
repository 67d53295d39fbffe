"""The GEMV (kernels/gemv.py, one row or a few), fp8 and plain weights, against the torch
reference, and fp8_gemm's dispatch to it. On CPU in the Triton interpreter on ragged shapes
(8 x 32 tiles, so N and K are not multiples of a tile); marked gpu, on every supported model's
linear shapes."""
import pytest
import torch

from nanovllm.kernels import fp8_gemm, gemv
from nanovllm.utils.model_shapes import SHAPES, linear_shapes
from tests.support.gemm import check, make_weight, reference


@pytest.mark.parametrize("kind,block", [("fp8_row", None), ("fp8_block", (32, 48)),
                                        ("fp8_block", (128, 128)), ("fp8_block", (8, 16))])
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k,bias", [(40, 100, False), (64, 256, True), (33, 70, True)])
def test_matches_reference(kind, block, xdtype, n, k, bias):
    w, s, block = make_weight(n, k, kind, block=block or (32, 48))
    x = torch.randn(1, k).to(xdtype)
    b = torch.randn(n) if bias else None
    y = gemv.gemv(x, w, s, block, b)
    check(y, reference(x, w, s, block, b), xdtype)


@pytest.mark.parametrize("kind,block", [("fp8_row", None), ("fp8_block", (32, 48)),
                                        ("bf16", None)])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_several_rows_match_reference(kind, block, m):
    """Rows past one keep an accumulator each (ROWS, a power of two, masks the rest)."""
    w, s, block = make_weight(33, 70, kind, block=block or (32, 48))
    x = torch.randn(m, 70).to(torch.bfloat16)
    b = torch.randn(33)
    check(gemv.gemv(x, w, s, block, b), reference(x, w, s, block, b), torch.bfloat16)


@pytest.mark.parametrize("kind,block", [("fp8_row", None), ("fp8_block", (32, 48)),
                                        ("bf16", None), ("fp32", None)])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k", [20, 64, 70, 100])
def test_first_tile_peeled_changes_nothing(kind, block, m, k):
    """PEEL (the first W tile loaded and summed before the loop: under PDL, before the wait
    on x's writer): the same tiles in the same order, so the same bits, at K under, at and
    past whole tiles."""
    w, s, block = make_weight(40, k, kind, block=block or (32, 48))
    x = torch.randn(m, k).to(torch.float32 if kind == "fp32" else torch.bfloat16)
    b = torch.randn(40)
    plain = gemv.gemv(x, w, s, block, b)
    peeled = gemv.gemv(x, w, s, block, b, config=dict(gemv.choose_config(40, k), PEEL=True))
    assert torch.equal(peeled, plain)
    check(peeled, reference(x, w, s, block, b), x.dtype)


@pytest.mark.parametrize("kind,block", [("fp8_row", None), ("fp8_block", (32, 48))])
def test_eight_byte_w_vectors_match_reference(kind, block):
    """W_VEC 8 (a load-width hint the interpreter ignores) with GROUP 8: the sums of eight."""
    w, s, block = make_weight(40, 100, kind, block=block or (32, 48))
    x = torch.randn(1, 100).to(torch.bfloat16)
    cfg = dict(gemv.choose_config(40, 100), GROUP=8, W_VEC=8)
    check(gemv.gemv(x, w, s, block, config=cfg), reference(x, w, s, block, None), x.dtype)


def test_rows_with_a_stride_and_leading_dims():
    w, s, _ = make_weight(24, 64, "fp8_row")
    x = torch.randn(3, 128).to(torch.bfloat16)[:, :64]  # rows 128 apart
    check(gemv.gemv(x, w, s, None), reference(x, w, s, None, None), torch.bfloat16)
    assert gemv.gemv(torch.randn(2, 2, 64).to(torch.bfloat16), w, s, None).shape == (2, 2, 24)


def test_leading_dims_and_a_one_dim_row():
    w, s, _ = make_weight(24, 64, "fp8_row")
    x = torch.randn(1, 1, 64).to(torch.bfloat16)
    assert gemv.gemv(x, w, s, None).shape == (1, 1, 24)
    assert gemv.gemv(x.view(64), w, s, None).shape == (24,)


def test_fp8_gemm_takes_it_up_to_max_m_rows(monkeypatch):
    assert gemv.MAX_M == 2  # (the default: the skinny kernel's dot wins from three rows)
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    w, s, block = make_weight(40, 96, "fp8_block", block=(32, 48))
    for m, taken in ((1, True), (2, True), (3, False)):
        x = torch.randn(m, 96).to(torch.bfloat16)
        calls.clear()
        check(fp8_gemm.fp8_gemm(x, w, s, block), reference(x, w, s, block, None), x.dtype)
        assert bool(calls) == taken
    # Row blocks no 8-row tile divides go to the skinny kernel.
    assert not gemv.takes(1, (12, 128)) and gemv.takes(1, (128, 128))
    monkeypatch.setattr(gemv, "MAX_M", 0)  # off: the skinny kernel again
    calls.clear()
    fp8_gemm.fp8_gemm(torch.randn(1, 96).to(torch.bfloat16), w, s, block)
    assert not calls


@pytest.mark.parametrize("kind,xdtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
@pytest.mark.parametrize("n,k,bias", [(40, 100, False), (33, 70, True)])
def test_plain_weights_match_reference(kind, xdtype, n, k, bias):
    w, _, _ = make_weight(n, k, kind)
    x = torch.randn(1, k).to(xdtype)
    b = torch.randn(n) if bias else None
    check(gemv.gemv(x, w, None, None, b), reference(x, w, None, None, b), xdtype)


def test_dense_linear_takes_it_up_to_plain_max_m_rows(monkeypatch):
    """layers/linear.dense_linear: up to PLAIN_MAX_M rows of a plain weight go to the GEMV
    (PLAIN_NARROW_MAX_M for a small narrow one); PLAIN 0 turns it off."""
    from nanovllm.layers import linear

    assert gemv.PLAIN == 1 and gemv.takes_plain(2) and not gemv.takes_plain(3)
    assert not gemv.takes_plain(0) and not gemv.takes(0, None)  # an empty batch: cuBLAS
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # the GPU branch
    # A weight wider than deep up to PLAIN_MAX_M rows; one narrower than deep (N < K, an o or
    # down projection) and small up to PLAIN_NARROW_MAX_M.
    for n, k, rows in ((96, 40, 2), (40, 96, 4)):
        w, _, _ = make_weight(n, k, "bf16")
        for m in range(1, rows + 2):
            x = torch.randn(m, k).to(torch.bfloat16)
            calls.clear()
            y = linear.dense_linear(x, w)
            assert bool(calls) == (m <= rows) and y.shape == (m, n)
            check(y, reference(x, w, None, None, None), x.dtype)
    assert gemv.PLAIN_MAX_M == 2 and gemv.PLAIN_NARROW_MAX_M == 4
    assert gemv.takes_plain(4, 1024, 3072) and not gemv.takes_plain(3, 4096, 4096)  # 0.6B / 8B
    monkeypatch.setattr(gemv, "PLAIN", 0)
    assert not gemv.takes_plain(1) and not gemv.takes_plain(3, 40, 96)



def test_tiles_by_width_rows_and_the_int8_heads_own(monkeypatch):
    """choose_config (on a GPU): ONE_ROW / TWO_ROWS by width; the int8 head copy (grouped)
    at one row takes GROUPED_ONE_ROW by K, at two the tables' as before."""
    monkeypatch.setattr(gemv, "INTERPRET", False)

    def tiles(*args, **kw):
        cfg = gemv.choose_config(*args, **kw)
        return cfg["BLOCK_N"], cfg["BLOCK_K"]

    assert tiles(151936, 4096, 1, 1) == gemv.ONE_ROW[(True, "wide")]
    assert tiles(151936, 4096, 1, 1, grouped=True) == gemv.GROUPED_ONE_ROW[True] == (8, 1024)
    assert tiles(151936, 1024, 1, 1, grouped=True) == gemv.GROUPED_ONE_ROW[False]
    assert tiles(151936, 4096, 1, 2, grouped=True) == gemv.TWO_ROWS[(True, "wide")]
    assert tiles(1024, 2048, 2, 1) == gemv.ONE_ROW[(False, "narrow")]
    assert tiles(4096, 100, 2, 1)[1] == 128  # BLOCK_K no wider than K's power of two


def test_one_wave_register_caps():
    """one_wave_regs at the Qwen3-8B shape's one-row grids on 132 SMs (4 warps): gate_up's
    1,536 programs fit at 40 registers, qkv's 768 at 80, o / down's 1,024 at 64; no cap for
    the LM head (past one wave), a handful of programs, or a cap under 40."""
    assert gemv.one_wave_regs(1536, 4, 132) == 40
    assert gemv.one_wave_regs(768, 4, 132) == 80
    assert gemv.one_wave_regs(1024, 4, 132) == 64
    assert gemv.one_wave_regs(4748, 4, 132) == 0
    assert gemv.one_wave_regs(8, 4, 132) == 0
    assert gemv.one_wave_regs(2048, 4, 132) == 0  # 16 an SM: 32 registers, too few

# ---- GPU: every supported model's shapes --------------------------------------------------

GPU_CASES = sorted({(nk, kind) for name in SHAPES for layer, nk in linear_shapes(name).items()
                    for kind in ("fp8_row", "fp8_block") if layer != "lm_head"})


@pytest.mark.gpu
@pytest.mark.parametrize("nk,kind", GPU_CASES)
def test_gpu_model_shapes(nk, kind):
    """Real shapes with the kernel's configs, bf16 x, with and without bias."""
    n, k = nk
    w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    for b in (None, torch.randn(n, device="cuda")):
        y = gemv.gemv(x, w, s, block, b)
        check(y, reference(x, w, s, block, b), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("nk", sorted({nk for name in SHAPES
                                       for layer, nk in linear_shapes(name).items()}))
def test_gpu_plain_model_shapes(nk):
    """bf16 weights at every supported model's shapes, LM heads included, with the plain
    configs."""
    n, k = nk
    w, _, _ = make_weight(n, k, "bf16", device="cuda")
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    check(gemv.gemv(x, w, None, None), reference(x, w, None, None, None), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block", "bf16"])
@pytest.mark.parametrize("model", sorted(SHAPES))
def test_gpu_several_rows(model, m, kind):
    """A few rows at every supported model's layer shapes (bf16: the LM head too) with the
    default configs."""
    for name, (n, k) in linear_shapes(model).items():
        if name == "lm_head" and kind != "bf16":
            continue
        w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        check(gemv.gemv(x, w, s, block), reference(x, w, s, block, None), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("nk", sorted({nk for name in SHAPES
                                       for layer, nk in linear_shapes(name).items()
                                       if layer != "lm_head"}))
@pytest.mark.parametrize("kind", ["fp8_row", "fp8_block"])
def test_gpu_eight_byte_w_vectors(monkeypatch, nk, kind):
    """ONE_ROW_W_VEC 8 (W in 8-byte vectors, eight products a group) at every model's layer
    shapes, one row, against the reference."""
    monkeypatch.setattr(gemv, "ONE_ROW_W_VEC", 8)
    n, k = nk
    assert gemv.choose_config(n, k, 1, 1)["W_VEC"] == 8
    w, s, block = make_weight(n, k, kind, block=(128, 128), device="cuda")
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    check(gemv.gemv(x, w, s, block), reference(x, w, s, block, None), torch.bfloat16)


@pytest.mark.gpu
def test_gpu_graph_replay_matches_eager():
    w, s, _ = make_weight(4096, 4096, "fp8_row", device="cuda")
    x = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    eager = gemv.gemv(x, w, s, None)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv.gemv(x, w, s, None)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
