"""Every dense decoder layer of a batch-1 decode step in one persistent Triton launch.

At batch 1 a layer is ~10 kernels, each moving a few megabytes at most: their launch, ramp
and tail cost more than their bytes (docs/PERF_NOTES.md: ~37 us a layer of Qwen3-0.6B for
~10 us of weight reads). Here one program per SM (layer_launch.py, the host side) runs each
layer's five phases in turn, layer after layer, separated by grid-wide barriers (an atomic
counter every program bumps, then polls; the grid is what the SMs hold at once):

  A  h = x + residual, RMSNorm (each program on the whole row: a few KB), qkv rows
  B  per (kv head, key split): q/k norm and RoPE, the new K/V into the paged cache (by the
     split that holds the new key), attention over the split, combined by the last split of
     a kv head (decode_reduce.split_done) or, up to C_SPLITS splits, by phase C's programs.
     NEW_APART: the new key a split of its own. PRE_KV: a split's one tile requested before
     the A -> B barrier's wait. An fp8 cache (KV_FP8) gets the codes the fused RoPE store
     writes (layer_attn.py: scales, Hadamard mixing (MIX), K's error feedback (FEEDBACK)).
  C  o_proj rows
  D  h2 = o + h, RMSNorm, gate and up rows side by side, SiLU-and-mul
  E  down rows -> the layer's output (h2 is the next residual)

Each matrix phase gives each program ceil(N / programs) whole rows over the full K (no
split-K partials); its first weight chunk is requested between the barrier's arrival and
its wait. Values are rounded to the model dtype where the unfused path rounds, so the two
paths differ only by summation order. Layers find their tensors through a table of offsets
from the first layer's (layer_launch.stack_layers): one compiled variant, any layer count.

PHASE >= 0 runs one phase of one layer per launch without barriers: the interpreter (which
runs programs one after another, so a barrier would wait forever) and tests take that path.
"""
import triton
import triton.language as tl

from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.decode_reduce import combine_all, split_done
from nanovllm.kernels.decode_tiles import attend_one_tile, attend_tiles
from nanovllm.kernels.gemm_prologue import rstd
from nanovllm.kernels.layer_attn import (key_splits, old_keys_tile, queries, split_range,
                                        store_new_kv)
from nanovllm.kernels.layer_parts import (arrive, barrier, chunk_across_barrier, epilogue,
                                          first_chunks, layer_at, matvec, matvec_x, row_sumsq,
                                          store_h, wait)
from nanovllm.kernels.triton_feedback import prefetch_rows

ALL_PHASES = -1
NUM_PHASES = 5
# Keys per attention tile (the decode kernel's).
BLOCK_N = 16 if INTERPRET else 64


@triton.jit
def _layers_kernel(
    x_ptr, res_ptr, h_ptr, res_out_ptr, y_ptr,
    qkv_ptr, po_ptr, lse_ptr, o_ptr, ao_ptr, act_ptr,
    w_in_ptr, w_qkv_ptr, b_qkv_ptr, qn_ptr, kn_ptr, w_o_ptr, b_o_ptr, w_post_ptr, w_gu_ptr,
    w_down_ptr, s_qkv_ptr, s_o_ptr, s_gu_ptr, s_down_ptr, k_cache_ptr, v_cache_ptr,
    k_scale_ptr, v_scale_ptr, fb_ptr, off_ptr,
    first, count, cos_sin_ptr, pos_ptr, slot_ptr, ctx_ptr, bt_ptr,
    stride_kblk, stride_kslot, bar_ptr, cnt_ptr, eps, qk_scale,
    D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, I: tl.constexpr,
    R_QKV: tl.constexpr, RP_QKV: tl.constexpr, R_O: tl.constexpr, RP_O: tl.constexpr,
    R_GU: tl.constexpr, RP_GU: tl.constexpr, R_DOWN: tl.constexpr, RP_DOWN: tl.constexpr,
    BK_A: tl.constexpr, BK_D: tl.constexpr, BK_Q: tl.constexpr, BK_I: tl.constexpr,
    TAIL_A: tl.constexpr, TAIL_D: tl.constexpr, TAIL_Q: tl.constexpr, TAIL_I: tl.constexpr,
    QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr,
    QK_NORM: tl.constexpr, SPLITS: tl.constexpr, G_PAD: tl.constexpr, RED_GP: tl.constexpr,
    RED_CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr, PHASE: tl.constexpr, NOFF: tl.constexpr,
    WORK: tl.constexpr, W_SCALE: tl.constexpr,
    GROUP: tl.constexpr, KV_FP8: tl.constexpr, MIX: tl.constexpr, LOG2_HALF: tl.constexpr,
    FEEDBACK: tl.constexpr, FB_G: tl.constexpr, FMAX: tl.constexpr, MANT: tl.constexpr,
    BIAS: tl.constexpr, SOFT: tl.constexpr, FP16_QK: tl.constexpr, FB_PREFETCH: tl.constexpr,
    FB_ASM: tl.constexpr, FB_AHEAD: tl.constexpr, NEW_APART: tl.constexpr, TRACE: tl.constexpr,
    C_SPLITS: tl.constexpr, PRE_KV: tl.constexpr, V_WORDS: tl.constexpr, V_TILE: tl.constexpr,
    V_LAST: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    G: tl.constexpr = HQ // HKV
    NQKV: tl.constexpr = (HQ + 2 * HKV) * HD
    PERSIST: tl.constexpr = PHASE < 0
    # The step's metadata, read once (the attention phase needs it after the first barrier).
    ctx = tl.load(ctx_ptr)
    pos = tl.load(pos_ptr).to(tl.int64)
    split_len, n_valid = key_splits(ctx, SPLITS, BLOCK_N, NEW_APART)
    # Each program's qkv rows, the same in every layer; the first layer's first weight chunk
    # and its norm weight, requested now. Later layers' come during the barrier before them.
    rows_a = pid * R_QKV + tl.arange(0, RP_QKV)
    mask_a = (rows_a < NQKV) & (tl.arange(0, RP_QKV) < R_QKV)
    w_in = layer_at(w_in_ptr, off_ptr, first, 0, NOFF)
    w_qkv = layer_at(w_qkv_ptr, off_ptr, first, 1, NOFF)
    w0_a, wt_a = first_chunks(w_qkv, D, rows_a, mask_a, D, BK_A, TAIL_A)
    last = first + count - 1
    for layer in range(first, first + count):
        bar0 = 5 * (layer - first) * nprog  # the counter's value as this layer begins
        # The layer's other tensors: their offsets load while phase A runs.
        b_qkv = layer_at(b_qkv_ptr, off_ptr, layer, 2, NOFF)
        s_qkv = layer_at(s_qkv_ptr, off_ptr, layer, 10, NOFF)
        q_norm = layer_at(qn_ptr, off_ptr, layer, 3, NOFF)
        k_norm = layer_at(kn_ptr, off_ptr, layer, 4, NOFF)
        k_cache = layer_at(k_cache_ptr, off_ptr, layer, 14, NOFF)
        v_cache = layer_at(v_cache_ptr, off_ptr, layer, 15, NOFF)
        k_scale = layer_at(k_scale_ptr, off_ptr, layer, 16, NOFF, False)
        v_scale = layer_at(v_scale_ptr, off_ptr, layer, 17, NOFF, False)
        k_fb = layer_at(fb_ptr, off_ptr, layer, 18, NOFF)
        if FEEDBACK and FB_PREFETCH:
            # The program that will store kv head h's new key (phase B's item (h, last
            # split)) asks for h's feedback rows now: the layers' weights stream through L2
            # between steps, and each of the rounding chain's steps waits on its rows.
            h = ((pid - (n_valid - 1) * HKV) % nprog + nprog) % nprog
            if h < HKV:
                prefetch_rows(k_fb + h * (HD * FB_G), HD * FB_G, HD * FB_G)
        w_o = layer_at(w_o_ptr, off_ptr, layer, 5, NOFF)
        b_o = layer_at(b_o_ptr, off_ptr, layer, 6, NOFF)
        s_o = layer_at(s_o_ptr, off_ptr, layer, 11, NOFF)
        w_post = layer_at(w_post_ptr, off_ptr, layer, 7, NOFF)
        w_gu = layer_at(w_gu_ptr, off_ptr, layer, 8, NOFF)
        s_gu = layer_at(s_gu_ptr, off_ptr, layer, 12, NOFF)
        w_down = layer_at(w_down_ptr, off_ptr, layer, 9, NOFF)
        s_down = layer_at(s_down_ptr, off_ptr, layer, 13, NOFF)
        # The first layer reads the launch's input; later ones the previous layer's output.
        x_in = tl.where(layer == first, x_ptr, y_ptr)
        r_in = tl.where(layer == first, res_ptr, res_out_ptr)

        # -- A: h = x + residual; qkv = RMSNorm(h) @ W_qkv^T --------------------------------
        if (PHASE < 0 or PHASE == 0) and WORK:
            inv = rstd(row_sumsq(x_in, r_in, D, BK_A, True, DTYPE), D, eps)
            if pid == 0:  # h, the residual the attention output is added to
                store_h(h_ptr, x_in, r_in, D, BK_A, DTYPE)
            out = matvec(w0_a, wt_a, w_qkv, D, rows_a, mask_a, x_in, r_in, w_in, inv, D, BK_A,
                         TAIL_A, RP_QKV, True, True, DTYPE, GROUP)
            epilogue(out, rows_a, mask_a, s_qkv, b_qkv, qkv_ptr, W_SCALE, QKV_BIAS)
        if PERSIST:
            seen = arrive(bar_ptr)
        if PRE_KV and (PHASE < 0 or PHASE == 1) and WORK:
            # This program's first split, when one tile: its old keys do not depend on phase
            # A, so they are requested before the wait, into registers (PRE_KV 1; the new key
            # joins them there) or into L2 (2).
            k_pre, v_pre = old_keys_tile(k_cache, v_cache, bt_ptr, pid, ctx, split_len, n_valid,
                                         stride_kblk, stride_kslot, HKV, HD, BLOCK_SIZE,
                                         BLOCK_N, PRE_KV == 2)
        if PERSIST:
            wait(bar_ptr, bar0 + nprog, seen, TRACE)

        # -- B: norms, RoPE, K/V store, attention over one key split, combine --------------
        if (PHASE < 0 or PHASE == 1) and WORK:
            for item in range(pid, HKV * SPLITS, nprog):
                kvh = item % HKV  # a token's kv heads side by side: whole cache rows a wave
                s = item // HKV
                start, end = split_range(s, split_len, n_valid, ctx, NEW_APART)
                if start < end:  # (none at ctx 0: the warm-up's stand-ins)
                    pre_tile = (item == pid) & (split_len == BLOCK_N) & (PRE_KV == 1)
                    heads, g_mask = kvh * G + tl.arange(0, G_PAD), tl.arange(0, G_PAD) < G
                    k_new, v_new = store_new_kv(
                        qkv_ptr, kvh, s == n_valid - 1, pre_tile == 0, slot_ptr, stride_kslot,
                        pos, cos_sin_ptr, k_norm, eps, k_cache, v_cache, k_scale, v_scale,
                        k_fb, HQ, HKV, HD, QK_NORM, DTYPE, KV_FP8, MIX, LOG2_HALF, FEEDBACK,
                        FB_ASM, FB_G, FMAX, MANT, BIAS, SOFT, DOT_PREC, BLOCK_SIZE, V_TILE,
                        FB_AHEAD)
                    q, scale = queries(qkv_ptr, heads, g_mask, pos, cos_sin_ptr, q_norm, eps,
                                       qk_scale, k_scale, kvh, HD, QK_NORM, DTYPE, KV_FP8, MIX,
                                       LOG2_HALF, FP16_QK, DOT_PREC)
                    if PRE_KV == 1 and pre_tile:
                        keys = start + tl.arange(0, BLOCK_N)
                        new = (keys == ctx - 1)[:, None]
                        acc, m_i, l_i = attend_one_tile(
                            q, tl.where(new, k_new, k_pre), tl.where(new, v_new, v_pre),
                            keys < end, scale, DOT_PREC)
                    else:
                        acc, m_i, l_i = attend_tiles(
                            q, k_cache, v_cache, k_cache, k_cache, bt_ptr, kvh * HD, start,
                            end, scale, stride_kblk, stride_kslot, 0, 0, G_PAD, HD,
                            BLOCK_SIZE, BLOCK_N, BLOCK_SIZE % BLOCK_N == 0, True, DOT_PREC,
                            KV_FP8, False, q.dtype, False, V_WORDS, V_TILE, V_LAST)
                    part = acc / l_i[:, None]
                    if KV_FP8:  # V's scale, once on the output
                        part = part * tl.load(v_scale + kvh)
                    po = (po_ptr + heads[:, None] * (SPLITS * HD) + s * HD
                          + tl.arange(0, HD)[None, :])
                    tl.store(po, part, mask=g_mask[:, None])
                    tl.store(lse_ptr + heads * SPLITS + s, m_i + tl.log2(l_i), mask=g_mask)
                    if C_SPLITS == 0 or n_valid > C_SPLITS:  # else phase C combines
                        split_done(po_ptr, lse_ptr, o_ptr, cnt_ptr, 0, kvh, n_valid, n_valid,
                                   0, SPLITS * HD, HD, 0, SPLITS, 0, HD, HKV, G, RED_GP,
                                   RED_CHUNK, HD)

        # -- C: o_proj ------------------------------------------------------------------------
        if (PHASE < 0 or PHASE == 2) and WORK:
            rows = pid * R_O + tl.arange(0, RP_O)
            mask = (rows < D) & (tl.arange(0, RP_O) < R_O)
            w0, wt = chunk_across_barrier(bar_ptr, bar0 + 2 * nprog, w_o, HQ * HD, rows, mask,
                                          HQ * HD, BK_Q, TAIL_Q, PERSIST, TRACE)
            # (o_rows, not out: a run-time branch's result may not reshape phase A's out.)
            if C_SPLITS > 0 and n_valid <= C_SPLITS:  # one K chunk; the splits combined here
                x = combine_all(po_ptr, lse_ptr, n_valid, HQ, BK_Q // HD, SPLITS, C_SPLITS, HD,
                                DTYPE)
                o_rows = matvec_x(w0, x, RP_O, BK_Q, GROUP)
            else:
                o_rows = matvec(w0, wt, w_o, HQ * HD, rows, mask, o_ptr, o_ptr, o_ptr, 1.0,
                                HQ * HD, BK_Q, TAIL_Q, RP_O, False, False, DTYPE, GROUP)
            epilogue(o_rows, rows, mask, s_o, b_o, ao_ptr, W_SCALE, O_BIAS)
        elif PERSIST:
            barrier(bar_ptr, bar0 + 2 * nprog, TRACE)

        # -- D: h2 = o + h; act = silu(gate) * up of RMSNorm(h2) ------------------------------
        if (PHASE < 0 or PHASE == 3) and WORK:
            # Rows interleaved gate, up, gate, up...: one matvec, split apart afterwards.
            j = tl.arange(0, 2 * RP_GU)
            pair = pid * R_GU + j // 2
            rows = pair + (j % 2) * I
            mask = (pair < I) & (j // 2 < R_GU)
            w0, wt = chunk_across_barrier(bar_ptr, bar0 + 3 * nprog, w_gu, D, rows, mask, D,
                                          BK_D, TAIL_D, PERSIST, TRACE)
            inv = rstd(row_sumsq(ao_ptr, h_ptr, D, BK_D, True, DTYPE), D, eps)
            if pid == 0:  # h2: the next layer's residual
                store_h(res_out_ptr, ao_ptr, h_ptr, D, BK_D, DTYPE)
            out = matvec(w0, wt, w_gu, D, rows, mask, ao_ptr, h_ptr, w_post, inv, D, BK_D,
                         TAIL_D, 2 * RP_GU, True, True, DTYPE, GROUP)
            if W_SCALE:
                out *= tl.load(s_gu + rows, mask=mask, other=0.0)
            gate, up = tl.split(tl.reshape(out.to(DTYPE).to(tl.float32), [RP_GU, 2]))
            act = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
            cols = pid * R_GU + tl.arange(0, RP_GU)
            tl.store(act_ptr + cols, (act * up).to(DTYPE),
                     mask=(cols < I) & (tl.arange(0, RP_GU) < R_GU))
        elif PERSIST:
            barrier(bar_ptr, bar0 + 3 * nprog, TRACE)

        # -- E: down_proj ---------------------------------------------------------------------
        if (PHASE < 0 or PHASE == 4) and WORK:
            rows = pid * R_DOWN + tl.arange(0, RP_DOWN)
            mask = (rows < D) & (tl.arange(0, RP_DOWN) < R_DOWN)
            w0, wt = chunk_across_barrier(bar_ptr, bar0 + 4 * nprog, w_down, I, rows, mask, I,
                                          BK_I, TAIL_I, PERSIST, TRACE)
            out = matvec(w0, wt, w_down, I, rows, mask, act_ptr, act_ptr, act_ptr, 1.0, I, BK_I,
                         TAIL_I, RP_DOWN, False, False, DTYPE, GROUP)
            epilogue(out, rows, mask, s_down, s_down, y_ptr, W_SCALE, False)
        elif PERSIST:
            barrier(bar_ptr, bar0 + 4 * nprog, TRACE)

        # The next layer's norm weight and first qkv chunk, requested while this layer's last
        # programs finish (a launch of a phase runs one layer: nothing comes next).
        nxt = tl.minimum(layer + 1, last)
        w_in = layer_at(w_in_ptr, off_ptr, nxt, 0, NOFF)
        w_qkv = layer_at(w_qkv_ptr, off_ptr, nxt, 1, NOFF)
        # (Masked off past the last layer rather than skipped: a chunk kept from before
        # would stay live, in registers, through the whole layer.)
        if PERSIST and layer < last:
            seen = arrive(bar_ptr)
        more = tl.full([RP_QKV], layer, tl.int32) < last  # (a vector: the interpreter's mask)
        w0_a, wt_a = first_chunks(w_qkv, D, rows_a, mask_a & more, D, BK_A, TAIL_A)
        if PERSIST and layer < last:
            wait(bar_ptr, bar0 + 5 * nprog, seen, TRACE)
    if PERSIST:
        # The last program out resets the counter for the next launch (no one polls then).
        if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel") == nprog - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)
