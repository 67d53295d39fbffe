"""SwiGLU activation."""
import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """silu(x[..., :d]) * x[..., d:] for the packed gate_up projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., 2n] gate and up halves -> [..., n] SiLU(gate) * up."""
        if x.is_cuda:  # one Triton launch (host time: see the kernel); imported here because
            # CPU-only installs may have no triton
            from nanovllm.kernels.triton_norm import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, -1)
        return F.silu(gate) * up
