"""The GEMV's pieces (kernels/gemv.py): a W tile's load and its products with each row of x,
widened, scaled and grouped into the rows' fp32 accumulators."""
import triton
import triton.language as tl


@triton.jit
def row_products(w, x_ptr, k0, offs_k, mask_k, scale_k, scale_g, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_SCALED: tl.constexpr, GROUP_SCALED: tl.constexpr):
    """One row of x's K tile times the widened W tile, GROUP adjacent products summed (in
    each thread's registers: a smaller accumulator, so fewer registers a program), and
    scaled per group where each row has its own column blocks."""
    if EVEN_K:
        x = tl.load(x_ptr + k0 + offs_k).to(tl.float32)
    else:
        x = tl.load(x_ptr + k0 + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if BLOCK_SCALED:
        x *= scale_k
    p = w * x[None, :]
    if GROUP > 1:
        p = tl.sum(tl.reshape(p, [BLOCK_N, BLOCK_K // GROUP, GROUP]), 2)
    if GROUP_SCALED:
        p *= scale_g
    return p


@triton.jit
def load_w(w_rows, k0, offs_k, mask_n, K, EVEN_K: tl.constexpr, W_EVICT: tl.constexpr):
    """W's tile at k0. W is read once: evict-first keeps x (read by every program) in L2."""
    if EVEN_K:
        return tl.load(w_rows + k0, mask=mask_n[:, None], other=0.0, eviction_policy=W_EVICT)
    return tl.load(w_rows + k0, mask=mask_n[:, None] & (k0 + offs_k < K)[None, :], other=0.0,
                   eviction_policy=W_EVICT)


@triton.jit
def tile_sums(w, k0, acc0, acc1, acc2, acc3, x_ptr, stride_xm, offs_k, offs_g, mask_n, K,
              s_row, s_groups, BLOCK_SCALED: tl.constexpr, GROUP_SCALED: tl.constexpr,
              SCALE_BK: tl.constexpr, EVEN_K: tl.constexpr, ROWS: tl.constexpr,
              GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W's loaded tile at k0, widened and scaled, times each row of x, into its accumulator."""
    mask_k = k0 + offs_k < K
    if w.dtype == tl.int8:  # 1.5 * 2^23 + c is exact: an add, not a quarter-rate I2F
        w = (w.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
    else:
        w = w.to(tl.float32)
    scale_k = 1.0
    if BLOCK_SCALED:
        scale_k = tl.load(s_row + (k0 + offs_k) // SCALE_BK, mask=mask_k, other=0.0)
    scale_g = 1.0
    if GROUP_SCALED:
        scale_g = tl.load(s_groups + (k0 + offs_g[None, :]) // SCALE_BK,
                          mask=mask_n[:, None] & (k0 + offs_g[None, :] < K), other=0.0)
    acc0 += row_products(w, x_ptr, k0, offs_k, mask_k, scale_k, scale_g, BLOCK_N, BLOCK_K,
                         GROUP, EVEN_K, BLOCK_SCALED, GROUP_SCALED)
    if ROWS > 1:
        acc1 += row_products(w, x_ptr + stride_xm, k0, offs_k, mask_k, scale_k, scale_g,
                             BLOCK_N, BLOCK_K, GROUP, EVEN_K, BLOCK_SCALED, GROUP_SCALED)
    if ROWS > 2:
        acc2 += row_products(w, x_ptr + 2 * stride_xm, k0, offs_k, mask_k, scale_k, scale_g,
                             BLOCK_N, BLOCK_K, GROUP, EVEN_K, BLOCK_SCALED, GROUP_SCALED)
    if ROWS > 3:
        acc3 += row_products(w, x_ptr + 3 * stride_xm, k0, offs_k, mask_k, scale_k, scale_g,
                             BLOCK_N, BLOCK_K, GROUP, EVEN_K, BLOCK_SCALED, GROUP_SCALED)
    return acc0, acc1, acc2, acc3

