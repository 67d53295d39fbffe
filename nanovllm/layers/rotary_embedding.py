"""Rotary position embedding (the rotate-half layout of Qwen and Llama), with the RoPE
scalings config.json may ask for (linear, llama3)."""
import math
import weakref

import torch
from torch import nn


# Eager on every device: the GPU runs RoPE in the fused Triton kernel, and this path there
# only for the fp8 cache's one-time calibration and the torch backend (a test oracle).
# torch.compile here made a fresh start import and run inductor (seconds, docs/PERF_NOTES.md).
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k from a precomputed cos/sin table indexed by position."""

    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: dict | None = None):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        if scaling is not None:
            inv_freq = scale_inv_freq(inv_freq, scaling)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
        # [max_position, 1, head_dim] so one gather serves every head.
        self.register_buffer("cos_sin_cache",
                             torch.cat((freqs.cos(), freqs.sin()), -1).unsqueeze(1),
                             persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q and k rotated by their positions' angles."""
        cos, sin = self.cos_sin_cache[positions].chunk(2, -1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


# Weak values: a table lives as long as a model that uses it. A process-wide table outliving
# its engine pinned the allocator segment it was carved from: after a 125 GiB KV cache was
# freed, a later engine's 2 MiB table landed in that segment and kept all of it from the next
# engine (H200, tests/worker: "no memory left for the KV cache").
_ROPES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def get_rope(head_dim: int, max_position: int, base: float,
             scaling: dict | None = None) -> RotaryEmbedding:
    """The RotaryEmbedding for these settings on the current default device, shared while a
    model holds it: every layer of a model shares its cos/sin table (Qwen3-0.6B: 28 tables of
    21 MB were 0.57 GB of GPU memory, ~20 KV blocks, and 2.2 s of a CPU start-up). The table
    is never written."""
    key = (head_dim, max_position, base, repr(sorted((scaling or {}).items())),
           str(torch.get_default_device()))
    rope = _ROPES.get(key)
    if rope is None:
        rope = _ROPES[key] = RotaryEmbedding(head_dim, max_position, base, scaling)
    return rope


def scale_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """The frequencies of a scaled RoPE (ModelConfig.rope_scaling, already validated)."""
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":  # positions divided by factor
        return inv_freq / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly in 1 / wavelength.
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq
