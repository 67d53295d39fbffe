"""What the Triton attention kernels share: the interpreter flag, the exp2 constant, the dot
precision choice and one online-softmax step."""
import functools
import os

import torch
import triton
import triton.language as tl

# TRITON_INTERPRET=1 (set by tests/conftest.py without a GPU) runs kernels on the CPU; tile
# configs then shrink so that tiny test shapes still span several tiles.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Kernels exponentiate with exp2 (one hardware instruction): exp(x) == exp2(x * LOG2E), so the
# softmax scale is premultiplied by LOG2E on the host.
LOG2E = 1.4426950408889634


@functools.lru_cache(maxsize=None)
def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input_precision for q's dtype: fp32 inputs get exact (ieee) dots so fp32 runs match
    the reference; tf32 would not. Other dtypes are unaffected by the choice."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def online_softmax_step(m_i, l_i, qk):
    """Fold one tile of exp2-domain scores qk [M, N] (masked keys at -inf) into the running row
    max m_i [M] and row sum l_i [M].

    Returns (m_i, l_i, p, alpha): the caller updates its accumulator as acc * alpha[:, None] + p @ V
    (written there, after V's load, so the compiled kernels keep their instruction order).
    """
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, p, alpha
