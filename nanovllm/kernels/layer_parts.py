"""The layer kernel's parts (kernels/layer_kernel.py): the grid barrier (arrive, then wait;
optionally traced), the residual add + RMSNorm on chunks of a row, the matvec over weight
chunks and its epilogue, per-head q/k RMSNorm + RoPE rows, the key splits of a context, and
a layer's tensor found through the offsets table. Each rounds where the launch-per-op path
rounds."""
import triton
import triton.language as tl

from nanovllm.kernels._common import aligned


@triton.jit
def arrive(bar_ptr):
    """Count this program in at the grid barrier; the count so far, with this one. Each
    CTA's stores are issued before its thread 0 bumps the counter (release); the count's
    acquire lets the last program to arrive go on without polling. Loads the program issues
    between arrive and wait (the next phase's first weight chunk) fly while it waits."""
    tl.debug_barrier()
    return tl.atomic_add(bar_ptr, 1, sem="acq_rel") + 1


@triton.jit
def wait(bar_ptr, target, seen, TRACE: tl.constexpr = False):
    """Wait until the counter reaches target (seen: arrive's count), polling with acquire
    loads (which leave the counter's line to the arrivals); then every thread may read
    what the others stored. TRACE: record this program's clocks as it starts and stops
    waiting (_trace; tools/lk_trace.py reads them)."""
    addr = (bar_ptr + tl.zeros([1], tl.int32)).to(tl.int64)
    if TRACE:
        t0 = _clocks(addr)
    while seen < target:
        seen = tl.max(tl.inline_asm_elementwise(
            "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [addr], dtype=tl.int32,
            is_pure=False, pack=1), axis=0)
    tl.debug_barrier()
    if TRACE:
        _trace(bar_ptr, target, t0, _clocks(addr))


@triton.jit
def _clocks(addr):
    """(the SM's cycle counter, the GPU's nanosecond timer), low 32 bits each."""
    clock = tl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,l", [addr], dtype=tl.int32,
                                      is_pure=False, pack=1)
    ns = tl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r,l", [addr],
                                   dtype=tl.int32, is_pure=False, pack=1)
    return tl.max(clock, axis=0), tl.max(ns, axis=0)


@triton.jit
def _trace(bar_ptr, target, t0, t1):
    """Words 64 on of the barrier buffer, 4 per (barrier, program): the clock and the timer
    as the wait began, then as it ended (barrier b = target / programs - 1)."""
    nprog = tl.num_programs(0)
    slot = bar_ptr + 64 + 4 * ((target // nprog - 1) * nprog + tl.program_id(0))
    tl.store(slot, t0[0])
    tl.store(slot + 1, t0[1])
    tl.store(slot + 2, t1[0])
    tl.store(slot + 3, t1[1])


@triton.jit
def barrier(bar_ptr, target, TRACE: tl.constexpr = False):
    """The grid barrier alone: count in, then wait for target arrivals."""
    wait(bar_ptr, target, arrive(bar_ptr), TRACE)


@triton.jit
def chunk_across_barrier(bar_ptr, target, w_ptr, stride_w, rows, row_mask, K: tl.constexpr,
                         BLOCK_K: tl.constexpr, TAIL: tl.constexpr, PERSIST: tl.constexpr,
                         TRACE: tl.constexpr = False):
    """A matrix phase's first weight chunk and its narrow last one (first_chunks), requested
    between the grid barrier's arrival and its wait (weights do not depend on what the other
    programs wrote before it); without barriers (PERSIST off: a launch per phase), the
    chunks alone."""
    if PERSIST:
        seen = arrive(bar_ptr)
    w0, wt = first_chunks(w_ptr, stride_w, rows, row_mask, K, BLOCK_K, TAIL)
    if PERSIST:
        wait(bar_ptr, target, seen, TRACE)
    return w0, wt


@triton.jit
def first_chunks(w_ptr, stride_w, rows, row_mask, K: tl.constexpr, BLOCK_K: tl.constexpr,
                 TAIL: tl.constexpr):
    """(W[rows, :BLOCK_K], W[rows, K - K % BLOCK_K:] in TAIL columns): what matvec takes
    loaded (TAIL 0: no narrow last chunk, the first chunk twice)."""
    w0 = weight_chunk(w_ptr, stride_w, rows, row_mask, 0, K, BLOCK_K)
    if TAIL > 0:
        wt = weight_chunk(w_ptr, stride_w, rows, row_mask, K - K % BLOCK_K, K, TAIL)
    else:
        wt = w0
    return w0, wt


@triton.jit
def row_sumsq(x_ptr, r_ptr, K: tl.constexpr, BLOCK_K: tl.constexpr, HAS_R: tl.constexpr,
              DTYPE: tl.constexpr):
    """sum of h^2 over the row h = x (+ r, rounded to DTYPE)."""
    acc = tl.zeros([BLOCK_K], tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        h = h_chunk(x_ptr, r_ptr, offs, K, HAS_R, DTYPE)
        acc += h * h
    return tl.sum(acc, axis=0)


@triton.jit
def h_chunk(x_ptr, r_ptr, offs, K: tl.constexpr, HAS_R: tl.constexpr, DTYPE: tl.constexpr):
    """h = x (+ r) at offs, rounded to DTYPE as the unfused residual add does (fp32)."""
    mask = offs < K
    h = tl.load(x_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    if HAS_R:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        h = (h + r).to(DTYPE).to(tl.float32)
    return h


@triton.jit
def store_h(dst_ptr, x_ptr, r_ptr, K: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """dst = x + r over the row (h_chunk's rounding), a BLOCK_K chunk at a time."""
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        tl.store(dst_ptr + offs, h_chunk(x_ptr, r_ptr, offs, K, True, DTYPE), mask=offs < K)


@triton.jit
def x_chunk(x_ptr, r_ptr, g_ptr, rstd, offs, K: tl.constexpr, NORM: tl.constexpr,
            HAS_R: tl.constexpr, DTYPE: tl.constexpr):
    """A chunk of the matmul's input: x itself, or RMSNorm(x (+ r)) rounded as layernorm.py
    rounds ((h * rstd) to DTYPE, then its product with the weight)."""
    if NORM:
        h = h_chunk(x_ptr, r_ptr, offs, K, HAS_R, DTYPE)
        g = tl.load(g_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
        x = ((h * rstd).to(DTYPE).to(tl.float32) * g).to(DTYPE).to(tl.float32)
    else:
        x = tl.load(x_ptr + offs, mask=offs < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    return x


@triton.jit
def weight_chunk(w_ptr, stride_w, rows, row_mask, k0, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[rows, k0:k0 + BLOCK_K] as stored (zero where masked), read once (evicted first)."""
    offs = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_w + offs[None, :],
                   mask=row_mask[:, None] & (offs < K)[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def matvec(w0, wt, w_ptr, stride_w, rows, row_mask, x_ptr, r_ptr, g_ptr, rstd,
           K: tl.constexpr, BLOCK_K: tl.constexpr, TAIL: tl.constexpr, ROWS: tl.constexpr,
           NORM: tl.constexpr, HAS_R: tl.constexpr, DTYPE: tl.constexpr,
           GROUP: tl.constexpr):
    """W[rows] @ x over the whole K (fp32 [ROWS]). w0 and wt are its first chunk and, with
    TAIL, its narrow last one (first_chunks), which the caller loads early: before a grid
    barrier's wait or the norm's reduction, so their latency hides behind them. Without TAIL
    the last chunk is a whole one, masked past K. The K loop is unrolled, each chunk's
    successor requested before the chunk is used. e4m3 weights go to fp32 by Triton's cvt
    (through f16x2), not _common.e4m3_to_bf16's integer ops and a bf16 -> fp32 step: H200,
    Qwen3-0.6B shape, fp8 weights, batch 1, 834 -> 1,250 tok/s (mean of two rounds).
    GROUP > 1: each thread sums GROUP adjacent products at once, so the partial sums take
    1/GROUP of the registers."""
    K_FULL: tl.constexpr = K - (K % BLOCK_K) * (TAIL > 0)  # what the whole chunks cover
    acc = tl.zeros([ROWS, BLOCK_K // GROUP], tl.float32)
    w_next = w0
    for k0 in tl.static_range(0, K_FULL, BLOCK_K):
        w = w_next
        if k0 + BLOCK_K < K_FULL:
            w_next = weight_chunk(w_ptr, stride_w, rows, row_mask, k0 + BLOCK_K, K, BLOCK_K)
        x = x_chunk(x_ptr, r_ptr, g_ptr, rstd, k0 + tl.arange(0, BLOCK_K), K, NORM, HAS_R,
                    DTYPE)
        acc = _accumulate(acc, w, x, ROWS, BLOCK_K, GROUP)
    out = tl.sum(acc, axis=1)
    if TAIL > 0:
        x = x_chunk(x_ptr, r_ptr, g_ptr, rstd, K_FULL + tl.arange(0, TAIL), K, NORM, HAS_R,
                    DTYPE)
        out += tl.sum(_accumulate(tl.zeros([ROWS, TAIL // GROUP], tl.float32), wt, x, ROWS,
                                  TAIL, GROUP), axis=1)
    return out


@triton.jit
def matvec_x(w0, x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """W[rows] @ x for a K of one chunk (w0) with x already in registers (fp32 [BLOCK_K])."""
    acc = tl.zeros([ROWS, BLOCK_K // GROUP], tl.float32)
    return tl.sum(_accumulate(acc, w0, x, ROWS, BLOCK_K, GROUP), axis=1)


@triton.jit
def _accumulate(acc, w, x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """acc + a chunk's products w * x, GROUP adjacent ones summed at once (matvec)."""
    p = w.to(tl.float32) * x[None, :]
    if GROUP > 1:
        acc += tl.sum(tl.reshape(p, [ROWS, BLOCK_K // GROUP, GROUP]), axis=2)
    else:
        acc += p
    return acc


@triton.jit
def rope_rows(src_ptr, heads, head_mask, pos, cos_sin_ptr, w_ptr, eps, HD: tl.constexpr,
              HAS_NORM: tl.constexpr, DTYPE: tl.constexpr):
    """Rows [R, HD] of heads at src_ptr (head h at h * HD): per-head RMSNorm (optional) and
    RoPE in the rotate-half layout, rounded to DTYPE where triton_rope rounds; fp32."""
    HALF: tl.constexpr = HD // 2
    offs = tl.arange(0, HD)
    partner = (offs + HALF) % HD
    mask = head_mask[:, None]
    x = tl.load(src_ptr + heads[:, None] * HD + offs[None, :], mask=mask, other=0.0,
                cache_modifier=".cg").to(tl.float32)
    y = tl.load(src_ptr + heads[:, None] * HD + partner[None, :], mask=mask, other=0.0,
                cache_modifier=".cg").to(tl.float32)
    if HAS_NORM:
        r = (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HD + eps))[:, None]
        wx = tl.load(w_ptr + offs).to(tl.float32)[None, :]
        wy = tl.load(w_ptr + partner).to(tl.float32)[None, :]
        x = ((x * r).to(DTYPE).to(tl.float32) * wx).to(DTYPE).to(tl.float32)
        y = ((y * r).to(DTYPE).to(tl.float32) * wy).to(DTYPE).to(tl.float32)
    cs = cos_sin_ptr + pos * HD
    cos = tl.load(cs + offs % HALF)[None, :]
    sin = tl.load(cs + HALF + offs % HALF)[None, :]
    # rotate_half: the first half takes -partner, the second +partner.
    sign = tl.where(offs < HALF, -1.0, 1.0)[None, :]
    return x * cos + sign * y * sin


@triton.jit
def epilogue(out, rows, mask, s_ptr, b_ptr, y_ptr, W_SCALE: tl.constexpr,
              HAS_BIAS: tl.constexpr):
    """y[rows] = out (times fp8 row scales) (+ bias), rounded once to y's dtype."""
    if W_SCALE:
        out *= tl.load(s_ptr + rows, mask=mask, other=0.0)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layer_at(base, off_ptr, layer, COL: tl.constexpr, NOFF: tl.constexpr,
        ALIGNED: tl.constexpr = True):
    """base moved to a layer's tensor: base + off[layer, COL] elements (ALIGNED: the host
    checks that each is a whole number of 16-byte steps, so the loads stay vectorized)."""
    EB: tl.constexpr = base.dtype.element_ty.primitive_bitwidth // 8
    off = tl.load(off_ptr + layer * NOFF + COL)
    if ALIGNED:
        off = aligned(off, 16 // EB)
    return base + off
