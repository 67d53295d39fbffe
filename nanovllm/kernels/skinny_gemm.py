"""Skinny GEMM: y[M, N] = x[M, K] @ W[N, K]^T (+ bias) for few rows (decode, M <= 16), with W
in bf16/fp16/fp32 or fp8 e4m3 with per-row or block scales. The weight-read-bound case: a
decode step reads every weight once, so the kernel's only job is to stream W at copy speed.

Tiling: a program owns BLOCK_N output columns (rows of W) and one K range of K / SPLIT_K;
it walks that range in BLOCK_K steps, loading a [BLOCK_N, BLOCK_K] tile of W and the
[BLOCK_M, BLOCK_K] tile of x (M padded to BLOCK_M = 16 rows with masked loads: tl.dot's
smallest tile; the padding costs tensor-core time, which is free here, not bytes), and
accumulates x @ W^T in fp32 (W as the second operand: see the kernel). fp8 tiles
are widened to x's dtype (exact: every e4m3 value is a bf16 value); their scales multiply the
fp32 partial products, per K tile for block scales (a tile never straddles a scale block) and
once at the end for row scales.

Split-K (num_splits > 1, when N alone gives too few programs to keep HBM busy): each split
writes its fp32 partial tile to a workspace [splits, M, N] and counts itself in on an atomic
counter per output tile; the last split to arrive sums the partials in split order (so the
result is deterministic) and writes y: no separate reduce launch. It resets the counter for
the next call.

Optional prologues (gemm_prologue.py: residual add + RMSNorm, SiluAndMul) transform each x
tile as it is loaded, so the decode step's op before the matmul needs no launch of its own.

The same kernel with taller BLOCK_M tiles and a grid over M serves larger M (fp8_gemm.py).

CUDA-graph safe: the grid and every buffer depend only on shapes; the workspace and counters
are made once per device outside capture (the engine runs each graph's batch size eagerly
first) and left ready (counters zero) by every call.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET, bits_to_bf16, dot_precision, e4m3_to_bf16
from nanovllm.kernels.gemm_prologue import (ADD_RMS_NORM, RMS_NORM, SILU_MUL, choose_prologue,
                                            norm_row, norm_tile, rstd, silu_mul_row,
                                            silu_mul_tile)
from nanovllm.kernels.skinny_config import auto_split_k, choose_config, workspace

# Most rows this kernel is meant for (the callers' dispatch bound).
MAX_M = 16

# Scale forms (the SCALE constexpr): no scales, one per output row, one per (row, col) block.
NO_SCALE, ROW_SCALE, BLOCK_SCALE = 0, 1, 2


# M varies per step (batch size, prompt length): not specialized on (== 1, % 16), so each
# layer shape compiles once, not once per kind of M.
@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, cnt_ptr,
                 M, N, K, k_per_split, num_splits, stride_xm, stride_wn, stride_ym, stride_sn,
                 g_ptr, r_ptr, rout_ptr, eps, PROLOGUE: tl.constexpr, ROW1: tl.constexpr,
                 SCALE: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_PREC: tl.constexpr, DOT_F32: tl.constexpr, BITS_TO_BF16: tl.constexpr):
    # Program ids: M tiles fastest, so programs of one column tile run side by side and read
    # its W tile from HBM once (larger M); then column tiles; then K splits.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid % tiles_m
    pid_n = (pid // tiles_m) % tiles_n
    pid_k = pid // (tiles_m * tiles_n)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    # The tile of y = x @ W^T. (Swapped, y^T = W @ x^T with W as the first operand, measured
    # slower on the H100: Qwen3-0.6B's LM head at batch 1 took ~40 us more.)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 2:
        sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)  # of this split's K range
        # ROW1: h^2 summed per column here and across columns once after the loop (a sum
        # across the program each K step cost a barrier each step)
        sq_cols = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if SCALE == 2:  # this K tile lies inside one scale block: one scale per W row
            # Loaded first, so its latency passes under the tile loads and the dot (the int8
            # KV decode's row scales: 241 -> 215 us on an H100 for the same move).
            s = tl.load(s_ptr + (offs_n // SCALE_BN) * stride_sn + k0 // SCALE_BK,
                        mask=mask_n, other=0.0)
        if EVEN_K:  # every K tile is whole: no column mask (full-width vector loads)
            mask_x, mask_w = mask_m[:, None], mask_n[:, None]
        else:
            mask_k = offs_k < k_end
            mask_x, mask_w = mask_m[:, None] & mask_k[None, :], mask_n[:, None] & mask_k[None, :]
        if (PROLOGUE == 1 or PROLOGUE == 2) and ROW1:  # x becomes h * g (gemm_prologue)
            x, sq = norm_row(x_ptr, r_ptr, g_ptr, rout_ptr, offs_m, offs_k, K, pid_n == 0,
                             PROLOGUE)
            sq_cols += sq
        elif PROLOGUE == 1 or PROLOGUE == 2:
            x, sq = norm_tile(x_rows + offs_k[None, :], r_ptr, g_ptr, rout_ptr, offs_m, offs_k,
                              mask_x, K, pid_n == 0, PROLOGUE)
            sumsq += sq
        elif PROLOGUE == 3 and ROW1:
            x = silu_mul_row(x_ptr, offs_m, offs_k, K)
        elif PROLOGUE == 3:
            x = silu_mul_tile(x_rows + offs_k[None, :], K, mask_x)
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=mask_x, other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=mask_w, other=0.0)
        if DOT_F32:  # the interpreter's bf16 tl.dot is wrong (Triton 3.9); fp32 is exact
            part = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        elif BITS_TO_BF16:  # e4m3 weights, bf16 x: widened with integer ops (_common)
            part = tl.dot(x, tl.trans(e4m3_to_bf16(w)), input_precision=DOT_PREC)
        else:
            # fp8 -> x's dtype is exact (e4m3 values are a subset of bf16's and fp32's).
            part = tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=DOT_PREC)
        if SCALE == 2:
            acc += part * s[None, :]
        else:
            acc += part
    if (PROLOGUE == 1 or PROLOGUE == 2) and ROW1:
        sumsq = tl.where(offs_m == 0, tl.sum(sq_cols, axis=0), 0.0)
    if SPLIT:
        # Park this split's partial; the last split of the column tile finishes it.
        tile = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        tl.store(tile + pid_k * M * N, acc, mask=mask)
        if PROLOGUE == 1 or PROLOGUE == 2:  # the row sums beside the partials
            sums = part_ptr + num_splits * M * N + pid_n * M + offs_m
            tl.store(sums + pid_k * tiles_n * M, sumsq, mask=mask_m)
        # acq_rel: each split's partial stores happen before its increment, and the last
        # split's loads after its own, so it sees every partial.
        cnt = cnt_ptr + pid_m * tiles_n + pid_n
        if tl.atomic_add(cnt, 1, sem="acq_rel") == num_splits - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for sp in range(num_splits):  # split order: the same sum on every call
                acc += tl.load(tile + sp * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if PROLOGUE == 1 or PROLOGUE == 2:
                sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for sp in range(num_splits):
                    sumsq += tl.load(sums + sp * tiles_n * M, mask=mask_m, other=0.0,
                                     cache_modifier=".cg")
                acc *= rstd(sumsq, K, eps)[:, None]
            _epilogue(acc, s_ptr, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, stride_ym,
                      SCALE, HAS_BIAS)
            tl.atomic_xchg(cnt, 0)  # ready for the next call (and the next graph replay)
    else:
        if PROLOGUE == 1 or PROLOGUE == 2:
            acc *= rstd(sumsq, K, eps)[:, None]
        _epilogue(acc, s_ptr, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, stride_ym, SCALE,
                  HAS_BIAS)


@triton.jit
def _epilogue(acc, s_ptr, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, stride_ym,
              SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Row scales and bias in fp32 on the y tile acc [BLOCK_M, BLOCK_N], then one rounding to
    y's dtype."""
    if SCALE == 1:
        acc *= tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         scale: torch.Tensor | None = None, block: tuple[int, int] | None = None,
         config: dict | None = None, block_m: int = MAX_M, *,
         norm_weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
         eps: float = 1e-6, act: str | None = None):
    """x[..., K] @ weight[N, K]^T (+ bias) in x's dtype, accumulated in fp32.

    fp8 weights come with `scale`: fp32 [N] per output row (block None), or [ceil(N / bn),
    ceil(K / bk)] for block = (bn, bk); the weight is read as value * scale. `config`
    overrides the table's tile config; `block_m` is the row tile (16 for M <= 16).

    Prologues (kernels/gemm_prologue.py), at most one: with `norm_weight`, the matmul reads
    RMSNorm(x (+ residual); norm_weight, eps) and, given a residual, returns (y, x + residual);
    with act="silu_mul", x is a packed [..., 2K] gate_up and the matmul reads
    silu(gate) * up."""
    prologue = choose_prologue(norm_weight, residual, act)
    k = x.shape[-1] // 2 if prologue == SILU_MUL else x.shape[-1]
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(1) == 1, (weight.shape, x.shape)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    r2 = res_out = None
    if prologue == ADD_RMS_NORM:  # the kernel indexes both as contiguous [M, K]
        r2 = residual.reshape(m, k).contiguous()
        res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if m == 0:
        y = y.view(*x.shape[:-1], n)
        return y if res_out is None else (y, res_out)
    cfg = dict(config or choose_config(n, k, weight.dtype, x.dtype))
    block_k = cfg["BLOCK_K"]
    if scale is None:
        mode, scale, s_bn, s_bk = NO_SCALE, x2, 1, 1
    elif block is None:
        mode, s_bn, s_bk = ROW_SCALE, 1, 1
    else:
        mode, (s_bn, s_bk) = BLOCK_SCALE, block
        assert scale.stride(1) == 1, scale.stride()
        # A K tile must not straddle two scale blocks: shrink it to divide the block.
        while s_bk % block_k:
            block_k //= 2
        assert block_k >= 16, f"scale block {block} too narrow for tl.dot"
    tiles_m = triton.cdiv(m, block_m)
    tiles_n = triton.cdiv(n, cfg["BLOCK_N"])
    split = cfg["SPLIT_K"]
    if split is None:
        split = auto_split_k(tiles_m * tiles_n, k, block_k)
    # Each split's K range is whole K tiles, so only the last tile of K can be partial.
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    # fp32 partials [split, M, N], then (norm prologues) row sums of squares [split, tiles_n, M]
    sums = split * tiles_n * m if prologue in (RMS_NORM, ADD_RMS_NORM) else 0
    part, cnt = (workspace(x.device, split * m * n + sums, tiles_m * tiles_n) if split > 1
                 else (y, y))
    _gemm_kernel[(tiles_m * tiles_n * split,)](
        x2, weight, scale, bias if bias is not None else x2, y, part, cnt,
        m, n, k, k_per_split, split, x2.stride(0), weight.stride(0), y.stride(0),
        scale.stride(0) if mode == BLOCK_SCALE else 0,
        # Unused prologue arguments go as None: constexprs, so the kernel without a prologue
        # compiles as it did before they existed.
        norm_weight, r2, res_out, eps if norm_weight is not None else None, PROLOGUE=prologue,
        ROW1=prologue != 0 and m == 1,
        SCALE=mode, SCALE_BN=s_bn, SCALE_BK=s_bk, HAS_BIAS=bias is not None, SPLIT=split > 1,
        EVEN_K=k % block_k == 0, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k,
        DOT_PREC=dot_precision(x.dtype), DOT_F32=INTERPRET,
        BITS_TO_BF16=cfg.get("BITS_TO_BF16", True) and bits_to_bf16(weight.dtype, x.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    y = y.view(*x.shape[:-1], n)
    return y if res_out is None else (y, res_out)
