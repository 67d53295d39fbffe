"""GEMM for batched decode (17-256 rows), its tiles brought in by Hopper's tensor memory
accelerator (TMA): y = x @ W^T (+ bias), or gated, silu(x @ gate^T) * (x @ up^T) for a packed
gate_up weight (no SiLU-and-mul launch). W is 16-bit, or e4m3 with fp32 row or block scales:
each W tile dequantized in registers as the reference does it (value * scale, rounded to x's
dtype), or, for e4m3 x (W8A8, layers/fp8_rows.py), fed to the tensor cores as loaded.

At these sizes a matmul is latency, not bytes or FLOPs; descriptor loads (one async copy a
tile, no address math a thread) tie cuBLAS where pointer loads lost by 1.5-3 us (PERF_NOTES,
forty-second and fifty-fifth sessions). So the engine takes it where it saves a launch or a
pass over the weight: the gated gate_up (bf16 on the measured shapes, GATED_TILES); narrow
layers (o, down) with K split across programs, each split's fp32 partial added in split order
by the residual-add RMSNorm after them (layers/split_k.py: no reduce launch, the same bits
every call); fp8 weights, whose other path past 16 rows writes a dequantized copy for cuBLAS.

CUDA-graph safe: grid and buffers depend only on shapes; descriptors hold the addresses.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels import pdl, tma_config
from nanovllm.kernels._common import INTERPRET, dot_precision
from nanovllm.kernels.tma_tiles import dequant, dot_e4m3, store

try:  # (a Triton without host-side descriptors: the path stays off)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

# Rows this path takes (above the skinny kernel's 16), and whether it runs at all (0: cuBLAS).
MIN_M, MAX_M = 17, 256
ON = 1
# Under PDL (kernels/pdl.py; 0: plain launches) this waits only before its K loop and lets
# the next kernel launch at its start (1; H200 bench.py +1.4%) or after its K loop (2).
PDL = 1
# Scale modes (skinny_gemm's values): none, one per output row, one per (bn, bk) block.
NO_SCALE, ROW_SCALE, BLOCK_SCALE = 0, 1, 2


@triton.jit
def _tma_gemm_kernel(x_desc, w_desc, y_ptr, b_ptr, s_ptr, xs_ptr, M, N, K, k_per_split,
                     stride_ym, stride_sn, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                     XSCALE: tl.constexpr, SCALE: tl.constexpr, SCALE_BN: tl.constexpr,
                     SCALE_BK: tl.constexpr, PARTS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                     DOT_PREC: tl.constexpr, GDC: tl.constexpr):
    pdl.release_next(GDC == 1)
    # Row tiles fastest: the programs of one column tile run side by side and share its W.
    pid = tl.program_id(0)
    pid_m, pid_n = pid % tl.cdiv(M, BLOCK_M), pid // tl.cdiv(M, BLOCK_M)
    k_start = tl.program_id(1) * k_per_split
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = acc
    s_gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    s_up = s_gate
    if SCALE == 1:  # row scales, loaded once
        s_gate = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
        if GATED:
            s_up = tl.load(s_ptr + N + offs_n, mask=n_mask, other=0.0)
    pdl.wait_previous(GDC > 0)  # (the scales are weights: loaded before it)
    for k in tl.range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K,
                      num_stages=STAGES):
        x = x_desc.load([pid_m * BLOCK_M, k])  # rows and columns past the tensor read as 0
        if SCALE == 2:  # a K tile lies inside one scale block (BLOCK_K divides SCALE_BK)
            s_gate = tl.load(s_ptr + (offs_n // SCALE_BN) * stride_sn + k // SCALE_BK,
                             mask=n_mask, other=0.0)
        w = w_desc.load([pid_n * BLOCK_N, k])
        if XSCALE:  # e4m3 x e4m3 dots; row scales at the end, block scales a K tile
            acc = dot_e4m3(x, w, acc, s_gate, BLOCK_K, SCALE)
        else:
            w = dequant(w, s_gate, x.dtype, SCALE)
            acc = tl.dot(x, w.T, acc, input_precision=DOT_PREC)
        if GATED:  # the up rows of the same outputs, N rows further down
            if SCALE == 2:
                s_up = tl.load(s_ptr + ((N + offs_n) // SCALE_BN) * stride_sn + k // SCALE_BK,
                               mask=n_mask, other=0.0)
            u = w_desc.load([N + pid_n * BLOCK_N, k])
            if XSCALE:
                acc_up = dot_e4m3(x, u, acc_up, s_up, BLOCK_K, SCALE)
            else:
                u = dequant(u, s_up, x.dtype, SCALE)
                acc_up = tl.dot(x, u.T, acc_up, input_precision=DOT_PREC)
    pdl.release_next(GDC == 2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if XSCALE:  # x is e4m3 rows times their scales: the exact products' sum, scaled twice
        xs = tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
        if SCALE == 1:
            acc = acc * s_gate[None, :]
            acc_up = acc_up * s_up[None, :]
        acc = acc * xs
        acc_up = acc_up * xs
    mask = (offs_m < M)[:, None] & n_mask[None, :]
    if PARTS:  # this split's fp32 partial: the caller adds them in split order
        part = y_ptr + tl.program_id(1).to(tl.int64) * M * N
        tl.store(part + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)
    else:
        store(acc, acc_up, y_ptr, b_ptr, offs_m, offs_n, mask, N, stride_ym, HAS_BIAS, GATED)


def takes(x: torch.Tensor, weight: torch.Tensor, gated: bool = False,
          scale: torch.Tensor | None = None, block: tuple[int, int] | None = None,
          split: bool = False) -> bool:
    """Whether tma_gemm runs this call: ON, MIN_M..MAX_M rows of a 16-bit x on a GPU that fits
    it (tma_config.gpu_fits), a contiguous weight of x's dtype (or e4m3 with scales: row, or
    blocks of 128-column multiples), rows 16-byte aligned (TMA's rule), and a config."""
    k = x.shape[-1]
    m = x.numel() // max(k, 1)
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    fp8 = scale is not None
    return (bool(ON) and TensorDescriptor is not None and x.is_cuda and not INTERPRET
            and MIN_M <= m <= MAX_M and x.dtype in (torch.bfloat16, torch.float16)
            and (weight.dtype == torch.float8_e4m3fn if fp8 else weight.dtype == x.dtype)
            and (block is None or block[1] % 128 == 0) and weight.is_contiguous()
            and (k * weight.element_size()) % 16 == 0 and weight.data_ptr() % 16 == 0
            and (not gated or weight.shape[0] % 2 == 0)
            and tma_config.choose_config(m, n, k, gated, fp8, split) is not None  # (first)
            and tma_config.gpu_fits(x.device.index or 0))


def takes_w8a8(m: int, k: int, weight: torch.Tensor, scale: torch.Tensor | None,
               block: tuple[int, int] | None, gated: bool = False) -> bool:
    """Whether w8a8_gemm runs m rows of K e4m3 activations (layers/fp8_rows.py) against this
    weight: ON, e4m3 with row scales (or, under tma_config.W8A8_BLOCKS, 128-multiple blocks)
    on a GPU that fits it (tma_config.gpu_fits), K 16-byte aligned, and a config."""
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    return (bool(ON) and TensorDescriptor is not None and weight.is_cuda and not INTERPRET
            and MIN_M <= m <= MAX_M and weight.dtype == torch.float8_e4m3fn
            and scale is not None and weight.is_contiguous()
            and (block is None or tma_config.W8A8_BLOCKS and block[1] % 128 == 0)
            and k % 16 == 0 and weight.data_ptr() % 16 == 0
            and (not gated or weight.shape[0] % 2 == 0)
            and tma_config.w8a8_config(m, n, k, gated) is not None
            and tma_config.gpu_fits(weight.device.index or 0))


def w8a8_gemm(values: torch.Tensor, scales: torch.Tensor, weight: torch.Tensor,
              scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
              gated: bool = False, config: dict | None = None,
              block: tuple[int, int] | None = None) -> torch.Tensor:
    """(values * scales[:, None]) @ (weight * scale)^T (+ bias) in dtype, [M, N]: values
    e4m3 [M, K] with fp32 row scales [M], weight e4m3 [N, K] with row scales [N] (block None)
    or (bn, bk) block scales; gated as tma_gemm. The dots run on e4m3 (no widening); each
    output is the fp32 sum of exact products, times both scales, rounded once."""
    m, k = values.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    cfg = (config or tma_config.w8a8_config(m, n, k, gated, (block or (0, 0))[1])
           or tma_config.default_config(m, n, k, gated))
    y = torch.empty(m, n, dtype=dtype, device=values.device)
    bias = bias.to(dtype) if bias is not None else None  # (rounded as fp8_gemm rounds it)
    _launch(values, weight, y, bias, scale, block, cfg, gated, parts=False, xs=scales)
    return y


def tma_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             gated: bool = False, config: dict | None = None, scale: torch.Tensor | None = None,
             block: tuple[int, int] | None = None) -> torch.Tensor:
    """x[..., K] @ weight[N, K]^T (+ bias) in x's dtype; gated: weight packs gate and up
    ([2I, K]) and the result is silu(gate) * up, [..., I]; scale / block: an e4m3 weight's
    row ([N]) or block scales. config overrides choose_config (default_config where that
    names another path: direct calls, tests, sweeps); a split config's partials are added
    here, in split order."""
    k = x.shape[-1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    m = x.numel() // k
    cfg = dict(config or tma_config.choose_config(m, n, k, gated, scale is not None)
               or tma_config.default_config(m, n, k, gated))
    if cfg["SPLIT"] > 1:
        assert not gated and bias is None, cfg
        parts = tma_partials(x, weight, scale, block, cfg)
        return sum(parts[1:], parts[0]).to(x.dtype).view(*x.shape[:-1], n)  # (in order)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _launch(x, weight, y, bias, scale, block, cfg, gated, parts=False)
    return y.view(*x.shape[:-1], n)


def tma_partials(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                 block: tuple[int, int] | None, config: dict | None = None) -> torch.Tensor:
    """x @ weight^T as fp32 partial sums over config's K splits, [SPLIT, M, N] (no bias):
    their sum in split order is the product (layers/split_k.py)."""
    k = x.shape[-1]
    m, n = x.numel() // k, weight.shape[0]
    cfg = config or tma_config.choose_config(m, n, k, False, scale is not None, split=True,
                                             scale_bk=block[1] if block else 0)
    parts = torch.empty(_splits(k, cfg), m, n, dtype=torch.float32, device=x.device)
    _launch(x, weight, parts, None, scale, block, cfg, False, parts=True)
    return parts


def _splits(k: int, cfg: dict) -> int:  # (splits that get columns: a short K leaves fewer)
    return triton.cdiv(k, _k_per_split(k, cfg))


def _k_per_split(k: int, cfg: dict) -> int:
    return triton.cdiv(triton.cdiv(k, cfg["SPLIT"]), cfg["BLOCK_K"]) * cfg["BLOCK_K"]


def _launch(x, weight, y, bias, scale, block, cfg, gated, parts, xs=None):
    """One launch into y: [M, N] in x's dtype (or y's, for e4m3 x with row scales xs), or
    (parts) fp32 partials [splits, M, N]."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous() or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    m, n = x2.shape[0], weight.shape[0] // 2 if gated else weight.shape[0]
    if m == 0:
        return
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    mode = NO_SCALE if scale is None else ROW_SCALE if block is None else BLOCK_SCALE
    s_bn, s_bk = block or (1, 1)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), _splits(k, cfg) if parts else 1)
    gdc = PDL if pdl.enabled(y) else 0
    _tma_gemm_kernel[grid](
        TensorDescriptor.from_tensor(x2, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        y, bias if bias is not None else y, scale if scale is not None else y,
        xs if xs is not None else y, m, n, k, _k_per_split(k, cfg) if parts else k, y.stride(0),
        scale.stride(0) if mode == BLOCK_SCALE else 0,
        HAS_BIAS=bias is not None, GATED=gated, XSCALE=xs is not None, SCALE=mode,
        SCALE_BN=s_bn, SCALE_BK=s_bk, PARTS=parts, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        STAGES=cfg["STAGES"], DOT_PREC=dot_precision(x.dtype), GDC=gdc,
        num_warps=cfg["num_warps"], **pdl.launch_kwargs(gdc))
