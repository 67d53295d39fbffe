"""The unsplit TMA GEMM's tiles measured per layer (kernels/tma_config.W8A8_TILES and
GATED_TILES): well formed, looked up by the smallest row bound at or above a call's rows, and
(GPU) every entry at its rows near the fp64 product."""
import pytest
import torch

from nanovllm.kernels import tma_config, tma_gemm

ENTRIES = [(n, k, gated, rows, tiles) for (n, k, gated), table in tma_config.W8A8_TILES.items()
           for rows, tiles in table.items()]
GATED = [(n, k, rows, tiles) for (n, k), table in tma_config.GATED_TILES.items()
         for rows, tiles in table.items()]


def test_tables_are_well_formed():
    """Row bounds within the TMA GEMM's 17-256 (W8A8's last one 256); tiles the kernel takes."""
    for (n, k, gated), table in tma_config.W8A8_TILES.items():
        assert max(table) == tma_gemm.MAX_M and min(table) >= tma_gemm.MIN_M
        for bm, bn, bk, stages in table.values():
            assert bm in (64, 128) and bn in (32, 64, 128) and bk in (128, 256)
            assert 2 <= stages <= 6
    for table in tma_config.GATED_TILES.values():
        assert max(table) <= tma_gemm.MAX_M and min(table) >= tma_gemm.MIN_M
        for bm, bn, bk, stages in table.values():
            assert bm == 64 and bn in (32, 64, 128) and bk in (64, 128, 256)
            assert 2 <= stages <= 6


def test_lookup_by_row_bound(monkeypatch):
    """A call takes its layer's entry for the smallest bound >= its rows (8 warps with 128-row
    tiles); block scales whose K its step does not divide: 128; W8A8_TABLE 0, an unlisted
    layer or W8A8 0: the rule."""
    monkeypatch.setattr(tma_config, "INTERPRET", False)
    monkeypatch.setattr(tma_config, "W8A8_TILES",
                        {(512, 1024, True): {64: (64, 32, 256, 5), 256: (128, 64, 128, 3)}})
    cfg = tma_config.w8a8_config(17, 512, 1024, gated=True)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["STAGES"]) == (64, 32, 256, 5)
    assert cfg["num_warps"] == 4
    assert tma_config.w8a8_config(65, 512, 1024, gated=True)["num_warps"] == 8
    assert tma_config.w8a8_config(64, 512, 1024, True, scale_bk=128)["BLOCK_K"] == 128
    assert tma_config.w8a8_config(64, 512, 1024, True, scale_bk=256)["BLOCK_K"] == 256
    rule = tma_config.w8a8_config(64, 512, 1024)  # ungated: not listed
    assert (rule["BLOCK_N"], rule["BLOCK_K"], rule["STAGES"]) == (64, 256, 5)
    assert tma_config.w8a8_config(64, 512, 1024, scale_bk=128)["BLOCK_K"] == 128
    assert tma_config.w8a8_config(129, 512, 1024)["BLOCK_K"] == 128
    assert tma_config.w8a8_config(64, 512, 192)["BLOCK_K"] == 128  # K under one 256 step
    monkeypatch.setattr(tma_config, "W8A8_TABLE", 0)
    rule = tma_config.w8a8_config(17, 512, 1024, gated=True)
    assert (rule["BLOCK_N"], rule["BLOCK_K"], rule["STAGES"]) == (64, 256, 4)
    for m, n in ((65, 512), (17, 12288)):  # past 64 rows, or past 8,192 outputs
        rule = tma_config.w8a8_config(m, n, 1024, gated=True)
        assert (rule["BLOCK_N"], rule["BLOCK_K"], rule["STAGES"]) == (32, 128, 4)
    monkeypatch.setattr(tma_config, "W8A8", 0)
    assert tma_config.w8a8_config(17, 512, 1024, gated=True) is None


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,gated,rows,tiles", ENTRIES)
def test_gpu_entry_near_fp64(n, k, gated, rows, tiles):
    """Each entry's tiles at its rows (K tails included: K need not be a multiple of the step),
    over all its weight's rows, against the fp64 product of the e4m3 rows and weights with
    their scales: within a bf16 rounding plus 1e-3 of the largest output. Gated: equal to
    SiLU-and-mul of that ungated product (the same fp32 sums; against fp64 instead, an output
    whose gate sits on a bf16 rounding boundary may round the other way, and SiLU's slope in
    its negative tail enlarges that step)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nanovllm.kernels.fp8_w8a8 import quantize_tokens
    from nanovllm.kernels.triton_norm import silu_and_mul
    g = torch.Generator().manual_seed(n + k + rows + gated)
    x = torch.randn(rows, k, generator=g).to("cuda", torch.bfloat16)
    w = torch.randn(2 * n if gated else n, k, generator=g) / k ** 0.5
    scale = (w.abs().amax(1) / 448).clamp(min=1e-12)
    w = (w / scale[:, None]).to("cuda", torch.float8_e4m3fn)
    scale = scale.cuda()
    values, scales = quantize_tokens(x)
    scales = scales.view(-1).contiguous()
    bm, bn, bk, stages = tiles
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=1, STAGES=stages,
               num_warps=8 if bm == 128 else 4)
    y = tma_gemm.w8a8_gemm(values, scales, w, scale, None, torch.bfloat16, config=cfg)
    ref = ((values.double() * scales.double()[:, None])
           @ (w.double() * scale.double()[:, None]).T)
    top = ref.abs().max().item()
    torch.testing.assert_close(y.double(), ref, rtol=2 ** -8, atol=1e-3 * top)
    if gated:
        fused = tma_gemm.w8a8_gemm(values, scales, w, scale, None, torch.bfloat16, gated=True,
                                   config=cfg)
        torch.testing.assert_close(fused, silu_and_mul(y), rtol=2 ** -7, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,rows,tiles", GATED)
def test_gpu_gated_entry_near_fp64(n, k, rows, tiles):
    """Each bf16 gated entry at its rows: SiLU(gate) x up against fp64, within twice cuBLAS's
    error (its bf16 gate and up, then SiLU-and-mul) plus 1e-3 of the largest output."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(n + k + rows)
    x = torch.randn(rows, k, generator=g).to("cuda", torch.bfloat16)
    w = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to("cuda", torch.bfloat16)
    bm, bn, bk, stages = tiles
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=1, STAGES=stages, num_warps=4)
    y = tma_gemm.tma_gemm(x, w, gated=True, config=cfg)
    ref = x.double() @ w.double().T
    ref = torch.nn.functional.silu(ref[:, :n]) * ref[:, n:]
    gu = torch.nn.functional.linear(x, w)
    cublas = (torch.nn.functional.silu(gu[:, :n].float()) * gu[:, n:].float()).to(x.dtype)
    err = (y.double() - ref).abs().max().item()
    err_cublas = (cublas.double() - ref).abs().max().item()
    assert err <= 2 * err_cublas + 1e-3 * ref.abs().max().item(), (err, err_cublas)


@pytest.mark.parametrize("capability,shared,fits", [
    ((9, 0), 232448, True),     # H100 / H200: the tables' tiles fit
    ((10, 0), 232448, True),    # B200
    ((12, 0), 101376, False),   # capability 12: ~100 KB, the 5-stage tiles would not fit
    ((8, 9), 101376, False),    # no TMA
    ((9, 0), None, True),       # Triton cannot say: capability decides
])
def test_gpu_fits_by_capability_and_shared_memory(monkeypatch, capability, shared, fits):
    """The TMA GEMM is taken only where its tiles fit the GPU's opt-in shared memory."""
    import triton.runtime

    class Utils:
        @staticmethod
        def get_device_properties(index):
            if shared is None:
                raise RuntimeError("no such query")
            return {"max_shared_mem": shared}

    class Driver:
        active = type("Active", (), {"utils": Utils})

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    monkeypatch.setattr(triton.runtime, "driver", Driver)
    tma_config._shared_room.cache_clear()
    try:
        assert tma_config.gpu_fits(0) is fits
    finally:
        tma_config._shared_room.cache_clear()
