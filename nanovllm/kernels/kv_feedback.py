"""An fp8 K cache rounded with the queries in mind: the plain-torch reference (issue 27).

Plain rounding gives each element of a key row its own error d_i, so a score q.k errs by
sum_i q_i d_i. Rounding the row's elements in turn and pushing each one's error onto those not
yet rounded, weighted by the queries' second moments H = E[q q^T] (GPTQ's update), minimizes
E[(q.d)^2] instead of sum_i d_i^2. H comes from the queries of the prefill that calibrates the
fp8 scales. Emulated on SmolLM2 (tools/kv_gptq_emulate.py, docs/PERF_NOTES.md): decode error
0.0549 -> 0.0373 nats. The torch path and the fused RoPE-store kernel (triton_rope) round
this way when NANOVLLM_KV_FEEDBACK=1; off by default until a GPU measures its cost.
"""
import os

import torch

# Added to H's diagonal, times its mean: best of 0.01-1.0 on both emulated texts.
DAMP = 0.1


def feedback_wanted() -> bool:
    """Whether an fp8_e4m3 cache with calibrated scales rounds K this way:
    NANOVLLM_KV_FEEDBACK=1 (off by default until measured on a GPU)."""
    return os.environ.get("NANOVLLM_KV_FEEDBACK", "0") == "1"


def feedback_factor(q: torch.Tensor, num_kv_heads: int, damp: float = DAMP) -> torch.Tensor:
    """The upper Cholesky factor [Hkv, D, D] of (H + damp * mean(diag H) * I)^-1 per kv head,
    H = E[q q^T] over the rotated queries q [T, Hq, D] of that kv head's group."""
    t, hq, d = q.shape
    rows = q.float().view(t, num_kv_heads, hq // num_kv_heads, d).permute(1, 0, 2, 3)
    rows = rows.reshape(num_kv_heads, -1, d)
    h = rows.transpose(1, 2) @ rows / rows.shape[1]
    eye = torch.eye(d, device=q.device)
    h = h + damp * h.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * eye
    factor = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    return factor.contiguous()  # the store kernel reads rows of it


def quantize_feedback(k: torch.Tensor, scale: torch.Tensor, factor: torch.Tensor,
                      dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """k [T, Hkv, D] as `dtype` codes of k / scale[kv head], rounded column by column with
    GPTQ's error feedback through factor (feedback_factor's [Hkv, D, D]). Works in units of
    the scale, in the order the fused store kernel does (triton_rope._feedback_round)."""
    fmax = torch.finfo(dtype).max
    y = k.float() / scale.float()[:, None]
    codes = torch.empty(y.shape, dtype=dtype, device=y.device)
    for i in range(y.shape[-1]):
        col = y[:, :, i]
        codes[:, :, i] = col.clamp(-fmax, fmax).to(dtype)
        err = (col - codes[:, :, i].float()) / factor[:, i, i]
        # Column i itself is its rounded value now; the rest take the error's share.
        y[:, :, i + 1:] -= err[:, :, None] * factor[None, :, i, i + 1:]
    return codes
