"""The host side of the one-launch decode layers (kernels/layer_kernel.py): which layer sizes
fit, the layers' tensors as a table of offsets (stack_layers), and the launch itself
(decode_layers: one persistent launch, or on the interpreter one per layer and phase)."""
import torch
import triton

from nanovllm.kernels._common import INTERPRET, LOG2E, dot_precision, fp8_meta
from nanovllm.kernels.decode_reduce import reduce_tile
from nanovllm.kernels.decode_splits import _num_sms
from nanovllm.kernels.feedback_chains import SOURCE_DTYPES, chain_asm
from nanovllm.kernels.layer_config import CONFIG
from nanovllm.kernels.layer_kernel import ALL_PHASES, BLOCK_N, NUM_PHASES, _layers_kernel
from nanovllm.kernels.triton_decode import _split_counters
from nanovllm.kernels.triton_kv import v_tile_of

_BARRIERS: dict = {}


def _barrier(device, words: int = 2) -> torch.Tensor:
    """Zeroed int32 [2] (arrivals, exits) per device, made once outside graph capture; every
    launch leaves those two zero. With CONFIG["TRACE"] the words from 64 on hold the waits'
    clocks (layer_parts._trace)."""
    buf = _BARRIERS.get((device, words))
    if buf is None:
        buf = _BARRIERS[(device, words)] = torch.zeros(words, dtype=torch.int32, device=device)
    return buf


def trace_words(num_layers: int, programs: int) -> int:
    """The barrier buffer's size with CONFIG["TRACE"]: 4 words a (barrier, program)."""
    return 64 + 4 * NUM_PHASES * num_layers * programs


_ZEROS: dict = {}


def _zeros(device, n: int, dtype) -> torch.Tensor:
    """A zero [1, n] row, made once (the first call is a warm-up's, outside graph capture)."""
    key = (device, n, dtype)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(1, n, dtype=dtype, device=device)
    return _ZEROS[key]


# The most weights one program's matvec tile may hold (rows padded x K padded): the K loop is
# unrolled, so past this compile time and registers blow up (the Qwen3-8B shape: 5 minutes of
# compiling and 10 KB of spills a thread); such models keep the launch-per-op path.
MAX_TILE = 1 << 17


def _programs(device) -> int:
    """The grid: PER_SM programs on each SM (all must be resident at once for the barriers:
    each program's registers and shared memory must leave room for PER_SM of them)."""
    return 4 if INTERPRET else CONFIG["PER_SM"] * _num_sms(device)


def fits(hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate: int,
         programs: int | None = None) -> bool:
    """Whether a layer of these sizes stays within MAX_TILE weights a program (the limit of
    the matvec's unrolled K loop)."""
    p = programs or _programs(torch.device("cuda"))
    pow2 = triton.next_power_of_2
    qkv = _rows((num_heads + 2 * num_kv_heads) * head_dim, p)[1] * pow2(hidden)
    o = _rows(hidden, p)[1] * pow2(num_heads * head_dim)
    gate_up = 2 * _rows(intermediate, p)[1] * pow2(hidden)
    down = _rows(hidden, p)[1] * pow2(intermediate)
    return max(qkv, o, gate_up, down) <= MAX_TILE


def _rows(n: int, programs: int) -> tuple[int, int]:
    """(rows per program, that rounded up to a power of two)."""
    r = triton.cdiv(n, programs)
    return r, triton.next_power_of_2(r)


def _block_k(rows_pad: int, k: int) -> int:
    """K chunk of a matvec: CONFIG["CHUNK"] weights a chunk, whole K if smaller."""
    return max(16, min(triton.next_power_of_2(k), CONFIG["CHUNK"] // rows_pad))


def _tail(k: int, block_k: int) -> int:
    """The width of a matvec's narrow last K chunk (a power of two), loaded with its first
    before the barrier, or 0: the last chunk a whole one, masked past K, requested only as
    the loop reaches it. Narrow: at most CONFIG["TAIL"] columns (SmolLM2's 576 = 512 + 64)."""
    rem = k % block_k
    tail = triton.next_power_of_2(rem) if rem and k > block_k else 0
    return tail if tail <= CONFIG["TAIL"] and tail < block_k else 0


def _c_splits(hq: int, hd: int, splits: int, bk_q: int) -> int:
    """Up to how many key splits phase C combines them itself (0: never; the last split of
    each kv head does): CONFIG["C_SPLITS"] (a power of two, 2 or more), where o_proj's K is
    one chunk (the combined row is its input) and the partials fit in 8K fp32 values a
    program (at Qwen3-0.6B's 16 heads of 128, 4 splits fit and cost more than they save)."""
    c = min(CONFIG["C_SPLITS"], 1 << (splits.bit_length() - 1))  # (at most the buffers')
    if c < 2 or c & (c - 1) or bk_q < hq * hd or c * bk_q > 8192:
        return 0
    return c


def _pre_kv(hd: int, fp8: bool, apart: bool) -> int:
    """Phase B's first tile requested before its barrier (CONFIG["PRE_KV"]): 1 into registers,
    which past 64-dim heads spill (Qwen3-0.6B's 128: 744-1,160 bytes), so there into L2 (2;
    not in the interpreter: it runs no PTX). 0 with the new key apart, and with an fp8 cache
    (its new key's codes, stored from PTX, would have to be read back into the tile: timed
    slower, 26.9 vs 19.9 us a layer, SmolLM2 shape, H200)."""
    pre = 0 if apart or fp8 else CONFIG["PRE_KV"]
    if pre == 1 and hd > 64:
        pre = 2
    return 0 if pre == 2 and INTERPRET else pre


# The per-layer tensors of the kernel, in the order of its offsets table's columns
# (layer_parts.layer_at).
# An fp8 cache adds its per-kv-head scales (k_scale, v_scale: fp32 [Hkv]) and K's error
# feedback matrix (k_fb: fp32 [Hkv, D, G], or None).
COLUMNS = ("w_in", "w_qkv", "b_qkv", "q_norm", "k_norm", "w_o", "b_o", "w_post", "w_gu",
           "w_down", "s_qkv", "s_o", "s_gu", "s_down", "k_cache", "v_cache", "k_scale",
           "v_scale", "k_fb")
_STAND_IN = {"b_qkv": "w_qkv", "q_norm": "w_in", "k_norm": "w_in", "b_o": "w_o",
             "s_qkv": "w_qkv", "s_o": "w_qkv", "s_gu": "w_qkv", "s_down": "w_qkv",
             "k_scale": "w_in", "v_scale": "w_in", "k_fb": "w_in"}
# Columns read one scalar at a time: any element step will do (the cache's scales are rows
# of one [2, layers, Hkv] tensor, 12 bytes apart for SmolLM2's 3 kv heads).
_UNALIGNED = ("k_scale", "v_scale")


def stack_layers(layers: list[dict]) -> dict | None:
    """Consecutive layers' tensors for one launch: each column's first-layer tensor (a stand-in
    where the layers have none, e.g. no bias) and "offsets", int64 [layers, columns] on the
    device: where each layer's tensor lies from the first's, in elements. A layer dict holds
    COLUMNS' names (b_qkv, q_norm, k_norm, b_o and the fp8 row scales s_* may be None); every
    layer's tensors must have the first layer's shapes, strides and dtypes. None where one
    lies off a 16-byte step from the first (the kernel's vectorized loads need that)."""
    first = layers[0]
    present = {c: first[c] is not None for c in COLUMNS}
    base, offsets = {}, []
    for c in COLUMNS:
        base[c] = first[c] if present[c] else first[_STAND_IN[c]]
    for layer in layers:
        row = []
        for c in COLUMNS:
            t = layer[c] if present[c] else None
            if t is None:
                row.append(0)
                continue
            b = base[c]
            assert (t.shape, t.stride(), t.dtype) == (b.shape, b.stride(), b.dtype), c
            delta = t.data_ptr() - b.data_ptr()
            if delta % (t.element_size() if c in _UNALIGNED else 16):
                return None
            row.append(delta // t.element_size())
        offsets.append(row)
    table = torch.tensor(offsets, dtype=torch.int64, device=first["w_qkv"].device)
    return dict(base, offsets=table, present=present, num_layers=len(layers))


def decode_layers(x, residual, stack: dict, *, eps, num_heads, num_kv_heads, head_dim, scale,
                  cos_sin, positions, slot_mapping, context_lens, block_tables,
                  mix: bool = False, programs: int | None = None, phased: bool | None = None,
                  phases: tuple[int, ...] = tuple(range(NUM_PHASES))):
    """Consecutive decoder layers (stack_layers) for one token, in one launch: x, residual
    [1, D] (residual None before the first layer) -> (the last layer's mlp output, its new
    residual), as DecoderLayer.forward chains them, with this token's K/V stored in each
    layer's k_cache / v_cache [blocks, block_size, Hkv, D] at slot_mapping[0]. w_gu is the
    packed [2I, D] gate_up weight; fp8 e4m3 weights come with fp32 row scales s_*; cos_sin
    is the RoPE table [max_pos, head_dim] (fp32, cos half then sin half). An fp8 cache needs
    the stack's k_scale / v_scale (k_fb: K rounded with error feedback); mix: q and K
    Hadamard-mixed after RoPE, as the backend's mix_kv (needs a head_dim >= 32). phased: a
    launch per layer and phase (default: interpreter), of `phases` only (timing one phase:
    tools/bench_layer_kernel.py)."""
    device, dtype = x.device, x.dtype
    k_cache, v_cache = stack["k_cache"], stack["v_cache"]
    d = x.shape[-1]
    inter = stack["w_down"].shape[1]
    hq, hkv, hd = num_heads, num_kv_heads, head_dim
    assert hd & (hd - 1) == 0 and k_cache.stride(3) == 1
    v_tile = v_tile_of(k_cache, v_cache)
    assert not v_tile or (v_tile % BLOCK_N == 0 and k_cache.shape[1] % BLOCK_N == 0)
    assert k_cache.stride(2) == hd and k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)
    if programs is None:
        programs = _programs(device)
    if phased is None:
        phased = INTERPRET
    splits = max(1, min(CONFIG["SPLITS"], programs // hkv))
    f32 = dict(dtype=torch.float32, device=device)
    qkv = torch.empty((hq + 2 * hkv) * hd, dtype=dtype, device=device)
    po = torch.empty(hq * splits * hd, **f32)
    lse = torch.empty(hq * splits, **f32)
    o = torch.empty(hq * hd, dtype=dtype, device=device)
    ao, h, res_out, y = (torch.empty(1, d, dtype=dtype, device=device) for _ in range(4))
    act = torch.empty(inter, dtype=dtype, device=device)
    r_qkv, rp_qkv = _rows((hq + 2 * hkv) * hd, programs)
    r_o, rp_o = _rows(d, programs)
    r_gu, rp_gu = _rows(inter, programs)
    r_down, rp_down = _rows(d, programs)
    # (At 64-dim heads a load of the combine takes 64 values a thread: SmolLM2's up to 44
    # splits in 2 loads instead of 6, H100, context 2048: 19.6 -> 17.4 us a layer.)
    red_gp, red_chunk = reduce_tile(hq // hkv, hd)
    if residual is None:  # before the first layer: h = x + 0 (exact)
        residual = _zeros(device, d, dtype)
    present = stack["present"]
    kv = fp8_meta(k_cache.dtype)
    assert not kv["KV_INT8"] and (present["k_scale"] or not kv["KV_FP8"])
    assert not mix or hd >= 32
    # K's feedback chains: a thread each on a GPU; the interpreter runs no PTX.
    fb_asm = (chain_asm(stack["k_fb"].shape[-1], SOURCE_DTYPES[dtype])
              if present["k_fb"] and hd <= CONFIG["FB_CHAINS_MAX_HD"] and not INTERPRET
              else "")
    apart = CONFIG["NEW_APART"] == 1 or (CONFIG["NEW_APART"] == 2 and present["k_fb"]
                                         and not fb_asm)
    head = (qkv, po, lse, o, ao, act, *(stack[c] for c in COLUMNS), stack["offsets"])
    tail = (cos_sin, positions, slot_mapping, context_lens, block_tables, k_cache.stride(0),
            k_cache.stride(1),
            _barrier(device, trace_words(stack["num_layers"], programs) if CONFIG["TRACE"] else 2),
            _split_counters(device, hkv), eps,
            scale * LOG2E)
    # Phase A's qkv rows take the chunks of D's gate_up rows (often more rows: narrower
    # chunks), unless A_CHUNK and their own chunk holds all of K (one load, no K loop).
    bk_d, bk_a = _block_k(max(rp_qkv, 2 * rp_gu), d), _block_k(rp_qkv, d)
    bk = dict(BK_A=bk_a if CONFIG["A_CHUNK"] and bk_a >= d else bk_d, BK_D=bk_d,
              BK_Q=_block_k(rp_o, hq * hd), BK_I=_block_k(rp_down, inter))
    tails = dict(TAIL_A=_tail(d, bk["BK_A"]), TAIL_D=_tail(d, bk_d),
                 TAIL_Q=_tail(hq * hd, bk["BK_Q"]), TAIL_I=_tail(inter, bk["BK_I"]))
    meta = dict(
        D=d, HQ=hq, HKV=hkv, HD=hd, I=inter, R_QKV=r_qkv, RP_QKV=rp_qkv, R_O=r_o, RP_O=rp_o,
        R_GU=r_gu, RP_GU=rp_gu, R_DOWN=r_down, RP_DOWN=rp_down, **bk, **tails,
        QKV_BIAS=present["b_qkv"], O_BIAS=present["b_o"], QK_NORM=present["q_norm"],
        SPLITS=splits, G_PAD=max(16, triton.next_power_of_2(hq // hkv)), RED_GP=red_gp,
        RED_CHUNK=red_chunk, BLOCK_SIZE=k_cache.shape[1], BLOCK_N=BLOCK_N,
        DOT_PREC=dot_precision(dtype), NOFF=len(COLUMNS), W_SCALE=present["s_qkv"],
        WORK=CONFIG["WORK"],
        # (a group lies within one K chunk)
        GROUP=min(CONFIG["GROUP"], *bk.values(), *(t for t in tails.values() if t)),
        KV_FP8=kv["KV_FP8"], MIX=mix, LOG2_HALF=(hd // 2).bit_length() - 1,
        FEEDBACK=present["k_fb"], FB_G=stack["k_fb"].shape[-1] if present["k_fb"] else 1,
        FMAX=kv["FMAX"], MANT=kv["MANT"], BIAS=kv["BIAS"], SOFT=kv["SOFT"],
        FP16_QK=kv["KV_FP8"] and dtype == torch.bfloat16,
        FB_PREFETCH=present["k_fb"] and CONFIG["FB_PREFETCH"] and not INTERPRET,
        FB_ASM=fb_asm, NEW_APART=apart and splits > 1, TRACE=bool(CONFIG["TRACE"]),
        FB_AHEAD=CONFIG["FB_AHEAD"] if CONFIG["FB_AHEAD"] != 2 or not INTERPRET else 0,
        C_SPLITS=_c_splits(hq, hd, splits, bk["BK_Q"]),
        PRE_KV=_pre_kv(hd, kv["KV_FP8"], apart and splits > 1),
        V_WORDS=CONFIG["V_WORDS"] and not INTERPRET and k_cache.dtype == torch.float8_e4m3fn
        and (dtype == torch.bfloat16 or dtype == torch.float16) and not v_tile, V_TILE=v_tile,
        V_LAST=min(CONFIG["V_LAST"], 1) if apart and splits > 1 else CONFIG["V_LAST"],
        num_warps=CONFIG["num_warps"] if not INTERPRET else 1)
    grid = (programs,)
    if not phased:
        _layers_kernel[grid](x, residual, h, res_out, y, *head, 0, stack["num_layers"], *tail,
                             PHASE=ALL_PHASES, **meta)
        return y, res_out
    for layer in range(stack["num_layers"]):  # each layer's input: the previous one's output
        src = (x, residual) if layer == 0 else (y, res_out)
        for phase in phases:
            _layers_kernel[grid](*src, h, res_out, y, *head, layer, 1, *tail, PHASE=phase,
                                 **meta)
    return y, res_out
