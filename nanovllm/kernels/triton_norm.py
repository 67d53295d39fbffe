"""RMSNorm (with the residual add before it) and SwiGLU as one Triton launch each.

Why: an eager prefill step launches ~25 small torch ops per layer (dtype casts, pow, mean,
rsqrt, muls), and torch.compile's call overhead is larger still outside a CUDA graph; on a
30-layer model that was ~40 ms of host time for a prefill the GPU finishes in ~2 ms. Both
kernels round to the model dtype where the torch path (layers/) does, so the two agree to the
last bit but for fp32 summation order.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels import pdl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, stride_s,
                     n, eps, HAS_RES: tl.constexpr, PARTS: tl.constexpr, GDC: tl.constexpr,
                     BLOCK: tl.constexpr):
    # Under PDL (kernels/pdl.py): the next kernel (a GEMV) may start loading its weights now;
    # this one loads its own weight (no kernel writes it) before it waits for x's writer.
    pdl.release_next(GDC)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    pdl.wait_previous(GDC)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if PARTS > 0:  # x is a split-K matmul's fp32 partials: added in split order, then rounded
        for s in tl.static_range(1, PARTS):  # as the unsplit matmul rounds its output
            x += tl.load(x_ptr + s * stride_s + row * stride_x + offs, mask=mask, other=0.0)
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        # The new residual is the sum rounded to the model dtype; the norm reads that rounded
        # value, as the torch path does.
        h = x.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n + offs, h, mask=mask)
        x = h.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    # Normalised value rounded to the model dtype, then times the weight in fp32 and rounded
    # again: torch's `(x * rsqrt).to(dtype) * weight`.
    y = (x * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, dtype: torch.dtype | None = None):
    """norm(x) * weight over the last dim; with a residual: (norm(x + residual) * weight,
    x + residual), both in x's dtype. dtype given: x is fp32 partial sums [S, rows, n] (a
    split-K matmul's, layers/split_k.py) whose in-order sum, rounded to dtype, is the input."""
    n, parts = x.shape[-1], 0
    if dtype is None:
        dtype = x.dtype
    else:  # the kernel reads the first partial here, each next one a partial's size on
        assert x.is_contiguous()
        parts, x = x.shape[0], x[0]
    x2 = x.reshape(-1, n)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    r2 = residual.reshape(-1, n) if residual is not None else x2
    if r2.stride(1) != 1:
        r2 = r2.contiguous()
    rows = x2.shape[0]
    if rows:
        block, gdc = triton.next_power_of_2(n), pdl.enabled(out)
        _rms_norm_kernel[(rows,)](x2, r2, weight, out, res_out, x2.stride(0), r2.stride(0),
                                  x2.numel(), n, eps, HAS_RES=residual is not None,
                                  PARTS=parts, GDC=gdc, BLOCK=block,
                                  num_warps=min(max(block // 256, 1), 16),
                                  **pdl.launch_kwargs(gdc))
    return out if residual is None else (out, res_out)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, d, GDC: tl.constexpr, BLOCK: tl.constexpr):
    pdl.release_next(GDC)  # (as in _rms_norm_kernel)
    pdl.wait_previous(GDC)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    # silu rounded to the model dtype before the product, as torch's F.silu(gate) * up.
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * d + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for a packed [..., 2d] gate_up output."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block, gdc = min(triton.next_power_of_2(d), 1024), pdl.enabled(out)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, out, x2.stride(0), d, GDC=gdc, BLOCK=block, num_warps=4, **pdl.launch_kwargs(gdc))
    return out
