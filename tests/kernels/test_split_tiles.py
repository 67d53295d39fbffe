"""The split-K tiles measured per layer (kernels/tma_config.SPLIT_TILES): well formed, looked
up by the smallest row bound at or above a call's rows, and (GPU) every entry's partials
within cuBLAS's error of the fp32 product at its rows."""
import pytest
import torch

from nanovllm.kernels import tma_config, tma_gemm

ENTRIES = [(fp8, n, k, rows, tiles) for (fp8, n, k), table in tma_config.SPLIT_TILES.items()
           for rows, tiles in table.items() if tiles is not None]


def test_table_is_well_formed():
    """Narrow layers only, row bounds up to the TMA GEMM's 256 (the last one 256), tiles the
    kernel takes, and every split keeping at least one K step."""
    for (fp8, n, k), table in tma_config.SPLIT_TILES.items():
        assert n <= 2048 and max(table) == tma_gemm.MAX_M and min(table) >= tma_gemm.MIN_M
        for tiles in table.values():
            if tiles is not None:
                bm, bn, split, bk, stages = (*tiles, 128, 4)[:5]
                assert bm in (64, 128) and bn in (32, 64) and split in (2, 4, 8)
                assert bk in (64, 128, 256) and 2 <= stages <= 6 and len(tiles) in (3, 5)
                assert k >= split * bk, (n, k, tiles)


def test_lookup_by_row_bound(monkeypatch):
    """A call takes its layer's entry for the smallest bound >= its rows; None there: no split
    (cuBLAS); block scales narrower than its K step: 128; SPLIT_TABLE 0 or an unlisted layer:
    the rule."""
    monkeypatch.setattr(tma_config, "SPLIT_TILES",
                        {(False, 512, 1024): {64: (64, 32, 4), 128: None,
                                              256: (128, 64, 2, 256, 3)}})
    cfg = tma_config.split_config(17, 512, 1024)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT"]) == (64, 32, 4)
    assert tma_config.split_config(64, 512, 1024)["SPLIT"] == 4
    assert tma_config.split_config(65, 512, 1024) is None
    cfg = tma_config.split_config(129, 512, 1024)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["SPLIT"], cfg["BLOCK_K"], cfg["STAGES"]) == (
        128, 64, 2, 256, 3)
    # 128-column block scales: K steps inside one block
    assert tma_config.split_config(129, 512, 1024, scale_bk=128)["BLOCK_K"] == 128
    assert tma_config.split_config(129, 512, 1024, scale_bk=256)["BLOCK_K"] == 256
    assert tma_config.split_config(64, 512, 1024, fp8=True)["SPLIT"] == 8  # not listed: rule
    monkeypatch.setattr(tma_config, "SPLIT_TABLE", 0)
    assert tma_config.split_config(129, 512, 1024)["SPLIT"] == 2  # the rule: 2 x 129 <= 512


@pytest.mark.gpu
@pytest.mark.parametrize("fp8,n,k,rows,tiles", ENTRIES)
def test_gpu_entry_partials_near_fp32(fp8, n, k, rows, tiles):
    """Each entry's tiles at its rows: the partials' in-order sum, rounded to bf16, against the
    fp64 product of the (dequantized) weight, within twice cuBLAS's error on the same bf16
    weight plus 1e-3 of the largest output."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(n + k + rows)
    x = torch.randn(rows, k, generator=g).to("cuda", torch.bfloat16)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    scale = None
    if fp8:
        scale = (w.abs().amax(1) / 448).clamp(min=1e-12)
        w = (w / scale[:, None]).to(torch.float8_e4m3fn)
        scale = scale.cuda()
    w = w.to("cuda", torch.float8_e4m3fn if fp8 else torch.bfloat16)
    dq = w.double() * scale.double()[:, None] if fp8 else w.double()
    bk, stages = tiles[3:] or (128, 4)
    cfg = dict(BLOCK_M=tiles[0], BLOCK_N=tiles[1], BLOCK_K=bk, SPLIT=tiles[2], STAGES=stages,
               num_warps=4)
    parts = tma_gemm.tma_partials(x, w, scale, None, config=cfg)
    y = sum(parts[1:], parts[0]).to(torch.bfloat16)
    ref = x.double() @ dq.T
    err = (y.double() - ref).abs().max().item()
    err_cublas = (torch.nn.functional.linear(x, dq.to(torch.bfloat16)).double() - ref).abs().max()
    assert err <= 2 * err_cublas.item() + 1e-3 * ref.abs().max().item(), (err, err_cublas)
