"""Hadamard mixing of q and k for an 8-bit KV cache: an orthonormal rotation after RoPE that
leaves every q.k as it was and spreads each key's outlier channels, so the cache's rounding
errors average out in the dot products."""
import functools
import os

import torch


def hadamard_mix(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] times the orthonormal D x D Hadamard matrix (D a power of two).

    Applied to q and k after RoPE it leaves every q.k unchanged, but spreads each key's few
    large channels over all D, so an fp8 cache's per-element rounding errors average out in
    the dot products instead of riding on the channels that dominate them (SmolLM2, CPU:
    decode 0.060 -> 0.050 nats mean; docs/PERF_NOTES.md)."""
    d = x.shape[-1]
    return (x.float() @ _hadamard(d, x.device)).to(x.dtype)


def mix_kv_wanted(head_dim: int) -> bool:
    """Whether an fp8 cache with calibrated scales (or an int8 cache) gets Hadamard-mixed q/k:
    a power-of-two head_dim of at least 32 (the fused kernel's dots need halves of >= 16),
    unless NANOVLLM_KV_MIX=0 (for measuring what the mixing buys)."""
    return (head_dim >= 32 and head_dim & (head_dim - 1) == 0
            and os.environ.get("NANOVLLM_KV_MIX", "1") != "0")


@functools.lru_cache(maxsize=None)
def _hadamard(d: int, device: torch.device) -> torch.Tensor:
    assert d & (d - 1) == 0, f"Hadamard mixing needs a power-of-two head_dim, got {d}"
    h = torch.ones(1, 1)
    while h.shape[0] < d:  # Sylvester: [[H, H], [H, -H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / d ** 0.5).to(device)
