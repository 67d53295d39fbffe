"""The skinny GEMM's (skinny_gemm.py) tile configs, split-K rule, where it beats cuBLAS, and
its split-K workspace."""
import torch

from nanovllm.kernels._common import INTERPRET

# Tile configs by weight width and (N, K) bucket: the first row whose max_n >= N and
# max_k >= K wins. SPLIT_K None: as many splits as bring the programs to TARGET_PROGRAMS
# (at least MIN_K_PER_SPLIT columns each). Module level so tools/bench_gemm.py and tests can
# override them.
# TODO(gemm): first guesses from the H100's sizes (132 SMs, ~25-50 KB of loads in flight per
# SM to cover HBM latency); replace with tools/bench_gemm.py --sweep figures.
BF16_TABLE = [
    # (max_n, max_k, config)
    (4096, 1 << 30, dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=None, num_warps=4, num_stages=4)),
    (1 << 30, 1 << 30, dict(BLOCK_N=64, BLOCK_K=256, SPLIT_K=None, num_warps=4,
                            num_stages=4)),
]
# fp8 tiles: block scales cap BLOCK_K at the scale block (128 in every known checkpoint).
# H100, tools/bench_gemm.py --sweep, 2026-11-24 (twelfth session), M = 1 and 16: 32-row tiles
# of 256 columns (512 for the widest layers, gate_up) won on every Qwen3-8B and Qwen3-0.6B
# layer in both scale forms; against the first guesses (64 x 512) Qwen3-8B's qkv went from 24.9
# to 14.8 us (row scales) and gate_up from 67.7 to 42.0 us (2.40 TB/s).
# The widest layers take 64-row tiles of 256 columns since the H200 (tools/fp8_table_sweep.py,
# 2026-11-29, Qwen3-8B's gate_up at M = 1 and 16, us summed): 68.6 -> 60.1 with row scales,
# 72.5 -> 66.4 with block scales (BLOCK_K 128 there); 32 x 512 was the H100's pick.
FP8_TABLE = [
    (16384, 1 << 30, dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=None, num_warps=4, num_stages=4)),
    (1 << 30, 1 << 30, dict(BLOCK_N=64, BLOCK_K=256, SPLIT_K=None, num_warps=4,
                            num_stages=3)),
]
TARGET_PROGRAMS = 264  # two waves of the H100's 132 SMs
MIN_K_PER_SPLIT = 512
MAX_SPLIT_K = 16
# The interpreter runs the smallest tiles tl.dot takes, so tiny test shapes span several tiles
# and splits.
INTERPRET_CONFIG = dict(BLOCK_N=16, BLOCK_K=16, SPLIT_K=None, num_warps=1, num_stages=1)

# Where it beats cuBLAS on bf16 weights at M <= 16 (H100, tools/bench_gemm.py, 2026-11-24, the
# first kernel version): the LM heads, 1.05-1.06x (Qwen3-0.6B's 105 vs 112 us, Qwen3-8B's 413
# vs 437 us: ~3.0 TB/s); not the layers of Qwen3-0.6B (0.65-1.02x: cuBLAS 5.4-7.1 us per layer)
# nor of Qwen3-8B (0.83-1.01x). So: from this N up.
SKINNY_FROM_N = 32768


def beats_cublas(n: int, k: int) -> bool:
    """Whether this kernel was measured faster than cuBLAS on a bf16 [N, K] weight at M <= 16
    (the static rule behind layers/linear.dense_linear)."""
    return n >= SKINNY_FROM_N


def choose_config(n: int, k: int, weight_dtype: torch.dtype,
                  x_dtype: torch.dtype = torch.bfloat16) -> dict:
    """The tile config of the table row for this (N, K) and weight width."""
    if INTERPRET:
        return INTERPRET_CONFIG
    table = FP8_TABLE if weight_dtype.itemsize == 1 else BF16_TABLE
    cfg = next(c for max_n, max_k, c in table if n <= max_n and k <= max_k)
    if weight_dtype.itemsize != 1 and k % cfg["BLOCK_K"]:
        # K tiles that divide K: no masked last tile. H100, LM heads at M = 1 (2026-11-25):
        # SmolLM2-135M's 49152 x 576 27.5 -> 22.3 us (cuBLAS 22.8) with 64-column tiles,
        # Qwen2.5-0.5B's 151936 x 896 96.2 -> 91.7 us with 128.
        block_k = cfg["BLOCK_K"]
        while block_k > 16 and k % block_k:
            block_k //= 2
        cfg = dict(cfg, BLOCK_K=block_k)
    if 4 in (weight_dtype.itemsize, x_dtype.itemsize):  # fp32 tiles: twice the shared memory
        cfg = dict(cfg, num_stages=min(cfg["num_stages"], 2))
    return cfg


def auto_split_k(tiles: int, k: int, block_k: int) -> int:
    """Splits (a power of two) that bring `tiles` programs up to TARGET_PROGRAMS, keeping at
    least MIN_K_PER_SPLIT columns (and one K tile) per split."""
    split = 1
    while (tiles * split < TARGET_PROGRAMS and split < MAX_SPLIT_K
           and k // (split * 2) >= max(MIN_K_PER_SPLIT, block_k)):
        split *= 2
    return split


_WORKSPACE: dict = {}
# Replaced workspaces stay alive: graphs captured before a growth still point at them.
_RETIRED: list = []


def workspace(device: torch.device, floats: int, counters: int):
    """(fp32 partials, zeroed int32 counters) for split-K, one pair per device.

    Made on the first call that needs them (eagerly, before any graph capture: the engine
    runs each captured batch size once first) and grown only when a larger one is needed;
    calls on one stream never overlap, which is what sharing them needs."""
    part, cnt = _WORKSPACE.get(device, (None, None))
    if part is None or part.numel() < floats or cnt.numel() < counters:
        _RETIRED.append((part, cnt))
        part = torch.empty(max(floats, 1 << 20), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(counters, 4096), dtype=torch.int32, device=device)
        _WORKSPACE[device] = (part, cnt)
    return part, cnt
