"""The skinny GEMM's optional prologues (kernels/skinny_gemm.py): the op before a decode matmul
computed on each x tile as the K loop loads it, so its output never goes to memory.

- RMS_NORM / ADD_RMS_NORM: y = RMSNorm(h) @ W^T with h = x (+ residual). RMSNorm(h)_k =
  h_k * rstd * g_k with one rstd per row, so the loop feeds h * g to the dot and sums h^2
  beside it; the epilogue scales the row by rstd = 1 / sqrt(sum / K + eps). With a residual,
  h = x + residual rounded to x's dtype (the new residual, stored by column tile 0's
  programs) is what the norm reads, as the unfused path (layers/layernorm.py) does.
- SILU_MUL: y = (silu(gate) * up) @ W^T for a packed [M, 2K] gate_up input, rounded where
  layers/activation.py's SiluAndMul rounds.

Against the unfused norm one rounding moves: the unfused path rounds h * rstd to the model
dtype and then its product with g; here h * g is rounded once and rstd multiplies the fp32 dot.
"""
import triton
import triton.language as tl

# The PROLOGUE constexpr of the kernel.
NONE, RMS_NORM, ADD_RMS_NORM, SILU_MUL = 0, 1, 2, 3


def choose_prologue(norm_weight, residual, act: str | None) -> int:
    """The PROLOGUE value for skinny_gemm.gemm's prologue arguments (ValueError if they
    clash)."""
    if act not in (None, "silu_mul"):
        raise ValueError(f"act={act!r}: expected None or 'silu_mul'")
    if act is not None and norm_weight is not None:
        raise ValueError("act and norm_weight: one prologue per call")
    if residual is not None and norm_weight is None:
        raise ValueError("residual needs norm_weight (the residual add feeds the norm)")
    if act is not None:
        return SILU_MUL
    if norm_weight is not None:
        return RMS_NORM if residual is None else ADD_RMS_NORM
    return NONE


@triton.jit
def norm_tile(x_tile, r_ptr, g_ptr, rout_ptr, offs_m, offs_k, mask, K, write_residual,
              PROLOGUE: tl.constexpr):
    """(h * g in x's dtype, per-row sum of h^2 in fp32) for one [BLOCK_M, BLOCK_K] tile, h =
    x (+ residual, rounded to x's dtype and stored when write_residual). Residuals are
    contiguous [M, K]."""
    x = tl.load(x_tile, mask=mask, other=0.0)
    h = x.to(tl.float32)
    if PROLOGUE == 2:
        rk = offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
        h += tl.load(r_ptr + rk, mask=mask, other=0.0).to(tl.float32)
        h = h.to(x.dtype)  # the new residual, which the norm reads as the unfused path does
        if write_residual:
            tl.store(rout_ptr + rk, h, mask=mask)
        h = h.to(tl.float32)
    g = tl.load(g_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    return (h * g[None, :]).to(x.dtype), tl.sum(h * h, axis=1)


@triton.jit
def norm_row(x_ptr, r_ptr, g_ptr, rout_ptr, offs_m, offs_k, K, write_residual,
             PROLOGUE: tl.constexpr):
    """norm_tile for a single row (M == 1): (h * g in row 0 of an otherwise zero tile, h^2 per
    column in fp32). Computed on the row's [BLOCK_K] vector: the 16-row tile computes it on 15
    padding rows too (H100: fused 2-5x slower than the two kernels it replaces)."""
    mask = offs_k < K
    x = tl.load(x_ptr + offs_k, mask=mask, other=0.0)
    h = x.to(tl.float32)
    if PROLOGUE == 2:
        h += tl.load(r_ptr + offs_k, mask=mask, other=0.0).to(tl.float32)
        h = h.to(x.dtype)
        if write_residual:
            tl.store(rout_ptr + offs_k, h, mask=mask)
        h = h.to(tl.float32)
    g = tl.load(g_ptr + offs_k, mask=mask, other=0.0).to(tl.float32)
    return _in_row0((h * g).to(x.dtype), offs_m), h * h


@triton.jit
def _in_row0(v, offs_m):
    """[BLOCK_M, BLOCK_K] with v in row 0 and zeros elsewhere."""
    return tl.where(offs_m[:, None] == 0, v[None, :], tl.zeros_like(v)[None, :])


@triton.jit
def rstd(sumsq, K, eps):
    """1 / rms of rows from their sum of squares over K columns (kernels/triton_norm.py's)."""
    return 1.0 / tl.sqrt(sumsq / K + eps)


@triton.jit
def silu_mul_tile(x_tile, K, mask):
    """silu(gate) * up in x's dtype for one tile; x_tile points at the gate half, the up half
    is K columns on. silu is rounded before the product, as torch's F.silu(gate) * up."""
    gate = tl.load(x_tile, mask=mask, other=0.0)
    up = tl.load(x_tile + K, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (act * up).to(gate.dtype)


@triton.jit
def silu_mul_row(x_ptr, offs_m, offs_k, K):
    """silu_mul_tile for a single row (M == 1; see norm_row)."""
    mask = offs_k < K
    gate = tl.load(x_ptr + offs_k, mask=mask, other=0.0)
    up = tl.load(x_ptr + K + offs_k, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return _in_row0((act * up).to(gate.dtype), offs_m)
