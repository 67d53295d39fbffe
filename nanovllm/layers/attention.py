"""Attention over the paged KV cache; the implementation is a pluggable backend."""
import torch
from torch import nn

from nanovllm.layers.attention_backend import TorchBackend, norm_and_rotate
from nanovllm.utils.context import get_context


class Attention(nn.Module):
    """Applies q/k norm and RoPE, stores this step's K/V in the cache, then attends (prefill
    or decode) through it. The backend may fuse the first three into one kernel."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.backend = TorchBackend()  # ModelRunner installs the chosen one
        self.k_cache = self.v_cache = torch.tensor([])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                rope: nn.Module, q_norm: nn.Module | None = None,
                k_norm: nn.Module | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] straight from the projection; rope maps
        (positions, q, k) to rotated (q, k); q_norm/k_norm are per-head norms or None."""
        ctx = get_context()
        if self.k_cache.numel() == 0:
            # Warm-up before the cache exists (sizing the activations): attention is skipped.
            q, _ = norm_and_rotate(q, k, positions, rope, q_norm, k_norm)
            return torch.zeros_like(q)
        q, k = self.backend.rope_and_store(q, k, v, positions, rope, q_norm, k_norm,
                                           self.k_cache, self.v_cache, ctx)
        if ctx.is_prefill:
            return self.backend.prefill(q, k, v, self.k_cache, self.v_cache, ctx, self.scale)
        return self.backend.decode(q, self.k_cache, self.v_cache, ctx, self.scale)
