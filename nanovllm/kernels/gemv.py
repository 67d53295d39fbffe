"""GEMV for one or two rows (small-batch decode): y = x @ (W * scale)^T (+ bias), no tensor
cores; W in e4m3 with fp32 scales (fp8_gemm.py's first path) or plain (bf16 / fp16 / fp32,
no scale; layers/linear.dense_linear's).

A program owns BLOCK_N rows of W and walks K in BLOCK_K tiles, widened to fp32 (e4m3 by
Triton's cvt), times each row of x by FMAs, GROUP products summed at a time into that row's
fp32 [BLOCK_N, BLOCK_K / GROUP] accumulator, summed across K after the loop. The products are
exact in fp32, as the tensor cores' are; only the summation order differs from
skinny_gemm.py, whose dot pads x to 16 rows (past two rows the FMAs cost more: see MAX_M).

Row scales multiply y's rows at the end. Block scales (bn x bk) multiply x's K tile instead:
a program's rows lie in one row block (BLOCK_N divides bn), so each column's scale is one
value for all of them (x * scale is rounded once in fp32 there, where the skinny kernel
rounds each partial sum times its scale). No split-K: one split won on every layer measured.
GATED (one row, gemv_gated.py): a gate_up projection's SiLU-and-mul in the epilogue.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels import pdl
from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.decode_splits import _num_sms
from nanovllm.kernels.gemv_gated import silu_mul_epilogue
from nanovllm.kernels.gemv_tiles import load_w, tile_sums
from nanovllm.kernels.layer_parts import epilogue

# Rows of x taken for fp8 weights (fp8_gemm dispatches M <= MAX_M here); 0: off. H200,
# Qwen3-8B's four layers, µs skinny kernel -> GEMV: one row 72.8 -> 56.4, two 73.3 -> 63.6,
# four 73.6 -> 92.4 (the FMAs outgrow the saved bytes). Engine, 8B fp8: two sequences 586 ->
# 650 tok/s, one 290 -> 352 (PERF_NOTES, 45th-46th).
MAX_M, MAX_ROWS = 2, 4  # (MAX_ROWS: the kernel's limit, for sweeps)
# Plain (bf16 / fp16) weights take it from layers/linear.dense_linear for up to PLAIN_MAX_M
# rows (PLAIN 0: never). H200, tok/s at two sequences / one, cuBLAS -> GEMV: Qwen3-8B 417 /
# 209 -> 455 / 231, Qwen3-0.6B 1,497 / 1,270 -> 1,941 / 1,313 (PERF_NOTES, 46th).
PLAIN, PLAIN_MAX_M = 1, 2
# Rows up to which a plain weight narrower than it is deep (N < K: o and down projections)
# and under PLAIN_NARROW_MAX_VALUES values takes it too, past PLAIN_MAX_M; 0: no further.
# H200, bench.py four sequences, tok/s 0 / 4: Qwen3-0.6B 3,166 / 3,594, Qwen2.5-0.5B 4,114 /
# 4,137; Qwen3-8B 841 / 787 (hence the bound: its o and down stay on cuBLAS; 49th).
PLAIN_NARROW_MAX_M = 4
PLAIN_NARROW_MAX_VALUES = 1 << 24
# Rows up to which the int8 LM head copy (layers/quant/int8_head) is read here rather than by
# the skinny kernel; 0: never. H200, bench.py --single, tok/s 0 / 1: 8B fp8 + int8 head
# 367.4 / 370.2; Qwen3-0.6B bf16 + int8 head 1,310 / 1,359 (PERF_NOTES, 47th-49th).
INT8_HEAD_MAX_M = 1
ONE_ROW_W_VEC = 0  # fp8 W's vector bytes at one row (0: 16); 8B batch 1, 0 / 8: 354 / 356
# Under PDL (kernels/pdl.py) the GEMV lets the next kernel launch at its start (True) or
# after its K loop (False). H200, 8B batch 1 tok/s, PDL off / early / late: fp8 355 / 367 /
# 382, bf16 236 / 216 / 248 (early, launched grids likely queue on SMs ahead of their turn).
PDL_EARLY_RELEASE = False
# Before its wait the GEMV loads its first W tile (PEEL). H200 8B batch 1, tok/s: that tile
# after the wait instead, fp8 405.1 -> 402.6, bf16 256.6 -> 253.0 (54th); two tiles before it,
# fp8 387 -> 342, bf16 245 -> 231 (registers, 52nd); the rest of each row asked into L2 there
# (prefetch.global.L2, 2 / 8 KB a row), fp8 405.7 -> 359.7 / 340.0, bf16 256.2 -> 234.9 /
# 216.4 (54th): early traffic slows the latency-bound kernel still running.
# (BLOCK_N, BLOCK_K) for the int8 head copy at one row, by K >= 4096: the sweep's best above.
GROUPED_ONE_ROW = {False: (32, 256), True: (8, 1024)}
# (BLOCK_N, BLOCK_K) by (fp8 weights?, width: n <= 4096 "narrow", >= 16384 "wide"): the sweep's
# best at one row and two (H200, Qwen3-8B's layers; GROUP 16, evict-first W); fp8 narrow
# (4, 1024) -> (4, 2048): 8B batch 1 354.0 / 353.8 -> 358.1 / 358.3 tok/s.
ONE_ROW = {(True, "narrow"): (4, 2048), (True, "mid"): (8, 1024), (True, "wide"): (16, 256),
           (False, "narrow"): (4, 1024), (False, "mid"): (8, 512), (False, "wide"): (32, 256)}
# Every program of a one- or two-row GEMV walks all of K, so a grid that fits the GPU at once
# takes one program's time, and one that does not, two. The 8B's fp8 gate_up (1,536 programs)
# fits 12 an SM at Triton 3.6's 40 registers; with the norm-chain branch's epilogue (41-50)
# it ran 24.6 -> 30.2 us (H200), and capped at 40 (maxnreg) 25.1. ONE_WAVE 1 caps each grid
# at what keeps it in one wave (one_wave_regs). Off: under Triton 3.6 every grid fits
# already, and the caps cost the 8B's fp8 batch 1 0.4% (405 -> 403 tok/s, three rounds in one
# process). Triton 3.9's sm_90 build counts 47 (fp8) and 96 (bf16) for the gated tiles, past
# one wave: turn it on there (untimed).
ONE_WAVE = 0
TWO_ROWS = {(True, "narrow"): (8, 1024), (True, "mid"): (8, 1024), (True, "wide"): (32, 256),
            (False, "narrow"): (8, 1024), (False, "mid"): (8, 512), (False, "wide"): (8, 512)}


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, N, K, stride_xm, stride_ym, stride_wn,
                 stride_sn, ROW_SCALED: tl.constexpr, BLOCK_SCALED: tl.constexpr,
                 GROUP_SCALED: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                 HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, ROWS: tl.constexpr,
                 GROUP: tl.constexpr, W_EVICT: tl.constexpr, W_VEC: tl.constexpr,
                 PEEL: tl.constexpr, GDC: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GATED: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    if GATED:  # rows gate j, up j (N + j) in turn, for BLOCK_N / 2 outputs j
        half = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2
        offs_n = half + (tl.arange(0, BLOCK_N) % 2) * N
        mask_n = half < N
    offs_k = tl.arange(0, BLOCK_K)
    offs_kw = offs_k
    if W_VEC > 0:  # W loaded W_VEC values a vector: x's layout then (bf16, 16 B) with no
        offs_kw = tl.max_contiguous(tl.multiple_of(offs_k, W_VEC), W_VEC)  # smem / barriers
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_kw[None, :]
    # Block scales: this program's row block (BLOCK_N divides SCALE_BN). Per-row blocks
    # (GROUP_SCALED, SCALE_BN 1: the int8 LM head copy's): each row's scale of each group.
    s_row = s_ptr + (pid * BLOCK_N // SCALE_BN) * stride_sn
    offs_g = tl.arange(0, BLOCK_K // GROUP) * GROUP
    s_groups = s_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
    # One accumulator a row (ROWS <= 4), each its own 2-D tile: a 3-D [ROWS, N, K] tile made
    # Triton sum the groups across threads by shuffles (4x the SASS, sm_90 compile).
    acc0 = tl.zeros((BLOCK_N, BLOCK_K // GROUP), dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    k_first = 0
    if PEEL:  # the first W tile goes out before the wait on the kernel that wrote x (PDL)
        w = load_w(w_rows, 0, offs_k, mask_n, K, EVEN_K, W_EVICT)
        pdl.release_next(GDC == 1)
        pdl.wait_previous(GDC > 0)
        acc0, acc1, acc2, acc3 = tile_sums(
            w, 0, acc0, acc1, acc2, acc3, x_ptr, stride_xm, offs_k, offs_g, mask_n, K, s_row,
            s_groups, BLOCK_SCALED, GROUP_SCALED, SCALE_BK, EVEN_K, ROWS, GROUP, BLOCK_N, BLOCK_K)
        k_first = BLOCK_K
    else:
        pdl.release_next(GDC == 1)
        pdl.wait_previous(GDC > 0)
    for k0 in range(k_first, K, BLOCK_K):
        w = load_w(w_rows, k0, offs_k, mask_n, K, EVEN_K, W_EVICT)
        acc0, acc1, acc2, acc3 = tile_sums(
            w, k0, acc0, acc1, acc2, acc3, x_ptr, stride_xm, offs_k, offs_g, mask_n, K, s_row,
            s_groups, BLOCK_SCALED, GROUP_SCALED, SCALE_BK, EVEN_K, ROWS, GROUP, BLOCK_N, BLOCK_K)
    pdl.release_next(GDC == 2)
    if GATED:
        silu_mul_epilogue(tl.sum(acc0, axis=1), offs_n, mask_n, pid, N, s_ptr, b_ptr, y_ptr,
                          ROW_SCALED, HAS_BIAS, BLOCK_N)
        return
    # Each row: summed across K, row-scaled, biased and stored (the layer kernel's epilogue).
    epilogue(tl.sum(acc0, axis=1), offs_n, mask_n, s_ptr, b_ptr, y_ptr, ROW_SCALED, HAS_BIAS)
    if ROWS > 1:
        epilogue(tl.sum(acc1, axis=1), offs_n, mask_n, s_ptr, b_ptr, y_ptr + stride_ym,
                 ROW_SCALED, HAS_BIAS)
    if ROWS > 2:
        epilogue(tl.sum(acc2, axis=1), offs_n, mask_n, s_ptr, b_ptr, y_ptr + 2 * stride_ym,
                 ROW_SCALED, HAS_BIAS)
    if ROWS > 3:
        epilogue(tl.sum(acc3, axis=1), offs_n, mask_n, s_ptr, b_ptr, y_ptr + 3 * stride_ym,
                 ROW_SCALED, HAS_BIAS)


def choose_config(n: int, k: int, itemsize: int = 1, rows: int = 1,
                  grouped: bool = False) -> dict:
    """The tiles for a weight [n, k] of itemsize bytes a value at this many rows (ONE_ROW /
    TWO_ROWS; rows 3-4, sweeps only, take TWO_ROWS'); grouped: the int8 head copy's, a scale
    a row and column block (GROUPED_ONE_ROW at one row)."""
    if INTERPRET:
        return dict(BLOCK_N=8, BLOCK_K=32, GROUP=4, W_EVICT="evict_first", num_warps=1,
                    num_stages=1)
    width = "wide" if n >= 16384 else "narrow" if n <= 4096 else "mid"
    bn, bk = (ONE_ROW if rows == 1 else TWO_ROWS)[(itemsize == 1, width)]
    if grouped and rows == 1:
        bn, bk = GROUPED_ONE_ROW[k >= 4096]
    if itemsize == 4:  # fp32 rows: twice bf16's registers a tile
        bk //= 2
    bk = min(bk, triton.next_power_of_2(k))
    vec = ONE_ROW_W_VEC if rows == 1 and itemsize == 1 and not grouped else 0
    return dict(BLOCK_N=bn, BLOCK_K=bk, GROUP=min(vec or 16, bk), W_EVICT="evict_first",
                W_VEC=vec, num_warps=4, num_stages=3)


def one_wave_regs(programs: int, num_warps: int, num_sms: int) -> int:
    """The most registers a thread may take with all `programs` resident at once (65,536 an
    SM, allocated in eights), or 0: no cap where one wave cannot be had (64 warps an SM),
    where it would be under 40 (every tile here needs 40-96: spills would cost more than a
    second wave) or where nothing limits it."""
    per_sm = -(-programs // num_sms)
    if per_sm * num_warps > 64:
        return 0
    regs = 65536 // (per_sm * num_warps * 32) // 8 * 8
    return regs if 40 <= regs < 255 else 0


def takes(m: int, block: tuple[int, int] | None) -> bool:
    """Whether the GEMV runs this fp8 call: up to MAX_M rows, row scales or row blocks that
    whole 8-row tiles divide (every known checkpoint's 128)."""
    return 0 < m <= MAX_M and (block is None or block[0] % 8 == 0)


def takes_plain(m: int, n: int = 0, k: int = 0) -> bool:
    """Whether the GEMV runs a call of m rows on a plain weight [n, k] (see PLAIN and
    PLAIN_NARROW_MAX_M)."""
    narrow = n < k and n * k < PLAIN_NARROW_MAX_VALUES
    return 0 < m <= PLAIN * max(PLAIN_MAX_M, PLAIN_NARROW_MAX_M if narrow else 0)


def gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
         block: tuple[int, int] | None, bias: torch.Tensor | None = None,
         config: dict | None = None, gated: bool = False) -> torch.Tensor:
    """x[..., K] (a few rows) @ (weight * scale)[N, K]^T (+ bias) in x's dtype; weight e4m3
    (or int8 codes) with scale fp32 per row [N] (block None) or per (bn, bk) block (bn 1:
    each row its own column blocks, the int8 head copy's), or plain with scale None.
    config overrides choose_config's tiles (sweeps); gated: see gemv_gated.py (one row)."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    assert 0 < m <= MAX_ROWS and weight.stride(1) == 1, (x.shape, weight.shape)
    assert not gated or (m == 1 and block is None and n % 2 == 0), (x.shape, block)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    n_out = n // 2 if gated else n
    y = torch.empty(*x.shape[:-1], n_out, dtype=x.dtype, device=x.device)
    per_row = block is not None and block[0] == 1
    cfg = dict(config or choose_config(n, k, weight.element_size(), m, per_row))
    if per_row:  # a group's products share one scale: GROUP divides the block
        cfg["GROUP"] = min(cfg["GROUP"], block[1])
        assert block[1] % cfg["GROUP"] == 0, (block, cfg)
    elif block is not None:
        while block[0] % cfg["BLOCK_N"]:  # a program's rows inside one row block
            cfg["BLOCK_N"] //= 2
    s_bn, s_bk = block if block is not None else (1, 1)
    gdc = pdl.enabled(y) and (1 if PDL_EARLY_RELEASE else 2)
    grid = triton.cdiv(n, cfg["BLOCK_N"])
    cap = 0 if INTERPRET or not ONE_WAVE else one_wave_regs(grid, cfg["num_warps"],
                                                           _num_sms(y.device))
    _gemv_kernel[(grid,)](
        x2, weight, scale if scale is not None else x2, bias if bias is not None else x2, y,
        n_out, k, x2.stride(0), n_out, weight.stride(0),
        scale.stride(0) if block is not None else 0,
        ROW_SCALED=scale is not None and block is None,
        BLOCK_SCALED=block is not None and not per_row, GROUP_SCALED=per_row, SCALE_BN=s_bn,
        SCALE_BK=s_bk, HAS_BIAS=bias is not None, EVEN_K=k % cfg["BLOCK_K"] == 0, ROWS=m,
        GROUP=cfg["GROUP"], W_EVICT=cfg["W_EVICT"], W_VEC=cfg.get("W_VEC", 0),
        PEEL=bool(cfg.get("PEEL") or gdc),
        GDC=int(gdc), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], GATED=gated, **pdl.launch_kwargs(bool(gdc)),
        **({"maxnreg": cap} if cap else {}))
    return y
