"""RMSNorm, optionally fused with the residual add that precedes it."""
import torch
from torch import nn

from nanovllm.layers.fp8_rows import Fp8Rows
from nanovllm.layers.split_k import SplitSum


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.to(dtype) * weight


def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    # The sum is rounded to the model dtype before the norm reads it, as HF's decoder layers
    # add in the model dtype.
    residual = (x.float() + residual.float()).to(x.dtype)
    return _rms_norm(residual, weight, eps), residual


class RMSNorm(nn.Module):
    """Root-mean-square norm; with a residual it returns (norm(x + residual), x + residual)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor | SplitSum, residual: torch.Tensor | None = None,
                quantize: bool = False):
        """norm(x), or with a residual (norm(x + residual), x + residual); x may be a split
        matmul's partials (layers/split_k.py), added here. quantize (on a GPU): the norm comes
        as Fp8Rows for an fp8 matmul (layers/fp8_rows.py)."""
        if isinstance(x, SplitSum) or quantize:  # (only on a GPU, where Triton is)
            from nanovllm.kernels.triton_norm import rms_norm

            parts = isinstance(x, SplitSum)
            out = rms_norm(x.parts if parts else x, self.weight, self.eps, residual,
                           dtype=x.dtype if parts else None, quantize=quantize)
            if not quantize:
                return out
            (values, scales), dtype = (out[0] if residual is not None else out), x.dtype
            rows = Fp8Rows(values, scales, dtype)
            return rows if residual is None else (rows, out[1])
        if x.is_cuda:  # one Triton launch instead of ~10 small ops (host time: see the kernel);
            # imported here because CPU-only installs may have no triton
            from nanovllm.kernels.triton_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return _rms_norm(x, self.weight, self.eps)
        return _add_rms_norm(x, residual, self.weight, self.eps)
