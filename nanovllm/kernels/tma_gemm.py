"""GEMM for batched decode (17-256 rows) on plain 16-bit weights, its tiles brought in by
Hopper's tensor memory accelerator (TMA): y = x @ W^T (+ bias), or gated, silu(x @ gate^T) *
(x @ up^T) for a packed gate_up weight, so the SiLU-and-mul needs no launch of its own.

At these sizes a layer's matmul is latency, not bytes or FLOPs (Qwen2.5-0.5B's o_proj, 1.6 MB,
takes cuBLAS 4.4 us at 64 rows). The skinny kernel's pointer loads with taller tiles lost to
cuBLAS by 1.5-3 us a call (PERF_NOTES, forty-second session); the same dot over descriptor
loads (`TensorDescriptor`: one async copy a tile, no address math a thread) matches it
(fifty-fifth). So the engine takes it where it saves a launch: the gated gate_up (H200,
bench.py alternating, tok/s: Qwen2.5-0.5B shape 70,388 -> 73,120 mean of three, Qwen3-0.6B
26,703 -> 26,897 of two). Narrow layers (o, down) would need K split across programs: each
parks its fp32 partial and counts in, and the last sums them in split order (the same bits
every call, as skinny_gemm's split-K), which costs ~2.5 us, so they stay on cuBLAS (PLAIN).

CUDA-graph safe like skinny_gemm: the grid and buffers depend only on shapes; the descriptors
hold the tensors' addresses, which a captured graph keeps.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET, dot_precision
from nanovllm.kernels.skinny_config import workspace

try:  # (a Triton without host-side descriptors: the path stays off)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

# Rows this path takes (above the skinny kernel's 16), and whether it runs at all (0: cuBLAS).
MIN_M, MAX_M = 17, 256
ON = 1
NUM_SMS = 132  # H100 / H200: only used to size splits


@triton.jit
def _tma_gemm_kernel(x_desc, w_desc, y_ptr, b_ptr, part_ptr, cnt_ptr, M, N, K, k_per_split,
                     stride_ym, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                     SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, STAGES: tl.constexpr, DOT_PREC: tl.constexpr):
    # Row tiles fastest: the programs of one column tile run side by side and share its W.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % tiles_m
    pid_n = pid // tiles_m
    pid_k = tl.program_id(1)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = acc
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
        x = x_desc.load([pid_m * BLOCK_M, k])  # rows and columns past the tensor read as 0
        acc = tl.dot(x, w_desc.load([pid_n * BLOCK_N, k]).T, acc, input_precision=DOT_PREC)
        if GATED:  # the up rows of the same outputs, N rows further down
            acc_up = tl.dot(x, w_desc.load([N + pid_n * BLOCK_N, k]).T, acc_up,
                            input_precision=DOT_PREC)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT > 1:
        tile = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(tile + pid_k * M * N, acc, mask=mask)
        # acq_rel: each split's partial is stored before its increment, and the last split
        # loads after its own, so it sees them all.
        cnt = cnt_ptr + pid
        if tl.atomic_add(cnt, 1, sem="acq_rel") == SPLIT - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for sp in range(SPLIT):  # split order: the same sum on every call
                acc += tl.load(tile + sp * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _store(acc, acc_up, y_ptr, b_ptr, offs_m, offs_n, mask, N, stride_ym, HAS_BIAS,
                   GATED)
            tl.atomic_xchg(cnt, 0)  # ready for the next call (and the next graph replay)
    else:
        _store(acc, acc_up, y_ptr, b_ptr, offs_m, offs_n, mask, N, stride_ym, HAS_BIAS, GATED)


@triton.jit
def _store(acc, acc_up, y_ptr, b_ptr, offs_m, offs_n, mask, N, stride_ym,
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


# (outputs, K) of a gated gate_up -> {most rows: (BLOCK_M, BLOCK_N, BLOCK_K, STAGES)}, from a
# sweep against cuBLAS + the SiLU-and-mul launch (H200, PERF_NOTES fifty-fifth session): only
# where it won; other shapes and rows stay on cuBLAS. Qwen2.5-0.5B, us at 32 / 64 / 128 / 256
# rows: 7.95 / 8.05 / 9.47 / 12.43 against 8.72 / 8.96 / 9.62 / 13.15; Qwen3-0.6B 7.11 /
# 6.97 / 7.59 against 7.21 / 7.41 / 7.63 (9.47 against 9.36 at 256: cuBLAS).
GATED_TILES = {(4864, 896): {64: (64, 64, 128, 4), 128: (64, 32, 64, 4), 256: (64, 64, 64, 3)},
               (3072, 1024): {64: (64, 32, 128, 4), 128: (64, 64, 128, 4)}}
# Ungated calls matched cuBLAS at best (qkv, o), and narrow ones (o, down) need split K,
# whose ordered sum costs ~2.5 us: off (PLAIN 1 runs them on choose_config's rule).
PLAIN = 0


def choose_config(m: int, n: int, k: int, gated: bool = False) -> dict | None:
    """Tiles and K splits for an [m, k] @ [n, k]^T call (n: outputs; gated: a tile's n
    columns are read twice, gate and up), or None where cuBLAS is faster (GATED_TILES,
    PLAIN)."""
    if INTERPRET:
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=2 if k >= 64 and not gated else 1,
                    STAGES=1, num_warps=4)
    if gated:
        rows = [r for r in sorted(GATED_TILES.get((n, k), {})) if m <= r]
        if not rows:
            return None
        bm, bn, bk, stages = GATED_TILES[(n, k)][rows[0]]
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=1, STAGES=stages, num_warps=4)
    return default_config(m, n, k) if PLAIN else None


def default_config(m: int, n: int, k: int, gated: bool = False) -> dict:
    """A rule for any shape: 64-row tiles, 128-wide K steps, 4 stages; 32 columns on narrow
    layers; K split until about one program an SM (never gated)."""
    block_n = 32 if n <= 2048 or gated else 128
    tiles = triton.cdiv(m, 64) * triton.cdiv(n, block_n)
    split = 1
    while not gated and split < 4 and tiles * split * 2 <= NUM_SMS and k >= split * 1024:
        split *= 2
    return dict(BLOCK_M=64, BLOCK_N=block_n, BLOCK_K=128, SPLIT=split, STAGES=4, num_warps=4)


def takes(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """Whether tma_gemm runs this call: ON, MIN_M..MAX_M rows of a 16-bit x on a Hopper-or-
    later GPU, a contiguous weight of x's dtype, rows 16-byte aligned (TMA's rule)."""
    k = x.shape[-1]
    m = x.numel() // max(k, 1)
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    return (bool(ON) and TensorDescriptor is not None and x.is_cuda and not INTERPRET
            and MIN_M <= m <= MAX_M and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.is_contiguous()
            and (k * x.element_size()) % 16 == 0 and weight.data_ptr() % 16 == 0
            and (not gated or weight.shape[0] % 2 == 0)
            and choose_config(m, n, k, gated) is not None  # (before the device query)
            and torch.cuda.get_device_capability(x.device)[0] >= 9)


def tma_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             gated: bool = False, config: dict | None = None) -> torch.Tensor:
    """x[..., K] @ weight[N, K]^T (+ bias) in x's dtype; gated: weight packs gate and up
    ([2I, K]) and the result is silu(gate) * up, [..., I]. config overrides choose_config
    (default_config where that names cuBLAS: direct calls, tests, sweeps)."""
    k = x.shape[-1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous() or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.view(*x.shape[:-1], n)
    cfg = dict(config or choose_config(m, n, k, gated) or default_config(m, n, k, gated))
    bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT"]
    assert not (gated and split > 1), cfg
    k_per_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    part, cnt = workspace(x.device, split * m * n, tiles) if split > 1 else (y, y)
    _tma_gemm_kernel[(tiles, split)](
        TensorDescriptor.from_tensor(x2, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        y, bias if bias is not None else y, part, cnt, m, n, k, k_per_split, y.stride(0),
        HAS_BIAS=bias is not None, GATED=gated, SPLIT=split, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=bk, STAGES=cfg["STAGES"], DOT_PREC=dot_precision(x.dtype),
        num_warps=cfg["num_warps"])
    return y.view(*x.shape[:-1], n)
