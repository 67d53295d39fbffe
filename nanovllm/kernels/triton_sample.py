"""Fused temperature sampling on GPU: one pass over the logits (Gumbel-max trick).

argmax(logits / T + Gumbel noise) is a sample from softmax(logits / T). Doing it in one kernel
reads the [batch, vocab] logits once, instead of the ~6 full passes (upcast, scale, softmax,
noise, divide, argmax) the torch version makes: ~0.3 ms a step at batch 256 on an H100.
At larger batches (TWO_LEVEL_FROM, below) the noise is drawn for one slice of the vocabulary a
row, picked from the slices' log-sum-exps: the same distribution for less compute.
"""
import torch
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET


@triton.jit
def _log2(x, HW: tl.constexpr):
    """log2(x): on the GPU, the hardware's approximate instruction (absolute error up to
    2^-22 on [0.5, 2], 2 ulp elsewhere: see _neg_log2); libdevice's exact log2f/logf are
    ~30-instruction polynomials, two per logit, which made the whole sampler compute-bound.
    The interpreter (no PTX) takes tl.log2."""
    if HW:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return tl.log2(x)


@triton.jit
def _neg_log2(u, HW: tl.constexpr):
    """-log2(u) for u in [0, 1), to a small relative error everywhere. Near u = 1 it nears 0,
    where lg2.approx's absolute error (up to 2^-22 on [0.5, 2]) would swamp it, and a row of
    151,936 uniforms has one within 2^-21 of 1 7% of the time. So for u > 1 - 2^-6, with
    w = 1 - u (exact), the series -ln(1 - w) = w + w^2/2 + ... + w^5/5 (truncated at under
    w^5/6 relative) in base 2; below, lg2.approx errs by at most ~1e-5 relative."""
    w = 1.0 - u
    series = w * (1.0 + w * (0.5 + w * (0.33333334 + w * (0.25 + w * 0.2))))
    return tl.where(w < 0.015625, series * 1.4426950408889634, -_log2(u, HW))


@triton.jit
def _fold(best, best_idx, logits_ptr, row, cols, vocab, stride_b, scale, greedy, u,
          HW: tl.constexpr):
    """Fold one quarter-block of scores into the running (max, argmax)."""
    mask = cols < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_b + cols, mask=mask,
                other=float("-inf")).to(tl.float32)
    # The Gumbel score x / T - ln(-ln u), times log2(e), less the constant log2(ln 2): the
    # same argmax, in base 2. u == 0 gives -inf, which can never win.
    score = tl.where(greedy, x, x * scale - _log2(_neg_log2(u, HW), HW))
    score = tl.where(mask, score, float("-inf"))
    # Strictly greater: an earlier (lower) index keeps a tie.
    take = score > best
    return tl.where(take, score, best), tl.where(take, cols, best_idx)


@triton.jit(do_not_specialize=["seed"])
def _gumbel_argmax_kernel(logits_ptr, temp_ptr, max_ptr, idx_ptr, seed, seed_ptr, vocab,
                          stride_b, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                          NUM_CHUNKS: tl.constexpr, SEED_PTR: tl.constexpr,
                          HW: tl.constexpr):
    # Program = (row, chunk of the vocabulary): a partial (max, argmax) per chunk.
    if SEED_PTR:  # the seed from device memory (a CUDA graph's replays: a new one each)
        seed = tl.load(seed_ptr)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    greedy = temp == 0
    scale = 1.4426950408889634 / tl.where(greedy, 1.0, temp)  # log2(e) / T
    Q: tl.constexpr = BLOCK // 4
    best = tl.full([Q], float("-inf"), tl.float32)
    best_idx = tl.zeros([Q], tl.int32)
    lo = chunk * CHUNK
    for off in range(lo, lo + CHUNK, BLOCK):
        # One Philox call yields four uniforms: one per quarter of the block. Offsets
        # row * vocab + off / 4 + j are distinct for every (row, block, j).
        j = tl.arange(0, Q)
        u0, u1, u2, u3 = tl.rand4x(seed, row.to(tl.int64) * vocab + off // 4 + j)
        best, best_idx = _fold(best, best_idx, logits_ptr, row, off + j, vocab, stride_b,
                               scale, greedy, u0, HW)
        best, best_idx = _fold(best, best_idx, logits_ptr, row, off + Q + j, vocab, stride_b,
                               scale, greedy, u1, HW)
        best, best_idx = _fold(best, best_idx, logits_ptr, row, off + 2 * Q + j, vocab,
                               stride_b, scale, greedy, u2, HW)
        best, best_idx = _fold(best, best_idx, logits_ptr, row, off + 3 * Q + j, vocab,
                               stride_b, scale, greedy, u3, HW)
    m = tl.max(best, 0)
    # Lowest index among the maxima keeps greedy ties deterministic.
    i = tl.min(tl.where(best == m, best_idx, 2147483647), 0)
    tl.store(max_ptr + row * NUM_CHUNKS + chunk, m)
    tl.store(idx_ptr + row * NUM_CHUNKS + chunk, i)


@triton.jit
def _pick_kernel(max_ptr, idx_ptr, out_ptr, seed_ptr, NUM_CHUNKS: tl.constexpr,
                 NC_POW2: tl.constexpr, BUMP: tl.constexpr):
    # Program = row: the chunk with the largest partial max (the first of equals), its id.
    row = tl.program_id(0)
    if BUMP and row == 0:  # every draw has read the seed: the next step's, here (no launch)
        tl.store(seed_ptr, tl.load(seed_ptr) + 1)
    c = tl.arange(0, NC_POW2)
    m = tl.load(max_ptr + row * NUM_CHUNKS + c, mask=c < NUM_CHUNKS, other=float("-inf"))
    first = tl.min(tl.where(m == tl.max(m, 0), c, NC_POW2), 0)
    best = tl.load(idx_ptr + row * NUM_CHUNKS + first)
    tl.store(out_ptr + row, best.to(out_ptr.dtype.element_ty))


def sample_temperature(logits: torch.Tensor, temperatures: torch.Tensor,
                       seed: int | torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids [B] (int64, or into `out`): argmax for rows with T == 0, a softmax(logits /
    T) sample otherwise. seed: an int, or a one-element int32 device tensor, which the
    kernels read and then bump by one (a CUDA graph's replays each draw anew)."""
    batch, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if batch * triton.cdiv(vocab, SLICE) >= TWO_LEVEL_FROM:
        return sample_two_level(logits, temperatures, seed, out)
    # Four quarters of 1024 lanes per iteration: as wide as one 1024-lane pass per uniform,
    # with a quarter of the Philox work. At small batch, narrower blocks and more chunks
    # fill the GPU (H100, batch 1, Qwen3's 151,936 logits: 16 chunks of 4096-wide blocks
    # took 11.8 us).
    block = 4096 if batch >= 8 else 1024
    num_chunks = 4 if batch >= 64 else 16 if batch >= 8 else 128
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block) * block
    num_chunks = triton.cdiv(vocab, chunk)
    part_max = torch.empty(batch, num_chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(batch, num_chunks, dtype=torch.int32, device=logits.device)
    _gumbel_argmax_kernel[(batch, num_chunks)](
        logits, temperatures, part_max, part_idx, seed if isinstance(seed, int) else 0,
        seed if isinstance(seed, torch.Tensor) else temperatures, vocab, logits.stride(0),
        CHUNK=chunk, BLOCK=block, NUM_CHUNKS=num_chunks, SEED_PTR=isinstance(seed, torch.Tensor),
        HW=not INTERPRET, num_warps=4)
    if out is None:
        out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    bump = isinstance(seed, torch.Tensor)
    _pick_kernel[(batch,)](part_max, part_idx, out, seed if bump else part_idx,
                           NUM_CHUNKS=num_chunks, NC_POW2=triton.next_power_of_2(num_chunks),
                           BUMP=bump, num_warps=1)
    return out


# Sample in two levels (sample_two_level) instead of one Gumbel-max pass over every logit once
# the first level has this many programs (rows x slices). H200, µs a call in a graph, one- vs
# two-level: 151,936 logits batch 1 5.2 vs 6.1, batch 8 8.3 vs 7.0, batch 256 82.5 vs 35.6;
# 49,152 logits batch 8 5.8 vs 6.5, batch 64 10.7 vs 8.2 (tools/bench_sampler.py).
TWO_LEVEL_FROM = 256
# Logits a first-level program reads (one tile in registers: its max, then its exp sum).
SLICE = 4096


@triton.jit
def _slice_stats_kernel(logits_ptr, temp_ptr, lse_ptr, idx_ptr, seed_ptr, seed_copy_ptr,
                        vocab, stride_b, NUM_SLICES: tl.constexpr, SLICE: tl.constexpr,
                        SEED_PTR: tl.constexpr):
    # Program = (row, slice): the slice's log2-sum-exp2 of logits * log2(e) / T (a greedy
    # row: its max logit) and its argmax. No random numbers: this pass is loads and one exp2
    # a logit.
    row = tl.program_id(0)
    sl = tl.program_id(1)
    if SEED_PTR and row == 0 and sl == 0:  # the second level's seed; the next step's bumped
        s = tl.load(seed_ptr)
        tl.store(seed_copy_ptr, s)
        tl.store(seed_ptr, s + 1)
    temp = tl.load(temp_ptr + row)
    greedy = temp == 0
    scale = 1.4426950408889634 / tl.where(greedy, 1.0, temp)
    cols = sl * SLICE + tl.arange(0, SLICE)
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_b + cols, mask=cols < vocab,
                other=float("-inf")).to(tl.float32)
    score = tl.where(greedy, x, x * scale)
    m = tl.max(score, 0)
    i = tl.min(tl.where(score == m, cols, 2147483647), 0)  # the first of equal maxima
    lse = m + tl.log2(tl.sum(tl.exp2(score - m), 0))
    # A slice masked whole (-inf, e.g. by a grammar): -inf, never drawn (not NaN).
    tl.store(lse_ptr + row * NUM_SLICES + sl, tl.where(greedy | (m == float("-inf")), m, lse))
    tl.store(idx_ptr + row * NUM_SLICES + sl, i)


@triton.jit(do_not_specialize=["seed"])
def _slice_pick_kernel(logits_ptr, temp_ptr, lse_ptr, idx_ptr, out_ptr, seed, seed_ptr, vocab,
                       stride_b, NUM_SLICES: tl.constexpr, NS_POW2: tl.constexpr,
                       SLICE: tl.constexpr, SEED_PTR: tl.constexpr, HW: tl.constexpr):
    # Program = row: a slice drawn by the Gumbel-max trick over the slices' log-sum-exps
    # (P(slice) = its share of the softmax mass), then a token within it by the Gumbel-max
    # trick over its logits (P(token | slice) = its share of the slice's): together exactly
    # softmax(logits / T). A greedy row takes the slice with the largest max (the first of
    # equals), whose argmax is the row's first.
    if SEED_PTR:
        seed = tl.load(seed_ptr)
    row = tl.program_id(0)
    temp = tl.load(temp_ptr + row)
    greedy = temp == 0
    c = tl.arange(0, NS_POW2)
    lse = tl.load(lse_ptr + row * NUM_SLICES + c, mask=c < NUM_SLICES, other=float("-inf"))
    # The slices' uniforms: another Philox key than the tokens', so the two draws are
    # independent (a row's token offsets are row * vocab + k, as in the one-level kernel).
    u = tl.rand(seed ^ 0x5BD1E995, row.to(tl.int64) * NS_POW2 + c)
    score = tl.where(greedy, lse, lse - _log2(_neg_log2(u, HW), HW))
    best = tl.max(score, 0)
    sl = tl.min(tl.where(score == best, c, NS_POW2), 0)
    if greedy:
        token = tl.load(idx_ptr + row * NUM_SLICES + sl)
    else:
        scale = 1.4426950408889634 / temp
        Q: tl.constexpr = SLICE // 4
        j = tl.arange(0, Q)
        lo = sl * SLICE
        u0, u1, u2, u3 = tl.rand4x(seed, row.to(tl.int64) * vocab + lo // 4 + j)
        top = tl.full([Q], float("-inf"), tl.float32)
        top_idx = tl.zeros([Q], tl.int32)
        top, top_idx = _fold(top, top_idx, logits_ptr, row, lo + j, vocab, stride_b, scale,
                             False, u0, HW)
        top, top_idx = _fold(top, top_idx, logits_ptr, row, lo + Q + j, vocab, stride_b, scale,
                             False, u1, HW)
        top, top_idx = _fold(top, top_idx, logits_ptr, row, lo + 2 * Q + j, vocab, stride_b,
                             scale, False, u2, HW)
        top, top_idx = _fold(top, top_idx, logits_ptr, row, lo + 3 * Q + j, vocab, stride_b,
                             scale, False, u3, HW)
        m = tl.max(top, 0)
        token = tl.min(tl.where(top == m, top_idx, 2147483647), 0)
    tl.store(out_ptr + row, token.to(out_ptr.dtype.element_ty))


def sample_two_level(logits: torch.Tensor, temperatures: torch.Tensor,
                     seed: int | torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """sample_temperature's draw in two levels: the vocabulary in SLICE-wide slices, their
    log-sum-exps in one pass (an exp2 a logit, no random numbers), then per row a slice and a
    token within it by the Gumbel-max trick (random numbers for one slice a row, not the
    whole vocabulary). The same distribution as the one-level kernel, other draws."""
    batch, vocab = logits.shape
    slices = triton.cdiv(vocab, SLICE)
    lse = torch.empty(batch, slices, dtype=torch.float32, device=logits.device)
    idx = torch.empty(batch, slices, dtype=torch.int32, device=logits.device)
    by_ptr = isinstance(seed, torch.Tensor)
    copy = torch.empty(1, dtype=torch.int32, device=logits.device) if by_ptr else idx
    if out is None:
        out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    _slice_stats_kernel[(batch, slices)](
        logits, temperatures, lse, idx, seed if by_ptr else idx, copy, vocab,
        logits.stride(0), NUM_SLICES=slices, SLICE=SLICE, SEED_PTR=by_ptr, num_warps=8)
    _slice_pick_kernel[(batch,)](
        logits, temperatures, lse, idx, out, 0 if by_ptr else seed, copy, vocab,
        logits.stride(0), NUM_SLICES=slices, NS_POW2=triton.next_power_of_2(slices),
        SLICE=SLICE, SEED_PTR=by_ptr, HW=not INTERPRET, num_warps=4)
    return out
