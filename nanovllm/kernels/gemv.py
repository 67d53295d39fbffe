"""GEMV for one row (batch-1 decode): y = x @ (W * scale)^T (+ bias), no tensor cores; W in
e4m3 with fp32 scales (fp8_gemm.py's first path) or plain (bf16 / fp16 / fp32, no scale).

A program owns BLOCK_N rows of W and walks K in BLOCK_K tiles: each tile is widened to
fp32 (e4m3 by Triton's cvt: e4m3x2 -> f16x2 -> f32) and multiplied into an fp32 [BLOCK_N,
BLOCK_K] accumulator by plain FMAs, summed across K once after the loop. The products are exact in
fp32 (an e4m3 value times a bf16 / fp16 / fp32 one fits 24 bits), as the tensor cores' are;
only the summation order differs from skinny_gemm.py. Against that kernel at M = 1 it skips
the dot's 16-row padding of x and the register shuffles between the widening and the dot
operands: H200, tools/fp8_gemv_sweep.py, Qwen3-8B's layers, µs skinny -> GEMV: qkv 12.2 ->
9.1, o 10.2 -> 7.3, gate_up 30.4 -> 29.4, down 19.5 -> 15.9.

Row scales multiply y's rows at the end. Block scales (bn x bk) multiply x's K tile instead:
a program's rows lie in one row block (BLOCK_N divides bn), so each column's scale is one
value for all of them (x * scale is rounded once in fp32 there, where the skinny kernel
rounds each partial sum times its scale). No split-K: one split won on every layer measured.

Plain weights: the same kernel against cuBLAS at one row, H200, tools/fp8_gemv_sweep.py
--weights bf16, Qwen3-8B's layers, µs cuBLAS -> GEMV: qkv 15.8 -> 14.5, o 12.8 -> 11.5,
gate_up 50.7 -> 49.0, down 29.6 -> 27.3. Off (PLAIN = 0) until timed in the engine.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET

# Rows of x this kernel takes (fp8_gemm dispatches M <= MAX_M here); 0 turns it off. One row:
# tools/fp8_gemv_ab.sh, H200, Qwen3-8B shape batch 1, fp8 weights 290 -> 326 tok/s (bf16 206).
# Two rows or more would need an accumulator per row; the skinny kernel's dot serves them.
MAX_M = 1
# Plain weights (layers/linear.dense_linear) take it for one row when PLAIN is 1 and the weight
# has at least PLAIN_MIN_WEIGHTS values (Qwen3-8B's smallest layer, o_proj, has 2^24).
PLAIN = 0
PLAIN_MIN_WEIGHTS = 1 << 24


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, N, K, stride_wn, stride_sn,
                 ROW_SCALED: tl.constexpr, BLOCK_SCALED: tl.constexpr, SCALE_BN: tl.constexpr,
                 SCALE_BK: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    # Block scales: this program's row block (BLOCK_N divides SCALE_BN).
    s_row = s_ptr + (pid * BLOCK_N // SCALE_BN) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_rows + k0, mask=mask_n[:, None], other=0.0)
            x = tl.load(x_ptr + k0 + offs_k).to(tl.float32)
            if BLOCK_SCALED:
                x *= tl.load(s_row + (k0 + offs_k) // SCALE_BK)
        else:
            mask_k = k0 + offs_k < K
            w = tl.load(w_rows + k0, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            x = tl.load(x_ptr + k0 + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            if BLOCK_SCALED:
                x *= tl.load(s_row + (k0 + offs_k) // SCALE_BK, mask=mask_k, other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if ROW_SCALED:
        y *= tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)


def choose_config(n: int, k: int, itemsize: int = 1) -> dict:
    """Tiles by the layer's width and W's bytes a value (H200, tools/fp8_gemv_sweep.py,
    Qwen3-8B's layers: the best of 10 tiles each; narrow layers want short, long tiles to
    keep enough programs)."""
    if INTERPRET:
        return dict(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1)
    if n <= 4096:
        cfg = dict(BLOCK_N=8, BLOCK_K=1024, num_warps=4, num_stages=3)
    elif itemsize > 1:  # bf16 rows: the sweep's --weights bf16 best
        cfg = (dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4) if n >= 16384
               else dict(BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=3))
    elif n >= 16384:
        cfg = dict(BLOCK_N=32, BLOCK_K=512, num_warps=8, num_stages=2)
    else:
        cfg = dict(BLOCK_N=16, BLOCK_K=512, num_warps=8, num_stages=3)
    if itemsize == 4:  # fp32 rows: twice bf16's registers a tile
        cfg["BLOCK_K"] //= 2
    cfg["BLOCK_K"] = min(cfg["BLOCK_K"], triton.next_power_of_2(k))
    return cfg


def takes(m: int, block: tuple[int, int] | None) -> bool:
    """Whether the GEMV runs this fp8 call: up to MAX_M rows, row scales or row blocks that
    whole 8-row tiles divide (every known checkpoint's 128)."""
    return m <= MAX_M and (block is None or block[0] % 8 == 0)


def takes_plain(m: int, n: int, k: int) -> bool:
    """Whether the GEMV runs this call on a plain weight [N, K] (see PLAIN)."""
    return bool(PLAIN) and m == 1 and n * k >= PLAIN_MIN_WEIGHTS


def gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
         block: tuple[int, int] | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x[..., K] (one row) @ (weight * scale)[N, K]^T (+ bias) in x's dtype; weight e4m3 with
    scale fp32 per row [N] (block None) or per (bn, bk) block, or plain with scale None."""
    n, k = weight.shape
    assert x.numel() == k and weight.stride(1) == 1, (x.shape, weight.shape)
    x1 = x.reshape(k).contiguous()
    y = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    cfg = choose_config(n, k, weight.element_size())
    if block is not None:
        while block[0] % cfg["BLOCK_N"]:  # a program's rows inside one row block
            cfg["BLOCK_N"] //= 2
    s_bn, s_bk = block if block is not None else (1, 1)
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x1, weight, scale if scale is not None else x1, bias if bias is not None else x1, y, n,
        k, weight.stride(0), scale.stride(0) if block is not None else 0,
        ROW_SCALED=scale is not None and block is None, BLOCK_SCALED=block is not None,
        SCALE_BN=s_bn, SCALE_BK=s_bk, HAS_BIAS=bias is not None, EVEN_K=k % cfg["BLOCK_K"] == 0,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return y
