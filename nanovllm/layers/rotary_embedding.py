"""Rotary position embedding (the rotate-half layout Qwen3 uses)."""
import torch
from torch import nn

from nanovllm.utils.compile import compile_on_cuda


@compile_on_cuda
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k from a precomputed cos/sin table indexed by position."""

    def __init__(self, head_dim: int, max_position: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
        # [max_position, 1, head_dim] so one gather serves every head.
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), -1).unsqueeze(1),
                             persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos, sin = self.cos_sin_cache[positions].chunk(2, -1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)
