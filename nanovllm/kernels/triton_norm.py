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
from nanovllm.kernels._common import fp8_meta, quantize_fp8


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, s_ptr, stride_x, stride_r,
                     stride_s, n, eps, HAS_RES: tl.constexpr, PARTS: tl.constexpr,
                     GDC: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                     FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr,
                     SOFT: tl.constexpr):
    # Under PDL (kernels/pdl.py): the next kernel (a GEMV) may start loading its weights now;
    # this one loads its own weight (no kernel writes it) before it waits for x's writer.
    pdl.release_next(GDC)
    # The model dtype: QUANT's output is e4m3, and then res_out is a model-dtype tensor.
    dtype = res_out_ptr.dtype.element_ty if QUANT else out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    pdl.wait_previous(GDC)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if PARTS > 0:  # x is a split-K matmul's fp32 partials: added in split order, then rounded
        for s in tl.static_range(1, PARTS):  # as the unsplit matmul rounds its output
            x += tl.load(x_ptr + s * stride_s + row * stride_x + offs, mask=mask, other=0.0)
        x = x.to(dtype).to(tl.float32)
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
    y = (x * inv).to(dtype).to(tl.float32)
    y = (y * w).to(dtype)
    if QUANT:  # the rounded output to e4m3 with one scale a row (layers/fp8_rows.py)
        y = _e4m3_row(y.to(tl.float32), s_ptr + row, out_ptr.dtype.element_ty, FMAX, MANT, BIAS,
                      SOFT)
    tl.store(out_ptr + row * n + offs, y, mask=mask)


@triton.jit
def _e4m3_row(y, s_ptr, out_ty: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr,
              BIAS: tl.constexpr, SOFT: tl.constexpr):
    """A whole row y (fp32, already rounded to the model dtype) in e4m3; its scale, max |y| /
    FMAX (fp8_w8a8.quantize_tokens's), stored at s_ptr."""
    scale = tl.maximum(tl.max(tl.abs(y), axis=0) / FMAX, 1.1754943508222875e-38)
    tl.store(s_ptr, scale)
    # Times the scale's reciprocal (rounded once), not divided: a division a value cost
    # 0.5-1.2 us a launch (H200). The largest |y| times it rounds to FMAX, not past it.
    y = y * tl.div_rn(1.0, scale)
    if SOFT:  # (the interpreter's cast mis-rounds: _common.quantize_fp8)
        return quantize_fp8(y, 1.0, out_ty, FMAX, MANT, BIAS, SOFT)
    return y.to(out_ty)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, dtype: torch.dtype | None = None,
             quantize: bool = False):
    """norm(x) * weight over the last dim; with a residual: (norm(x + residual) * weight,
    x + residual), both in x's dtype. dtype given: x is fp32 partial sums [S, rows, n] (a
    split-K matmul's, layers/split_k.py) whose in-order sum, rounded to dtype, is the input.
    quantize: the norm comes as (e4m3 values [rows, n], fp32 scales [rows]) of the rounded
    output y: scale = max |y| / 448 (fp8_w8a8.quantize_tokens's), values y * (1 / scale)
    rounded to nearest (layers/fp8_rows.py)."""
    n, parts = x.shape[-1], 0
    if dtype is None:
        dtype = x.dtype
    else:  # the kernel reads the first partial here, each next one a partial's size on
        assert x.is_contiguous()
        parts, x = x.shape[0], x[0]
    x2 = x.reshape(-1, n)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn if quantize else dtype, device=x.device)
    if residual is not None:
        res_out = torch.empty(x.shape, dtype=dtype, device=x.device)
    elif quantize:  # (only its dtype is read: the model's)
        res_out = x2 if x2.dtype == dtype else torch.empty(1, dtype=dtype, device=x.device)
    else:
        res_out = out
    scales = torch.empty(rows if quantize else 0, dtype=torch.float32, device=x.device)
    r2 = residual.reshape(-1, n) if residual is not None else x2
    if r2.stride(1) != 1:
        r2 = r2.contiguous()
    if rows:
        block, gdc = triton.next_power_of_2(n), pdl.enabled(out)
        meta = fp8_meta(torch.float8_e4m3fn)
        # (the interpreter stores fp8 bit patterns: see _common.quantize_fp8)
        dst = out.view(torch.uint8) if quantize and meta["SOFT"] else out
        _rms_norm_kernel[(rows,)](x2, r2, weight, dst, res_out, scales, x2.stride(0),
                                  r2.stride(0), x2.numel(), n, eps,
                                  HAS_RES=residual is not None, PARTS=parts, GDC=gdc,
                                  BLOCK=block, QUANT=quantize, FMAX=meta["FMAX"],
                                  MANT=meta["MANT"], BIAS=meta["BIAS"], SOFT=meta["SOFT"],
                                  num_warps=min(max(block // 256, 1), 16),
                                  **pdl.launch_kwargs(gdc))
    if quantize:
        out = (out.view(-1, n), scales)
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


@triton.jit
def _silu_mul_rows_kernel(x_ptr, out_ptr, s_ptr, stride_x, d, GDC: tl.constexpr,
                          BLOCK: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr,
                          BIAS: tl.constexpr, SOFT: tl.constexpr):
    # _silu_and_mul_kernel's product over a whole row, in e4m3 with the row's scale.
    pdl.release_next(GDC)
    pdl.wait_previous(GDC)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < d
    dtype = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    y = _e4m3_row((act * up).to(dtype).to(tl.float32), s_ptr + row, out_ptr.dtype.element_ty,
                  FMAX, MANT, BIAS, SOFT)
    tl.store(out_ptr + row * d + offs, y, mask=mask)


def silu_and_mul(x: torch.Tensor, quantize: bool = False):
    """silu(x[..., :d]) * x[..., d:] for a packed [..., 2d] gate_up output; quantize: as
    (e4m3 values [rows, d], fp32 scales [rows]) of the rounded product, as rms_norm's."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if quantize:
        return _silu_mul_rows(x2, d)
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block, gdc = min(triton.next_power_of_2(d), 1024), pdl.enabled(out)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, out, x2.stride(0), d, GDC=gdc, BLOCK=block, num_warps=4, **pdl.launch_kwargs(gdc))
    return out


def _silu_mul_rows(x2: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = x2.shape[0]
    out = torch.empty(rows, d, dtype=torch.float8_e4m3fn, device=x2.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x2.device)
    if rows:
        block, gdc = triton.next_power_of_2(d), pdl.enabled(out)
        meta = fp8_meta(torch.float8_e4m3fn)
        dst = out.view(torch.uint8) if meta["SOFT"] else out  # (as rms_norm's)
        _silu_mul_rows_kernel[(rows,)](x2, dst, scales, x2.stride(0), d, GDC=gdc, BLOCK=block,
                                       FMAX=meta["FMAX"], MANT=meta["MANT"], BIAS=meta["BIAS"],
                                       SOFT=meta["SOFT"], num_warps=min(max(block // 256, 1), 16),
                                       **pdl.launch_kwargs(gdc))
    return out, scales
