"""SwiGLU activation."""
import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.compile import compile_on_cuda


@compile_on_cuda
def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, -1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """silu(x[..., :d]) * x[..., d:] for the packed gate_up projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _silu_and_mul(x)
