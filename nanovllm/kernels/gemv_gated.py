"""A one-row gate_up projection with its SiLU-and-mul in the GEMV's epilogue (gemv.gemv's
gated=True): silu(x @ gate^T) * (x @ up^T) in one launch, without the SiLU·mul kernel after it.

Each program takes BLOCK_N / 2 gate rows and the up rows of the same outputs, interleaved
(gate j, up j, ...), so its epilogue holds both halves of its outputs and nothing is
computed twice (a prologue on the down projection would redo the activation in every
program that reads it). The rounding is the unfused path's: gate_up rounded to the model
dtype as stored, silu rounded, then the product, as triton_norm.silu_and_mul does.

At batch 1 the chain of a launch per op (models past the one-launch layer kernel, e.g. the
Qwen3-8B shape) loses one launch a layer: on the H200 that shape's batch 1 went 400.5 -> 405.2
tok/s with fp8 weights, 254.3 -> 255.8 with bf16 (2026-11-30, PERF_NOTES fifty-third session).
"""
import torch
import triton
import triton.language as tl

# Whether a one-row gate_up takes the gated GEMV (layers/linear.silu_mul_matmul); 0: never.
GATED = 1


@triton.jit
def silu_mul_epilogue(out, rows, mask, pid, N, s_ptr, b_ptr, y_ptr, W_SCALE: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """out: the program's interleaved gate / up sums ([BLOCK_N], fp32) for rows; y[j] =
    silu(gate j) * up j for its BLOCK_N / 2 outputs j, each step rounded to y's dtype."""
    if W_SCALE:
        out *= tl.load(s_ptr + rows, mask=mask, other=0.0)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    dtype = y_ptr.dtype.element_ty
    gate, up = tl.split(tl.reshape(out.to(dtype).to(tl.float32), [BLOCK_N // 2, 2]))
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    cols = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(y_ptr + cols, (act * up).to(dtype), mask=cols < N)


def takes(x: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None) -> bool:
    """Whether a gate_up call runs as gemv.gemv(..., gated=True): GATED on, one row on a
    GPU, a weight of even rows in e4m3 with row scales (block None) or plain bf16 / fp16."""
    kind = weight.dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
    return (bool(GATED) and kind and x.is_cuda and x.numel() == x.shape[-1]
            and block is None and weight.shape[0] % 2 == 0 and weight.stride(1) == 1)
