"""RMSNorm, optionally fused with the residual add that precedes it."""
import torch
from torch import nn

from nanovllm.utils.compile import compile_on_cuda


@compile_on_cuda
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.to(dtype) * weight


@compile_on_cuda
def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    dtype = x.dtype
    x = x.float() + residual.float()
    residual = x.to(dtype)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.to(dtype) * weight, residual


class RMSNorm(nn.Module):
    """Root-mean-square norm; with a residual it returns (norm(x + residual), x + residual)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return _rms_norm(x, self.weight, self.eps)
        return _add_rms_norm(x, residual, self.weight, self.eps)
