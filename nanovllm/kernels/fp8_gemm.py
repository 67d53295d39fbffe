"""fp8-weight GEMM on a GPU: y = x @ dequant(W)^T (+ bias) with W in e4m3 and fp32 row or block
scales, for any number of rows.

Weight-only (W8A16): x stays in its dtype; each W tile is widened in registers (exact) and
fed to a bf16 (fp32: fp32) tensor-core dot; the scales multiply the fp32 partial products.
It is skinny_gemm.py's kernel: M <= 16 (decode) uses its table; larger M (prefill, batched
decode) uses taller row tiles and a grid over M, so W is read from HBM once per row tile
instead of the whole weight being dequantized in torch on every call (the reference).
Not yet: fp8 x fp8 dots with activations quantized per token and 128-column group (DeepSeek's
recipe), which would also halve the dot's operand traffic and double tensor-core peak.
"""
import torch

from nanovllm.kernels._common import INTERPRET
from nanovllm.kernels.skinny_gemm import MAX_M, gemm

# Tall-tile configs by rows, the first whose max_m >= M. BLOCK_K 128: one scale block (every
# known checkpoint's), so block scales apply once per tile. SPLIT_K None: K splits while the
# tiles alone give too few programs (batched decode of a narrow layer). Module level so
# tools/bench_gemm.py and tests can override them.
# TODO(gemm): first guesses; tune with tools/bench_gemm.py --large-m on an H100.
TALL_CONFIGS = [
    (32, dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, SPLIT_K=None, num_warps=4, num_stages=4)),
    (64, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=None, num_warps=4, num_stages=4)),
    (1 << 62, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=None, num_warps=8,
                   num_stages=3)),
]
INTERPRET_TALL = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=None, num_warps=1,
                      num_stages=1)


def tall_config(m: int, x_dtype: torch.dtype) -> dict:
    """The tall-tile config for m rows of x."""
    if INTERPRET:
        return INTERPRET_TALL
    cfg = next(c for max_m, c in TALL_CONFIGS if m <= max_m)
    if x_dtype.itemsize == 4:  # fp32 x tiles take twice the shared memory
        cfg = dict(cfg, num_stages=2)
    return cfg


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             block: tuple[int, int] | None, bias: torch.Tensor | None = None,
             config: dict | None = None) -> torch.Tensor:
    """x[..., K] @ (weight * scale)[N, K]^T (+ bias) in x's dtype: weight e4m3, scale fp32
    per row [N] (block None) or per (bn, bk) block [ceil(N / bn), ceil(K / bk)]."""
    m = x.numel() // x.shape[-1]
    if m <= MAX_M and config is None:
        return gemm(x, weight, bias, scale, block)
    cfg = config or tall_config(m, x.dtype)
    return gemm(x, weight, bias, scale, block, config=cfg, block_m=cfg["BLOCK_M"])
