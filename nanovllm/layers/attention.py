"""Attention over the paged KV cache; the implementation is a pluggable backend."""
import torch
from torch import nn

from nanovllm.layers.attention_backend import TorchBackend
from nanovllm.utils.context import get_context


class Attention(nn.Module):
    """Stores this step's K/V in the cache, then attends (prefill or decode) through it."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.backend = TorchBackend()  # ModelRunner installs the chosen one
        self.k_cache = self.v_cache = torch.tensor([])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        if self.k_cache.numel() == 0:
            # Warm-up before the cache exists (sizing the activations): attention is skipped.
            return torch.zeros_like(q)
        self.backend.store_kv(k, v, self.k_cache, self.v_cache, ctx)
        if ctx.is_prefill:
            return self.backend.prefill(q, k, v, self.k_cache, self.v_cache, ctx, self.scale)
        return self.backend.decode(q, self.k_cache, self.v_cache, ctx, self.scale)
