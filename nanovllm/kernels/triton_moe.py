"""Fused mixture-of-experts: (token, expert) pairs sorted by expert (moe_align.py), then two
grouped GEMMs.

Each token picks top_k experts; the pairs are sorted by expert and each expert's run is padded
to a whole number of BLOCK_M rows (`align_pairs`), so a program of the GEMM kernel reads one
expert's weight tile once for up to BLOCK_M pairs. The first GEMM computes the gate and the up
tile of the same columns and writes silu(gate) * up (the activation never goes to memory); the
second multiplies by w2 and by the pair's routing weight; a sum over each token's top_k rows
finishes it. Decode steps are weight-bound: a step reads each routed expert once.

CUDA-graph safe: every shape and the grid depend only on the number of tokens, never on the
routing; programs past the padded end exit at once (their count is read on the device).
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET, bits_to_bf16, dot_precision, e4m3_to_bf16
from nanovllm.kernels.moe_align import align_pairs

# Tile configs by the number of (token, expert) pairs per expert on average: few pairs (decode)
# want short BLOCK_M (less padding; every small config measured the same, ~2.4 TB/s at 32-256
# tokens for Qwen3-30B-A3B's experts on H100); many pairs (prefill) want tall tiles: 64 rows
# from 48 pairs per expert (1024 tokens: 644 us vs 900 for 16 rows), 128 rows and 8 warps from
# 256 (16384 tokens: 3.2 ms vs 3.7 for 64 rows). Module level so tests and tools can override.
SMALL_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
LARGE_CONFIG = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)
HUGE_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
# Average pairs per expert from which LARGE_CONFIG / HUGE_CONFIG are used.
LARGE_FROM, HUGE_FROM = 48, 256
# The interpreter uses the smallest tiles tl.dot accepts, so tiny test shapes span several.
INTERPRET_CONFIG = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1)


def choose_config(num_pairs: int, num_experts: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The tile config for this many (token, expert) pairs."""
    if INTERPRET:
        return INTERPRET_CONFIG
    per_expert = num_pairs / num_experts
    cfg = (HUGE_CONFIG if per_expert >= HUGE_FROM else LARGE_CONFIG if per_expert >= LARGE_FROM
           else SMALL_CONFIG)
    if dtype.itemsize == 4:  # fp32 tiles take twice the shared memory: pipeline less deep
        cfg = dict(cfg, num_stages=min(cfg["num_stages"], 2))
    return cfg


@triton.jit
def _scales(s_ptr, rows, k0, n_mask, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
            stride_sn):
    """An fp8 expert's scales for weight rows `rows` and the K tile from k0: [rows] of a row
    scale vector (SCALE_BK == 0), or of the block scales [row blocks, col blocks]."""
    if SCALE_BK == 0:
        s = tl.load(s_ptr + rows, mask=n_mask, other=0.0)
    else:
        s = tl.load(s_ptr + (rows // SCALE_BN) * stride_sn + k0 // SCALE_BK, mask=n_mask,
                    other=0.0)
    return s


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, topk_w_ptr,
    s_ptr, N, K, num_pairs,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, SCALE: tl.constexpr, SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr, WIDEN: tl.constexpr,
):
    # SCALE: 0 plain weights; 1 fp8 weights with a scale per output row [E, rows], applied
    # once to the fp32 result; 2 fp8 with block scales [E, row blocks, col blocks], applied
    # to each K tile's partial product (a tile never straddles a block: BLOCK_K divides
    # SCALE_BK). fp8 tiles are widened to the activation dtype (exact), with integer ops
    # where WIDEN (kernels/_common.e4m3_to_bf16), and never written back dequantized.
    # Program = (block of one expert's pairs, block of output columns); the column index runs
    # fastest, so neighbouring programs share the gathered activation rows.
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = pairs < num_pairs
    rows = (pairs // A_ROW_DIV).to(tl.int64)  # first GEMM: pair -> its token's row of x
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    # Weights are [E, N_total, K] (a row per output feature): a [BLOCK_K, BLOCK_N] tile.
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up_ptrs = w_ptrs + N * stride_wn  # the up half starts N rows below the gate half
    s_ptr += expert * stride_se
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = _widen(tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0), a,
                   SCALE, WIDEN)
        if SCALE == 2:
            acc += tl.dot(a, w, input_precision=DOT_PREC) * _scales(
                s_ptr, offs_n, k * BLOCK_K, n_mask, SCALE_BN, SCALE_BK, stride_sn)[None, :]
        else:
            acc = tl.dot(a, w, acc, input_precision=DOT_PREC)
        if GATED:
            w_up = _widen(tl.load(up_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0),
                          a, SCALE, WIDEN)
            if SCALE == 2:
                acc_up += tl.dot(a, w_up, input_precision=DOT_PREC) * _scales(
                    s_ptr, N + offs_n, k * BLOCK_K, n_mask, SCALE_BN, SCALE_BK,
                    stride_sn)[None, :]
            else:
                acc_up = tl.dot(a, w_up, acc_up, input_precision=DOT_PREC)
            up_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SCALE == 1:
        acc *= _scales(s_ptr, offs_n, 0, n_mask, 1, 0, 0)[None, :]
        if GATED:
            acc_up *= _scales(s_ptr, N + offs_n, 0, n_mask, 1, 0, 0)[None, :]
    out_dtype = out_ptr.dtype.element_ty
    if GATED:
        # Rounded to the activation dtype where the unfused SiluAndMul would round.
        gate = acc.to(out_dtype).to(tl.float32)
        acc = (gate * tl.sigmoid(gate)).to(out_dtype).to(tl.float32) * acc_up.to(out_dtype).to(
            tl.float32)
    if MUL_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + pairs, mask=m_mask, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_dtype), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _widen(w, a, SCALE: tl.constexpr, WIDEN: tl.constexpr):
    """A weight tile as the dot's second operand: fp8 widened to a's dtype, else as is."""
    if WIDEN:
        w = e4m3_to_bf16(w)
    elif SCALE != 0:
        w = w.to(a.dtype)
    return w


def _gemm(a, w, out, aligned, topk_weights, num_pairs, a_row_div, gated, cfg, scale, block):
    sorted_ids, expert_ids, num_padded = aligned
    n = w.shape[1] // 2 if gated else w.shape[1]
    block_k = cfg["BLOCK_K"]
    if scale is None:
        mode, scale, s_bn, s_bk, s_strides = 0, topk_weights, 1, 0, (0, 0)
    elif block is None:
        mode, s_bn, s_bk, s_strides = 1, 1, 0, (scale.stride(0), 0)
    else:
        (s_bn, s_bk), mode, s_strides = block, 2, scale.stride()[:2]
        assert scale.stride(2) == 1, scale.stride()
        while s_bk % block_k:  # a K tile must not straddle two scale blocks
            block_k //= 2
        assert block_k >= 16, f"scale block {block} too narrow for tl.dot"
    grid = (expert_ids.numel() * triton.cdiv(n, cfg["BLOCK_N"]),)
    _moe_gemm_kernel[grid](
        a, w, out, sorted_ids, expert_ids, num_padded, topk_weights, scale,
        n, w.shape[2], num_pairs, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        *s_strides, A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=not gated,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k,
        DOT_PREC=dot_precision(a.dtype), SCALE=mode, SCALE_BN=s_bn, SCALE_BK=s_bk,
        WIDEN=mode != 0 and bits_to_bf16(w.dtype, a.dtype), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              config: dict | None = None, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None,
              block: tuple[int, int] | None = None) -> torch.Tensor:
    """sum_k topk_weights[t, k] * w2[e] @ (silu(gate_e x_t) * (up_e x_t)), e = topk_ids[t, k].

    x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights [T, k]
    (float32) and topk_ids [T, k] (int). Returns [T, H] in x's dtype. fp8 (e4m3) experts come
    with their scales: fp32 [E, rows] per output row (block None) or [E, row blocks, col
    blocks] for block = (bn, bk); each expert is read as value * scale.
    """
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    cfg = config or choose_config(num_pairs, num_experts, x.dtype)
    assert x.stride(1) == w13.stride(2) == w2.stride(2) == 1
    inter = torch.empty(num_pairs, two_i // 2, dtype=x.dtype, device=x.device)
    out = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out.view(0, top_k, hidden).sum(1)
    aligned = align_pairs(topk_ids, num_experts, cfg["BLOCK_M"])
    weights = topk_weights.float().contiguous()
    _gemm(x, w13, inter, aligned, weights, num_pairs, top_k, True, cfg, w13_scale, block)
    _gemm(inter, w2, out, aligned, weights, num_pairs, 1, False, cfg, w2_scale, block)
    return out.view(num_tokens, top_k, hidden).sum(1)


__all__ = ["fused_moe", "align_pairs", "choose_config"]
