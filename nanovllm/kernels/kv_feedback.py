"""An fp8 K cache rounded with the queries in mind: the plain-torch reference (issue 27).

Plain rounding gives each element of a key row its own error d_i, so a score q.k errs by
sum_i q_i d_i. Rounding the row's elements in turn and pushing each one's error onto those not
yet rounded, weighted by the queries' second moments H = E[q q^T] (GPTQ's update), minimizes
E[(q.d)^2] instead of sum_i d_i^2. H comes from the queries of the prefill that calibrates the
fp8 scales. Emulated on SmolLM2 (tools/kv_gptq_emulate.py, docs/PERF_NOTES.md): decode error
0.0549 -> 0.0373 nats; the engine does not use it yet (the store kernels do not round this way).
"""
import torch

from nanovllm.kernels.torch_ref import quantize

# Added to H's diagonal, times its mean: best of 0.01-1.0 on both emulated texts.
DAMP = 0.1


def feedback_factor(q: torch.Tensor, num_kv_heads: int, damp: float = DAMP) -> torch.Tensor:
    """The upper Cholesky factor [Hkv, D, D] of (H + damp * mean(diag H) * I)^-1 per kv head,
    H = E[q q^T] over the rotated queries q [T, Hq, D] of that kv head's group."""
    t, hq, d = q.shape
    rows = q.float().view(t, num_kv_heads, hq // num_kv_heads, d).permute(1, 0, 2, 3)
    rows = rows.reshape(num_kv_heads, -1, d)
    h = rows.transpose(1, 2) @ rows / rows.shape[1]
    h = h + damp * h.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * torch.eye(d)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def quantize_feedback(k: torch.Tensor, scale: torch.Tensor, factor: torch.Tensor,
                      dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """k [T, Hkv, D] as `dtype` codes of k / scale[kv head], rounded column by column with
    GPTQ's error feedback through factor (feedback_factor's [Hkv, D, D])."""
    w = k.float().clone()
    codes = torch.empty(w.shape, dtype=dtype)
    for i in range(w.shape[-1]):
        col = w[:, :, i]
        codes[:, :, i] = quantize(col[..., None], scale, dtype)[..., 0]
        err = (col - codes[:, :, i].float() * scale) / factor[:, i, i]
        # Column i itself becomes its rounded value; the rest take the error's share.
        w[:, :, i + 1:] -= err[:, :, None] * factor[None, :, i, i + 1:]
    return codes
