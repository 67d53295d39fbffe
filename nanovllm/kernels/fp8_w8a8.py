"""fp8 x fp8 GEMM (W8A8) for many rows: activations quantized on the fly per token and
GROUP-column group (DeepSeek-V3's / vLLM's block recipe), then tensor-core dots on e4m3
operands (twice bf16's peak on Hopper) with both sides' scales applied in the kernel.

Two launches:
1. `quantize_groups`: x [M, K] -> e4m3 values [M, K] and fp32 scales [M, ceil(K / GROUP)],
   scale = amax(|group|) / 448 (so each group uses e4m3's whole range), values rounded to
   nearest even as torch does.
2. `_w8a8_kernel`: a program owns a [BLOCK_M, BLOCK_N] output tile and walks K one group at a
   time (BLOCK_K = GROUP): acc += dot(xq, wq^T) * x_scale[:, g] (* w_scale[n block, g] for
   block-scaled weights, whose blocks are GROUP wide; row-scaled weights multiply once at the
   end). Programs are ordered in groups of GROUP_M row tiles so that neighbours share W tiles
   in L2 (the usual grouped ordering).

Numerics differ from the weight-only path by the activation rounding (e4m3: 3 mantissa bits,
relative error up to 2^-4 per element); vLLM runs Qwen's fp8 checkpoints this way.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET, fp8_meta, quantize_fp8

FP8 = torch.float8_e4m3fn
GROUP = 128  # activation group = weight scale block width in every known checkpoint
# Tile config (module level so tools/bench_gemm.py and tests can override it).
# TODO(gemm): first guess; tune with tools/bench_gemm.py --large-m on an H100.
CONFIG = dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=3)
INTERPRET_CONFIG = dict(BLOCK_M=16, BLOCK_N=16, GROUP_M=2, num_warps=1, num_stages=1)


@triton.jit
def _quantize_groups_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_sm, num_groups,
                            GROUP: tl.constexpr, GROUPS_PER_PROG: tl.constexpr,
                            FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                            SOFT: tl.constexpr):
    # One row, GROUPS_PER_PROG groups of it: a [groups, GROUP] tile, one amax per group.
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS_PER_PROG + tl.arange(0, GROUPS_PER_PROG)
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = (g < num_groups)[:, None] & (cols < K)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    # An all-zero group would divide by zero; any positive scale represents it exactly.
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / FMAX, 1.1754943508222875e-38)
    q = quantize_fp8(x, scale[:, None], q_ptr.dtype.element_ty, FMAX, MANT, BIAS, SOFT)
    tl.store(q_ptr + row * K + cols, q, mask=mask)
    tl.store(s_ptr + row * stride_sm + g, scale, mask=g < num_groups)


def quantize_groups(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [M, K], fp32 scales [M, ceil(K / group)]) of x [M, K], x ~= q * scale."""
    m, k = x.shape
    assert x.stride(1) == 1
    groups = triton.cdiv(k, group)
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    s = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    meta = fp8_meta(FP8)
    per_prog = min(triton.next_power_of_2(groups), 1 if INTERPRET else 8)
    if m:
        # The interpreter writes bit patterns (its fp32 -> fp8 cast mis-rounds; see
        # _common.quantize_fp8), so it gets a byte view.
        _quantize_groups_kernel[(m, triton.cdiv(groups, per_prog))](
            x, q.view(torch.uint8) if meta["SOFT"] else q, s, k, x.stride(0), s.stride(0),
            groups, GROUP=group, GROUPS_PER_PROG=per_prog, FMAX=meta["FMAX"],
            MANT=meta["MANT"], BIAS=meta["BIAS"], SOFT=meta["SOFT"], num_warps=4)
    return q, s


@triton.jit
def _quantize_tokens_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK: tl.constexpr,
                            FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                            SOFT: tl.constexpr):
    # One whole row: one amax, one scale.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FMAX, 1.1754943508222875e-38)
    q = quantize_fp8(x, scale, q_ptr.dtype.element_ty, FMAX, MANT, BIAS, SOFT)
    tl.store(q_ptr + row * K + cols, q, mask=mask)
    tl.store(s_ptr + row, scale)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [M, K], fp32 scales [M, 1]) of x [M, K], one scale per row (token)."""
    m, k = x.shape
    assert x.stride(1) == 1
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    meta = fp8_meta(FP8)
    block = triton.next_power_of_2(k)
    if m:
        _quantize_tokens_kernel[(m,)](
            x, q.view(torch.uint8) if meta["SOFT"] else q, s, k, x.stride(0), BLOCK=block,
            FMAX=meta["FMAX"], MANT=meta["MANT"], BIAS=meta["BIAS"], SOFT=meta["SOFT"],
            num_warps=min(16, max(4, block // 1024)))
    return q, s


def rowwise_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x[..., K] @ (weight * scale[:, None])^T (+ bias) in x's dtype (bf16): x quantized
    to e4m3 per token, then torch._scaled_mm with row-wise scales on both sides (CUTLASS
    fp8 tensor cores on Hopper). weight e4m3 [N, K], scale fp32 [N]."""
    k = x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    xq, xs = quantize_tokens(x2)
    y = torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=scale.view(1, n),
                         bias=None if bias is None else bias.to(x.dtype), out_dtype=x.dtype)
    return y.view(*x.shape[:-1], n)


@triton.jit(do_not_specialize=["M"])  # M varies per prefill: compile each shape once
def _w8a8_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, M, N, K, stride_xsm, stride_wsn,
                 stride_ym, BLOCK_SCALE: tl.constexpr, SCALE_BN: tl.constexpr,
                 HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped ordering: GROUP_M row tiles side by side walk the column tiles together.
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    x_rows = xq_ptr + offs_m.to(tl.int64)[:, None] * K
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            a = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None], other=0.0)
            b = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None], other=0.0)
        else:
            mask_k = offs_k < K
            a = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                        other=0.0)
            b = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                        other=0.0)
        g = k0 // BLOCK_K
        xs = tl.load(xs_ptr + offs_m * stride_xsm + g, mask=mask_m, other=0.0)
        part = tl.dot(a, tl.trans(b))  # e4m3 x e4m3, fp32 accumulate
        if BLOCK_SCALE:
            ws = tl.load(ws_ptr + (offs_n // SCALE_BN) * stride_wsn + g, mask=mask_n, other=0.0)
            acc += part * xs[:, None] * ws[None, :]
        else:
            acc += part * xs[:, None]
    if not BLOCK_SCALE:
        acc *= tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def w8a8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
              block: tuple[int, int] | None, bias: torch.Tensor | None = None,
              config: dict | None = None) -> torch.Tensor:
    """x[..., K] @ (weight * scale)[N, K]^T (+ bias) in x's dtype, x quantized to e4m3 per
    token and GROUP columns. weight e4m3 [N, K]; scale fp32 [N] (block None) or
    [ceil(N / bn), ceil(K / GROUP)] for block = (bn, GROUP)."""
    k = x.shape[-1]
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.is_contiguous()
    if block is not None and block[1] != GROUP:
        raise NotImplementedError(f"W8A8 needs {GROUP}-wide scale blocks, not {block}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.view(*x.shape[:-1], n)
    cfg = config or (INTERPRET_CONFIG if INTERPRET else CONFIG)
    xq, xs = quantize_groups(x2, GROUP)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _w8a8_kernel[grid](
        xq, xs, weight, scale, bias if bias is not None else xs, y, m, n, k, xs.stride(0),
        scale.stride(0) if block is not None else 0, y.stride(0),
        BLOCK_SCALE=block is not None, SCALE_BN=block[0] if block is not None else 1,
        HAS_BIAS=bias is not None, EVEN_K=k % GROUP == 0, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=GROUP, GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y.view(*x.shape[:-1], n)
