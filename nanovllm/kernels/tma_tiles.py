"""The TMA GEMM's (tma_gemm.py) per-tile pieces: the e4m3 dots, a W tile widened as the
reference dequantizes it, and the epilogue's store."""
import triton
import triton.language as tl


@triton.jit
def dot_e4m3(x, w, acc, scale, BLOCK_K: tl.constexpr, SCALE: tl.constexpr):
    """acc + x @ w^T on e4m3 tiles (block scales: times this K tile's scale of each column),
    each K tile's product added in full fp32: Hopper's fp8 MMAs accumulate narrower (cuBLAS
    without fast accumulation does this too; K = 4096: PERF_NOTES, fifty-seventh session)."""
    if SCALE == 2:
        return acc + tl.dot(x, w.T) * scale[None, :]
    return tl.dot(x, w.T, acc, max_num_imprecise_acc=BLOCK_K)


@triton.jit
def dequant(w, scale, dtype: tl.constexpr, SCALE: tl.constexpr):
    """A W tile in x's dtype: 16-bit as loaded; e4m3 times its rows' scales in fp32, rounded
    once (what fp8_gemm.dequantize writes for cuBLAS)."""
    if SCALE == 0:
        return w
    return (w.to(tl.float32) * scale[:, None]).to(dtype)


@triton.jit
def store(acc, acc_up, y_ptr, b_ptr, offs_m, offs_n, mask, N, stride_ym,
           HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    """Bias in fp32, one rounding to y's dtype; gated: gate and up each rounded as the
    unfused gate_up stores them, then silu rounded and the product (triton_norm's
    silu_and_mul)."""
    dtype = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if HAS_BIAS:
            acc_up += tl.load(b_ptr + N + offs_n, mask=offs_n < N,
                              other=0.0).to(tl.float32)[None, :]
        gate = acc.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = act * acc_up.to(dtype).to(tl.float32)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :],
             acc.to(dtype), mask=mask)
