"""fp8-weight GEMM on a GPU: y = x @ dequant(W)^T (+ bias) with W in e4m3 and fp32 row or block
scales, for any number of rows. Weight-only (W8A16): x stays in its dtype.

Three paths by the number of rows M (one or two rows go to gemv.py's FMA kernel first,
which beats the skinny kernel there; gemv.MAX_M = 0 turns it off):
- M <= 16 (decode): skinny_gemm.py's kernel and table; each W tile is widened in registers
  (exact) and fed to a tensor-core dot in x's dtype; the scales multiply the fp32 partial
  products. W is read once, at half the bytes of bf16.
- 16 < M < DEQUANT_FROM_M (batched decode, short prefills): the same kernel with taller row
  tiles and a grid over M (W read once per row-tile wave, mostly from L2). Off for now: the
  first version was slower than the next path at every M measured (see DEQUANT_FROM_M).
- 17-256 rows where tma_gemm.py takes the call (wide layers, the gated gate_up, and o / down
  split for the norm after them, layers/split_k.py): TMA tiles dequantized in registers.
- M >= DEQUANT_FROM_M otherwise (prefills and batched decode), by NANOVLLM_FP8_PREFILL
  (past 256 rows a row-scaled model's qkv, gate_up and down mostly come as e4m3 rows
  instead and take torch._scaled_mm: layers/fp8_rows.py, LARGE):
  "dequant" (default): one Triton pass writes the dequantized weight in x's dtype, then
  cuBLAS; the extra weight traffic is small beside the matmul, and the result is the
  reference's to the bit (dequantize, round to x's dtype, F.linear).
  "w8a8": fp8_w8a8.py, activations quantized per token and 128 columns, e4m3 tensor-core dots
  (twice bf16's peak; activation rounding changes the numerics slightly, as in vLLM).
  "rowwise": row-scaled layers quantize activations per token and call torch._scaled_mm
  (CUTLASS on Hopper; vLLM's dynamic fp8 recipe); block-scaled layers take "w8a8".
  H100, tools/bench_gemm.py --large-m, 2026-11-25, Qwen3-0.6B layers: at M = 2048 rowwise
  took 27.4 / 15.1 / 33.7 / 24.7 us (qkv / o / gate_up / down) against dequantize + cuBLAS
  32.9 / 17.2 / 47.7 / 24.2 and bf16 cuBLAS 26.6 / 13.6 / 39.0 / 18.6; at M = 32-256 every
  fp8 path lost to bf16 cuBLAS (5.8-8.7 us: latency-bound), and bench.py with fp8 weights
  gave 18,808 (dequant) vs 18,770 / 18,620 (rowwise) vs 20,358 bf16. So dequant stays the
  default: it is exact against the reference.
"""
import functools
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from nanovllm.kernels import gemv, tma_gemm
from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.fp8_w8a8 import GROUP, rowwise_gemm, w8a8_gemm
from nanovllm.kernels.skinny_gemm import BLOCK_SCALE, MAX_M, ROW_SCALE, gemm

# Tall-tile configs by rows, the first whose max_m >= M. BLOCK_K 128: one scale block (every
# known checkpoint's), so block scales apply once per tile. SPLIT_K None: K splits while the
# tiles alone give too few programs (batched decode of a narrow layer). Module level so
# tools/bench_gemm.py and tests can override them.
# (Off: see DEQUANT_FROM_M. tools/fp8_tall_sweep.py timed 12 tile shapes per M.)
TALL_CONFIGS = [
    (32, dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, SPLIT_K=None, num_warps=4, num_stages=4)),
    (64, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=None, num_warps=4, num_stages=4)),
    (1 << 62, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=None, num_warps=8,
                   num_stages=3)),
]
# Rows from which the dequantize + cuBLAS (or W8A8) path is taken. H100, tools/bench_gemm.py
# --large-m, 2026-11-24, the first tall-tile version (W as the second dot operand): at M = 128
# tall tiles took 19-26 us on Qwen3-0.6B's layers and 45-147 us on Qwen3-8B's, dequantize +
# cuBLAS 9-12 and 32-194, W8A8 10-24 and 25-85; at M = 1024 and 8192 tall tiles were 2-3x
# slower than either. H200, 2026-11-29, tools/fp8_tall_sweep.py (Qwen3-0.6B's four layers,
# us summed, each tile shape's best): M = 32 / 64 / 128 / 256 tall 32.9 / 36.2 / 43.5 / 62.7,
# dequantize + cuBLAS 36.5 / 38.2 / 39.1 / 43.9, bf16 cuBLAS 24.1 / 24.9 / 25.6 / 28.8 (best
# tiles 32 x 64 x 128-256, 4 warps); bench.py with tall tiles up to M = 64: 24,567 tok/s vs
# 24,405 dequantize + cuBLAS (bf16 26,599), within a run's spread. So the tall tiles stay
# off (17 = just past the skinny kernel): every fp8 path here is latency-bound, ~1.3-2x
# bf16 cuBLAS's ~5-8 us a layer.
DEQUANT_FROM_M = 17
INTERPRET_TALL = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=None, num_warps=1,
                      num_stages=1)


def tall_config(m: int, x_dtype: torch.dtype) -> dict:
    """The tall-tile config for m rows of x."""
    if INTERPRET:
        return INTERPRET_TALL
    cfg = next(c for max_m, c in TALL_CONFIGS if m <= max_m)
    if x_dtype.itemsize == 4:  # fp32 x tiles take twice the shared memory
        cfg = dict(cfg, num_stages=2)
    return cfg


@functools.cache
def prefill_path() -> str:
    """NANOVLLM_FP8_PREFILL: how fp8 layers run M > 16 rows ("dequant", "w8a8", "rowwise")."""
    value = os.environ.get("NANOVLLM_FP8_PREFILL", "dequant")
    if value not in ("dequant", "w8a8", "rowwise"):
        raise ValueError(f"NANOVLLM_FP8_PREFILL={value!r}: use dequant (dequantize + cuBLAS, "
                         "the reference's numerics), w8a8 (fp8 activations and dots) or "
                         "rowwise (per-token fp8 activations, torch._scaled_mm)")
    return value


def takes(block: tuple[int, int] | None) -> bool:
    """Whether these kernels take a layer with these scales: row scales, or blocks whose K
    side holds whole 16-column tiles (tl.dot's minimum; every known checkpoint uses 128).
    Narrower blocks (a valid checkpoint) run the torch reference instead."""
    return block is None or block[1] % 16 == 0


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             block: tuple[int, int] | None, bias: torch.Tensor | None = None,
             config: dict | None = None) -> torch.Tensor:
    """x[..., K] @ (weight * scale)[N, K]^T (+ bias) in x's dtype: weight e4m3, scale fp32
    per row [N] (block None) or per (bn, bk) block [ceil(N / bn), ceil(K / bk)]."""
    m = x.numel() // x.shape[-1]
    if config is not None:
        return gemm(x, weight, bias, scale, block, config=config, block_m=config["BLOCK_M"])
    if gemv.takes(m, block):  # one or two rows: FMAs, no tensor cores (gemv.py)
        return gemv.gemv(x, weight, scale, block, bias)
    if m <= MAX_M:
        return gemm(x, weight, bias, scale, block)
    if tma_gemm.takes(x, weight, scale=scale, block=block):  # 17-256 rows (tma_gemm.py)
        # (the bias rounded as the dequantize + F.linear path below rounds it)
        bias = bias.to(x.dtype) if bias is not None else None
        return tma_gemm.tma_gemm(x, weight, bias, scale=scale, block=block)
    if m >= DEQUANT_FROM_M:
        path = prefill_path()
        # Row-wise _scaled_mm writes bf16 only (torch's CUTLASS kernel); others take W8A8.
        if path == "rowwise" and block is None and x.dtype == torch.bfloat16:
            return rowwise_gemm(x, weight, scale, bias)
        if path != "dequant" and (block is None or block[1] == GROUP):
            return w8a8_gemm(x, weight, scale, block, bias)
        if bias is not None and bias.dtype != x.dtype:  # F.linear takes one dtype
            bias = bias.to(x.dtype)
        return F.linear(x, dequantize(weight, scale, block, x.dtype), bias)
    cfg = tall_config(m, x.dtype)
    return gemm(x, weight, bias, scale, block, config=cfg, block_m=cfg["BLOCK_M"])


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_sn, SCALE: tl.constexpr,
                    SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    # One [BLOCK_N, BLOCK_K] tile: value (exact in fp32) * its scale, rounded once.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    idx = offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
    w = tl.load(w_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    if SCALE == 1:
        s = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)[:, None]
    else:
        s = tl.load(s_ptr + (offs_n // SCALE_BN)[:, None] * stride_sn
                    + (offs_k // SCALE_BK)[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + idx, (w * s).to(out_ptr.dtype.element_ty), mask=mask)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
               dtype: torch.dtype) -> torch.Tensor:
    """weight * scale in `dtype` (what layers/quant/fp8.dequantize(...).to(dtype) gives), in
    one pass: read fp8, write `dtype`."""
    n, k = weight.shape
    assert weight.is_contiguous() and scale.stride(-1) == 1
    out = torch.empty(n, k, dtype=dtype, device=weight.device)
    bn, bk = (16, 16) if INTERPRET else (32, 256)
    mode, (s_bn, s_bk) = (ROW_SCALE, (1, 1)) if block is None else (BLOCK_SCALE, block)
    _dequant_kernel[(triton.cdiv(n, bn), triton.cdiv(k, bk))](
        weight, scale, out, n, k, scale.stride(0) if block is not None else 0, SCALE=mode,
        SCALE_BN=s_bn, SCALE_BK=s_bk, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return out
